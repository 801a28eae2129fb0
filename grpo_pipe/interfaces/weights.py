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
        """A full Hugging Face checkpoint (LoRA merged), cast to `dtype` when given.

        Args:
            path: The folder to write the checkpoint into (a bridge's restart folder, a best-model export).
            dtype: The dtype to cast the weights to (the engine's), or None to keep the policy's own.
        """
        ...


@runtime_checkable
class ModulePolicy(Policy, Protocol):
    """A policy whose model is one module the trainer updates in place (with `AdapterPolicy`: an adapter on it).

    Attributes:
        module: The loaded model the trainer updates; None until loaded.
    """

    module: torch.nn.Module | None  # None until loaded


@runtime_checkable
class AdapterPolicy(Protocol):
    """A policy that trains a LoRA adapter on a frozen base, and can save the adapter alone.

    Attributes:
        rank: The adapter's LoRA rank (an engine serving it must allow adapters of this rank).
    """

    rank: int

    def save_adapter(self, path: Path, dtype: torch.dtype | None = None) -> None:
        """The adapter alone, in peft's format, for an engine that loads adapters from a folder.

        Args:
            path: The folder to write the adapter into.
            dtype: The dtype to cast the adapter to (the engine's), or None to keep the policy's own.
        """
        ...

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
        """Join the group whose store listens at host:port as the sending rank; returns once all joined.

        Args:
            backend: The collective backend (`nccl` on GPUs, `gloo` on CPUs).
            host: Address of the group's rendezvous store.
            port: Port of the group's rendezvous store.
            timeout_s: How long to wait for every rank to join before giving up.
            world_size: Ranks in the group: the sender plus every engine worker.
        """
        ...

    def broadcast_weights(self, wire_plan: list[dict[str, Any]]) -> dict[str, float]:
        """Broadcast every bucket of the plan, each tensor cast to its bucket's dtype. Returns `gather_s`
        (assembling full tensors from shards) and `send_s` (the whole broadcast).

        Args:
            wire_plan: The buckets in sending order (their tensors' names and shapes, the bucket's dtype), as the
                bridge planned them from `weight_specs`; the engine's workers receive the same plan.
        """
        ...

    def close_weight_group(self) -> None: ...


@runtime_checkable
class WeightBridge(Protocol):
    """Moves trained weights into the live engine.

    The contract the caller keeps (`grpo_pipe.bridges.contract.push_weights`), so no bridge repeats it:
    it pushes only every `sync_every` versions, times the whole sync and records the version the engine
    serves afterwards. A bridge only moves the weights and reports the phases only it can see.

    Attributes:
        sync_every: Optimizer steps between syncs (samples in between are off-policy, corrected by the ratio).
    """

    sync_every: int

    def check(self, engine: RolloutEngine, policy: object) -> list[str]:
        """Config problems (e.g. needs a GPU, needs an in-process engine); reported before anything loads.

        Args:
            engine: The configured engine, not started: the bridge asks it for the capabilities it needs.
            policy: The configured policy, not loaded (a LoRA bridge needs a LoRA policy).
        """
        ...

    def engine_options(self) -> dict[str, Any]:
        """Extra engine settings this bridge needs (e.g. enable_lora); applied when the engine starts."""
        ...

    def connect(self, engine: RolloutEngine, policy: Policy) -> None:
        """Set up the transport once both sides exist (a collective group, shared memory, a folder).

        Args:
            engine: The live engine the bridge pushes into, started with `engine_options`.
            policy: The loaded policy whose weights the bridge will send.
        """
        ...

    def push(self, policy: Policy, version: int) -> SyncStats:
        """Move the policy's current weights into the engine; the phases only the bridge sees are in the stats.

        Args:
            policy: The policy to send, as the trainer left it after its update.
            version: The policy version being pushed (the trainer's `version`), for the bridge's own records.
        """
        ...

    def close(self) -> None:
        """Release the transport (groups, mapped memory, folders); the engine itself is the runner's to stop."""
        ...
