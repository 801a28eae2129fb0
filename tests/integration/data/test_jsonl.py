"""data=jsonl: column mapping, chat prompts, metadata on each task, bad rows counted, the split, config checks."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from grpo_pipe.data.jsonl import JsonlTasks


def _write(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_columns_are_mapped_and_metadata_travels_with_each_task(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.jsonl", [
        {"q": "What is 2+3?", "solution": "2+3 is 5 #### 5", "level": 1, "source": "hand"},
        {"q": "What is 4*4?", "solution": "#### 16", "level": 2, "source": "hand"},
    ])
    data = JsonlTasks(train_path=str(train), prompt_key="q", answer_key="solution", answer_after="####", eval_fraction=0.0)
    tasks = data.train_tasks()
    assert [(t.question, t.answer) for t in tasks] == [("What is 2+3?", "5"), ("What is 4*4?", "16")]
    assert [dict(t.metadata) for t in tasks] == [{"level": 1, "source": "hand"}, {"level": 2, "source": "hand"}]
    assert tasks[0].uid == "train.jsonl:1" and data.eval_tasks() == []
    only_level = JsonlTasks(train_path=str(train), prompt_key="q", answer_key="solution", metadata_keys=["level"],
                            eval_fraction=0.0)
    assert [dict(t.metadata) for t in only_level.train_tasks()] == [{"level": 1}, {"level": 2}]


def test_bad_rows_are_skipped_counted_and_named(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.jsonl", [
        {"prompt": "good", "answer": "1"},
        "{not json",
        "[1, 2]",
        {"prompt": "", "answer": "2"},
        {"prompt": "no answer"},
        {"prompt": {"not": "text"}, "answer": "3"},
        {"prompt": "x" * 50, "answer": "4"},
        {"prompt": "also good", "answer": 5},
    ])
    data = JsonlTasks(train_path=str(train), eval_fraction=0.0, max_prompt_chars=40)
    assert [t.answer for t in data.train_tasks()] == ["1", "5"]
    assert len(data.skipped) == 6
    joined = "\n".join(data.skipped.reasons)
    for line in range(2, 8):
        assert f"train.jsonl:{line}:" in joined


def test_chat_messages_prompts(tmp_path: Path) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    train = _write(tmp_path / "train.jsonl", [{"prompt": messages, "answer": "red"}])
    task = JsonlTasks(train_path=str(train), eval_fraction=0.0).train_tasks()[0]
    assert task.messages == tuple(messages) and task.question == "Name a colour."


def test_held_out_fraction_is_seeded_and_disjoint(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)])
    first, again, other = (JsonlTasks(train_path=str(train), eval_fraction=0.25, seed=s) for s in (1, 1, 2))
    held = {t.uid for t in first.eval_tasks()}
    assert len(held) == 5 and held == {t.uid for t in again.eval_tasks()} and held != {t.uid for t in other.eval_tasks()}
    assert held.isdisjoint(t.uid for t in first.train_tasks()) and len(first.train_tasks()) == 15


def test_eval_file_and_parquet(tmp_path: Path) -> None:
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": ["1", "2"], "tag": ["x", "y"]}), tmp_path / "t.parquet")
    evals = _write(tmp_path / "eval.jsonl", [{"prompt": "c", "answer": "3", "tag": "z"}])
    data = JsonlTasks(train_path=str(tmp_path / "t.parquet"), eval_path=str(evals))
    assert data.config_problems() == []
    assert [t.metadata["tag"] for t in data.train_tasks()] == ["x", "y"]
    assert [t.answer for t in data.eval_tasks()] == ["3"]


def test_config_problems_name_the_key_the_value_and_what_is_allowed(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.jsonl", [{"question": "q", "answer": "1"}])
    nowhere = JsonlTasks(train_path=str(tmp_path / "nope.jsonl"))
    assert nowhere.config_problems() == [f"train_path='{tmp_path}/nope.jsonl': no such file"]
    (missing,) = JsonlTasks(train_path=str(train)).config_problems()
    assert missing == "prompt_key='prompt': no such column in train.jsonl; columns: answer, question"
    (bad_meta,) = JsonlTasks(train_path=str(train), prompt_key="question", metadata_keys=["level"]).config_problems()
    assert bad_meta.startswith("metadata_keys='level': no such column")
    (suffix,) = JsonlTasks(train_path=str(train), prompt_key="question", eval_path=str(tmp_path / "x.csv")).config_problems()
    assert suffix.startswith("eval_path=") and "no such file" in suffix
    (fraction,) = JsonlTasks(train_path=str(train), prompt_key="question", eval_fraction=1.5).config_problems()
    assert fraction == "eval_fraction=1.5: allowed 0 <= eval_fraction < 1"
