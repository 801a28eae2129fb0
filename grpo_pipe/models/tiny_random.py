"""A tiny random Qwen2-style model with a locally trained byte-level BPE tokenizer, for fast tests.

Everything is generated from a seed, offline, in a few seconds. head_dim is kept >= 32 because the
CPU attention kernels of vLLM support only certain head sizes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from grpo_pipe.config.errors import failed
from grpo_pipe.models.cache import build_once
from grpo_pipe.models.folder import FolderModelSource
from grpo_pipe.runtime import env

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _training_corpus() -> list[str]:
    """Text covering what the tests feed the model: arithmetic questions, numbers, short English."""
    words = (
        "what is the answer question solve compute total sum of plus minus times divided by each how many "
        "has had buys sells gives gets more less than left after before per day week apple apples "
        "box boxes dollar dollars cost price step first then so therefore final you are a helpful assistant "
        "think show your work put number on last line"
    ).split()
    lines = [" ".join(words[i : i + 9]) for i in range(0, len(words), 3)]
    lines += [f"{a} + {b} = {a + b}. {a} * {b} = {a * b}. #### {a - b}" for a in range(40) for b in range(0, 40, 7)]
    return lines


class TinyRandomModel(FolderModelSource):
    """Builds (once) and returns a folder with a tiny random Qwen2 model and its tokenizer.

    `model=tiny_random`: builds in seconds, for tests. The settings are Qwen2Config fields (with the seed: the cache key).

    Args:
        hidden_size: The model's width.
        num_layers: Decoder layers.
        num_heads: Attention heads (head_dim = hidden_size / num_heads; vLLM's CPU attention needs >= 32).
        num_kv_heads: Key/value heads (grouped-query attention).
        intermediate_size: The MLP's width.
        vocab_size: The size of the locally trained tokenizer's vocabulary.
        tie_word_embeddings: Share the embedding with the LM head (the path SmolLM2 and Qwen2.5 take).
        initializer_range: Standard deviation of the random init; large gives decisive greedy outputs.
        max_position_embeddings: The longest sequence the model takes.
        seed: The seed of the random weights.
    """

    def __init__(
        self,
        *,
        hidden_size: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        num_kv_heads: int = 2,
        intermediate_size: int = 256,
        vocab_size: int = 512,
        tie_word_embeddings: bool = True,
        initializer_range: float = 0.2,
        max_position_embeddings: int = 1024,
        seed: int = 0,
    ) -> None:
        self.settings: dict[str, Any] = dict(  # Qwen2Config fields (and, with the seed, the cache key)
            hidden_size=hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            intermediate_size=intermediate_size,
            vocab_size=vocab_size,
            tie_word_embeddings=tie_word_embeddings,
            initializer_range=initializer_range,
            max_position_embeddings=max_position_embeddings,
        )
        self.seed = seed

    def config_problems(self) -> list[str]:
        heads = max(self.settings["num_attention_heads"], 1)
        return failed(
            (self.settings["num_attention_heads"] >= 1, f"model.num_heads={self.settings['num_attention_heads']}: must be >= 1"),
            (self.settings["hidden_size"] // heads >= 32,
             f"model.hidden_size / model.num_heads = {self.settings['hidden_size'] // heads}: vLLM's CPU attention "
             "needs head_dim >= 32 (e.g. 32, 64, 128)"),
        )

    def fetch_folder(self) -> Path:
        key = hashlib.sha256(json.dumps([self.settings, self.seed], sort_keys=True).encode()).hexdigest()[:12]
        return build_once(env.cache_dir() / "models" / f"tiny-random-qwen2-{key}", self._build, "tiny random model")

    def _build(self, out: Path) -> None:
        import torch
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=self.settings["vocab_size"],
            special_tokens=_SPECIAL,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        bpe.train_from_iterator(_training_corpus(), trainer=trainer)
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=bpe,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            bos_token=None,
            chat_template=CHAT_TEMPLATE,
        )
        tokenizer.save_pretrained(out)
        eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
        assert isinstance(eos_id, int) and isinstance(pad_id, int)  # both are special tokens of the vocabulary above
        config = Qwen2Config(
            **{**self.settings, "vocab_size": len(tokenizer)},
            eos_token_id=eos_id,
            pad_token_id=pad_id,
            bos_token_id=None,
        )
        torch.manual_seed(self.seed)
        model = Qwen2ForCausalLM(config).float()
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(out, safe_serialization=True)
