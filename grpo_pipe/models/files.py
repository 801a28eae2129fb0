"""Files of a model folder: the tokenizer files a fresh engine needs, a folder's size, a replace that is never half
done; used by the model sources and by the bridges that hand weights over through files."""

from __future__ import annotations

import shutil
from pathlib import Path

# Everything a fresh engine needs besides config.json and the weights the policy writes itself.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def copy_tokenizer_files(source: Path, target: Path) -> None:
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy2(source / name, target / name)


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def replace_atomically(tmp: Path, final: Path) -> None:
    """Rename a fully written folder into place, so a crash never leaves a half-written one."""
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
