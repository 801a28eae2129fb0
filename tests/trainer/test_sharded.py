"""The FSDP2 trainer: 2 Ray actor ranks over gloo on the tiny model against the single-device trainer;
sharded checkpoints (torch.distributed.checkpoint) resumed at another world size; the HF export."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from grpo_pipe.config.validate import ConfigError
from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.trainer.grpo import GRPOTrainer
from grpo_pipe.trainer.policy import FullFinetunePolicy, LoraPolicy
from grpo_pipe.trainer.shard_worker import deal
from grpo_pipe.trainer.sharded import ShardedTrainer
from grpo_pipe.types import Completion, RequestTelemetry, RolloutGroup, Task

TELEMETRY = RequestTelemetry(prompt_tokens=4, generated_tokens=3, cached_prompt_tokens=0)
# micro_batch_size=3 over 8 active samples: micro-batches of 3, 3, 2 -> rank 0 gets two, rank 1 one
# and an idle slot, so the uneven case (a zero-loss pass joining the collectives) is exercised.
SETTINGS = dict(steps=3, lr=1e-3, micro_batch_size=3, warmup_steps=0, grad_clip=1.0)


def _groups(seed: int = 0) -> tuple[list[RolloutGroup], list[float]]:
    gen = torch.Generator().manual_seed(seed)
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


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    import ray

    ray.init(num_cpus=3, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_path() -> Path:
    return TinyRandomModel().materialize()


def _single(path: Path, policy: object | None = None) -> GRPOTrainer:
    torch.manual_seed(0)
    trainer = GRPOTrainer(policy or FullFinetunePolicy(), **SETTINGS)
    trainer.setup(path, torch.device("cpu"), pad_id=0)
    return trainer


def _sharded(path: Path, world_size: int, policy: object | None = None) -> ShardedTrainer:
    trainer = ShardedTrainer(policy or FullFinetunePolicy(), world_size=world_size, **SETTINGS)
    trainer.setup(path, torch.device("cpu"), pad_id=0)
    return trainer


def test_deal_keeps_micro_batches_and_pads_every_rank_to_the_same_count() -> None:
    groups, rewards = _groups()
    plans, _ = ShardedTrainer(FullFinetunePolicy(), world_size=2, **SETTINGS).plan(groups, rewards, 1.0)
    sizes = [[len(chunk) for chunk in p.micro_batches] for p in plans]
    assert sizes == [[3, 2], [3, 0]]  # chunks 3, 3, 2 dealt round-robin; rank 1 idles once
    assert all(p.total == 12 and p.max_tokens == 4 for p in plans)  # whole-batch normalisers on every rank
    assert deal([], micro_batch_size=4, world_size=3) == [[], [], []]  # nothing to train: no pass at all


def test_unknown_setting_is_a_config_error_naming_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"trainer.world_sise: unknown setting .* allowed: world_size"):
        ShardedTrainer(FullFinetunePolicy(), world_sise=2)


@pytest.mark.slow
def test_two_ranks_match_one_device_and_resume_at_world_size_one(ray_local: None, model_path: Path, tmp_path: Path) -> None:
    import ray

    groups, rewards = _groups()
    single, sharded = _single(model_path), _sharded(model_path, world_size=2)
    try:
        # Gradients: the same full-batch gradient, gathered from the shards.
        want = single.accumulate_gradients(groups, rewards, temperature=1.0)
        plans, _ = sharded.plan(groups, rewards, 1.0)
        sums = ray.get([w.accumulate.remote(p) for w, p in zip(sharded.workers, plans)])
        assert sum(s["loss"] for s in sums) == pytest.approx(want["train/loss"], rel=1e-5)
        got = sharded.collect("full_state", "grads")
        expected = {n: p.grad for n, p in single.policy.module.named_parameters() if p.grad is not None}
        assert got.keys() == expected.keys() and any(g.abs().max() > 0 for g in got.values())
        for name, grad in expected.items():  # fp32, another summation order: equal to rounding
            torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-7)
        # A whole step: same loss, same global grad norm, same weights after the update.
        single.optimizer.zero_grad(set_to_none=True)
        one, two = single.step(groups, rewards, 1.0), sharded.step(groups, rewards, 1.0)
        assert two["train/loss"] == pytest.approx(one["train/loss"], rel=1e-5)
        assert two["train/grad_norm"] == pytest.approx(one["train/grad_norm"], rel=1e-4)
        assert sharded.version == single.version == 1
        _assert_same_weights(dict(sharded.policy.named_weights()), dict(single.policy.named_weights()))
        # Sharded checkpoint at world size 2, resumed at world size 1: the next step matches again.
        sharded.save_sharded(tmp_path / "ckpt")
        export = tmp_path / "export"
        sharded.policy.save_pretrained(export)
    finally:
        sharded.close()
    resumed = _sharded(model_path, world_size=1)
    try:
        resumed.load_sharded(tmp_path / "ckpt")
        assert resumed.version == 1
        groups2, rewards2 = _groups(seed=1)
        one, again = single.step(groups2, rewards2, 1.0), resumed.step(groups2, rewards2, 1.0)
        assert again["train/lr"] == pytest.approx(one["train/lr"])
        _assert_same_weights(dict(resumed.policy.named_weights()), dict(single.policy.named_weights()))
    finally:
        resumed.close()
    _assert_plain_hf_folder(export)


def _assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=1e-6)


def _assert_plain_hf_folder(folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    assert (folder / "config.json").exists() and (folder / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(folder)  # transformers loads it as any HF checkpoint
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.slow
def test_lora_two_ranks_match_one_device(ray_local: None, model_path: Path, tmp_path: Path) -> None:
    groups, rewards = _groups()
    lora = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
    single, sharded = _single(model_path, LoraPolicy(**lora)), _sharded(model_path, 2, LoraPolicy(**lora))
    try:
        single.step(groups, rewards, 1.0)  # B starts at zero: after one step the adapter is not a no-op
        two = sharded.step(groups, rewards, 1.0)
        assert two["train/update_applied"] == 1.0
        _assert_same_weights(dict(sharded.policy.named_weights()), dict(single.policy.named_weights()))
        sharded.policy.save_adapter(tmp_path / "adapter")
        single.policy.save_adapter(tmp_path / "single")
    finally:
        sharded.close()
    from safetensors.torch import load_file

    got, want = load_file(tmp_path / "adapter" / "adapter_model.safetensors"), load_file(tmp_path / "single" / "adapter_model.safetensors")
    _assert_same_weights(got, want)
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
