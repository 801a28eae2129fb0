"""An episode's environment tokens (tool results, the template's glue) are context only: exactly zero gradient, no
place in the loss's normaliser, whatever their sampling log-probs or the advantage."""

from __future__ import annotations

import torch

from grpo_pipe.trainer.batch import collate, completion_logprobs, flatten
from grpo_pipe.trainer.loss import GRPOLoss
from grpo_pipe.types import Completion, RequestTelemetry, RolloutGroup, Task

TELEMETRY = RequestTelemetry(prompt_tokens=3, generated_tokens=4, cached_prompt_tokens=0)
MASK = (True, True, False, False, False, True)  # model turn, environment block, model turn


def _episode(advantage_sign: float) -> Completion:
    return Completion(token_ids=(5, 6, 7, 8, 9, 10), logprobs=(-1.0, -2.0, 0.0, 0.0, 0.0, -0.5), text="",
                      finish_reason="stop", policy_version=0, telemetry=TELEMETRY, sampled_by_model=MASK)


def test_environment_tokens_get_exactly_zero_gradient_and_no_share_of_the_normaliser() -> None:
    group = RolloutGroup(Task(uid="t", question="q", answer="1"), (1, 2, 3), (_episode(1.0),))
    sample = flatten([group], [1.5])[0]
    assert sample.trained_tokens == 3 and sample.loss_mask == MASK
    batch = collate([sample], pad_id=0, device=torch.device("cpu"))
    assert batch.loss_inputs.completion_mask.tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0, 1.0]]
    logits = torch.randn(1, 3 + 6, 16, requires_grad=True)  # [B, P + T, V]
    for aggregation in ("sequence_mean", "token_mean", "constant"):
        loss_fn = GRPOLoss(aggregation=aggregation, max_tokens=8)
        logits.grad = None
        new = completion_logprobs(logits, batch, temperature=1.0)  # [B, T]
        normaliser = loss_fn.normaliser([sample.trained_tokens])
        inputs = batch.loss_inputs
        loss, stats = loss_fn(new, inputs.sampling_logprobs, inputs.advantages, inputs.completion_mask, normaliser)
        loss.backward()
        assert logits.grad is not None
        # position p predicts completion token p - P + 1: tokens 2, 3, 4 are the environment's
        env_positions = [3 - 1 + i for i, own in enumerate(MASK) if not own]
        model_positions = [3 - 1 + i for i, own in enumerate(MASK) if own]
        assert torch.count_nonzero(logits.grad[0, env_positions]) == 0, aggregation
        assert all(torch.count_nonzero(logits.grad[0, p]) > 0 for p in model_positions), aggregation
        assert stats.tokens == 3.0
    assert GRPOLoss(aggregation="token_mean").normaliser([sample.trained_tokens]) == 3.0  # environment tokens: none
