"""The trained policy as a weight bridge sees it, and the bridge itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from grpo_pipe.interfaces.engines import RolloutEngine
from grpo_pipe.types import (
    SyncStats,
)


@runtime_checkable
class Policy(Protocol):
    """The trainable model as the bridges see it."""

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full-model weights under Hugging Face checkpoint names (LoRA merged where relevant)."""
        ...

    def save_pretrained(self, path: Path, dtype: torch.dtype | None = None) -> None:
        """A full Hugging Face checkpoint (LoRA merged), cast to `dtype` when given."""
        ...


@runtime_checkable
class ModulePolicy(Policy, Protocol):
    """A policy whose model is one module the trainer updates in place (with `AdapterPolicy`: an adapter on it)."""

    module: torch.nn.Module | None  # None until loaded


@runtime_checkable
class AdapterPolicy(Protocol):
    """A policy that trains a LoRA adapter on a frozen base, and can save the adapter alone."""

    rank: int

    def save_adapter(self, path: Path, dtype: torch.dtype | None = None) -> None: ...

    def adapter_tensors(self) -> dict[str, torch.Tensor]:
        """The adapter's tensors under peft's names, as `save_adapter` writes them."""
        ...

    def adapter_config(self) -> dict[str, Any]:
        """peft's adapter config as plain data, as `save_adapter` writes it."""
        ...


@runtime_checkable
class SendingPolicy(Policy, Protocol):
    """A policy whose weights live in other processes (the sharded trainer's ranks) and that can join a bridge's
    collective group as its sending rank, so a sync never carries the whole model through this process."""

    @property
    def sends_own_weights(self) -> bool:
        """False where the weights must be assembled here first (a LoRA adapter merged into its base)."""
        ...

    def weight_specs(self) -> list[tuple[str, tuple[int, ...]]]:
        """Names and shapes of `named_weights`, in its order, without gathering a tensor."""
        ...

    def open_weight_group(self, backend: str, host: str, port: int, timeout_s: float, world_size: int) -> None:
        """Join the group whose store listens at host:port as the sending rank; returns once all joined."""
        ...

    def broadcast_weights(self, wire_plan: list[dict[str, Any]]) -> dict[str, float]:
        """Broadcast every bucket of the plan, each tensor cast to its bucket's dtype. Returns `gather_s`
        (assembling full tensors from shards) and `send_s` (the whole broadcast)."""
        ...

    def close_weight_group(self) -> None: ...


@runtime_checkable
class WeightBridge(Protocol):
    """Moves trained weights into the live engine.

    The contract the caller keeps (`grpo_pipe.bridges.contract.push_weights`), so no bridge repeats it:
    it pushes only every `sync_every` versions, times the whole sync and records the version the engine
    serves afterwards. A bridge only moves the weights and reports the phases only it can see.
    """

    sync_every: int

    def check(self, engine: RolloutEngine, policy: object) -> list[str]:
        """Config problems (e.g. needs a GPU, needs an in-process engine); reported before anything loads."""
        ...

    def engine_options(self) -> dict[str, Any]:
        """Extra engine settings this bridge needs (e.g. enable_lora); applied when the engine starts."""
        ...

    def connect(self, engine: RolloutEngine, policy: Policy) -> None: ...

    def push(self, policy: Policy, version: int) -> SyncStats: ...

    def close(self) -> None: ...
