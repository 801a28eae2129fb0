"""A whole run on a data file with broken rows and a prompt far longer than the engine can take: with
`data.max_bad_fraction` allowing them it completes, and every row left out is counted and named; by default a
broken row is an error naming file and line, raised before any model loads."""

import json
import logging
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from grpo_pipe.runner.pipeline import JobContext, run
from tests.conftest import GSM8K_DIR, REPO, TINY


def test_a_run_on_bad_rows_completes_and_counts_every_skip(compose_cfg, tmp_path, caplog) -> None:
    good = (GSM8K_DIR / "test.jsonl").read_text().splitlines()[:3]
    rows = [
        *good,
        "{not json",
        json.dumps({"question": "What is 2 + 2?", "answer": ""}),  # empty answer: nothing to score against
        json.dumps({"answer": "#### 3"}),  # no question
        json.dumps({"question": "Add these: " + " + ".join(["1"] * 25_000), "answer": "#### 25000"}),  # 100k chars
    ]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "train.jsonl").write_text("\n".join(rows) + "\n")
    (data_dir / "test.jsonl").write_text("\n".join(good[:2]) + "\n")  # fewer than run.eval_size: a warning says so
    cfg = compose_cfg([
        "data=gsm8k", f"data.path={data_dir}", "data.max_question_chars=200000", "data.max_eval=3",
        "data.max_bad_fraction=0.34",  # 3 broken rows of 9: allowed to be skipped and counted
        "trainer.steps=2", "curriculum.prompts_per_step=4", "run.eval_size=3",
    ])
    with caplog.at_level(logging.WARNING):
        result = run(cfg, JobContext(output_dir=tmp_path / "run", run_name="bad-input"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    mlrun = client.get_run(result.run_id)
    assert mlrun.info.status == "FINISHED" and len(result.rewards) == 2
    assert mlrun.data.metrics["data/skipped_rows"] == 3.0  # unparsable, empty answer, no question
    for line in (4, 5, 6):
        assert f"train.jsonl:{line}" in caplog.text
    too_long = {k: v for k, v in result.ledger.dropped.items() if k.startswith("prompt longer than")}
    # 4 usable tasks, 4 per step: each step is one pass and meets the 100k-char question once, skips it,
    # and trains on the other 3 (the long question never reaches the engine).
    assert sum(too_long.values()) == 2
    assert "skipped, prompt longer than" in caplog.text and "train.jsonl:7 (" in caplog.text
    assert result.ledger.balanced() and result.ledger.trained == 2 * 3
    assert "The held-out split has 2 tasks, fewer than run.eval_size=3" in caplog.text




def _bad_data(tmp_path):
    good = (GSM8K_DIR / "test.jsonl").read_text().splitlines()[:3]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "train.jsonl").write_text("\n".join([*good, "{not json", *good]) + "\n")
    (data_dir / "test.jsonl").write_text("\n".join(good[:2]) + "\n")
    return data_dir


def test_by_default_a_broken_row_is_an_error_naming_file_and_line(tmp_path) -> None:
    """From outside, as a user meets it: one block in the config-error format, in seconds, no model loaded; no
    tracked run and no output folder are left behind."""
    store = tmp_path / "mlflow.db"
    command = [sys.executable, "-m", "grpo_pipe", *TINY, "data=gsm8k", f"data.path={_bad_data(tmp_path)}",
               f"logger.tracking_uri=sqlite:///{store}", f"logger.artifact_location={tmp_path}/artifacts",
               f"hydra.run.dir={tmp_path}/run"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    flat = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, flat[-2000:]
    assert not (tmp_path / "run").exists()
    assert not store.exists() or not MlflowClient(f"sqlite:///{store}").search_runs(
        [e.experiment_id for e in MlflowClient(f"sqlite:///{store}").search_experiments()])
    assert "data: 1 of 9 rows cannot be used (gsm8k/train.jsonl:4: unparsable row" in flat, flat[-2000:]
    assert "data.max_bad_fraction (now 0.0, needed >= 0.111)" in flat
    assert "Loading weights" not in flat and "vLLM engine up" not in flat


def test_a_misspelt_key_gets_the_nearest_allowed_names_not_hydras_append_advice(tmp_path) -> None:
    command = [sys.executable, "-m", "grpo_pipe", "trainer.lrr=1", "run.tempreature=0.5", "data=jsonl",
               "data.train_path=tasks.jsonl", f"hydra.run.dir={tmp_path}/run"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "trainer.lrr: unknown key; nearest: trainer.optimisation.lr; allowed under trainer:" in out
    assert "run.tempreature: unknown key; nearest: run.temperature;" in out
    assert "data.train_path: unknown key" not in out  # a key of the chosen option (data=jsonl) is known...
    assert "data.train_path='tasks.jsonl'" in out  # ...and its file, missing, is named in the same block
    assert "To append to your config use" not in out and "Traceback" not in out


def test_an_unwritable_mlflow_store_is_named_before_anything_loads(tmp_path) -> None:
    command = [sys.executable, "-m", "grpo_pipe", *TINY, "logger.tracking_uri=sqlite:////proc/no-such/mlflow.db",
               f"hydra.run.dir={tmp_path}/run"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    flat = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, flat[-2000:]
    assert "logger.tracking_uri=sqlite:////proc/no-such/" in flat  # the console may wrap the long value
    assert "cannot create /proc/no-such (No such file or directory); allowed: a folder this user can write" in flat
    assert "Traceback" not in flat and "Loading weights" not in flat


def test_an_empty_train_split_is_named_with_the_other_data_problems(compose_cfg) -> None:
    from grpo_pipe.config.errors import ConfigError
    from grpo_pipe.runner.components import build
    from grpo_pipe.runner.data_checks import check_data_and_reward

    parts = build(compose_cfg([]))
    with pytest.raises(ConfigError, match="data: the train split is empty"):
        check_data_and_reward(parts, [], list(parts.data.eval_tasks()))
