"""Atropos's scored groups read as our groups: the shared prompt, the trained spans checked against what the engine
served (their log-probs and versions taken from its record), and every malformed group refused with its reason."""

from __future__ import annotations

import math
from typing import Any

import pytest

from grpo_pipe.environments.scored_groups import Limits, RefusedGroup, read_scored_group
from grpo_pipe.rewards.environment import EnvironmentReward
from grpo_pipe.serving.served_log import ServedLog
from grpo_pipe.types import Completion, RequestTelemetry

LIMITS = Limits(vocab_size=100, max_model_len=16)
M = -100  # not trained


def _served(prompt: tuple[int, ...], ids: tuple[int, ...], version: int, log: ServedLog) -> None:
    log.record(prompt, Completion(token_ids=ids, logprobs=tuple(-0.5 - i for i in range(len(ids))), text="", finish_reason="stop",
                                  policy_version=version,
                                  telemetry=RequestTelemetry(prompt_tokens=0, generated_tokens=0, cached_prompt_tokens=0)))


def _log() -> ServedLog:
    log = ServedLog()
    _served((1, 2, 3), (10, 11), 4, log)
    _served((1, 2, 3), (12,), 5, log)
    _served((1, 2, 3, 12, 50, 51), (13, 14), 6, log)  # a second turn after the environment's tokens 50 51
    return log


def _group(**changes: Any) -> dict[str, Any]:
    data = {"tokens": [[1, 2, 3, 10, 11], [1, 2, 3, 12, 50, 51, 13, 14]],
            "masks": [[M, M, M, 10, 11], [M, M, M, 12, M, M, 13, 14]], "scores": [1.0, 0.0]}
    return {**data, **changes}


def test_a_scored_group_reads_as_our_group_with_the_engines_logprobs_and_versions() -> None:
    scored = read_scored_group(_group(), LIMITS, _log(), "atropos/0")
    group = scored.group
    assert group.prompt_token_ids == (1, 2, 3) and scored.scores == (1.0, 0.0)
    single, episode = group.completions
    assert single.token_ids == (10, 11) and single.logprobs == (-0.5, -1.5) and single.policy_version == 4
    assert episode.token_ids == (12, 50, 51, 13, 14)
    assert episode.sampled_by_model == (True, False, False, True, True)  # the environment's tokens are masked
    assert episode.logprobs == (-0.5, 0.0, 0.0, -0.5, -1.5)
    assert episode.policy_version == 5 and episode.version_switches == ((3, 6),)  # the second turn: a newer policy
    assert episode.episode is not None and episode.episode.model_turns == 2 and episode.episode.environment_tokens == 2
    assert EnvironmentReward()([group]).values == [1.0, 0.0]  # reward=environment trains on the environment's scores


@pytest.mark.parametrize(("changes", "says"), [
    ({"tokens": [], "masks": [], "scores": []}, "empty group"),
    ({"scores": [1.0]}, "must agree"),
    ({"scores": [1.0, math.nan]}, "not finite"),
    ({"scores": [math.inf, 0.0]}, "not finite"),
    ({"tokens": [[1, 2, 3, 10, 11], [1, 2, 3, 12, 50, 51, 13]]}, "8 mask entries"),
    ({"tokens": [[1, 2, 3, 10, 11], [1, 2, 3, 12, 500, 51, 13, 14]]}, "outside the vocabulary"),
    ({"tokens": [[1] * 17, [1, 2]], "masks": [[M] * 16 + [1], [M, 2]]}, "more than the model's 16"),
    ({"masks": [[M, M, M, 10, 99], [M, M, M, 12, M, M, 13, 14]]}, "neither -100 nor the token"),
    ({"masks": [[M] * 5, [M, M, M, 12, M, M, 13, 14]]}, "nothing to train"),
    ({"tokens": [[1, 2, 3, 10, 12], [1, 2, 3, 12, 50, 51, 13, 14]],
      "masks": [[M, M, M, 10, 12], [M, M, M, 12, M, M, 13, 14]]}, "not a completion the engine served"),
])
def test_a_malformed_or_foreign_group_is_refused_with_its_reason(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(RefusedGroup, match=says):
        read_scored_group(_group(**changes), LIMITS, _log(), "atropos/0")


def test_a_span_sampled_at_another_temperature_than_the_runs_is_refused() -> None:
    log = ServedLog()
    log.record((1, 2, 3), Completion(token_ids=(10, 11), logprobs=(-0.5, -1.5), text="", finish_reason="stop", policy_version=4,
                                     telemetry=RequestTelemetry(prompt_tokens=0, generated_tokens=0,
                                                                cached_prompt_tokens=0)), temperature=0.7)
    data = {"tokens": [[1, 2, 3, 10, 11]], "masks": [[M, M, M, 10, 11]], "scores": [1.0]}
    assert read_scored_group(data, Limits(100, 16, temperature=0.7), log, "a/0").scores == (1.0,)
    with pytest.raises(RefusedGroup, match="sampled at temperature 0.7, the run trains at 1.0"):
        read_scored_group(data, Limits(100, 16, temperature=1.0), log, "a/0")
