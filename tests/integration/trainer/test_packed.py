"""Packed micro-batches on a real tiny transformers model: the same log-probs as padded ones and as each sequence
alone, the same loss and gradients (full fine-tune, LoRA, a KL term and entropy bonus, episodes with environment
tokens), and the lm head's log-softmax in chunks or fused equal to the plain one."""

from __future__ import annotations

import pytest
import torch

from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.trainer import lm_head
from grpo_pipe.trainer.batch import TrainSample, collate, completion_entropy, completion_logprobs
from grpo_pipe.trainer.batch_plan import PassCache
from grpo_pipe.trainer.grpo import GRPOTrainer
from grpo_pipe.trainer.loss import GRPOLoss
from grpo_pipe.trainer.packed_attention import ATTENTION_NAME, packing_problem
from grpo_pipe.trainer.packing import pack
from grpo_pipe.trainer.policy import FullFinetunePolicy, LoraPolicy
from grpo_pipe.trainer.settings import BatchingSettings, OptimisationSettings, PrecisionSettings
from grpo_pipe.types import Completion, RequestTelemetry, RolloutGroup, Task
from tests.fakes import scored_groups

CPU = torch.device("cpu")
TEMPERATURE = 0.7


def _trainer(packed: bool, policy: str = "full", loss: GRPOLoss | None = None) -> GRPOTrainer:
    torch.manual_seed(0)
    trainer = GRPOTrainer(policy=LoraPolicy(rank=4) if policy == "lora" else FullFinetunePolicy(), steps=2,
                          loss=loss or GRPOLoss(), optimisation=OptimisationSettings(lr=1e-3),
                          batching=BatchingSettings(packed=packed, micro_batch_size=3, max_tokens=24),
                          precision=PrecisionSettings(compile=False))
    trainer.setup(TinyRandomModel().materialize(), CPU, pad_id=0)
    return trainer


def _samples() -> list[TrainSample]:
    gen = torch.Generator().manual_seed(1)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(torch.randint(10, 400, (n,), generator=gen).tolist())

    shapes = [(3, 5, None), (7, 2, None), (5, 6, (True, True, False, False, True, True)), (1, 1, None)]
    return [TrainSample(prompt_ids=ids(p), completion_ids=ids(c), sampling_logprobs=(-1.0,) * c, advantage=1.0, policy_version=0,
                        loss_mask=m) for p, c, m in shapes]


@pytest.mark.parametrize("policy", ["full", "lora"])
def test_packed_log_probs_and_entropy_equal_the_padded_ones(policy: str) -> None:
    packed, padded = _trainer(True, policy), _trainer(False, policy)
    assert packed.packed and packed.policy.module.config._attn_implementation == ATTENTION_NAME
    samples = _samples()
    assert packed.scorer is not None and packed.scorer.parts is not None  # the head runs apart on the scored positions
    with torch.no_grad():
        got, got_entropy = packed.scorer.policy_scores(pack(samples, CPU), TEMPERATURE, False, need_entropy=True)
        batch = collate(samples, 0, CPU)
        logits = padded.policy.module(**batch.model_inputs(True)).logits
        want = completion_logprobs(logits, batch, TEMPERATURE)  # [B, T]
        want_entropy = completion_entropy(logits, batch, TEMPERATURE)
    assert got.shape == want.shape and got_entropy is not None
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)  # masked positions are 0 in both
    torch.testing.assert_close(got_entropy, want_entropy, rtol=0, atol=2e-5)
    assert torch.count_nonzero(got[2, 2:4]) == 0  # the episode's environment tokens are not scored


@pytest.mark.parametrize(("policy", "loss"), [
    ("full", GRPOLoss()),
    ("lora", GRPOLoss()),
    ("full", GRPOLoss(kl_coef=0.1, entropy_coef=0.01, aggregation="token_mean")),
], ids=["full", "lora", "kl-entropy"])
def test_packed_and_padded_steps_give_the_same_loss_gradients_and_metrics(policy: str, loss: GRPOLoss) -> None:
    groups, rewards = scored_groups()
    packed, padded = _trainer(True, policy, loss), _trainer(False, policy, loss)
    plan_packed, plan_padded = packed.plan(groups, rewards), padded.plan(groups, rewards)
    assert len(plan_packed.cuts) >= 2  # gradients accumulate over packed passes too
    got = packed._accumulate(plan_packed, TEMPERATURE, PassCache())
    want = padded._accumulate(plan_padded, TEMPERATURE, PassCache())
    assert got["train/loss"] == pytest.approx(want["train/loss"], rel=1e-5) and want["train/loss"] != 0.0
    for key in ("mismatch/logprob_abs_mean", "train/entropy", "train/kl", "train/clip_fraction", "train/tokens"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    mine = dict(packed.policy.module.named_parameters())
    grads = [(n, p.grad) for n, p in padded.policy.module.named_parameters() if p.grad is not None]
    assert grads and any(g.abs().max() > 0 for _, g in grads)
    for name, grad in grads:
        torch.testing.assert_close(mine[name].grad, grad, rtol=1e-4, atol=max(1e-7, 1e-5 * float(grad.abs().max())),
                                   msg=name)


def test_an_episode_trains_the_same_packed_and_its_environment_tokens_get_no_gradient() -> None:
    telemetry = RequestTelemetry(prompt_tokens=3, generated_tokens=6, cached_prompt_tokens=0)
    mask = (True, True, False, False, False, True)  # model turn, tool result, model turn
    episodes = tuple(Completion(token_ids=tuple(range(20 + i, 26 + i)), logprobs=(-1.0, -2.0, 0.0, 0.0, 0.0, -0.5),
                                text="", finish_reason="stop", policy_version=0, telemetry=telemetry,
                                sampled_by_model=mask) for i in range(4))
    groups = [RolloutGroup(Task(uid="t", question="q", answer="1"), (1, 2, 3), episodes)]
    rewards = [1.0, 0.0, 0.0, 1.0]
    packed, padded = _trainer(True), _trainer(False)
    got = packed._accumulate(packed.plan(groups, rewards), 1.0, PassCache())
    want = padded._accumulate(padded.plan(groups, rewards), 1.0, PassCache())
    assert got["train/tokens"] == want["train/tokens"] == 12.0  # 3 model tokens of each of 4 episodes
    assert got["train/loss"] == pytest.approx(want["train/loss"], rel=1e-5)
    embedding = dict(packed.policy.module.named_parameters())["model.embed_tokens.weight"]
    want_embedding = dict(padded.policy.module.named_parameters())["model.embed_tokens.weight"]
    torch.testing.assert_close(embedding.grad, want_embedding.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("fused", [False, True], ids=["chunked", "fused"])
def test_the_heads_log_softmax_in_chunks_or_fused_equals_the_plain_one(fused: bool, monkeypatch) -> None:
    monkeypatch.setattr(lm_head, "HEAD_CHUNK_ELEMENTS", 3 * 64)  # 3 rows of a 64-word vocabulary a chunk
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(16, 64, bias=False)
    hidden = torch.randn(10, 16, generator=gen, requires_grad=True)  # [M, H]
    targets = torch.randint(0, 64, (10,), generator=gen)
    got, got_entropy = lm_head.head_logprobs(hidden, head, targets, TEMPERATURE, entropy_grad=True, fused=fused)
    (got.sum() + 0.3 * got_entropy.sum()).backward()
    got_grads = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    logp = torch.log_softmax(head(hidden).float() / TEMPERATURE, dim=-1)  # [M, V]
    want = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    want_entropy = -(logp.exp() * logp).sum(-1)
    (want.sum() + 0.3 * want_entropy.sum()).backward()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_entropy, want_entropy, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_grads[0], hidden.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_grads[1], head.weight.grad, rtol=1e-5, atol=1e-6)


def test_a_model_that_cannot_pack_is_named_and_trains_padded() -> None:
    from transformers import Qwen2Config

    assert packing_problem(Qwen2Config()) is None  # Qwen2's window is off unless use_sliding_window
    windowed = Qwen2Config(use_sliding_window=True, sliding_window=64, max_window_layers=0)
    assert "sliding" in (packing_problem(windowed) or "")
