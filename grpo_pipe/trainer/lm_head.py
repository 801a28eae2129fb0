"""Log-probs and entropy of the scored tokens straight from the last hidden states, never an fp32 [tokens x vocab].

The vocabulary projection of a micro-batch is the largest tensor of the step: [tokens x 151936] for a Qwen model,
9.7 GB in fp32 for 16 k tokens, and as much again for its gradient. Only the scored positions (the completion
tokens the model sampled) are projected at all, never a prompt's or an environment's token. Then, two ways:
- `fused` (with compiled layers, i.e. on a GPU by default): the head's logits stay in the compute dtype (bf16) and
  one compiled function takes the fp32 log-softmax, the sampled token's log-prob and the entropy in registers, and
  its backward writes the logits' gradient in one pass. Measured on an H200 at 0.5B, autograd's own ops for the same
  (a float copy, logsumexp, gather and their backward, each a pass over [tokens x vocab]) took 38% of the update's
  device time (BENCHMARKS.md).
- otherwise: the head runs on `HEAD_CHUNK_ELEMENTS` logits at a time, each chunk's fp32 log-softmax taken and
  dropped at once and computed again in the backward pass (activation checkpointing), so no [tokens x vocabulary]
  tensor is held at all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import cast

import torch
from torch.utils.checkpoint import checkpoint

# fp32 logits held at once per chunk (256 Mi elements: 1 GiB); the chunk's rows follow from the vocabulary.
HEAD_CHUNK_ELEMENTS = 2**28


def causal_lm_parts(module: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, lm head) of a Hugging Face causal LM (through a peft wrapper), or None where its logits are more
    than the head's output (a soft cap or a scale on them) or it has no such parts."""
    unwrap = getattr(module, "get_base_model", None)
    base = cast(torch.nn.Module, unwrap()) if callable(unwrap) else module
    config = getattr(base, "config", None)
    if any(getattr(config, name, None) not in (None, 1.0) for name in
           ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")):
        return None
    decoder_of, head_of = getattr(base, "get_decoder", None), getattr(base, "get_output_embeddings", None)
    if not callable(decoder_of) or not callable(head_of):
        return None
    decoder, head = decoder_of(), head_of()
    if not isinstance(decoder, torch.nn.Module) or not isinstance(head, torch.nn.Module):
        return None
    return decoder, head


def head_logprobs(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, temperature: float,
                  entropy_grad: bool = False, fused: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [M, H] (the outputs that predict the scored tokens), targets [M] ->
    (log pi(target) at `temperature` [M] fp32, the policy's entropy at each position [M] fp32, with a gradient only
    when `entropy_grad`). `fused`: see the module docstring."""
    if fused:
        return logits_logprobs(head(hidden), targets, temperature, entropy_grad, fused=True)  # [M, V] bf16 logits
    return _in_chunks(functools.partial(_head_chunk, head), hidden, targets, temperature, head_width(head),
                      entropy_grad)


def head_width(head: torch.nn.Module) -> int:
    """The vocabulary size the head projects to."""
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    out = getattr(head, "out_features", None)
    return int(out) if isinstance(out, int) else 1


def logits_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                    entropy_grad: bool = False, fused: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """As `head_logprobs`, from logits already projected ([M, V], e.g. bf16): the fp32 log-softmax is taken in one
    compiled function (`fused`) or a chunk of rows at a time, recomputed in the backward pass, so only the logits
    themselves are held. Also for a model whose head cannot be run apart from it (a sharded root module: its hooks
    gather the head's weights)."""
    if fused and logits.shape[0] > 0:  # nothing scored (a sharded rank's padding pass): the plain path below
        logprob, entropy = _fused_from_logits()(logits, targets, temperature)
        return logprob, entropy if entropy_grad else entropy.detach()
    return _in_chunks(_from_logits, logits, targets, temperature, logits.shape[-1], entropy_grad)


ChunkScore = Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]


def _in_chunks(score: ChunkScore, rows_in: torch.Tensor, targets: torch.Tensor, temperature: float, vocab: int,
               entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`score` over `HEAD_CHUNK_ELEMENTS` logits' worth of rows at a time, each chunk recomputed in the backward
    pass (activation checkpointing) when it needs a gradient. rows_in [M, ...], targets [M] -> [M], [M]."""
    rows = max(1, HEAD_CHUNK_ELEMENTS // max(vocab, 1))
    logprobs, entropies = [], []
    for start in range(0, rows_in.shape[0], rows):
        part, wanted = rows_in[start : start + rows], targets[start : start + rows]
        if torch.is_grad_enabled() and part.requires_grad:
            logprob, entropy = cast(tuple[torch.Tensor, torch.Tensor],
                                    checkpoint(score, part, wanted, temperature, use_reentrant=False))
        else:
            logprob, entropy = score(part, wanted, temperature)
        logprobs.append(logprob)
        entropies.append(entropy if entropy_grad else entropy.detach())
    if not logprobs:  # nothing scored: still through `score`, so a backward reaches every weight it would
        logprob, entropy = score(rows_in, targets, temperature)  # [0], [0]
        return logprob, entropy if entropy_grad else entropy.detach()
    return torch.cat(logprobs), torch.cat(entropies)


def _head_chunk(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[m, H], [m] -> log-prob [m] and entropy [m] of the head's softmax at `temperature`, in fp32."""
    return _from_logits(head(hidden), targets, temperature)


def _from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[m, V], [m] -> log-prob [m] and entropy [m] of the softmax at `temperature`, in fp32."""
    scaled = logits.float() / temperature  # [m, V]
    normaliser = scaled.logsumexp(dim=-1)  # [m]
    logprob = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - normaliser  # [m]
    entropy = normaliser - (torch.softmax(scaled, dim=-1) * scaled).sum(dim=-1)  # [m] H = log Z - E[z]
    return logprob, entropy


@functools.cache
def _fused_from_logits() -> Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]:
    """`_from_logits` compiled once per process, for any number of rows."""
    return cast(Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]],
                torch.compile(_from_logits, dynamic=True))
