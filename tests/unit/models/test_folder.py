"""A model source hands out one folder, the tokenizer read from it, and its tokenizer files for a saved policy.
The tiny model stands in for every source (each shipped one is a `FolderModelSource`); a folder with its own code,
whose tokenizer loads only when trusted, is in tests/integration/models/test_hf.py."""

from __future__ import annotations

import shutil
from pathlib import Path

from transformers import AutoTokenizer

from grpo_pipe.models.folder import FolderModelSource
from grpo_pipe.models.tiny_random import TinyRandomModel

CHAT = [{"role": "user", "content": "what is 12 + 3"}]


class CountedFolder(FolderModelSource):
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.fetches = 0

    def fetch_folder(self) -> Path:
        self.fetches += 1
        return self.folder


def test_a_source_fetches_its_folder_once_and_reads_its_tokenizer_from_that_folder(tmp_path: Path) -> None:
    folder = TinyRandomModel().materialize()
    source = CountedFolder(folder)
    assert source.materialize() == folder == source.materialize()
    source.tokenizer()
    source.copy_tokenizer(tmp_path)
    assert source.fetches == 1


def test_the_tokenizer_is_the_materialized_folders() -> None:
    source = TinyRandomModel()
    tokenizer = source.tokenizer()
    expected = AutoTokenizer.from_pretrained(source.materialize())
    rendered = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert rendered == "<|im_start|>user\nwhat is 12 + 3<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer(rendered).input_ids == expected(rendered).input_ids


def test_copy_tokenizer_puts_only_the_tokenizer_files_beside_saved_weights(tmp_path: Path) -> None:
    source = TinyRandomModel()
    shutil.copy2(source.materialize() / "config.json", tmp_path)  # what the policy's save_pretrained writes first
    source.copy_tokenizer(tmp_path)
    added = sorted(f.name for f in tmp_path.iterdir() if f.name != "config.json")
    assert added == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]  # no weights, no generation config
    copied, original = AutoTokenizer.from_pretrained(tmp_path), source.tokenizer()
    assert copied.apply_chat_template(CHAT, tokenize=False) == original.apply_chat_template(CHAT, tokenize=False)
    assert copied("12 + 3").input_ids == original("12 + 3").input_ids
