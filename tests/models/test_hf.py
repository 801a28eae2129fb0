"""model=hf: a local Hugging Face folder as is, or with a chat-template / dtype overlay; bad paths are config problems."""

import json
from pathlib import Path

from transformers import AutoTokenizer

from grpo_pipe.models.hf import HfModel
from grpo_pipe.models.tiny_random import TinyRandomModel

TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


def _chat(folder: Path) -> str:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)


def test_local_folder_is_used_as_is() -> None:
    folder = TinyRandomModel().materialize()
    model = HfModel(str(folder))
    assert model.config_problems() == [] and model.materialize() == folder.resolve()


def test_chat_template_override_inline_or_from_a_file_leaves_the_source_alone(tmp_path: Path) -> None:
    folder = TinyRandomModel().materialize()
    original = _chat(folder)
    inline = HfModel(str(folder), chat_template=TEMPLATE).materialize()
    assert inline != folder and _chat(inline) == "[user] hi\n[assistant] "
    (tmp_path / "t.jinja").write_text(TEMPLATE.replace("[assistant]", "[bot]"))
    from_file = HfModel(str(folder), chat_template=str(tmp_path / "t.jinja"), dtype="bfloat16").materialize()
    assert _chat(from_file) == "[user] hi\n[bot] "
    assert json.loads((from_file / "config.json").read_text())["dtype"] == "bfloat16"
    assert (from_file / "model.safetensors").resolve() == (folder / "model.safetensors").resolve()  # linked, not copied
    assert _chat(folder) == original


def test_config_problems(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert HfModel(str(tmp_path / "nope")).config_problems() == [
        f"path='{tmp_path}/nope': no such folder (allowed: a local model folder or a hub id 'org/name')"
    ]
    assert HfModel(str(tmp_path / "empty")).config_problems() == [
        f"path='{tmp_path}/empty': the folder has no config.json (not a Hugging Face model folder)"
    ]
    folder = TinyRandomModel().materialize()
    assert HfModel(str(folder), chat_template="missing.jinja").config_problems() == [
        "chat_template='missing.jinja': no such file (a .jinja file or an inline template)"
    ]
    custom = tmp_path / "custom"
    custom.mkdir()
    (custom / "config.json").write_text(json.dumps({"auto_map": {"AutoModelForCausalLM": "m.M"}}))
    (problem,) = HfModel(str(custom)).config_problems()
    assert "custom code" in problem and "model.trust_remote_code=true" in problem
    assert HfModel(str(custom), trust_remote_code=True).config_problems() == []
