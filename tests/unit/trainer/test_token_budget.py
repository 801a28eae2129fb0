"""The packed pass's token budget from measured memory: the largest power of two that fits, within its bounds."""

from __future__ import annotations

import pytest
import torch

from grpo_pipe.trainer import token_budget
from grpo_pipe.trainer.token_budget import MemoryProbe, budget

GIB = 2**30


def _probe(free_gib: float, mib_per_token: float, fixed_gib: float = 2.0) -> MemoryProbe:
    return MemoryProbe(bytes_per_token=mib_per_token * 2**20, fixed_bytes=fixed_gib * GIB, allocated_bytes=2 * GIB,
                       available_bytes=free_gib * GIB, total_bytes=140 * GIB)


@pytest.mark.parametrize(("free_gib", "optimizer_gib", "expected"), [
    (135, 8, 32768),  # the 0.5B benchmark alone on an H200: 1.87 MiB a token, about 116 GiB of room
    (88, 8, 32768),   # beside a colocated engine holding 35% of the card: ~70 GiB of room still takes 32 k
    (60, 8, 16384),   # ~41 GiB of room
    (20, 8, 4096),    # less than the smallest budget's worth: the smallest, never zero
    (10_000, 8, 65536),  # a huge card: capped
])
def test_the_budget_is_the_largest_power_of_two_that_fits(free_gib: float, optimizer_gib: float, expected: int) -> None:
    measured = _probe(free_gib, 1.87)
    tokens = budget(measured, optimizer_gib * GIB)
    assert tokens == expected
    room = measured.available_bytes - optimizer_gib * GIB - measured.fixed_bytes - token_budget.MARGIN * measured.total_bytes
    assert tokens == token_budget.FEWEST_TOKENS or tokens * measured.bytes_per_token <= room


def test_the_optimizer_states_are_two_moments_per_trainable_weight() -> None:
    weights = [torch.nn.Parameter(torch.zeros(10, 4)), torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))]
    assert token_budget.optimizer_state_bytes(weights) == 2 * (40 * 4 + 3 * 2)


def test_describe_names_the_setting_and_the_figures() -> None:
    text = token_budget.describe(_probe(88, 1.87), 32768)
    assert text.startswith("32768 tokens per packed micro-batch") and "1.87 MiB a token" in text
    assert "88.0 GiB free of 140" in text and "trainer.batching.max_tokens" in text
