"""The sweep comparison from a real MLflow store (sqlite), populated directly through MlflowClient."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from grpo_pipe import report
from grpo_pipe.tracking.comparison import table_rows, write_comparison
from grpo_pipe.tracking.comparison_plots import spans_decades
from grpo_pipe.tracking.mlflow_tracker import EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND, MlflowTracker
from grpo_pipe.tracking.run_tags import run_tags
from grpo_pipe.tracking.sweep_runs import find_parent, read_children
from grpo_pipe.types import TrackedRun

# Three bridges of one sweep: step -> (reward, sync phases), and a final accuracy each; lora is best.
BRIDGES = {"reload": 0.25, "lora": 0.75, "nccl": 0.5}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[MlflowClient, str, Path]:
    """A parent and one child per bridge, written the way MlflowTracker writes them (one store: creating one takes seconds)."""
    tmp_path = tmp_path_factory.mktemp("sweep-store")
    store = f"sqlite:///{tmp_path}/mlflow.db"
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    tracker = MlflowTracker(tracking_uri=store, artifact_location=str(tmp_path / "artifacts"), system_metrics=False)
    for index, (bridge, accuracy) in enumerate(BRIDGES.items()):
        overrides = [f"weight_bridge={bridge}", "trainer.steps=2", "model=tiny_random"]
        tracker.start(TrackedRun(name=f"job{index}", tags=run_tags(["python"], {"weight_bridge": bridge}, overrides),
                                 sweep_dir=str(sweep_dir)))
        tracker.log_params({"run.objective": "eval/accuracy", "run.objective_direction": "maximize"})
        tracker.log_metrics({"eval/accuracy": 0.0, "eval/score": 0.0}, step=0)
        for step in (1, 2):
            tracker.log_metrics({
                "train/reward/mean": accuracy * step / 2, "train/reward/task": accuracy, "train/reward/weighted/task": 1.0,
                "time/step_s": 1.0 + index, "rollout/tokens_per_s": 100.0 * (index + 1),
                "sync/total_s": 0.6, "sync/gather_s": 0.1, "sync/transport_s": 0.2, "sync/load_s": 0.3,
                "sync/pause_s": 0.05, "sync/bytes": 1000.0,
            }, step=step)
        tracker.log_metrics({"eval/accuracy": accuracy, "eval/score": accuracy, "summary/reward_first_quarter": 0.1,
                             "summary/reward_last_quarter": accuracy}, step=2)
        tracker.close()
    client = MlflowClient(tracking_uri=store)
    return client, tracker.parent_run_id or "", sweep_dir


def test_children_carry_their_evaluations_against_minutes_since_their_start(sweep) -> None:
    client, parent_id, _ = sweep
    lora = read_children(client, parent_id)[1]
    run = client.get_run(lora.run_id)
    history = client.get_metric_history(lora.run_id, "eval/accuracy")
    want = sorted(((m.timestamp - run.info.start_time) / 60_000, m.value) for m in history)
    assert lora.clock["eval/accuracy"] == want and [v for _, v in want] == [0.0, 0.75]
    assert all(minutes >= 0 for minutes, _ in want)


def test_time_charts_go_to_a_log_scale_only_when_values_span_a_decade() -> None:
    assert spans_decades([0.012, 0.03, 4.1])  # in-memory bridges beside a checkpoint sync
    assert not spans_decades([0.5, 1.2, 3.0])
    assert not spans_decades([None, 0.0, 2.0])  # nothing to compare a single positive value with


def test_the_comparison_has_a_row_per_child_plots_page_params_and_the_best(sweep, tmp_path: Path) -> None:
    client, parent_id, _ = sweep
    write_comparison(client, parent_id)
    write_comparison(client, parent_id)  # regenerated: replaced, not appended to

    table = json.loads(Path(client.download_artifacts(parent_id, "comparison/comparison.json", str(tmp_path))).read_text())
    rows = [dict(zip(table["columns"], values)) for values in table["data"]]
    assert [r["run"] for r in rows] == ["weight_bridge=reload", "weight_bridge=lora", "weight_bridge=nccl"]
    lora = rows[1]
    assert lora["objective_final"] == 0.75 and lora["objective_best"] == 0.75 and lora["status"] == "FINISHED"
    assert lora["sync_total_s"] == 0.6 and lora["sync_gather_s"] == 0.1 and lora["sync_pause_s"] == 0.05
    assert lora["sync_bytes_total"] == 2000.0 and lora["step_s"] == 2.0 and lora["rollout_tokens_per_s"] == 200.0
    assert lora["reward_last_quarter"] == 0.75 and "weight_bridge=lora" in lora["overrides"]

    files = {f.path for f in client.list_artifacts(parent_id, "comparison")}
    pngs = {"curves.png", "score_by_time.png", "sync_breakdown.png", "throughput.png", "reward_terms.png"}
    assert files == {f"comparison/{name}" for name in pngs | {"comparison.json", "comparison.html"}}
    for name in pngs:
        assert Path(client.download_artifacts(parent_id, f"comparison/{name}", str(tmp_path))).read_bytes()[:8] == (
            b"\x89PNG\r\n\x1a\n")
    page = Path(client.download_artifacts(parent_id, "comparison/comparison.html", str(tmp_path))).read_text()
    assert page.count("data:image/png;base64,") == 5 and "<b>weight_bridge=lora</b>" in page
    assert "Held-out score against wall-clock time" in page

    parent = client.get_run(parent_id)
    assert parent.data.params == {"weight_bridge": "reload,lora,nccl"}  # only the key that differs
    assert parent.data.metrics == {"best/eval/accuracy": 0.75}
    assert parent.data.tags["grpo_pipe.best_run"] == "weight_bridge=lora"
    assert json.loads(parent.data.tags["mlflow.loggedArtifacts"]) == [{"path": "comparison/comparison.json", "type": "table"}]
    # The run list names the parent by what it varied; its description gives the answer and says the margin is
    # unknown (one seed per bridge).
    assert parent.info.run_name == "sweep weight_bridge=reload,lora,nccl (sweep)"
    assert parent.data.tags["grpo_pipe.verdict"].startswith("weight_bridge=lora leads on eval/accuracy by 0.25")
    description = parent.data.tags["mlflow.note.content"]
    assert "margin unknown" in description and "- weight_bridge=nccl: 0.5 (1 seed)" in description
    assert "margin unknown" in page and lora["setup_min"] is not None and lora["setup_min"] >= 0


def test_minimize_picks_the_lowest(sweep, tmp_path: Path) -> None:
    client, parent_id, _ = sweep
    children = read_children(client, parent_id)
    for child in children:
        child.direction, child.objective = "minimize", "eval/accuracy"
    from grpo_pipe.tracking.comparison import best_child

    best = best_child(children)
    assert best is not None and best.label == "weight_bridge=reload"
    assert table_rows(children)[0]["objective_best"] == 0.0  # the best of its history, in its direction


def test_the_report_finds_the_parent_by_sweep_folder_or_run_id(sweep, tmp_path: Path, monkeypatch) -> None:
    client, parent_id, sweep_dir = sweep
    assert find_parent(client, str(sweep_dir)) == parent_id == find_parent(client, parent_id)
    with pytest.raises(LookupError, match="no MLflow parent run"):
        find_parent(client, str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)  # the CLI reads it when no --tracking-uri
    assert report.main([str(sweep_dir)]) == 0
    assert client.get_run(parent_id).data.metrics["best/eval/accuracy"] == 0.75
    assert report.main([str(tmp_path)]) == 2


def test_tracker_marks_the_experiment_copies_headline_metrics_and_links_the_training_view(tmp_path: Path) -> None:
    tracker = MlflowTracker(tracking_uri=f"sqlite:///{tmp_path}/m.db", artifact_location=str(tmp_path / "a"),
                            system_metrics=False)
    tracker.start(TrackedRun(name="one", tags={"grpo_pipe.choice.weight_bridge": "lora"}))
    tracker.log_metrics({"train/reward/mean": 0.5, "sync/total_s": 2.0, "async/queue_depth": 1.0}, step=1)
    tracker.close()
    client = MlflowClient(tracking_uri=tracker.tracking_uri)
    experiment = client.get_experiment_by_name("grpo_pipe")
    assert experiment.tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
    metrics = client.get_run(tracker.run_id or "").data.metrics
    assert metrics["Headline/reward"] == 0.5 and metrics["Headline/sync_s"] == 2.0
    assert sorted(k.split("/")[0] for k in metrics)[0] == "Headline"  # the section the chart view shows first
    assert "?workflowType=machine_learning" in tracker.describe()


def test_mlflow_tracking_uri_is_used_when_the_config_names_none(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/env.db")
    assert MlflowTracker(tracking_uri=None).tracking_uri == f"sqlite:///{tmp_path}/env.db"
    config_wins = f"sqlite:///{tmp_path}/cfg.db"
    assert MlflowTracker(tracking_uri=config_wins).tracking_uri == config_wins
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert MlflowTracker(tracking_uri=None).tracking_uri.endswith("/outputs/mlflow.db")
    assert MlflowTracker(tracking_uri="http://127.0.0.1:1", artifact_location="x").artifact_location is None  # the server decides


def test_a_shared_first_place_is_reported_as_a_tie(sweep) -> None:
    from grpo_pipe.tracking.comparison import best_child, best_label

    client, parent_id, _ = sweep
    children = read_children(client, parent_id)
    for child in children:
        child.last["eval/accuracy"] = 0.0  # as four bridges that all score 0 on a tiny model
    best = best_child(children)
    assert best is not None
    assert best_label(children, best) == "tie: " + ", ".join(c.label for c in children)
    assert best_label(children[:1], children[0]) == children[0].label


def test_a_finished_sweep_prints_its_answer_in_the_terminal_too(sweep, capsys) -> None:
    from omegaconf import OmegaConf

    from grpo_pipe.tracking.sweep_callback import EndSweepRun

    client, parent_id, sweep_dir = sweep
    config = OmegaConf.create({
        "logger": {"_target_": "grpo_pipe.tracking.mlflow_tracker.MlflowTracker", "tracking_uri": client.tracking_uri,
                   "experiment": "grpo_pipe"},
        "hydra": {"sweep": {"dir": str(sweep_dir)}},
    })
    EndSweepRun().on_multirun_end(config)
    printed = capsys.readouterr().out
    answer = client.get_run(parent_id).data.tags["grpo_pipe.verdict"]
    assert printed.startswith(f"Sweep finished: {answer}\n") and "margin unknown" in answer, printed
    assert printed.splitlines()[0].startswith("Sweep finished: weight_bridge=lora leads on eval/accuracy by 0.25")
    assert client.get_run(parent_id).info.status == "FINISHED"
