"""The optimisation step on a real tiny transformers model."""

import dataclasses
import math

import pytest
import torch

from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.trainer.batch import collate, completion_logprobs, flatten
from grpo_pipe.trainer.batch_plan import PassCache, micro_batches
from grpo_pipe.trainer.grpo import GRPOTrainer
from grpo_pipe.trainer.loss import GRPOLoss
from grpo_pipe.trainer.policy import FullFinetunePolicy, LoraPolicy
from grpo_pipe.trainer.settings import BatchingSettings, OptimisationSettings, PrecisionSettings
from grpo_pipe.types import RolloutGroup
from tests.fakes import TELEMETRY, scored_groups


def _trainer(micro_batch_size: int, path, compile: bool = False, lora: bool = False, packed: bool = False) -> GRPOTrainer:
    """Padded micro-batches of `micro_batch_size` by default (what these tests count); `packed`: one token budget."""
    torch.manual_seed(0)
    policy = LoraPolicy(rank=4) if lora else FullFinetunePolicy()
    trainer = GRPOTrainer(policy=policy, steps=2, optimisation=OptimisationSettings(lr=1e-3),
                          batching=BatchingSettings(micro_batch_size=micro_batch_size, packed=packed, max_tokens=32),
                          precision=PrecisionSettings(compile=compile))
    trainer.setup(path, torch.device("cpu"), pad_id=0)
    return trainer


def _gradients(micro_batch_size: int, path) -> dict[str, torch.Tensor]:
    trainer = _trainer(micro_batch_size, path)
    groups, rewards = scored_groups()
    plan = trainer.plan(groups, rewards)
    metrics = {**plan.metrics(), **trainer._accumulate(plan, 1.0, PassCache())}
    assert metrics["train/active_samples"] == 8.0  # the 4 zero-advantage samples never ran
    assert metrics["train/samples"] == 12.0
    return {n: p.grad.clone() for n, p in trainer.policy.module.named_parameters() if p.grad is not None}


def test_micro_batches_are_as_even_as_possible_and_never_a_sliver() -> None:
    assert [len(r) for r in micro_batches(65, 64)] == [32, 33]
    assert [len(r) for r in micro_batches(64, 64)] == [64]
    assert [len(r) for r in micro_batches(130, 64)] == [43, 44, 43]
    assert micro_batches(0, 64) == [] and micro_batches(1, 64) == [range(0, 1)]
    cuts = micro_batches(1000, 7)
    assert cuts[0].start == 0 and cuts[-1].stop == 1000 and all(a.stop == b.start for a, b in zip(cuts, cuts[1:]))
    assert len(cuts) == 143 and {len(c) for c in cuts} <= {6, 7}


@pytest.mark.parametrize(("lora", "packed"), [(False, False), (True, False), (False, True)],
                         ids=["full", "lora", "full-packed"])
def test_compiled_blocks_train_exactly_as_the_eager_model(lora: bool, packed: bool) -> None:
    """trainer.precision.compile: each decoder layer compiled in place (names unchanged); the same loss and
    gradients as eager, to fp32 rounding, for a full fine-tune and a LoRA adapter, over micro-batches of different
    shapes, padded or packed."""
    path = TinyRandomModel().materialize()
    groups, rewards = scored_groups()
    eager = _trainer(3, path, lora=lora, packed=packed)
    compiled = _trainer(3, path, compile=True, lora=lora, packed=packed)
    layers = max((m for m in compiled.policy.module.modules() if isinstance(m, torch.nn.ModuleList)), key=len)
    assert all(layer._compiled_call_impl is not None for layer in layers)
    assert [n for n, _ in compiled.policy.module.named_parameters()] == [n for n, _ in eager.policy.module.named_parameters()]
    plan = eager.plan(groups, rewards)
    # more than one shape goes through the graph
    assert len(plan.cuts) >= 2 if packed else [len(c) for c in plan.cuts] == [3, 2, 3]
    graphs_after_warm_up = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs_after_warm_up >= 2  # the counter counts: set-up compiled the no-mask and the mask graph
    want, got = eager._accumulate(plan, 1.0, PassCache()), compiled._accumulate(plan, 1.0, PassCache())
    # Set-up compiled every graph training needs: widths 6-10 padded to 8 or 16, with and without padding.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs_after_warm_up
    assert got["train/loss"] == pytest.approx(want["train/loss"], rel=1e-5) and want["train/loss"] != 0.0
    grads = [(n, p.grad) for n, p in eager.policy.module.named_parameters() if p.grad is not None]
    assert grads and any(g.abs().max() > 0 for _, g in grads)
    compiled_grads = dict(compiled.policy.module.named_parameters())
    for name, grad in grads:  # fp32, fused kernels sum in another order: equal to rounding, which scales with the
        # tensor (the tied embedding's gradient sums the head's over every position: 2e-7 off where its largest is 0.13);
        # a wrong gradient would be off by a share of the gradient itself
        scale = float(grad.abs().max())
        torch.testing.assert_close(compiled_grads[name].grad, grad, rtol=1e-4, atol=max(1e-7, 1e-5 * scale), msg=name)


def test_collate_pads_the_width_to_a_multiple_and_masks_the_padding() -> None:
    groups, _ = scored_groups()
    samples = flatten(groups, [1.0] * 12)[4:7]  # prompt 5, completions 2-4: width 9
    plain, padded = collate(samples, 0, torch.device("cpu")), collate(samples, 0, torch.device("cpu"), 8)
    assert plain.input_ids.shape[1] % 8 != 0 and padded.input_ids.shape[1] % 8 == 0
    extra = padded.input_ids.shape[1] - plain.input_ids.shape[1]
    assert torch.equal(padded.input_ids[:, : plain.input_ids.shape[1]], plain.input_ids)
    plain_mask, padded_mask = plain.loss_inputs.completion_mask, padded.loss_inputs.completion_mask
    assert torch.equal(padded_mask[:, : plain.loss_inputs.width], plain_mask)
    assert padded.attention_mask[:, -extra:].sum() == 0 and padded_mask[:, -extra:].sum() == 0


def test_micro_batching_accumulates_the_full_batch_gradient() -> None:
    path = TinyRandomModel().materialize()
    one, full = _gradients(1, path), _gradients(8, path)
    assert one.keys() == full.keys() and one
    assert any(g.abs().max() > 0 for g in one.values())
    for name in one:  # fp32, different summation order: equal to rounding
        torch.testing.assert_close(one[name], full[name], rtol=1e-4, atol=1e-7)


def test_step_applies_one_update_and_bumps_the_version() -> None:
    path = TinyRandomModel().materialize()
    trainer = _trainer(4, path)
    before = {k: v.clone() for k, v in trainer.policy.module.state_dict().items()}
    groups, rewards = scored_groups()
    metrics = trainer.step(groups, rewards, temperature=1.0)
    assert metrics["train/update_applied"] == 1.0 and trainer.version == 1
    assert any(not torch.equal(v, before[k]) for k, v in trainer.policy.module.state_dict().items())


def test_non_finite_gradient_skips_the_update_names_where_it_is_and_stops_after_the_limit(caplog) -> None:
    path = TinyRandomModel().materialize()
    trainer = GRPOTrainer(policy=FullFinetunePolicy(), steps=3, optimisation=OptimisationSettings(lr=1e-3, max_bad_steps=2))
    trainer.setup(path, torch.device("cpu"), pad_id=0)
    before = {k: v.clone() for k, v in trainer.policy.module.state_dict().items()}
    groups, _ = scored_groups()
    nan_rewards = [math.nan] + [0.0] * 11  # poisons every advantage in group 0
    metrics = trainer.step(groups, nan_rewards, temperature=1.0)
    assert metrics["train/update_applied"] == 0.0 and trainer.version == 0
    assert metrics["train/skipped_updates_total"] == 1.0
    for key, value in trainer.policy.module.state_dict().items():
        assert torch.equal(value, before[key]), key
    [warning] = [r.getMessage() for r in caplog.records if "Non-finite gradient" in r.getMessage()]
    assert " gradients, first: model." in warning  # which tensors, by name: where to look
    with pytest.raises(FloatingPointError, match=r"max_bad_steps\); the last in \d+ of \d+ gradients, first: model\."):
        trainer.step(groups, nan_rewards, temperature=1.0)


class _NanGradient(torch.autograd.Function):
    """The identity whose backward returns NaN: a fault inside the backward pass, the forward finite."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return grad * float("nan")


def _trainer_with_a_faulty_norm(faulty_calls: int | None, diagnose: bool = True) -> tuple[GRPOTrainer, list[int]]:
    """A trainer whose final norm's backward gives NaN on its first `faulty_calls` forwards (None: always)."""
    trainer = GRPOTrainer(policy=FullFinetunePolicy(), steps=2, optimisation=OptimisationSettings(
        lr=1e-3, diagnose_non_finite=diagnose))
    trainer.setup(TinyRandomModel().materialize(), torch.device("cpu"), pad_id=0)
    calls = [0]

    def hook(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        faulty = faulty_calls is None or calls[0] <= faulty_calls
        return _NanGradient.apply(output) if faulty else output

    trainer.policy.module.model.norm.register_forward_hook(hook)
    return trainer, calls


def test_a_non_finite_gradient_is_run_again_under_anomaly_mode_which_names_the_op_and_the_forward_line(caplog) -> None:
    trainer, _ = _trainer_with_a_faulty_norm(faulty_calls=None)
    groups, rewards = scored_groups()
    metrics = trainer.step(groups, rewards, temperature=1.0)
    assert metrics["train/update_applied"] == 0.0 and math.isfinite(metrics["train/loss"])  # the forward is finite
    [warning] = [r.getMessage() for r in caplog.records if "Non-finite gradient" in r.getMessage()]
    assert "a second pass under anomaly detection: Function '_NanGradientBackward' returned nan values" in warning
    assert "(forward: test_grpo.py, line " in warning and "_NanGradient.apply(output)" in warning  # the hook's line


def test_a_non_finite_gradient_that_does_not_repeat_is_reported_as_such(caplog) -> None:
    """Only the first micro-batch's forward is faulty: the second pass over the same batch is finite."""
    trainer, _ = _trainer_with_a_faulty_norm(faulty_calls=1)
    groups, rewards = scored_groups()
    assert trainer.step(groups, rewards, temperature=1.0)["train/update_applied"] == 0.0
    [warning] = [r.getMessage() for r in caplog.records if "Non-finite gradient" in r.getMessage()]
    assert "a second pass over the same batch and weights gave finite gradients: the fault does not repeat" in warning
    assert trainer.step(groups, rewards, temperature=1.0)["train/update_applied"] == 1.0  # and the run trains on


def test_without_diagnosis_a_bad_step_runs_its_pass_once(caplog) -> None:
    trainer, calls = _trainer_with_a_faulty_norm(faulty_calls=None, diagnose=False)
    groups, rewards = scored_groups()
    plan = trainer.plan(groups, rewards)
    trainer.step(groups, rewards, temperature=1.0)
    assert calls[0] == len(plan.cuts)  # one forward per micro-batch: no second pass
    [warning] = [r.getMessage() for r in caplog.records if "Non-finite gradient" in r.getMessage()]
    assert "second pass" not in warning and " gradients, first: model." in warning


def _weights(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.policy.module.state_dict().items()}


def test_updates_per_batch_is_mu_updates_against_the_sampler_and_one_version() -> None:
    """mu=2 on one batch = two single updates on the same batch (both ratios against the sampler's log-probs)."""
    path = TinyRandomModel().materialize()
    groups, rewards = scored_groups()
    torch.manual_seed(0)
    sampler = GRPOLoss(ratio_reference="sampler", is_cap=None)
    twice = GRPOTrainer(policy=FullFinetunePolicy(), loss=sampler, steps=2,
                        optimisation=OptimisationSettings(lr=1e-3, updates_per_batch=2))
    twice.setup(path, torch.device("cpu"), pad_id=0)
    metrics = twice.step(groups, rewards, temperature=1.0)
    assert twice.version == 1 and metrics["train/update_applied"] == 1.0
    assert twice.optimizer.state_dict()["state"][0]["step"] == 2  # two optimizer updates
    torch.manual_seed(0)
    once = GRPOTrainer(policy=FullFinetunePolicy(), loss=sampler, steps=4, optimisation=OptimisationSettings(lr=1e-3))
    once.setup(path, torch.device("cpu"), pad_id=0)
    once.step(groups, rewards, temperature=1.0)
    once.step(groups, rewards, temperature=1.0)
    assert once.version == 2
    mu, reference = _weights(twice), _weights(once)
    for name in mu:
        torch.testing.assert_close(mu[name], reference[name], rtol=0, atol=0)


def test_later_passes_take_the_ratio_against_the_policy_the_batch_found() -> None:
    """ratio_reference=policy: the first pass's ratio is 1 (nothing clipped); the second pass's is against the
    first pass's log-probs, so after a large update the clip binds there (it would not against a fresh detach)."""
    path = TinyRandomModel().materialize()
    groups, rewards = scored_groups()
    torch.manual_seed(0)
    one = GRPOTrainer(policy=FullFinetunePolicy(), loss=GRPOLoss(), steps=2,
                      optimisation=OptimisationSettings(lr=5e-2, updates_per_batch=1))
    one.setup(path, torch.device("cpu"), pad_id=0)
    assert one.step(groups, rewards, temperature=1.0)["train/clip_fraction"] == 0.0
    torch.manual_seed(0)
    two = GRPOTrainer(policy=FullFinetunePolicy(), loss=GRPOLoss(), steps=2,
                      optimisation=OptimisationSettings(lr=5e-2, updates_per_batch=2))
    two.setup(path, torch.device("cpu"), pad_id=0)
    metrics = two.step(groups, rewards, temperature=1.0)
    assert metrics["train/clip_fraction"] > 0.0  # the mean over passes: only the second pass clipped


def test_mismatch_is_zero_when_the_sampler_reported_the_trainers_own_log_probs() -> None:
    path = TinyRandomModel().materialize()
    groups, rewards = scored_groups()
    trainer = _trainer(4, path)
    plan = trainer.plan(groups, rewards)
    first = trainer._accumulate(plan, 1.0, PassCache())
    assert first["mismatch/logprob_abs_mean"] > 0.5  # the made-up sampler log-probs (-3.0) are far off
    # Give each sample the trainer's own log-probs, as an engine on the same weights and numerics would.
    exact = []
    for sample in plan.active:
        batch = collate([sample], 0, torch.device("cpu"))
        with torch.no_grad():
            logits = trainer.policy.module(**batch.model_inputs(trainer.scorer.logits_to_keep)).logits
        own = completion_logprobs(logits, batch, 1.0)[0, : len(sample.completion_ids)].tolist()
        exact.append(dataclasses.replace(sample, sampling_logprobs=tuple(own)))
    same = trainer._accumulate(dataclasses.replace(plan, active=exact), 1.0, PassCache())
    assert same["mismatch/logprob_abs_mean"] < 1e-5 and same["mismatch/kl_k3"] < 1e-9
    assert same["mismatch/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert same["mismatch/outside_clip_fraction"] == 0.0
    assert same["train/entropy"] > 0.0


def _truncated_groups() -> tuple[list[RolloutGroup], list[float]]:
    groups, rewards = scored_groups()
    first = groups[0]
    cut = dataclasses.replace(first.completions[0], finish_reason="length", policy_version=0, telemetry=TELEMETRY)
    groups[0] = RolloutGroup(first.task, first.prompt_token_ids, (cut, *first.completions[1:]))
    return groups, rewards


def test_mask_truncated_gives_a_budget_hitting_completion_no_loss() -> None:
    path = TinyRandomModel().materialize()
    groups, rewards = _truncated_groups()
    masked = GRPOTrainer(policy=FullFinetunePolicy(), loss=GRPOLoss(aggregation="token_mean", mask_truncated=True))
    masked.setup(path, torch.device("cpu"), pad_id=0)
    plan = masked.plan(groups, rewards)
    assert plan.masked == 1 and len(plan.active) == 7
    assert all(not s.truncated for s in plan.active)
    lengths = [len(c.token_ids) for g in groups for c in g.completions]
    assert plan.normaliser == sum(lengths) - lengths[0]  # the masked completion is in no normaliser
    kept = GRPOTrainer(policy=FullFinetunePolicy(), loss=GRPOLoss(aggregation="token_mean"))
    kept.setup(path, torch.device("cpu"), pad_id=0)
    assert kept.plan(groups, rewards).masked == 0 and len(kept.plan(groups, rewards).active) == 8


@pytest.mark.parametrize("policy_cls", [FullFinetunePolicy, LoraPolicy])
def test_kl_to_the_frozen_starting_policy(policy_cls) -> None:
    path = TinyRandomModel().materialize()
    groups, rewards = scored_groups()
    torch.manual_seed(0)
    policy = policy_cls() if policy_cls is FullFinetunePolicy else LoraPolicy(rank=4)
    # padded: the test calls the model itself below (a packed model's attention takes packed rows only)
    trainer = GRPOTrainer(policy=policy, loss=GRPOLoss(kl_coef=0.1), steps=3, optimisation=OptimisationSettings(lr=1e-2),
                          batching=BatchingSettings(packed=False))
    trainer.setup(path, torch.device("cpu"), pad_id=0)
    ids = torch.tensor([list(groups[0].prompt_token_ids)])
    mask = torch.ones_like(ids)
    inputs = {"input_ids": ids, "attention_mask": mask}
    start = trainer.policy.reference_logits(inputs)
    first = trainer.step(groups, rewards, temperature=1.0)
    assert first["train/kl"] == 0.0  # the policy is still the reference
    assert first["train/active_samples"] == 12.0  # the KL term is not zero for zero-advantage samples
    second = trainer.step(groups, rewards, temperature=1.0)
    assert second["train/kl"] > 0.0
    torch.testing.assert_close(trainer.policy.reference_logits(inputs), start, rtol=0, atol=0)  # frozen
    with torch.no_grad():
        now = trainer.policy.module(input_ids=ids, attention_mask=mask).logits
    assert not torch.equal(now, start)


def test_entropy_bonus_spreads_a_batch_whose_rewards_are_all_equal() -> None:
    """A collapsed policy gives every group equal rewards: no advantage, nothing to learn from. The entropy bonus is
    the one term left with a gradient; it must train every sample and raise the policy's entropy."""
    path = TinyRandomModel().materialize()
    groups, rewards = scored_groups()
    flat = [1.0] * len(rewards)
    plain = _trainer(4, path)
    assert plain.plan(groups, flat).active == []  # no advantage anywhere: nothing runs
    torch.manual_seed(0)
    trainer = GRPOTrainer(policy=FullFinetunePolicy(), loss=GRPOLoss(aggregation="token_mean", entropy_coef=1.0), steps=3,
                          optimisation=OptimisationSettings(lr=1e-2))
    trainer.setup(path, torch.device("cpu"), pad_id=0)
    first = trainer.step(groups, flat, temperature=1.0)
    second = trainer.step(groups, flat, temperature=1.0)
    assert first["train/active_samples"] == 12.0 and first["train/update_applied"] == 1.0
    assert second["train/entropy"] > first["train/entropy"]  # measured before each update: the first one spread it
    assert first["train/loss"] == pytest.approx(-first["train/entropy"], rel=1e-5)  # no advantage: the bonus alone


def test_bnpo_runs_every_sample_and_divides_by_the_steps_micro_batches() -> None:
    path = TinyRandomModel().materialize()
    groups, rewards = scored_groups()
    trainer = GRPOTrainer(policy=FullFinetunePolicy(), loss=GRPOLoss(aggregation="micro_batch_token_mean"),
                          batching=BatchingSettings(micro_batch_size=5, packed=False))
    trainer.setup(path, torch.device("cpu"), pad_id=0)
    plan = trainer.plan(groups, rewards)
    assert len(plan.active) == 12  # zero-advantage completions too: their tokens count in their micro-batch
    assert [len(c) for c in plan.cuts] == [4, 4, 4] and plan.normaliser == 3.0
    assert trainer.step(groups, rewards, temperature=1.0)["train/update_applied"] == 1.0
