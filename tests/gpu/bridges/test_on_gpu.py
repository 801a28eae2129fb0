"""The fresh-engine check for the CPU-capable bridges, repeated on a GPU in bf16 with the GPU defaults (engine
core in its own process, CUDA graphs): exact equality, since the same weights, settings and batch run the same
kernels."""

import time

import pytest
import torch

from grpo_pipe.bridges.contract import push_weights
from grpo_pipe.runner.pipeline import build
from grpo_pipe.types import SamplingSettings
from tests.bridge_equality import GREEDY, divergence, fresh_greedy, greedy, train_sync_and_compare

# A small max_num_seqs keeps CUDA-graph capture (one graph per batch size) short in tests.
GPU = ["data=gsm8k", "data.path=tests/fixtures/gsm8k", "data.train_file=test.jsonl", "rollout.dtype=bfloat16",
       "trainer.precision.dtype=bfloat16", "rollout.memory.gpu_memory_utilization=0.15", "rollout.memory.max_num_seqs=16"]


@pytest.mark.parametrize(
    ("bridge", "fresh_from"),
    [(["weight_bridge=reload", "trainer.optimisation.lr=2e-3"], "merged"),
     (["weight_bridge=checkpoint", "trainer.optimisation.lr=2e-3"], "merged"),
     (["weight_bridge=lora", "trainer.optimisation.lr=5e-3", "policy.rank=8", "policy.alpha=16"], "adapter")],
    ids=["reload", "checkpoint", "lora"],
)
def test_bridge_matches_a_fresh_engine_on_gpu(compose_cfg, tmp_path, bridge, fresh_from) -> None:
    cfg = compose_cfg([*GPU, *bridge])
    # the defaults: out of process, graphs
    assert cfg.rollout.layout.in_process is None and cfg.rollout.features.enforce_eager is None
    train_sync_and_compare(cfg, tmp_path / "saved", fresh_from)


def test_an_engine_process_with_cuda_graphs_sleeps_and_wakes_with_the_same_outputs(compose_cfg) -> None:
    from hydra.utils import instantiate

    from grpo_pipe.models.tiny_random import TinyRandomModel

    engine = instantiate(compose_cfg([*GPU, "rollout.memory.enable_sleep_mode=true"]).rollout, _convert_="all")
    assert engine.in_process is False
    engine.connect(TinyRandomModel().materialize())
    try:
        prompts = [[3 + (7 * i + j) % 300 for j in range(20)] for i in range(4)]
        before = [g[0].token_ids for g in engine.generate(prompts, [1] * 4, GREEDY)]
        free_awake = torch.cuda.mem_get_info()[0]
        engine.sleep(1)
        assert torch.cuda.mem_get_info()[0] > free_awake  # the engine process gave memory back
        engine.wake_up()
        assert [g[0].token_ids for g in engine.generate(prompts, [1] * 4, GREEDY)] == before
    finally:
        engine.shutdown()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs: trainer on one, engine process on the other")
def test_nccl_broadcast_to_an_engine_on_another_gpu_matches_a_fresh_engine(compose_cfg, tmp_path) -> None:
    cfg = compose_cfg([*GPU, "weight_bridge=nccl", "weight_bridge.bucket_mb=64", "rollout.layout.in_process=false",
                       "rollout.layout.device_ids='1'", "trainer.optimisation.lr=2e-3"])
    stats = train_sync_and_compare(cfg, tmp_path / "saved", push_every_step=True)  # the second on the first's plan
    assert stats.bytes_moved > 0


# Long enough that every sample is still running when the push lands (ignore_eos), within the tiny config's context.
ENDLESS = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=480, seed=5, extra={"ignore_eos": True})


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs: trainer on one, engine process on the other")
def test_an_nccl_sync_that_lands_mid_generation_leaves_the_engine_equal_to_a_fresh_one(compose_cfg, tmp_path) -> None:
    """The engine generates on its own thread (engine core in its own process on GPU 1, CUDA graphs, bf16); the
    trainer's push over NCCL lands between two engine steps of that generation: the running samples switch to the new
    weights at a recorded token, and afterwards the engine serves exactly what a fresh engine on those weights serves."""
    cfg = compose_cfg([*GPU, "weight_bridge=nccl", "rollout.layout.in_process=false", "rollout.layout.device_ids='1'",
                       "rollout.layout.background=true", "rollout_scheduler.max_staleness=1"])
    parts = build(cfg)
    engine, trainer, bridge = parts.rollout, parts.trainer, parts.weight_bridge
    model_path = parts.model.materialize()
    prompts = [[3 + (11 * i + 5 * j) % 400 for j in range(24)] for i in range(6)]
    engine.connect(model_path, bridge.engine_options())
    try:
        trainer.setup(model_path, parts.placement.trainer_device(), pad_id=parts.model.tokenizer().pad_token_id)
        bridge.connect(engine, trainer.policy)
        before = greedy(engine, prompts)
        with torch.no_grad():  # other weights under the same names: the new version clearly speaks differently
            for name, weight in trainer.policy.named_weights():
                if ".mlp." in name:
                    weight.mul_(1.5)
        pending = engine.submit(prompts, [2] * len(prompts), ENDLESS)
        deadline = time.monotonic() + 120
        while engine.generation_steps() < 3:  # a few tokens on the old weights first
            assert time.monotonic() < deadline, "the background generation never got going"
            time.sleep(0.001)
        stats = push_weights(bridge, engine, trainer.policy, 1)
        during = pending.result().completions
        live = greedy(engine, prompts)
        trainer.policy.save_pretrained(tmp_path / "saved")
        parts.model.copy_tokenizer(tmp_path / "saved")
    finally:
        bridge.close()
        engine.shutdown()
        parts.placement.close()
    assert stats.bytes_moved > 0 and engine.served_version == 1
    switched = [c for group in during for c in group if c.version_switches]
    assert switched, "the push did not land while samples were running"
    assert all(c.policy_version == 0 and c.version_switches[-1][1] == 1 for c in switched)
    fresh = fresh_greedy(cfg, tmp_path / "saved", prompts)
    assert live == fresh, f"after an in-flight sync the engine differs from a fresh one: {divergence(live, fresh)}"
    assert live != before


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs: one tensor-parallel engine spans both")
def test_a_tensor_parallel_engine_after_reload_matches_a_fresh_tensor_parallel_engine(compose_cfg, tmp_path) -> None:
    # Each tensor-parallel worker maps the trainer's buckets (CUDA IPC) and loads its own shard through vLLM's loader.
    cfg = compose_cfg([*GPU, "weight_bridge=reload", "rollout.layout.tensor_parallel_size=2", "trainer.optimisation.lr=2e-3"])
    train_sync_and_compare(cfg, tmp_path / "saved", push_every_step=True)


@pytest.mark.skipif(torch.cuda.device_count() < 3,
                    reason="needs three GPUs: the trainer on one and a tensor-parallel engine on two others (NCCL puts "
                           "one rank on a GPU)")
def test_a_tensor_parallel_engine_after_nccl_matches_a_fresh_tensor_parallel_engine(compose_cfg, tmp_path) -> None:
    # Every tensor-parallel worker receives every bucket in one broadcast and loads its shard of it.
    cfg = compose_cfg([*GPU, "weight_bridge=nccl", "rollout.layout.in_process=false", "rollout.layout.device_ids='1,2'",
                       "rollout.layout.tensor_parallel_size=2", "trainer.optimisation.lr=2e-3"])
    stats = train_sync_and_compare(cfg, tmp_path / "saved", push_every_step=True)
    assert stats.bytes_moved > 0


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason="needs two GPUs: a sharded trainer's rank on one, the engine on another")
def test_a_sharded_trainer_broadcasts_over_nccl_from_its_rank_into_an_engine_equal_to_a_fresh_one(
        compose_cfg, tmp_path) -> None:
    """`trainer=fsdp` with `nccl`: rank 0 joins the bridge's group and broadcasts from its own GPU, bucket by bucket,
    each tensor gathered from the shards on the way (two ranks from three GPUs up, one rank on two)."""
    ranks = min(torch.cuda.device_count() - 1, 2)
    cfg = compose_cfg([*GPU, "placement=split", "trainer=fsdp", f"trainer.world_size={ranks}", "weight_bridge=nccl",
                       "trainer.optimisation.lr=2e-3"])
    stats = train_sync_and_compare(cfg, tmp_path / "saved", push_every_step=True)
    assert stats.bytes_moved > 0 and stats.gather_s > 0
