"""The correct episode the call-decision benchmark plays, and how it sums the model's choices up."""

from __future__ import annotations

import pytest

from grpo_pipe.benchmarks.call_decisions import Reading, correct_turns, summarize
from grpo_pipe.config.errors import InputError
from grpo_pipe.data.arithmetic import steps
from grpo_pipe.types import Task


def test_the_episode_runs_products_first_one_operation_a_call_then_answers() -> None:
    turns = correct_turns("Calculate 14 + 3 * 25 - 40.", "calculator")
    assert [t.text for t in turns] == ["<calculator>3 * 25</calculator>", "<calculator>14 + 75</calculator>",
                                       "<calculator>89 - 40</calculator>", "#### 49"]
    assert [t.left for t in turns] == [3, 2, 1, 0]
    assert all(t.answer.startswith("####") for t in turns)  # the other way at each point: answering now


def test_the_results_are_the_datas_own_steps() -> None:
    turns = correct_turns("Calculate 633 + 75 + 69 * 65 - 12.", "calculator")
    assert turns[-1].text == f"#### {steps([633, 75, 69, 65, 12], ['+', '+', '*', '-'])[-1]}"


def test_a_lead_in_restates_what_is_left_before_later_calls_and_if_asked_before_the_answer() -> None:
    plain_answer = correct_turns("Calculate 86 - 27 * 3.", "calculator", "Now {left}. ")
    assert [t.text for t in plain_answer] == ["<calculator>27 * 3</calculator>",
                                              "Now 86 - 81. <calculator>86 - 81</calculator>", "#### 5"]
    assert plain_answer[-1].call.startswith("Now 5. ")  # calling on would restate first, as the examples do
    restated = correct_turns("Calculate 86 - 27 * 3.", "calculator", "Now {left}. ", restate_answer=True)
    assert restated[-1].text == "Now 5. #### 5" and restated[1].answer == "Now 86 - 81. #### 86 - 81"


@pytest.mark.parametrize("question", ["Calculate 14 plus 3.", "What is 2 + 2?", "Calculate 14 + ."])
def test_a_task_that_is_not_arithmetic_is_named(question: str) -> None:
    with pytest.raises(InputError, match="call_decisions reads arithmetic tasks"):
        correct_turns(question, "calculator")


def test_the_summary_averages_by_length_and_by_operations_left() -> None:
    tasks = [Task(uid=f"t{i}", question="", answer="", metadata={"operations": ops}) for i, ops in enumerate([2, 2, 3])]
    prompts = [(1,), (2,), (3,)]
    readings = [Reading(prompt=(1,), left=1, share=0.2, mass=0.9), Reading(prompt=(2,), left=1, share=0.4, mass=0.7),
                Reading(prompt=(1,), left=0, share=0.1, mass=0.8), Reading(prompt=(3,), left=0, share=0.5, mass=1.0)]
    figures = summarize(tasks, prompts, readings)
    assert figures["terms_3"]["left_1"] == pytest.approx(0.3) and figures["terms_3"]["left_0"] == pytest.approx(0.1)
    assert figures["terms_3"]["mass"] == pytest.approx(0.8) and figures["terms_4"] == {"mass": 1.0, "left_0": 0.5}
