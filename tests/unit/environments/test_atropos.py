"""environment=atropos's source of training groups, against in-memory stand-ins for the API, the endpoint and the
processes: what each `take` keeps, drops as stale and refuses, with the ledger balanced; the engine is the
environments' only while the trainer waits. The real parts: tests/integration/environments/test_atropos_environment.py."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_pipe.environments.atropos import AtroposSource, suggested_settings
from grpo_pipe.environments.scored_groups import Limits
from grpo_pipe.serving.served_log import ServedLog
from grpo_pipe.types import Completion, RequestTelemetry

M = -100


class Api:
    report_every_s = 30.0

    def __init__(self, batches: list[list[dict[str, Any]]]) -> None:
        self.batches = batches

    def next_batch(self, timeout_s: float) -> list[dict[str, Any]]:
        return self.batches.pop(0)


class Endpoint:
    def __init__(self, served: ServedLog) -> None:
        self.served = served
        self.events: list[str] = []

    def pause(self) -> None:
        self.events.append("pause")

    def resume(self) -> None:
        self.events.append("resume")


class Processes:
    checks = 0

    def check(self) -> None:
        self.checks += 1


def _group(first: int) -> dict[str, Any]:
    return {"tokens": [[1, 2, first], [1, 2, first + 1]], "masks": [[M, M, first], [M, M, first + 1]],
            "scores": [1.0, 0.0]}


def test_each_take_keeps_fresh_groups_drops_stale_ones_and_refuses_foreign_ones() -> None:
    served = ServedLog()
    for first, version in ((10, 3), (20, 1), (30, 3)):
        for token in (first, first + 1):
            served.record((1, 2), Completion(token_ids=(token,), logprobs=(-0.5,), text="", finish_reason="stop",
                                             policy_version=version,
                                             telemetry=RequestTelemetry(prompt_tokens=2, generated_tokens=1,
                                                                        cached_prompt_tokens=0)), 1.0)
    foreign = _group(40)  # never served by the engine
    endpoint, processes = Endpoint(served), Processes()
    source = AtroposSource(api=Api([[_group(10), _group(20), foreign, _group(30)]]), endpoint=endpoint, processes=processes,  # type: ignore[arg-type]
                           limits=Limits(100, 16, temperature=1.0), max_staleness=1, timeout_s=60)
    taken = source.take(trainer_version=3)
    assert [g.completions[0].token_ids for g in taken.groups] == [(10,), (30,)] and taken.staleness == [0, 0]
    assert taken.dropped == [("atropos/2", 2)]  # sampled by version 1, two behind the trainer
    assert source.ledger.trained == 2 and source.ledger.dropped == {"refused": 1, "stale": 1}
    assert source.ledger.balanced() and source.ledger.submitted == 4
    assert endpoint.events == ["resume", "pause"] and processes.checks == 1  # the engine was theirs while it waited
    assert taken.groups[0].completions[0].episode is not None  # their scores, for reward=environment
    assert taken.groups[0].completions[0].episode.environment_reward == 1.0


def test_with_overlap_the_endpoint_stays_open_while_the_trainer_trains() -> None:
    """max_staleness >= 1 with an engine that serialises its calls on its own thread: after a take the environments go
    on sampling (no pause), so the next batch is being made while the trainer trains on this one."""
    served = ServedLog()
    for token in (10, 11, 20, 21):
        served.record((1, 2), Completion(token_ids=(token,), logprobs=(-0.5,), text="", finish_reason="stop", policy_version=0,
                                         telemetry=RequestTelemetry(prompt_tokens=2, generated_tokens=1,
                                                                    cached_prompt_tokens=0)), 1.0)
    endpoint = Endpoint(served)
    source = AtroposSource(api=Api([[_group(10)], [_group(20)]]), endpoint=endpoint, processes=Processes(),  # type: ignore[arg-type]
                           limits=Limits(100, 16, temperature=1.0), max_staleness=1, timeout_s=60, overlap=True)
    first, second = source.take(trainer_version=0), source.take(trainer_version=1)
    assert endpoint.events == ["resume", "resume"]  # never paused
    assert (first.staleness, second.staleness) == ([0], [1])  # a group a version behind is kept, as max_staleness says


def test_an_evaluation_cadence_atroposlib_would_never_fire_is_refused_before_anything_starts(tmp_path) -> None:
    from grpo_pipe.environments.atropos import AtroposEnvironment

    script = tmp_path / "env.py"
    script.write_text("")
    problems = AtroposEnvironment(environments=[[str(script), "serve"]], eval_every=1).config_problems()
    assert problems == ["eval_every=1: allowed 0 (the environments never evaluate), 2 or more (atroposlib never "
                        "evaluates at steps_per_eval=1), or null (each environment's own)"]
    assert AtroposEnvironment(environments=[[str(script), "serve"]], eval_every=2).config_problems() == []


@pytest.mark.parametrize(("max_staleness", "depth"), [(0, "1"), (1, "2"), (3, "4")])
def test_environments_sample_no_deeper_ahead_than_the_trainer_can_use(max_staleness: int, depth: str) -> None:
    assert suggested_settings(max_staleness) == {"env.max_batches_offpolicy": depth}


def test_a_number_or_a_flag_in_an_environments_command_is_passed_on_as_written(compose_cfg, tmp_path) -> None:
    from grpo_pipe.config.validate import validate_config
    from grpo_pipe.environments.atropos import AtroposEnvironment
    from grpo_pipe.runner.components import PLAIN_KEYS, VALIDATED_GROUPS

    script = tmp_path / "env.py"
    script.write_text("")
    cfg = compose_cfg(["environment=atropos", "reward=environment",
                       f"environment.environments=[[{script},serve,--env.max_new_tokens,64,--env.greedy,true,--env.t,0.5]]"])
    validate_config(cfg, VALIDATED_GROUPS, PLAIN_KEYS)  # raises ConfigError on "expected a string"
    environment = AtroposEnvironment(environments=cfg.environment.environments)
    assert environment.environments == [[str(script), "serve", "--env.max_new_tokens", "64", "--env.greedy", "true",
                                         "--env.t", "0.5"]]
    assert environment.config_problems() == []
