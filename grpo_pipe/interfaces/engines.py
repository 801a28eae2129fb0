"""Rollout engines, and the capabilities a weight bridge may ask of one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from grpo_pipe.types import (
    Completion,
    GeneratedBatch,
    SamplingSettings,
)


@runtime_checkable
class PendingRollout(Protocol):
    """A generation call that may still be running (on another process, device or machine)."""

    def result(self) -> GeneratedBatch:
        """Block until it is done."""
        ...


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates completions from token ids. It knows nothing about rewards or training.

    Calls take effect in the order they are made: a generation submitted after a weight sync uses
    the new weights, one submitted before it uses the old ones. The async loop relies on this.
    """

    @property
    def served_version(self) -> int:
        """Policy version of the weights the engine generates with (set by `bridges.contract.push_weights`)."""
        ...

    @served_version.setter
    def served_version(self, version: int) -> None: ...

    @property
    def model_path(self) -> Path | None:
        """The folder it was started on (None before `connect`)."""
        ...

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype it holds weights in (bridges convert before sending)."""
        ...

    @property
    def in_process(self) -> bool:
        """True when the engine's model lives in this process."""
        ...

    @property
    def max_model_len(self) -> int:
        """Prompt + completion tokens one request may hold."""
        ...

    @property
    def enable_sleep_mode(self) -> bool:
        """Whether `sleep` can free the engine's memory."""
        ...

    def connect(self, model_path: Path, options: dict[str, Any] | None = None) -> None:
        """Start the engine on a model folder (the heavy step: construction only records settings).

        Args:
            model_path: The local Hugging Face model folder the model source materialized.
            options: Extra engine settings the bridge, the policy or the placement need (e.g. `enable_lora`),
                merged over the configured ones; None for none.
        """
        ...

    def generate(
        self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
    ) -> list[list[Completion]]:
        """For prompt i return `samples[i]` completions, tagged with `served_version`.

        Args:
            prompts: The prompts' token ids, already rendered in the chat template (tokens in, tokens out).
            samples: How many completions each prompt gets (the curriculum may give tasks different counts).
            sampling: Temperature, token budget and the other sampling settings of this call.
        """
        ...

    def submit(
        self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
    ) -> PendingRollout:
        """Like `generate`, without waiting where the engine runs elsewhere.

        Args:
            prompts: The prompts' token ids, as for `generate`.
            samples: How many completions each prompt gets.
            sampling: The sampling settings of this call.
        """
        ...

    def sleep(self, level: int) -> None:
        """Free the engine's GPU memory while the trainer runs (vLLM sleep mode).

        Args:
            level: vLLM's sleep level (the placement's `sleep_level`): 0 keeps the memory, 1 moves the weights to host
                memory and drops the KV cache, 2 drops both (the next push brings the weights back).
        """
        ...

    def wake_up(self) -> None:
        """Take the memory `sleep` freed back before the next generation."""
        ...

    def shutdown(self) -> None:
        """Stop the engine and release its processes and memory."""
        ...


@runtime_checkable
class InProcessModelEngine(Protocol):
    """An engine whose model lives in this process, so a bridge can hand it tensors directly (a capability
    users' own bridges ask for: see the README's extension example)."""

    @property
    def in_process(self) -> bool: ...  # false when the same class was started in its own process

    @property
    def weight_dtype(self) -> torch.dtype: ...

    def reload_weights(self, weights: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors into the live model (vLLM fuses qkv / gate_up itself).

        Args:
            weights: (name, tensor) pairs under Hugging Face checkpoint names, in the engine's weight dtype.
        """
        ...


@runtime_checkable
class WorkerRpcEngine(Protocol):
    """An engine whose workers run bridge code (`worker_extension_cls`), wherever they live."""

    def call_workers(self, method: str, *args: Any, timeout_s: float | None = None) -> list[Any]:
        """Run a worker-extension method in every engine worker; one result per worker.

        Args:
            method: The name of the worker-extension method (e.g. `grpo_open_weight_group`).
            *args: Passed to the method in every worker as they are (picklable where the workers run elsewhere).
            timeout_s: How long to wait for every worker's answer; None waits as long as the engine allows.
        """
        ...

    def after_external_weight_update(self) -> None:
        """Tell the engine its weights changed behind its back: requests from now on get a fresh prefix cache."""
        ...

    def is_running(self) -> bool:
        """Whether the engine's workers can still be called (false after `shutdown` or a crash)."""
        ...

    def worker_count(self) -> int:
        """How many workers `call_workers` reaches (all replicas together)."""
        ...


@runtime_checkable
class LocalEngine(InProcessModelEngine, WorkerRpcEngine, Protocol):
    """An engine on the trainer's machine: its model lives in this process, or in an engine process that maps
    memory the trainer shares with it. What `reload`, `ipc` and LoRA adapters handed over in memory ask for;
    an engine behind Ray, on other machines, is none."""

    @property
    def device_ids(self) -> str | None: ...  # GPUs of an engine process of its own: set = not the trainer's device

    @property
    def on_gpu(self) -> bool: ...

    @property
    def enable_sleep_mode(self) -> bool: ...

    def call_workers_in_process(self, fn: Callable[[Any], Any]) -> Any:
        """Call `fn(worker)` on the worker of an engine in this process; its result as is (tensors included).

        Args:
            fn: A function of the vLLM worker; nothing is pickled, so it may close over tensors.
        """
        ...


@runtime_checkable
class AdapterEngine(Protocol):
    """An engine that serves LoRA adapters loaded while it runs."""

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype the engine computes adapters in (vLLM's LoRA dtype follows the model's)."""
        ...

    def use_adapter(self, name: str, adapter_id: int, folder: Path) -> None:
        """Load the adapter saved in `folder` and serve every following request with it.

        Args:
            name: The adapter's name in the engine (one per pushed version, e.g. `policy-v3`).
            adapter_id: vLLM's integer id for it; a new id makes the engine load it instead of reusing a slot.
            folder: Where `AdapterPolicy.save_adapter` wrote it.
        """
        ...

    def retire_adapter(self, adapter_id: int) -> None:
        """Free the adapter's slot once no running request uses it.

        Args:
            adapter_id: The id `use_adapter` or `serve_adapter` loaded it under.
        """
        ...


@runtime_checkable
class MemoryAdapterEngine(AdapterEngine, LocalEngine, Protocol):
    """An engine on this machine whose workers build each adapter from memory they mapped once (`weight_bridge=lora`
    with `transport: memory`): no folder is written or read."""

    def call_workers(self, method: str, *args: Any, timeout_s: float | None = None, changes_weights: bool = True
                     ) -> list[Any]:
        """As `WorkerRpcEngine.call_workers`; `changes_weights=False` for calls that leave the weights alone
        (building an adapter), so cached prefixes stay valid.

        Args:
            method: The name of the worker-extension method.
            *args: Passed to the method in every worker.
            timeout_s: How long to wait for every worker's answer; None waits as long as the engine allows.
            changes_weights: False when the call leaves the served weights as they are.
        """
        ...

    def serve_adapter(self, name: str, adapter_id: int) -> None:
        """Serve every following request with an adapter the workers already built.

        Args:
            name: The adapter's name in the engine.
            adapter_id: The id the workers built it under.
        """
        ...


@runtime_checkable
class GeneratesInBackground(Protocol):
    """An engine in the trainer's process that can generate on a thread of its own, so that the trainer
    trains while the next batch is generated; None = not decided by the config (the runner decides).

    Attributes:
        background: True: generate on a thread of its own; False: in the caller's thread; None: the runner decides.
    """

    background: bool | None
