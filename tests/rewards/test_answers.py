import json

import pytest

from grpo_pipe.data.gsm8k import gold_final_answer
from grpo_pipe.rewards.answers import extract_answer, is_correct, parse_number
from tests.conftest import GSM8K_DIR


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so she has 5 left.\n#### 72", "72"),
        ("The answer is \\boxed{1,200}.", "1,200"),
        ("Therefore the answer is $18.", "$18"),
        ("Final answer: 3.50 dollars", "3.50"),
        ("I think 4 apples plus 3 apples makes 7 apples", "7"),
        ("#### 5 ... wait, #### 6", "6"),
        ("no digits here", None),
        ("The answer is: **-12**", "-12"),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_numeric_equivalence_handles_commas_units_and_forms() -> None:
    assert parse_number("1,200") == parse_number("1200.0")
    assert is_correct("It costs $1,200.", "1200") is True
    assert is_correct("#### 0.5", "1/2") is True
    assert is_correct("#### 7", "8") is False
    assert is_correct("I don't know", "8") is None


def _gsm8k_test_rows() -> list[dict[str, str]]:
    path = GSM8K_DIR / "test.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_every_gsm8k_gold_solution_scores_correct_and_a_perturbed_answer_wrong() -> None:
    rows = _gsm8k_test_rows()
    assert len(rows) == 1319
    for row in rows:
        gold = gold_final_answer(row["answer"])
        assert gold is not None, row["answer"]
        assert is_correct(row["answer"], gold) is True, row["answer"]
        reasoning, final = row["answer"].rsplit("####", 1)
        perturbed = f"{reasoning}#### {parse_number(final.strip().replace(',', '')) + 1}"
        assert is_correct(perturbed, gold) is False, perturbed
