"""Any causal LM that both vLLM and transformers load: a local Hugging Face folder or a hub id.

Overrides (chat template, stored dtype) never touch the user's folder: they go into an overlay folder in
the model cache whose files link back to the original, with only the tokenizer config / `config.json`
rewritten. The engine, the trainer and the prompt renderer all start from that one folder, so they agree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Any, Literal

from grpo_pipe.config.errors import InputError
from grpo_pipe.models.cache import build_once
from grpo_pipe.models.custom_code import runs_custom_code
from grpo_pipe.models.folder import FolderModelSource
from grpo_pipe.runtime import env

log = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # "gpt2", "org/name"
# Files that hold a chat template; an override replaces all of them.
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


class HfModel(FolderModelSource):
    """`model=hf`: a local folder (config.json + weights + tokenizer) or a hub id downloaded on first use.

    Args:
        path: A local folder (config.json, weights, tokenizer) or a hub id `org/name`.
        revision: Hub ids only: a branch, tag or commit.
        dtype: The dtype recorded in the model's config.json: `auto` (as the folder says), `float32`, `bfloat16` or
            `float16`.
        trust_remote_code: Needed by models whose config.json names custom code (`auto_map`).
        chat_template: Overrides the tokenizer's chat template: a .jinja file, or the template inline; None keeps it.
    """

    def __init__(
        self,
        *,
        path: str,
        revision: str | None = None,
        dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
        trust_remote_code: bool = False,
        chat_template: str | None = None,
    ) -> None:
        self.path = path
        self.revision = revision  # hub ids only: a branch, tag or commit
        self.dtype = dtype  # the dtype recorded in config.json ("auto": as the folder says)
        self.trust_remote_code = trust_remote_code
        self.chat_template = chat_template  # a .jinja file, or the template itself inline

    def config_problems(self) -> list[str]:
        problems: list[str] = []
        local = Path(self.path).expanduser()
        if local.exists():
            if not (local / "config.json").is_file():
                problems.append(f"path={self.path!r}: the folder has no config.json (not a Hugging Face model folder)")
            elif runs_custom_code(local) and not self.trust_remote_code:
                problems.append(
                    f"path={self.path!r}: the model's config.json names custom code (auto_map); "
                    "set model.trust_remote_code=true if you trust it"
                )
        elif self._looks_local() or not _HUB_ID.match(self.path):
            problems.append(f"path={self.path!r}: no such folder (allowed: a local model folder or a hub id 'org/name')")
        elif env.hub_offline():
            problems.append(f"path={self.path!r}: not a local folder, and HF_HUB_OFFLINE is set, so it cannot be downloaded")
        template = self.chat_template
        if template is not None and _is_file_reference(template) and not Path(template).expanduser().is_file():
            problems.append(f"chat_template={template!r}: no such file (a .jinja file or an inline template)")
        return problems

    def fetch_folder(self) -> Path:
        source = self._source_folder()
        if self.chat_template is None and self.dtype == "auto":
            return source
        template = self._template_text()
        key = hashlib.sha256(json.dumps([str(source), template, self.dtype]).encode()).hexdigest()[:12]
        target = env.cache_dir() / "models" / f"overlay-{source.name}-{key}"
        return build_once(target, lambda out: _overlay(source, out, template, self.dtype), f"{source} with overrides")

    def _looks_local(self) -> bool:
        return self.path.startswith((".", "/", "~")) or self.path.count("/") > 1

    def _source_folder(self) -> Path:
        local = Path(self.path).expanduser()
        if local.is_dir():
            return local.resolve()
        from huggingface_hub import snapshot_download

        log.info("Downloading %s (revision %s) from the hub", self.path, self.revision or "main")
        folder = Path(snapshot_download(self.path, revision=self.revision))
        if runs_custom_code(folder) and not self.trust_remote_code:  # only knowable once downloaded
            raise InputError([f"model.path={self.path!r}: the model's config.json names custom code (auto_map); "
                               "set model.trust_remote_code=true if you trust it"])
        return folder

    def _template_text(self) -> str | None:
        if self.chat_template is None:
            return None
        if _is_file_reference(self.chat_template):
            return Path(self.chat_template).expanduser().read_text(encoding="utf-8")
        return self.chat_template


def _is_file_reference(template: str) -> bool:
    """A template is inline when it holds Jinja markup; otherwise it names a file."""
    return "{{" not in template and "{%" not in template


def _overlay(source: Path, out: Path, template: str | None, dtype: str) -> None:
    """Link every file of `source` into `out`, then write the overridden ones as real files."""
    rewritten = {"tokenizer_config.json", *_TEMPLATE_FILES} if template is not None else set()
    if dtype != "auto":
        rewritten.add("config.json")
    for item in source.iterdir():
        if item.name not in rewritten:
            (out / item.name).symlink_to(item.resolve())
    if template is not None:
        tokenizer_config = _read_json(source / "tokenizer_config.json")
        tokenizer_config.pop("chat_template", None)
        (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
        (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    if dtype != "auto":
        config = _read_json(source / "config.json")
        config["dtype"] = dtype  # transformers 5 name; vLLM and older readers use torch_dtype
        config["torch_dtype"] = dtype
        (out / "config.json").write_text(json.dumps(config, indent=2))


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}
