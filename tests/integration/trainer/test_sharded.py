"""The FSDP2 trainer: 2 Ray actor ranks over gloo on the tiny model against the single-device trainer,
with the configured loss component (dr_grpo / dapo aggregation, mask_truncated, KL to the frozen
reference) and several updates per batch; sharded checkpoints (torch.distributed.checkpoint) resumed at
another world size; the HF export."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from grpo_pipe.checkpoint.store import CheckpointManager
from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.trainer.batch_plan import PassCache
from grpo_pipe.trainer.grpo import GRPOTrainer
from grpo_pipe.trainer.loss import GRPOLoss
from grpo_pipe.trainer.policy import FullFinetunePolicy, LoraPolicy
from grpo_pipe.trainer.settings import BatchingSettings, OptimisationSettings
from grpo_pipe.trainer.shard_worker import deal
from grpo_pipe.trainer.sharded import ShardedTrainer
from grpo_pipe.types import RequestTelemetry, RolloutGroup
from tests.fakes import scored_groups

TELEMETRY = RequestTelemetry(prompt_tokens=4, generated_tokens=3, cached_prompt_tokens=0)
# Padded micro-batches, as the counts below assume; the packed layout has a test of its own (LoRA, below).
SETTINGS = dict(steps=3, optimisation=OptimisationSettings(lr=1e-3, grad_clip=1.0),
                batching=BatchingSettings(packed=False, micro_batch_size=3))
# With the KL term on, every completion runs (zero advantages included) but the truncated one is masked:
# 11 active, micro-batches of 4, 4, 3 -> rank 1 runs a padding micro-batch to join the collectives.
# Two updates per batch: the second pass moves away from the reference, so the KL gradient is not zero.
KL_SETTINGS = dict(SETTINGS, optimisation=OptimisationSettings(lr=1e-3, grad_clip=1.0, updates_per_batch=2),
                   batching=BatchingSettings(packed=False, micro_batch_size=4))
# Packed rows of at most 36 tokens: 11 sequences of 6-10 tokens in three passes, so one rank runs a padding pass.
PACKED_KL_SETTINGS = dict(KL_SETTINGS, batching=BatchingSettings(packed=True, max_tokens=36))
DR_GRPO_KL = dict(aggregation="constant", max_tokens=6, normalize_std=False, mask_truncated=True, kl_coef=0.05)
DAPO_KL = dict(aggregation="token_mean", mask_truncated=True, kl_coef=0.05)


def _groups(seed: int = 0) -> tuple[list[RolloutGroup], list[float]]:
    return scored_groups(seed, truncated={(0, 3)})  # one completion hit the budget: mask_truncated has work


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    import ray

    ray.init(address="local", num_cpus=3, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_path() -> Path:
    return TinyRandomModel().materialize()


def _single(path: Path, policy: object | None = None, loss: dict | None = None, **settings: object) -> GRPOTrainer:
    torch.manual_seed(0)
    trainer = GRPOTrainer(policy=policy or FullFinetunePolicy(), loss=GRPOLoss(**(loss or {})), **(settings or SETTINGS))
    trainer.setup(path, torch.device("cpu"), pad_id=0)
    return trainer


def _sharded(
    path: Path, world_size: int, policy: object | None = None, loss: dict | None = None, **settings: object
) -> ShardedTrainer:
    trainer = ShardedTrainer(
        policy=policy or FullFinetunePolicy(), world_size=world_size, loss=GRPOLoss(**(loss or {})), **(settings or SETTINGS)
    )
    trainer.setup(path, torch.device("cpu"), pad_id=0)
    return trainer


def test_deal_keeps_micro_batches_and_pads_every_rank_to_the_same_count() -> None:
    groups, rewards = _groups()
    whole, shares = ShardedTrainer(policy=FullFinetunePolicy(), world_size=2, **SETTINGS).plan(groups, rewards)
    assert len(whole.active) == 8  # group 2 carries no signal: skipped, but counted in the normaliser
    assert [len(c) for c in whole.cuts] == [3, 2, 3]  # 8 at micro-batch 3: as even as possible, no sliver
    cut = [[share.active[c.start : c.stop] for c in share.cuts] for share in shares]
    assert [[len(c) for c in chunks] for chunks in cut] == [[3, 3], [2, 1]]  # chunks dealt round-robin, rank 1 padded
    assert cut[0] == [whole.active[0:3], whole.active[5:8]] and cut[1][0] == whole.active[3:5]
    assert cut[1][1][0].completion_ids == () and cut[1][1][0].advantage == 0.0  # rank 1 pads: an empty completion
    assert all(share.normaliser == whole.normaliser == 12 for share in shares)  # the whole batch's, on every rank
    empty = replace(whole, active=[], cuts=[])
    assert [s.active for s in deal(empty, world_size=3, pad_id=0)] == [[], [], []]  # no pass at all


def test_unknown_setting_is_a_config_error_naming_what_is_allowed() -> None:
    [problem] = [p for p in ShardedTrainer(policy=FullFinetunePolicy(), world_sise=2).config_problems()
                 if "world_sise" in p]
    assert problem.startswith("trainer.world_sise: unknown setting for ShardedTrainer; allowed: world_size")


def test_two_ranks_match_one_device_and_resume_at_world_size_one(ray_local: None, model_path: Path, tmp_path: Path) -> None:
    import ray

    groups, rewards = _groups()
    single = _single(model_path, loss=DR_GRPO_KL, **KL_SETTINGS)
    sharded = _sharded(model_path, 2, loss=DR_GRPO_KL, **KL_SETTINGS)
    try:
        # Gradients: the same full-batch gradient, gathered from the shards.
        want = single._accumulate(single.plan(groups, rewards), 1.0, PassCache())
        _, shares = sharded.plan(groups, rewards)
        sums = ray.get([w.accumulate.remote(share, 1.0) for w, share in zip(sharded.workers, shares)])
        assert sum(s["train/loss"] for s in sums) == pytest.approx(want["train/loss"], rel=1e-5)
        got = sharded.collect("full_state", "grads")
        expected = {n: p.grad for n, p in single.policy.module.named_parameters() if p.grad is not None}
        assert got.keys() == expected.keys() and any(g.abs().max() > 0 for g in got.values())
        for name, grad in expected.items():  # fp32, another summation order: equal to rounding
            torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-7)
        # A whole step of two updates: same metrics, same global grad norm, same weights after it.
        single.optimizer.zero_grad(set_to_none=True)
        one, two = single.step(groups, rewards, 1.0), sharded.step(groups, rewards, 1.0)
        for key in ("train/loss", "train/grad_norm", "train/clip_fraction"):
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-9), key
        assert two["train/tokens"] == one["train/tokens"]
        assert two["train/masked_truncated"] == one["train/masked_truncated"] == 1.0
        assert two["train/active_samples"] == one["train/active_samples"] == 11.0
        assert sharded.version == single.version == 1
        _assert_same_weights(dict(sharded.policy.named_weights()), dict(single.policy.named_weights()))
        # Sharded checkpoint at world size 2, resumed at world size 1: the next step matches again.
        # Through the run's checkpoint store: the ranks write their shards into it, the manifest covers them.
        store = CheckpointManager(every=1)
        store.attach(tmp_path)
        saved = store.save(1, sharded, {"step": 1}, "a: 1\n")
        assert saved is not None and saved.sharded and saved.problems() == []
        export = tmp_path / "export"
        sharded.policy.save_pretrained(export)
    finally:
        sharded.close()
    resumed = _sharded(model_path, 1, loss=DR_GRPO_KL, **KL_SETTINGS)
    try:
        saved.restore_trainer(resumed)
        assert resumed.version == 1
        groups2, rewards2 = _groups(seed=1)
        one, again = single.step(groups2, rewards2, 1.0), resumed.step(groups2, rewards2, 1.0)
        assert again["train/lr"] == pytest.approx(one["train/lr"])
        # The reference is the start.
        assert one["train/kl"] > 0 and again["train/kl"] == pytest.approx(one["train/kl"], rel=1e-3, abs=1e-7)
        # Four Adam updates in: an element whose gradient is near zero moves by a fraction of lr either
        # way with the summation order (Adam's step is lr-sized whatever the gradient's size); a wrong
        # resume (weights, moments, schedule) moves elements by ~lr = 1e-3.
        _assert_same_weights(dict(resumed.policy.named_weights()), dict(single.policy.named_weights()), atol=1e-4)
    finally:
        resumed.close()
    _assert_plain_hf_folder(export)


def _assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=atol)


def _assert_plain_hf_folder(folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    assert (folder / "config.json").exists() and (folder / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(folder)  # transformers loads it as any HF checkpoint
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.parametrize("settings", [KL_SETTINGS, PACKED_KL_SETTINGS], ids=["padded", "packed"])
def test_lora_two_ranks_match_one_device(ray_local: None, model_path: Path, tmp_path: Path, settings: dict) -> None:
    groups, rewards = _groups()
    lora = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
    single = _single(model_path, LoraPolicy(**lora), loss=DAPO_KL, **settings)
    sharded = _sharded(model_path, 2, LoraPolicy(**lora), loss=DAPO_KL, **settings)
    whole, _ = sharded.plan(groups, rewards)
    assert len(whole.cuts) % 2 == 1  # an odd number of passes: one rank runs a padding pass
    try:
        # B starts at zero: after one step the adapter is not a no-op. The reference is the adapter
        # switched off: on the ranks a sharded (collective) forward, padding micro-batch included.
        one, two = single.step(groups, rewards, 1.0), sharded.step(groups, rewards, 1.0)
        assert two["train/update_applied"] == 1.0
        assert two["train/loss"] == pytest.approx(one["train/loss"], rel=1e-4)
        _assert_same_weights(dict(sharded.policy.named_weights()), dict(single.policy.named_weights()))
        sharded.policy.save_adapter(tmp_path / "adapter")
        single.policy.save_adapter(tmp_path / "single")
    finally:
        sharded.close()
    from safetensors.torch import load_file

    got = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    want = load_file(tmp_path / "single" / "adapter_model.safetensors")
    _assert_same_weights(got, want)
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
