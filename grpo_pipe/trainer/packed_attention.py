"""Attention over packed sequences: each sequence of a packed row attends causally to itself only.

Registered with Hugging Face's attention interface under `ATTENTION_NAME` and switched on per model
(`use_packed_attention`), so the model's own code runs unchanged and its attention calls this function with the
bounds that `PackedBatch.model_inputs` passes (`cu_seq_lens_q`, `max_length_q`).

- On a GPU: torch's variable-length FlashAttention (`torch.nn.attention.varlen.varlen_attn`), which visits only the
  blocks inside each sequence: no mask is built, nothing outside a sequence is computed.
- Elsewhere (a CPU, or a torch without it): scaled-dot-product attention over each sequence in turn, exact and
  cheap at the lengths a CPU trains.

Sliding windows and attention sinks are not handled: a model that needs them keeps padded micro-batches
(`trainer.batching.max_tokens: null`); `packing_problem` says which.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F

ATTENTION_NAME = "grpo_pipe_packed"


@torch.compiler.disable  # one opaque kernel: nothing to fuse, and its Python (bounds, lengths) is not the graph's
def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [1, Hq, N, D], key/value [1, Hkv, N, D] -> ([1, N, Hq, D], None), as Hugging Face's attention functions."""
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None or attention_mask is not None:
        raise ValueError("packed attention needs a packed batch's cu_seq_lens_q and no attention mask "
                         "(trainer/packing.py builds both)")
    half = _half_dtype(query)
    if half is not None and _varlen() is not None:
        q, k, v = (x.to(half) for x in (query, key, value))  # RoPE leaves q and k in fp32 under autocast
        return _varlen_attention(q, k, v, bounds, int(kwargs["max_length_q"]), scaling), None
    return _per_sequence_attention(query, key, value, bounds, scaling), None


def _half_dtype(query: torch.Tensor) -> torch.dtype | None:
    """The 16-bit dtype FlashAttention computes in here (the autocast dtype, or the inputs' own), or None: not on a
    GPU, or in fp32 without autocast (then scaled-dot-product attention, which takes any dtype)."""
    if not query.is_cuda:
        return None
    if torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
    else:
        dtype = query.dtype
    return dtype if dtype in (torch.float16, torch.bfloat16) else None


def _per_sequence_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: torch.Tensor,
                            scaling: float | None) -> torch.Tensor:
    """Split, not sliced: the backward of a split is one concatenation, a slice's is a zero tensor of the whole row."""
    edges = bounds.tolist()
    lengths = [b - a for a, b in zip(edges, edges[1:])]
    gqa = key.shape[1] != query.shape[1]
    outputs = [F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa)  # [1, Hq, L, D]
               for q, k, v in zip(query.split(lengths, dim=2), key.split(lengths, dim=2), value.split(lengths, dim=2))]
    return torch.cat(outputs, dim=2).transpose(1, 2)  # [1, N, Hq, D]


def _varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: torch.Tensor,
                      max_length: int, scaling: float | None) -> torch.Tensor:
    varlen = _varlen()
    assert varlen is not None
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [N, H, D]
    options = inspect.signature(varlen).parameters
    extra: dict[str, Any] = {"scale": scaling}
    if "window_size" in options:  # the causal mask, as newer torch spells it
        extra["window_size"] = (-1, 0)
    else:
        extra["is_causal"] = True
    if k.shape[1] != q.shape[1]:  # grouped-query attention
        if "enable_gqa" in options:
            extra["enable_gqa"] = True
        else:
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    out = varlen(q, k, v, bounds, bounds, max_length, max_length, **extra)  # [N, Hq, D]
    return out.unsqueeze(0)  # [1, N, Hq, D]


def _varlen() -> Any:
    """torch's variable-length attention, where this torch has it (2.10 and later)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def packing_problem(config: Any) -> str | None:
    """Why this model cannot train on packed rows, or None. Checked before the trainer switches its attention."""
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return f"it uses sliding-window attention (sliding_window={config.sliding_window})"
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types):
        return f"not every layer is full attention (layer_types: {sorted(set(layer_types))})"
    return None


def use_packed_attention(module: torch.nn.Module) -> None:
    """Switch a Hugging Face model's attention to `packed_attention` (registered once per process)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, packed_attention)
    setter = getattr(module, "set_attn_implementation", None)
    base = getattr(module, "get_base_model", None)  # through a peft wrapper
    if setter is None and callable(base):
        setter = getattr(base(), "set_attn_implementation", None)
    if setter is None:
        raise TypeError(f"{type(module).__name__} cannot change its attention implementation; packed micro-batches "
                        "need a Hugging Face model (trainer.batching.max_tokens: null pads instead)")
    setter(ATTENTION_NAME)
