"""What a placement asks of the machine, checked before anything loads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable


@runtime_checkable
class ShardedTraining(Protocol):
    """A trainer whose ranks run in Ray actors on devices of their own (`trainer=fsdp`)."""

    world_size: int

    def gpus_needed(self, cuda: bool) -> int:
        """GPUs the ranks reserve.

        Args:
            cuda: Whether the machine has GPUs (none are reserved on a CPU cluster).
        """
        ...


def gpu_problems(needs: Mapping[str, int], available: int) -> list[str]:
    """One problem naming every consumer when together they need more GPUs than there are."""
    total = sum(needs.values())
    if total <= available:
        return []
    parts = ", ".join(f"{who} {n}" for who, n in needs.items() if n)
    return [f"this placement needs {total} GPUs ({parts}) and this machine has {available}"]

