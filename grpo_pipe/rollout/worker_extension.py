"""Code that runs inside vLLM's worker: the base of every bridge's engine-side half, and the engine's own calls.

vLLM mixes a class into its worker (`worker_extension_cls`) and calls its methods by name through
`collective_rpc`, in whichever process the worker lives. A bridge with an engine-side half (broadcast,
shared buckets, adapters, exported weights) defines it in its own module as a subclass of `EngineWorker`
and names it in `engine_options()`; an engine whose bridge has none gets `EngineOwnCalls`. So a new bridge
touches no shared file.

vLLM injects each class into the worker *class*, so in one process (engines in the trainer's process, as in
tests and benchmarks) the halves of several bridges accumulate there, and vLLM refuses one that repeats an
attribute already present. Hence `EngineWorker` declares types only, and every half's methods carry names
of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from grpo_pipe.rollout.worker_weights import refresh_cpu_tied_lm_head


class EngineWorker:
    """The vLLM worker as the halves see it; `self` is the worker. Annotations only (see above)."""

    # Provided by the vLLM Worker this class is mixed into (declared only, for the type checker: a value
    # here would clash with the Worker's own attribute, which vLLM refuses).
    device: torch.device  # read behind hasattr: not every worker kind sets it
    model_runner: Any  # its `.model` is the live nn.Module with vLLM's `load_weights`
    reload_weights: Callable[..., None]  # vLLM's reload through its weight loader (CPU: repacks for oneDNN)


class EngineOwnCalls(EngineWorker):
    """What the engine itself calls by name, when its bridge brings no half of its own."""

    def grpo_refresh_tied_head(self) -> bool:
        """After vLLM's own `reload_weights` on a CPU (by name: the engine may live in another process)."""
        return refresh_cpu_tied_lm_head(self)


def worker_extension(cls: type[EngineWorker]) -> dict[str, Any]:
    """The engine option that mixes `cls` into vLLM's worker: what a bridge's `engine_options()` returns."""
    return {"worker_extension_cls": f"{cls.__module__}.{cls.__qualname__}"}


ENGINE_OWN_CALLS = worker_extension(EngineOwnCalls)["worker_extension_cls"]
