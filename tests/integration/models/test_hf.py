"""model=hf: a local Hugging Face folder as is, or with a chat-template / dtype overlay; bad paths are config problems."""

import json
from pathlib import Path

import torch
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
    model = HfModel(path=str(folder))
    assert model.config_problems() == [] and model.materialize() == folder.resolve()


def test_chat_template_override_inline_or_from_a_file_leaves_the_source_alone(tmp_path: Path) -> None:
    folder = TinyRandomModel().materialize()
    original = _chat(folder)
    inline = HfModel(path=str(folder), chat_template=TEMPLATE).materialize()
    assert inline != folder and _chat(inline) == "[user] hi\n[assistant] "
    (tmp_path / "t.jinja").write_text(TEMPLATE.replace("[assistant]", "[bot]"))
    from_file = HfModel(path=str(folder), chat_template=str(tmp_path / "t.jinja"), dtype="bfloat16").materialize()
    assert _chat(from_file) == "[user] hi\n[bot] "
    assert json.loads((from_file / "config.json").read_text())["dtype"] == "bfloat16"
    assert (from_file / "model.safetensors").resolve() == (folder / "model.safetensors").resolve()  # linked, not copied
    assert _chat(folder) == original


def test_config_problems(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert HfModel(path=str(tmp_path / "nope")).config_problems() == [
        f"path='{tmp_path}/nope': no such folder (allowed: a local model folder or a hub id 'org/name')"
    ]
    assert HfModel(path=str(tmp_path / "empty")).config_problems() == [
        f"path='{tmp_path}/empty': the folder has no config.json (not a Hugging Face model folder)"
    ]
    folder = TinyRandomModel().materialize()
    assert HfModel(path=str(folder), chat_template="missing.jinja").config_problems() == [
        "chat_template='missing.jinja': no such file (a .jinja file or an inline template)"
    ]
    custom = tmp_path / "custom"
    custom.mkdir()
    (custom / "config.json").write_text(json.dumps({"auto_map": {"AutoModelForCausalLM": "m.M"}}))
    (problem,) = HfModel(path=str(custom)).config_problems()
    assert "custom code" in problem and "model.trust_remote_code=true" in problem
    assert HfModel(path=str(custom), trust_remote_code=True).config_problems() == []


_CUSTOM_CONFIG = '''from transformers import Qwen2Config


class ShortConfig(Qwen2Config):
    model_type = "short_qwen2"
'''
_CUSTOM_MODEL = '''from transformers import Qwen2ForCausalLM

from .configuration_short import ShortConfig


class ShortForCausalLM(Qwen2ForCausalLM):
    config_class = ShortConfig
'''


def test_a_folder_with_its_own_model_code_loads_in_the_trainer_and_tokenizer_once_trusted(tmp_path: Path) -> None:
    """The tiny model as a 'custom architecture' (auto_map to code in the folder), as a user's model would ship."""
    import shutil

    from grpo_pipe.models.custom_code import loader_options
    from grpo_pipe.trainer.policy import _load_causal_lm

    folder = tmp_path / "short"
    shutil.copytree(TinyRandomModel().materialize(), folder)
    (folder / "configuration_short.py").write_text(_CUSTOM_CONFIG)
    (folder / "modeling_short.py").write_text(_CUSTOM_MODEL)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="short_qwen2", architectures=["ShortForCausalLM"], auto_map={
        "AutoConfig": "configuration_short.ShortConfig", "AutoModelForCausalLM": "modeling_short.ShortForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))

    assert HfModel(path=str(folder)).config_problems()  # refused until trusted ...
    source = HfModel(path=str(folder), trust_remote_code=True)
    assert source.config_problems() == []
    path = source.materialize()
    assert loader_options(path) == {"trust_remote_code": True}  # ... then every loader is told
    model = _load_causal_lm(path, torch.device("cpu"), torch.float32)
    assert type(model).__name__ == "ShortForCausalLM"  # the folder's own class, not the built-in one
    assert source.tokenizer()("12+3").input_ids  # the source loads it as the trainer loads the model
    assert loader_options(TinyRandomModel().materialize()) == {}
