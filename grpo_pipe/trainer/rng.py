"""Every random generator a training step may draw from, saved and put back, so that a resumed run draws what the
uninterrupted one would have: torch's CPU and CUDA generators, numpy's global one, Python's `random`. Kept as tensors
and plain types, so a checkpoint loads with `weights_only=True` (no pickled objects, no code run on load)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """Every random generator a training step may draw from, as tensors and plain types
    (loadable with `weights_only=True`): torch CPU, every CUDA device, numpy's global, Python's `random`."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()  # type: ignore[misc]
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": _to_lists(random.getstate()),
    }


def restore_rng(state: Mapping[str, Any]) -> None:
    """Put back what `rng_state` recorded (CUDA only when this machine has the same devices)."""
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    numpy = state["numpy"]
    keys = numpy["keys"].numpy().astype(np.uint32)
    np.random.set_state((numpy["kind"], keys, numpy["pos"], numpy["has_gauss"], numpy["cached_gaussian"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def _to_lists(value: Any) -> Any:
    return [_to_lists(v) for v in value] if isinstance(value, tuple) else value
