"""A whole run on a data file with broken rows and a prompt far longer than the engine can take:
it completes, and every row left out is counted and named."""

import json
import logging

from mlflow.tracking import MlflowClient

from grpo_pipe.pipeline import JobContext, run
from tests.conftest import GSM8K_DIR


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
    (data_dir / "test.jsonl").write_text("\n".join(good) + "\n")
    cfg = compose_cfg([
        "data=gsm8k", f"data.path={data_dir}", "data.max_question_chars=200000", "data.max_eval=3",
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
