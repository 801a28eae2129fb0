"""The endpoint's record of what the engine served: found by exactly its prompt and completion, forgotten oldest first."""

from grpo_pipe.serving.served_log import ServedLog
from grpo_pipe.types import Completion, RequestTelemetry


def _completion(ids: tuple[int, ...], version: int = 0) -> Completion:
    return Completion(token_ids=ids, logprobs=tuple(-0.1 * (i + 1) for i in range(len(ids))), text="", finish_reason="stop",
                      policy_version=version, telemetry=RequestTelemetry(prompt_tokens=0, generated_tokens=0,
                                                                         cached_prompt_tokens=0))


def test_a_completion_is_found_only_after_exactly_its_prompt() -> None:
    log = ServedLog()
    log.record((1, 2, 3), _completion((4, 5), version=2))
    found = log.find((1, 2, 3), (4, 5))
    assert found is not None and found.policy_version == 2 and found.logprobs == (-0.1, -0.2)
    assert log.find((1, 2), (3, 4, 5)) is None  # the same tokens, split elsewhere: not what was served
    assert log.find((1, 2, 3), (4,)) is None


def test_the_oldest_records_are_forgotten_past_capacity() -> None:
    log = ServedLog(capacity=2)
    for i in range(3):
        log.record((i,), _completion((9,)))
    assert len(log) == 2 and log.find((0,), (9,)) is None and log.find((2,), (9,)) is not None
