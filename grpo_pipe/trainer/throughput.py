"""The trainer's speed as the field reports it: tokens per second and model FLOPs utilisation (MFU).

The count (model FLOPs: what the update must compute, not what a layout or a recomputation adds):
- every token of a sequence, prompt and completion, runs forward and backward through the decoder:
  6 x N_body FLOPs, N_body = the decoder's matmul weights (attention and MLP projections of every layer; the
  embedding lookup is no matmul and is left out);
- causal attention: a sequence of L tokens costs 6 x layers x (heads x head_dim) x L^2 (QK^T and AV, 2 x 2 x L^2 / 2
  per layer forward, three times that with the backward);
- the lm head, on the scored tokens only (the only positions projected to the vocabulary): 6 x hidden x vocab each.
MFU = those FLOPs per second over the card's dense bf16 peak (`peak_flops`), which is known per device name and
never guessed: on an unknown device (a CPU among them) the MFU is not reported.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets, FLOP/s, matched against the device name.
DENSE_BF16_PEAKS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H800", 989e12),
    ("H20", 148e12),
    ("B200", 2250e12),
    ("GB200", 2500e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("A10G", 70e12),
)


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a device by its name (`torch.cuda.get_device_name`), or None when not known."""
    for key, peak in DENSE_BF16_PEAKS:
        if key in device_name:
            return peak
    return None


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The numbers the FLOP count needs, read from a Hugging Face config.

    Args:
        layers: Decoder layers.
        hidden: The hidden size.
        attention_width: Query heads x head_dim.
        body_params: The decoder's matmul weights, all layers.
        vocab: The vocabulary size.
    """

    layers: int
    hidden: int
    attention_width: int
    body_params: int
    vocab: int

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        hidden, layers = int(config.hidden_size), int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        intermediate = int(config.intermediate_size)
        attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o; k, v
        mlp = 3 * hidden * intermediate  # gate, up, down
        return cls(layers=layers, hidden=hidden, attention_width=heads * head_dim,
                   body_params=layers * (attention + mlp), vocab=int(config.vocab_size))

    def step_flops(self, sequence_lengths: Iterable[int], scored_tokens: int) -> float:
        """Model FLOPs of one forward and backward over these sequences, `scored_tokens` of them through the head."""
        lengths = list(sequence_lengths)
        body = 6.0 * self.body_params * sum(lengths)
        attention = 6.0 * self.layers * self.attention_width * sum(length * length for length in lengths)
        head = 6.0 * self.hidden * self.vocab * scored_tokens
        return body + attention + head


def throughput_metrics(*, tokens: int, flops: float, seconds: float, peak: float | None) -> dict[str, float]:
    """`train/tokens_per_s` and, where the peak is known, `train/mfu` (a fraction of the peak)."""
    if seconds <= 0:
        return {}
    metrics = {"train/tokens_per_s": tokens / seconds}
    if peak:
        metrics["train/mfu"] = flops / seconds / peak
    return metrics
