"""Models whose `config.json` names Python code of their own (`auto_map`).

Consent is asked once, by the model source (`model=hf` refuses such a folder unless
`model.trust_remote_code=true`); every loader of the folder it hands out (engine, tokenizer, trainer,
each sharded rank) then asks here, so they all agree without passing a flag through each component.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def runs_custom_code(folder: Path) -> bool:
    """True when the model folder's config names its own modelling code."""
    try:
        return "auto_map" in json.loads((Path(folder) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False


def loader_options(folder: Path) -> dict[str, Any]:
    """Keyword arguments for transformers' and vLLM's loaders of `folder`."""
    return {"trust_remote_code": True} if runs_custom_code(folder) else {}
