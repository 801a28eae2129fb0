"""The optimisation step on a real tiny transformers model."""

import math

import pytest
import torch

from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.trainer.grpo import GRPOTrainer
from grpo_pipe.trainer.policy import FullFinetunePolicy
from grpo_pipe.types import Completion, RequestTelemetry, RolloutGroup, Task

TELEMETRY = RequestTelemetry(prompt_tokens=4, generated_tokens=3, cached_prompt_tokens=0)


def _groups() -> tuple[list[RolloutGroup], list[float]]:
    gen = torch.Generator().manual_seed(0)
    groups = []
    for g in range(3):
        prompt = tuple(torch.randint(10, 400, (4 + g,), generator=gen).tolist())
        completions = tuple(
            Completion(
                tuple(torch.randint(10, 400, (2 + (i % 3),), generator=gen).tolist()),
                tuple([-3.0] * (2 + (i % 3))),
                "", "stop", 0, TELEMETRY,
            )
            for i in range(4)
        )
        groups.append(RolloutGroup(Task(str(g), "q", "1"), prompt, completions))
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1.0, 0.0, 0.0, 0.0]  # group 2 carries no signal
    return groups, rewards


def _trained_weights(micro_batch_size: int, path) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    trainer = GRPOTrainer(FullFinetunePolicy(), steps=2, lr=1e-3, micro_batch_size=micro_batch_size, warmup_steps=0)
    trainer.setup(path, torch.device("cpu"), pad_id=0)
    groups, rewards = _groups()
    metrics = trainer.step(groups, rewards, temperature=1.0)
    assert metrics["train/active_samples"] == 8.0  # the 4 zero-advantage samples never ran
    assert metrics["train/samples"] == 12.0
    assert trainer.version == 1
    return {k: v.clone() for k, v in trainer.policy.module.state_dict().items()}


def test_micro_batching_gives_the_full_batch_update() -> None:
    path = TinyRandomModel().materialize()
    one = _trained_weights(1, path)
    full = _trained_weights(8, path)
    initial = FullFinetunePolicy()
    initial.load(path, torch.device("cpu"), torch.float32)
    start = initial.module.state_dict()
    changed = [k for k in one if not torch.equal(one[k], start[k])]
    assert changed, "the update changed nothing"
    # Summation order differs between 1 and 8 sequences per forward, and Adam's per-element m/sqrt(v)
    # magnifies that fp32 rounding where a gradient is near zero; 1% of one lr-sized step still
    # catches any normalisation mistake (those are off by whole steps).
    for key in one:
        torch.testing.assert_close(one[key], full[key], rtol=0, atol=1e-2 * 1e-3)


def test_non_finite_gradient_skips_the_update_and_stops_after_the_limit() -> None:
    path = TinyRandomModel().materialize()
    trainer = GRPOTrainer(FullFinetunePolicy(), steps=3, lr=1e-3, max_bad_steps=2)
    trainer.setup(path, torch.device("cpu"), pad_id=0)
    before = {k: v.clone() for k, v in trainer.policy.module.state_dict().items()}
    groups, _ = _groups()
    nan_rewards = [math.nan] + [0.0] * 11  # poisons every advantage in group 0
    metrics = trainer.step(groups, nan_rewards, temperature=1.0)
    assert metrics["train/update_applied"] == 0.0 and trainer.version == 0
    for key, value in trainer.policy.module.state_dict().items():
        assert torch.equal(value, before[key]), key
    with pytest.raises(FloatingPointError, match="max_bad_steps"):
        trainer.step(groups, nan_rewards, temperature=1.0)
