"""Random-initialised models of published architectures, for benchmarks where only shapes matter
(sync cost and throughput do not depend on the weight values). `model=random_architecture`
trains one through the whole pipeline: its answers are noise, its speed and memory are real."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from grpo_pipe.models.cache import build_once
from grpo_pipe.models.folder import FolderModelSource
from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.runtime import env

# Qwen2.5 architecture numbers from the published configs.
QWEN25: dict[str, dict[str, Any]] = {  # Qwen2Config fields
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, tie_word_embeddings=False),
}
# Qwen3 (Qwen3Config fields): the 0.6B is the shape of prime-rl's published trainer benchmark.
QWEN3: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, tie_word_embeddings=True),
}


class RandomArchitectureModel(FolderModelSource):
    """A random-init model with a published architecture's shapes (tokenizer: the tiny model's).

    Weights are noise; speed and memory are real: for throughput, async and memory benchmarks at real sizes.

    Args:
        arch: `qwen2.5-0.5b`, `qwen2.5-1.5b`, `qwen2.5-7b` or `qwen3-0.6b` (prime-rl's benchmark shape).
    """

    def __init__(self, arch: Literal["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen3-0.6b"] = "qwen2.5-1.5b") -> None:
        self.arch = arch

    def fetch_folder(self) -> Path:
        return benchmark_model(self.arch)


def benchmark_model(name: str) -> Path:
    """A model folder for `name`: tiny, smollm2-135m, or a random-init Qwen2.5 architecture."""
    if name == "tiny":
        return TinyRandomModel().materialize()
    if name == "smollm2-135m":
        from grpo_pipe.models.smollm2 import GgufOrHubModel

        return GgufOrHubModel().materialize()
    if name not in QWEN25 and name not in QWEN3:
        raise SystemExit(f"--models: unknown {name!r}; allowed: tiny, smollm2-135m, {', '.join([*QWEN25, *QWEN3])}")
    tokenizer_source = TinyRandomModel().materialize()  # any tokenizer works: only the vocab size matters
    return build_once(env.cache_dir() / "models" / f"random-{name}",
                      lambda out: in_child_process(_build, name, out, tokenizer_source), f"random-init {name}")


def in_child_process(function: Callable[..., None], *args: Any) -> None:
    """Run `function(*args)` in a fresh process: the weights are initialised on a GPU for speed, and the memory
    that takes (30 GB for 7B in fp32) must go back to the device before the engine and trainer claim it; the run's
    own process would keep it in PyTorch's cache, on the device Ray may give the engine."""
    process = multiprocessing.get_context("spawn").Process(target=function, args=args)
    process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"{function.__name__} failed in its own process (exit code {process.exitcode}); its "
                           "error is printed above")


def _build(name: str, out: Path, tokenizer_source: Path) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    config_class, model_class = (Qwen3Config, Qwen3ForCausalLM) if name in QWEN3 else (Qwen2Config, Qwen2ForCausalLM)
    config = config_class(**{**QWEN25, **QWEN3}[name], vocab_size=151936, max_position_embeddings=4096,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = model_class(config).bfloat16()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
