"""Benchmark: median sync latency and effective GB/s of each weight bridge, next to the raw limit
measured in the same run on the same bytes (a plain device copy for reload / ipc, a raw broadcast
between the same two peers for nccl, a cold engine start for checkpoint).

    python -m grpo_pipe.benchmarks.bridges --models tiny,smollm2-135m --bridges reload,lora,nccl,checkpoint
    python -m grpo_pipe.benchmarks.bridges --models qwen2.5-1.5b --bridges ipc,reload,lora,checkpoint   # GPU
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from grpo_pipe.bridges.contract import configured_bridges, push_weights
from grpo_pipe.bridges.nccl import BroadcastBridge
from grpo_pipe.config.sources import CONF_DIR
from grpo_pipe.models.random_architecture import benchmark_model
from grpo_pipe.rollout.engine_settings import FeatureSettings, LayoutSettings, MemorySettings
from grpo_pipe.rollout.vllm_engine import VllmEngine
from grpo_pipe.trainer.policy import FullFinetunePolicy, LoraPolicy
from grpo_pipe.trainer.precision import resolve_dtype

log = logging.getLogger("grpo_pipe.benchmarks")
ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda") if ON_GPU else torch.device("cpu")


def _sync() -> None:
    if ON_GPU:
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    fn()  # warm-up
    times, result = [], None
    for _ in range(repeats):
        _sync()
        start = time.perf_counter()
        result = fn()
        _sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def raw_copy_s(nbytes: int, repeats: int) -> float:
    """A plain copy of `nbytes` on the trainer's device: the floor for any bridge that copies."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    return timed(lambda: dst.copy_(src), repeats)[0]


def engine_memory_fraction(path: Path) -> float:
    """The engine's share of a GPU: the weights on `path` plus a few GiB for activations and the KV cache, and
    at least 0.2 (a fixed 0.2 leaves no KV cache for a 7B model on an 80 GB card)."""
    if not ON_GPU:
        return 0.2
    weight_bytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return max(0.2, (weight_bytes + 6 * 2**30) / torch.cuda.get_device_properties(0).total_memory)


def _engine(path: Path, bridge: str, options: dict[str, Any]) -> VllmEngine:
    # The engine runs where it runs by default (GPU: its own process; CPU: this one); nccl always gets a process
    # (and, with two GPUs, a GPU) of its own. Eager: sync cost does not depend on CUDA graphs, whose capture
    # would only lengthen every start (and the checkpoint bridge's restarts with their baseline alike).
    other_gpu = "1" if bridge == "nccl" and torch.cuda.device_count() > 1 else None
    engine = VllmEngine(
        max_model_len=512,
        memory=MemorySettings(kv_cache_gib=0.5, gpu_memory_utilization=engine_memory_fraction(path)),
        layout=LayoutSettings(in_process=False if bridge == "nccl" else None, device_ids=other_gpu),
        features=FeatureSettings(enforce_eager=True),
    )
    engine.connect(path, options)
    return engine


def _policy(kind: str, path: Path) -> Any:
    policy = LoraPolicy(rank=16, alpha=32) if kind == "lora" else FullFinetunePolicy()
    # The trainer in the engine's dtype (bf16 on a GPU), as the figures in BENCHMARKS.md were measured and as
    # weight_bridge=ipc needs; fp32 master weights add one cast per tensor to every bridge but ipc's gather.
    policy.load(path, DEVICE, resolve_dtype("bfloat16" if DEVICE.type == "cuda" else "float32", DEVICE))
    return policy


def _bridge(name: str) -> Any:
    """The bridge as `weight_bridge=<name>` builds it, from its yaml (defaults included)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"weight_bridge={name}"])
    return instantiate(cfg.weight_bridge, _convert_="all")


def bench_bridge(name: str, path: Path, repeats: int) -> dict[str, Any]:
    bridge = _bridge(name)
    if name == "nccl" and ON_GPU and torch.cuda.device_count() < 2:
        return {"bridge": name, "skipped": "needs two GPUs (engine and trainer on different devices)"}
    policy = _policy("lora" if name == "lora" else "full", path)
    cold_start = time.perf_counter()
    engine = _engine(path, name, bridge.engine_options())
    cold_start_s = time.perf_counter() - cold_start
    if name == "checkpoint":  # the baseline: a start with vLLM already imported, as every restart has it
        engine.shutdown()
        cold_start = time.perf_counter()
        engine.connect(path, bridge.engine_options())
        cold_start_s = time.perf_counter() - cold_start
    try:
        problems = bridge.check(engine, policy)
        if problems:
            return {"bridge": name, "skipped": "; ".join(problems)}
        bridge.connect(engine, policy)
        memory = _memory_after_connect()
        # A checkpoint sync restarts the engine: two repeats are plenty to see its cost.
        repeats_here = min(repeats, 2) if name == "checkpoint" else repeats
        median_s, stats = timed(_pusher(bridge, engine, policy), repeats_here)
        weight_bytes = stats.bytes_moved if name == "lora" else sum(
            t.numel() * t.element_size() for _, t in policy.named_weights()
        )
        row = {"bridge": name, "sync_ms": median_s * 1e3, "bytes": stats.bytes_moved, "weight_bytes": weight_bytes,
               "gather_ms": stats.gather_s * 1e3, "transport_ms": stats.transport_s * 1e3, "load_ms": stats.load_s * 1e3,
               "gb_per_s": stats.bytes_moved / median_s / 1e9 if stats.bytes_moved else None}
        row.update(_limit(name, bridge, stats.bytes_moved or weight_bytes, median_s, cold_start_s, repeats))
        if ON_GPU:
            row["resident_gib"] = memory
            row["sync_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        return row
    finally:
        bridge.close()
        engine.shutdown()
        del policy
        if ON_GPU:
            torch.cuda.empty_cache()


def _pusher(bridge: Any, engine: Any, policy: Any) -> Callable[[], Any]:
    """Syncs `policy` once per call, each time as the next version. A function of its own so that no
    closure in the caller keeps `policy` alive past its `del`."""
    version = iter(range(1, 10_000))
    return lambda: push_weights(bridge, engine, policy, next(version))


def _memory_after_connect() -> float | None:
    """GPU memory in use on the device, by every process (the engine's included), once engine and trainer
    are set up (weights, KV cache; optimizer state not yet created); the peak counter of this process
    restarts here so `sync_peak_gib` covers the syncs only."""
    if not ON_GPU:
        return None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def _limit(name: str, bridge: Any, nbytes: int, median_s: float, cold_start_s: float, repeats: int) -> dict[str, Any]:
    if name == "checkpoint":
        return {"limit": "cold engine start", "limit_ms": cold_start_s * 1e3, "ratio": median_s / cold_start_s}
    if name == "nccl":
        limit_s = timed(lambda: raw_broadcast(bridge, nbytes), repeats)[0]
        return {"limit": f"raw {bridge.resolved_backend} broadcast", "limit_ms": limit_s * 1e3, "ratio": median_s / limit_s}
    if name == "lora":
        return {"limit": "target 50 ms", "limit_ms": 50.0, "ratio": median_s / 0.05}
    limit_s = raw_copy_s(nbytes, repeats)
    return {"limit": "device copy", "limit_ms": limit_s * 1e3, "ratio": median_s / limit_s}


def raw_broadcast(bridge: BroadcastBridge, nbytes: int) -> None:
    """One flat broadcast of `nbytes` to the same engine worker, through the same group."""
    from grpo_pipe.bridges.nccl import _Call
    from grpo_pipe.transport.collective import broadcast

    engine = bridge.engine
    if engine is None:
        raise RuntimeError("raw_broadcast before the bridge connected")
    receiving = _Call(lambda: engine.call_workers("grpo_receive_raw", nbytes, timeout_s=bridge.timeout_s))
    broadcast(bridge._group, torch.empty(nbytes, dtype=torch.uint8, device=DEVICE))
    receiving.wait(bridge.timeout_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,smollm2-135m")
    parser.add_argument("--bridges", default=",".join(configured_bridges()), help="options of conf/weight_bridge/")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows = []
    for model in args.models.split(","):
        path = benchmark_model(model)
        for name in args.bridges.split(","):
            row = {"model": model, **bench_bridge(name, path, args.repeats)}
            rows.append(row)
            print(format_row(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


def format_row(row: dict[str, Any]) -> str:
    if "skipped" in row:
        return f"{row['model']:>14} {row['bridge']:>10}  skipped: {row['skipped']}"
    gbps = f"{row['gb_per_s']:.2f} GB/s" if row.get("gb_per_s") else "0 bytes moved"
    peak = (f"  device in use {row['resident_gib']:.2f} GiB, trainer sync peak {row['sync_peak_gib']:.2f} GiB"
            if "resident_gib" in row else "")
    return (f"{row['model']:>14} {row['bridge']:>10}  sync {row['sync_ms']:9.2f} ms  {gbps:>14}  "
            f"{row['limit']}: {row['limit_ms']:.2f} ms  ratio {row['ratio']:.2f}x{peak}")


if __name__ == "__main__":
    main()
