"""Test helper: a second set of weights for the tiny model."""

import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from grpo_pipe.models.files import copy_tokenizer_files


def other_weights(source: Path, out: Path) -> Path:
    """The tiny model's weights with every MLP scaled: the same names, clearly other outputs; a complete model
    folder, so a fresh engine can start on it."""
    out.mkdir()
    for file in source.glob("*.safetensors"):
        tensors = load_file(file)
        save_file({k: (v * 1.5 if ".mlp." in k else v).contiguous() for k, v in tensors.items()}, out / file.name)
    copy_tokenizer_files(source, out)
    for name in ("config.json", "generation_config.json"):
        if (source / name).exists():
            shutil.copy2(source / name, out / name)
    return out
