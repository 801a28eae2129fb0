"""The dtype names a config may use, and the one map from those names to torch dtypes."""

from __future__ import annotations

from typing import Literal

import torch

DtypeName = Literal["auto", "float32", "bfloat16", "float16"]  # auto: the component picks for its device
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
