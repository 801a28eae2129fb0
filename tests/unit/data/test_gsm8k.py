import json

import pytest

from grpo_pipe.data.gsm8k import Gsm8kTasks
from tests.conftest import GSM8K_DIR


def test_bad_rows_are_skipped_counted_and_named(tmp_path) -> None:
    rows = [
        json.dumps({"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"}),
        "{not json",
        json.dumps({"question": "", "answer": "#### 1"}),
        json.dumps({"question": "No final answer?", "answer": "it is seven"}),
        json.dumps({"question": "x" * 100_000, "answer": "#### 2"}),
        json.dumps({"answer": "#### 3"}),
        json.dumps({"question": "Sum 1,000 and 200.", "answer": "#### 1,200"}),
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "test.jsonl").write_text(rows[0] + "\n")
    data = Gsm8kTasks(path=str(tmp_path))
    tasks = data.train_tasks()
    assert [t.answer for t in tasks] == ["7", "1200"]
    assert len(data.skipped) == 5
    joined = "\n".join(data.skipped.reasons)
    for line in (2, 3, 4, 5, 6):
        assert f"train.jsonl:{line}:" in joined
    assert "100000 chars" in joined


def test_a_folder_with_only_the_test_split_serves_it(tmp_path) -> None:
    (tmp_path / "test.jsonl").write_text('{"question": "1 + 1?", "answer": "#### 2"}\n')
    assert [t.answer for t in Gsm8kTasks(path=str(tmp_path)).eval_tasks()] == ["2"]  # train.jsonl is never opened


def test_real_gsm8k_test_split_loads_without_skips() -> None:
    data = Gsm8kTasks(path=str(GSM8K_DIR), max_eval=None)
    assert len(data.eval_tasks()) == 1319 and len(data.skipped) == 0


def test_real_gsm8k_splits_load_without_skips() -> None:
    if not (GSM8K_DIR / "train.jsonl").exists():
        pytest.skip(f"GSM8K train split not found in {GSM8K_DIR} (only the test split ships with the repo)")
    data = Gsm8kTasks(path=str(GSM8K_DIR), max_eval=None)
    assert len(data.train_tasks()) == 7473 and len(data.eval_tasks()) == 1319
    assert len(data.skipped) == 0
    assert not {t.question for t in data.train_tasks()} & {t.question for t in data.eval_tasks()}
