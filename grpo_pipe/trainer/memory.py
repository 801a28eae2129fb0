"""The trainer's GPU memory, read where the trainer runs: the runner's process, or each rank of a sharded trainer."""

from __future__ import annotations

import torch


def memory_metrics(device: torch.device | None) -> dict[str, float]:
    """GPU memory in use on the trainer's device (all processes) and the trainer's own peak there. Named, not the
    process's current device: with placement=split the trainer's card is not the first one, and the first one is
    an engine's. None (a trainer whose ranks are other processes: they report their own) or a CPU: nothing."""
    if device is None or device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    return {"memory/device_used_gib": (total - free) / 2**30, "memory/trainer_peak_gib": peak / 2**30}
