import time

import pytest
import torch

from grpo_pipe.transport.collective import by_bucket, host_store, open_group, pack, plan_buckets, unpack
from tests.bridge_equality import train_sync_and_compare


def test_broadcast_over_gloo_to_an_engine_process_matches_a_fresh_engine(compose_cfg, tmp_path) -> None:
    # rollout.layout.in_process=false: the engine (and its worker) run in their own process.
    cfg = compose_cfg(["weight_bridge=nccl", "weight_bridge.bucket_mb=1", "rollout.layout.in_process=false",
                       "trainer.optimisation.lr=2e-3"])
    stats = train_sync_and_compare(cfg, tmp_path / "saved")
    assert stats.bytes_moved > 0 and stats.transport_s > 0


def test_buckets_pack_and_unpack_exactly() -> None:
    weights = [("a", torch.randn(3, 4)), ("b", torch.randn(700)), ("c", torch.randn(2, 2))]
    buckets = plan_buckets(weights, bucket_bytes=1024)
    assert [len(b.specs) for b in buckets] == [1, 1, 1]  # b alone exceeds a bucket; c cannot join it
    assert by_bucket(["a", "b", "c"], buckets) == [["a"], ["b"], ["c"]]  # one run of items per bucket, in plan order
    merged = plan_buckets(weights, bucket_bytes=10_000)
    assert len(merged) == 1
    restored = unpack(pack(merged[0], [t for _, t in weights]), merged[0])
    for (name, tensor), (name2, tensor2) in zip(weights, restored):
        assert name == name2 and torch.equal(tensor, tensor2)
    # Packing casts to the bucket's dtype on the way (the trainer's fp32 master weights, a bf16 engine).
    half = plan_buckets([(n, t.to(torch.bfloat16)) for n, t in weights], bucket_bytes=10_000)[0]
    for (_, tensor), (_, packed) in zip(weights, unpack(pack(half, [t for _, t in weights]), half)):
        assert packed.dtype == torch.bfloat16 and torch.equal(packed, tensor.to(torch.bfloat16))


def test_a_peer_that_never_joins_is_an_error_within_the_timeout() -> None:
    store = host_store("127.0.0.1", timeout_s=2.0, world_size=2)
    started = time.perf_counter()
    with pytest.raises(torch.distributed.DistError):  # the store's wait times out (DistStoreError)
        open_group(store, "gloo", timeout_s=2.0, world_size=2)
    assert time.perf_counter() - started < 15
