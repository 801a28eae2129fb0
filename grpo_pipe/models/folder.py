"""What every model source shares: its folder, found or built once, and the tokenizer that comes with it.

A source says how to get its folder in `fetch_folder`. The recipe asks the source, not the folder, for the
tokenizer it renders prompts with and for the tokenizer files an exported policy needs beside its weights, so how
a model folder's tokenizer is read (its custom code trusted exactly when the source consented) is decided here, once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_pipe.models.custom_code import loader_options
from grpo_pipe.models.files import copy_tokenizer_files


class FolderModelSource:
    """`materialize`, `tokenizer` and `copy_tokenizer` of the `ModelSource` Protocol, over `fetch_folder`."""

    _folder: Path | None = None  # set by the first `materialize`: a source hands out one folder for its lifetime

    def fetch_folder(self) -> Path:
        """Find, download or build the model folder (called once per source, by `materialize`)."""
        raise NotImplementedError

    def materialize(self) -> Path:
        # Once: a hub source asked again could fall back to another folder (or reach the network again).
        if self._folder is None:
            self._folder = self.fetch_folder()
        return self._folder

    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        folder = self.materialize()
        return AutoTokenizer.from_pretrained(folder, **loader_options(folder))

    def copy_tokenizer(self, folder: Path) -> None:
        copy_tokenizer_files(self.materialize(), folder)
