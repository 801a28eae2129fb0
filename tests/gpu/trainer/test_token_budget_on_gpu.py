"""On one GPU with `max_tokens: null`, the trainer measures its packed budget in set-up and trains with it."""

import pytest
import torch

from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.trainer.grpo import GRPOTrainer
from grpo_pipe.trainer.policy import FullFinetunePolicy
from grpo_pipe.trainer.token_budget import FEWEST_TOKENS, MOST_TOKENS
from tests.fakes import scored_groups


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the budget is measured on the card")
def test_the_measured_budget_is_a_power_of_two_within_bounds_and_the_step_trains() -> None:
    trainer = GRPOTrainer(policy=FullFinetunePolicy(), steps=2)
    trainer.setup(TinyRandomModel().materialize(), torch.device("cuda", 0), pad_id=0)
    tokens = trainer.max_tokens
    assert FEWEST_TOKENS <= tokens <= MOST_TOKENS and tokens & (tokens - 1) == 0
    groups, rewards = scored_groups()
    metrics = trainer.step(groups, rewards, temperature=1.0)
    assert metrics["train/update_applied"] == 1.0 and metrics["train/grad_norm"] > 0
