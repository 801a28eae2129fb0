"""Micro-batches whose prompts differ in length train with finite gradients on a GPU.

With left-padded prompts, a pad's query attended to no key; on an H200 (random-init Qwen2.5-0.5B, fp32 masters under
bf16 autocast, compiled layers, 16 sequences per micro-batch) this batch's gradients were NaN in every tensor at steps
1, 3 and 4 while the loss stayed finite, on the first card or the second alike, with math attention as well; with
every prompt of one length they were finite. `collate` now fills a short prompt with masked repeats of its last token,
so every query sees a key (tests/unit/trainer/test_collate.py checks the layout on a CPU)."""

import random

import pytest
import torch

from grpo_pipe.models.random_architecture import benchmark_model
from grpo_pipe.trainer.grpo import GRPOTrainer
from grpo_pipe.trainer.policy import FullFinetunePolicy
from grpo_pipe.trainer.settings import BatchingSettings
from grpo_pipe.types import Completion, RolloutGroup, Task
from tests.fakes import TELEMETRY

STEPS, GROUPS, SAMPLES, COMPLETION_TOKENS = 4, 16, 8, 256


def _batch(step: int, vocab: int, rng: random.Random, gen: torch.Generator) -> tuple[list[RolloutGroup], list[float]]:
    """GSM8K-like prompt lengths (60-200 tokens), full-length completions of random tokens (what a random-init
    model samples); one rewarded sample at step 1, none after (the steps that failed had no signal either)."""
    groups, rewards = [], []
    for g in range(GROUPS):
        prompt = tuple(torch.randint(10, 2000, (rng.randint(60, 200),), generator=gen).tolist())
        completions = tuple(
            Completion(token_ids=tuple(torch.randint(10, vocab, (COMPLETION_TOKENS,), generator=gen).tolist()),
                       logprobs=tuple((-11.93 + 0.05 * torch.randn(COMPLETION_TOKENS, generator=gen)).tolist()),
                       text="", finish_reason="length", policy_version=0, telemetry=TELEMETRY)
            for _ in range(SAMPLES)
        )
        groups.append(RolloutGroup(Task(uid=str(g), question="q", answer="1"), prompt, completions))
        rewards += [1.0 if (step == 1 and g == 0 and i == 0) else 0.0 for i in range(SAMPLES)]
    return groups, rewards


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the NaN came from its attention kernels")
def test_prompts_of_different_lengths_give_finite_gradients_with_compiled_layers() -> None:
    trainer = GRPOTrainer(policy=FullFinetunePolicy(), steps=STEPS + 1,
                          batching=BatchingSettings(skip_zero_advantage=False, micro_batch_size=16))
    trainer.setup(benchmark_model("qwen2.5-0.5b"), torch.device("cuda", 0), pad_id=0)
    assert trainer.policy.module is not None
    vocab = trainer.policy.module.config.vocab_size
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    for step in range(1, STEPS + 1):
        groups, rewards = _batch(step, vocab, rng, gen)
        metrics = trainer.step(groups, rewards, temperature=1.0)
        assert metrics["train/update_applied"] == 1.0, f"step {step}: non-finite gradient"
        assert (metrics["train/grad_norm"] > 0) == (step == 1), step  # zero advantages: exactly zero gradient
