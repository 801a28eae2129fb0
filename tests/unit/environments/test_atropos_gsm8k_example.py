"""The Atropos GSM8K environment of examples/: its data reading and scoring (the GPU sweep of BENCHMARKS.md runs it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).parents[3] / "examples" / "atropos_gsm8k" / "gsm8k_server.py"
FIXTURE = Path(__file__).parents[2] / "fixtures" / "gsm8k" / "test.jsonl"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gsm8k_server", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_are_read_with_their_final_answers(example: ModuleType) -> None:
    rows = example.read_rows(FIXTURE)
    assert len(rows) == sum(1 for line in FIXTURE.read_text().splitlines() if line.strip())
    question, answer = rows[0]
    assert question and float(answer) == float(answer.replace(",", ""))


def test_a_row_without_a_final_answer_is_named_by_file_and_line(example: ModuleType, tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2 #### 2"}\n{"question": "2+2?", "answer": "four"}\n')
    with pytest.raises(ValueError, match=rf"{data}:2: no numeric final answer"):
        example.read_rows(data)


@pytest.mark.parametrize(("reply", "reference", "correct"), [
    ("3 apples and 4 more make 7.\n#### 7", "7", True),
    ("#### 1,234 dollars", "1234", True),
    ("#### 7.0", "7", True),
    ("The answer is 7", "7", False),       # no marker: not an answer in the asked format
    ("#### 6\n... wait\n#### 8", "8", True),  # the last marker counts
    ("#### eight", "8", False),
])
def test_a_reply_is_correct_when_its_number_after_the_marker_equals_the_reference(
        example: ModuleType, reply: str, reference: str, correct: bool) -> None:
    assert example.is_correct(reply, reference) is correct


@pytest.mark.parametrize(("reply", "expected"), [
    ("#### 7", 1.0),          # right: full marks whatever the format score
    ("#### 8", 0.25),         # wrong number in the asked format: the format score
    ("The answer is 7", 0.0),  # no marker: nothing, even though the number is right
])
def test_a_wrong_answer_in_the_asked_format_earns_the_format_score(
        example: ModuleType, reply: str, expected: float) -> None:
    assert example.score(reply, "7", format_score=0.25) == expected
    assert example.score(reply, "7", format_score=0.0) == float(expected == 1.0)


def test_the_environment_config_carries_its_own_settings(example: ModuleType) -> None:
    env_config, servers = example.Gsm8kServer.config_init()
    assert isinstance(env_config, example.Gsm8kConfig)
    assert env_config.data_dir and env_config.eval_rows == 64 and servers[0].server_type == "vllm"
    assert env_config.format_score == 0.0  # correctness only unless asked


def test_a_format_score_of_one_or_more_is_refused(example: ModuleType) -> None:
    # It would make a wrong answer worth as much as a right one.
    with pytest.raises(ValueError, match="format_score"):
        example.Gsm8kConfig(format_score=1.0)
