"""The single-device trainer makes its card the process's current device (placement=split: not the first one)."""

import pytest
import torch

from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.trainer.grpo import GRPOTrainer
from grpo_pipe.trainer.policy import FullFinetunePolicy
from grpo_pipe.trainer.settings import BatchingSettings
from tests.fakes import scored_groups


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs: the first one and the trainer's")
def test_a_trainer_on_the_second_card_trains_there_with_finite_gradients_after_updates() -> None:
    """fp32 masters under bf16 autocast on the second card, the first one current as in a placement=split run: the
    trainer makes its card current and its gradients stay finite and exact (three steps, the last two with every
    advantage zero: their gradient is exactly zero). Passed on two H200. The placement=split job's NaN gradients lay
    elsewhere: in left-padded micro-batches, on either card alike (test_padding_on_gpu.py)."""
    torch.cuda.set_device(0)
    trainer = GRPOTrainer(policy=FullFinetunePolicy(), steps=4, batching=BatchingSettings(skip_zero_advantage=False))
    trainer.setup(TinyRandomModel().materialize(), torch.device("cuda", 1), pad_id=0)
    assert torch.cuda.current_device() == 1
    groups, rewards = scored_groups()
    first = trainer.step(groups, rewards, temperature=1.0)
    assert first["train/update_applied"] == 1.0 and first["train/grad_norm"] > 0
    for _ in range(2):
        flat = trainer.step(groups, [0.0] * len(rewards), temperature=1.0)
        assert flat["train/grad_norm"] == 0.0 and flat["train/update_applied"] == 1.0
