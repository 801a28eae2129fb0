"""Statistics kept on the device until a pass ends, then read in one transfer.

Each `float(tensor)` on a GPU waits for every kernel queued before it: read per micro-batch, the statistics of the
loss and of the trainer/sampler mismatch made the host wait about twenty times a micro-batch, and the card idled
while the host queued the next one (BENCHMARKS.md, "The trainer alone"). Records here hold 0-dim tensors while
the pass runs; `read` turns all of them into floats with one copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

import torch

Record = TypeVar("Record")


def read(records: Sequence[Record]) -> list[Record]:
    """The records (dataclass instances) with every tensor field replaced by its float, read in one transfer."""
    found: list[tuple[int, str, torch.Tensor]] = [
        (index, field.name, value)
        for index, record in enumerate(records)
        for field in dataclasses.fields(record)  # type: ignore[arg-type]
        if isinstance(value := getattr(record, field.name), torch.Tensor)
    ]
    if not found:
        return list(records)
    values = torch.stack([tensor.detach().reshape(()).double() for _, _, tensor in found]).tolist()
    changes: dict[int, dict[str, Any]] = {}
    for (index, name, _), value in zip(found, values):
        changes.setdefault(index, {})[name] = value
    return [dataclasses.replace(record, **changes.get(index, {}))  # type: ignore[type-var]
            for index, record in enumerate(records)]
