"""The verifiers worker's own logic (it runs under the verifiers environment's Python, but these parts need neither
verifiers nor the run): a task's rollouts become Atropos scored groups that `read_scored_group` accepts, with the
rubric's rewards as scores; the environment's config is the taskset plus the user's args over the defaults."""

from __future__ import annotations

import math

import pytest

from grpo_pipe.environments.scored_groups import Limits, read_scored_group
from grpo_pipe.environments.verifiers_worker import environment_config, parse, scored_groups
from grpo_pipe.serving.served_log import ServedLog
from grpo_pipe.types import Completion, RequestTelemetry

M = -100


def _served(log: ServedLog, prompt: list[int], completion: list[int], version: int = 4) -> None:
    log.record(prompt, Completion(token_ids=tuple(completion), logprobs=(-0.25,) * len(completion), text="", finish_reason="stop",
                                  policy_version=version,
                                  telemetry=RequestTelemetry(prompt_tokens=len(prompt), generated_tokens=len(completion),
                                                             cached_prompt_tokens=0)), 1.0)


def test_each_rollouts_branch_becomes_one_sequence_masked_where_the_model_did_not_sample() -> None:
    rollouts = [[([1, 2, 7, 8], [False, False, True, True])], [([1, 2, 9], [False, False, True])]]
    groups, left_out = scored_groups(rollouts, [2.0, 0.5], env_id=3)
    assert left_out == 0
    assert groups == [{"tokens": [[1, 2, 7, 8], [1, 2, 9]], "masks": [[M, M, 7, 8], [M, M, 9]], "scores": [2.0, 0.5],
                       "env_id": 3}]
    served = ServedLog()
    _served(served, [1, 2], [7, 8])
    _served(served, [1, 2], [9])
    scored = read_scored_group(groups[0], Limits(16, 32, 1.0), served, "verifiers/0")
    assert scored.scores == (2.0, 0.5)  # the rubric's rewards, as the trainer's environment_reward
    assert [c.episode.environment_reward for c in scored.group.completions] == [2.0, 0.5]  # type: ignore[union-attr]
    assert [c.logprobs for c in scored.group.completions] == [(-0.25, -0.25), (-0.25,)]


def test_turn_k_of_every_rollout_forms_group_k_and_turns_not_all_reached_are_left_out() -> None:
    """The default renderer gives a branch per model turn: each is a sequence of its own, scored with its rollout."""
    one = [([1, 5], [False, True]), ([1, 5, 2, 6], [False, False, False, True]), ([9, 9], [False, True])]
    two = [([1, 7], [False, True]), ([1, 7, 2, 8], [False, False, False, True])]
    groups, left_out = scored_groups([one, two], [1.0, 0.0], env_id=None)
    assert left_out == 1
    assert [g["tokens"] for g in groups] == [[[1, 5], [1, 7]], [[1, 5, 2, 6], [1, 7, 2, 8]]]
    assert [g["scores"] for g in groups] == [[1.0, 0.0], [1.0, 0.0]]


def test_a_bridged_episode_is_one_sequence_with_every_model_turn_trained_and_the_environments_masked() -> None:
    bridged = [([1, 5, 6, 2, 3, 7], [False, True, True, False, False, True])]
    groups, _ = scored_groups([bridged, bridged], [1.0, 1.0], env_id=0)
    assert groups[0]["masks"][0] == [M, 5, 6, M, M, 7]


def test_a_rubric_reward_that_is_not_a_finite_number_is_never_posted() -> None:
    with pytest.raises(ValueError, match="not all finite numbers"):
        scored_groups([[([1, 5], [False, True])], [([1, 6], [False, True])]], [1.0, math.nan], env_id=0)


def test_the_environment_config_is_the_taskset_and_the_args_over_an_in_process_runtime() -> None:
    config = environment_config("my_tasks", {"agent": {"harness": {"id": "h", "turns": 2}}})
    assert config == {"taskset": {"id": "my_tasks"},
                      "agent": {"runtime": {"type": "subprocess"}, "harness": {"id": "h", "turns": 2}}}
    assert environment_config("t", {"agent": {"runtime": {"type": "docker"}}})["agent"]["runtime"] == {"type": "docker"}


def test_the_worker_reads_the_flags_the_run_passes_and_ignores_the_others() -> None:
    options = parse(["--vf.name=t", "--vf.args={}", "--env.rollout_server_url=http://a", "--env.tokenizer_name=/m",
                     "--env.group_size=4", "--openai.base_url=http://e/v1", "--openai.api_key=k",
                     "--openai.model_name=grpo_pipe", "--openai.server_type=vllm", "--env.use_wandb=false",
                     "--vf.temperature=0.7", "--vf.max_tokens=16", '--vf.renderer={"name": "qwen3"}'])
    assert (options.name, options.group_size, options.api_key, options.temperature, options.max_tokens) == \
        ("t", 4, "k", 0.7, 16)
    assert options.renderer == '{"name": "qwen3"}'  # verifiers' TrainClientConfig.renderer; unset: the default


def test_the_worker_takes_the_token_from_the_config_file_the_run_writes(tmp_path) -> None:
    config = tmp_path / "environment-0.config.json"
    config.write_text('{"openai": {"api_key": "s3cret"}}')
    options = parse(["--vf.name=t", "--env.rollout_server_url=http://a", "--env.tokenizer_name=/m",
                     "--openai.base_url=http://e/v1", "--openai.model_name=grpo_pipe", f"--config={config}"])
    assert options.api_key == "s3cret"
