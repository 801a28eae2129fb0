"""The trainer's memory figures are read on the trainer's card, not on the process's current one (an engine's)."""

import pytest
import torch

from grpo_pipe.trainer.memory import memory_metrics


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs: the current one and the trainer's")
def test_memory_is_read_on_the_named_card_while_another_is_current() -> None:
    """placement=split puts the trainer on a card no replica took, while the process's current device stays the
    first, an engine's: the figures once read that card's (122 GiB, the engine's reservation)."""
    trainer_card = torch.device("cuda", 1)
    torch.cuda.set_device(0)  # the runner's process: the first card current
    memory_metrics(trainer_card)  # resets the peak
    held = torch.empty(2**30, dtype=torch.uint8, device=trainer_card)  # 1 GiB on the trainer's card only
    got = memory_metrics(trainer_card)
    assert got["memory/trainer_peak_gib"] >= 1.0 and got["memory/device_used_gib"] >= 1.0
    assert memory_metrics(torch.device("cuda", 0))["memory/trainer_peak_gib"] < 0.5  # nothing of it on card 0
    del held
