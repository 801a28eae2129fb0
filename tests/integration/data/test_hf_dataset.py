"""data=hf from local folders (offline): a `save_to_disk` dataset and a folder of JSONL files."""

import json
from pathlib import Path

import datasets

from grpo_pipe.data.hf_dataset import HfDatasetTasks


def test_saved_dataset_folder_with_splits_and_metadata(tmp_path: Path) -> None:
    rows = {"question": ["2+2?", "3+3?", "4+4?"], "answer": ["4", "6", "8"], "level": [1, 2, 3]}
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict(rows),
        "validation": datasets.Dataset.from_dict({k: v[:1] for k, v in rows.items()}),
    }).save_to_disk(tmp_path / "ds")
    data = HfDatasetTasks(name=str(tmp_path / "ds"), prompt_key="question", eval_split="validation")
    assert data.config_problems() == []
    assert [(t.question, t.answer, t.metadata["level"]) for t in data.train_tasks()] == [
        ("2+2?", "4", 1), ("3+3?", "6", 2), ("4+4?", "8", 3)
    ]
    assert [t.answer for t in data.eval_tasks()] == ["4"]


def test_folder_of_jsonl_files_split_by_file_name_and_held_out_fraction(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    lines = [json.dumps({"prompt": f"q{i}", "answer": str(i)}) for i in range(10)]
    lines.append(json.dumps({"prompt": "no answer", "answer": None}))
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    data = HfDatasetTasks(name=str(folder), eval_split=None, eval_fraction=0.2, seed=3)
    assert data.config_problems() == []
    assert len(data.train_tasks()) == 8 and len(data.eval_tasks()) == 2 and len(data.skipped) == 1


def test_config_problems(tmp_path: Path) -> None:
    datasets.Dataset.from_dict({"question": ["q"], "answer": ["1"]}).save_to_disk(tmp_path / "one")
    assert HfDatasetTasks(name=str(tmp_path / "nope")).config_problems() == [
        f"name='{tmp_path}/nope': no such folder (allowed: a local dataset folder or a hub id 'org/name')"
    ]
    problems = HfDatasetTasks(name=str(tmp_path / "one"), eval_split="test").config_problems()
    assert problems == [
        f"prompt_key='prompt': no such column in {tmp_path / 'one'} [train]; columns: answer, question",
        "eval_split='test': no such split in " + str(tmp_path / "one") + "; splits: train",
    ]
