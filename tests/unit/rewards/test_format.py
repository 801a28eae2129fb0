"""The plain format rewards: what counts as a reply that ends with its answer."""

from __future__ import annotations

from grpo_pipe.rewards.format import answer_ends_the_reply, ends_with_marked_answer


def test_an_answer_at_the_end_of_the_reply_ends_it() -> None:
    replies = ["#### 49", "Adding them up.\n#### -1,250.5\n", "#### 7  ", "Now 49. #### 49"]
    assert answer_ends_the_reply(replies) == [1.0, 1.0, 1.0, 1.0]


def test_text_after_the_number_or_no_number_does_not_end_the_reply() -> None:
    replies = ["#### 30500Vanacos</tool_response>Always", "#### 1104 + 675", "#### 12\nmore text", "the answer is 12",
               "#### x", ""]
    assert answer_ends_the_reply(replies) == [0.0] * 6
    assert ends_with_marked_answer(replies[:2]) == [1.0, 1.0]  # the looser check takes both: why the strict one exists


def test_an_episode_is_judged_by_its_last_assistant_turn() -> None:
    episode = [{"role": "assistant", "content": "<calculator>3 * 25</calculator>"},
               {"role": "tool", "content": "75", "name": "calculator"},
               {"role": "assistant", "content": "#### 75"}]
    runs_on = [*episode[:2], {"role": "assistant", "content": "#### 75 then"}]
    assert answer_ends_the_reply([episode, runs_on, [{"role": "tool", "content": "75"}]]) == [1.0, 0.0, 0.0]
