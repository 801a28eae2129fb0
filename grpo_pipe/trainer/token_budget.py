"""Tokens per packed micro-batch, chosen from the card's free memory when the config leaves it open.

A larger micro-batch means fewer, larger kernels: at 0.5B on an H200 the step takes 0.65 s at 16 k tokens a pass
and 0.57 s at 32 k (MFU 23% and 26%, BENCHMARKS.md "The trainer alone"). How many fit depends on the model and on
what else holds the card (a colocated engine, whose memory is claimed before the trainer sets up). So the trainer
measures: two probe passes of different sizes give the activation memory per token (their difference, so weights,
gradients and workspaces cancel out); the budget is the largest power of two whose pass fits the memory left after
the optimizer's states, with a margin. Powers of two keep the compiled graphs' shapes few.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpo_pipe.trainer.batch import TrainSample

log = logging.getLogger(__name__)

PROBE_TOKENS = (2048, 4096)
MOST_TOKENS = 65536  # past this, a pass is long enough that fewer launches gain nothing measurable
FEWEST_TOKENS = 4096
MARGIN = 0.06  # of the card's memory, kept free: the allocator's fragmentation, the engine's spikes


@dataclass(frozen=True, kw_only=True)
class MemoryProbe:
    """What two probe passes measured on the trainer's card.

    Args:
        bytes_per_token: Activation memory a packed pass holds per token at its peak.
        fixed_bytes: The rest of a pass's peak above what was allocated before it (gradients, workspaces).
        allocated_bytes: Allocated before a pass: weights and whatever else the trainer keeps.
        available_bytes: Free on the card, plus what this process's allocator holds unused.
        total_bytes: The card's memory.
    """

    bytes_per_token: float
    fixed_bytes: float
    allocated_bytes: float
    available_bytes: float
    total_bytes: float


def probe(run_pass: Callable[[int], None], device: torch.device) -> MemoryProbe:
    """Run `run_pass(tokens)` (a forward and backward of a packed micro-batch of that many tokens, gradients freed
    after) at each probe size and read the peaks."""
    peaks = []
    for tokens in PROBE_TOKENS:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run_pass(tokens)
        torch.cuda.synchronize(device)
        peaks.append(torch.cuda.max_memory_allocated(device) - before)
    per_token = max((peaks[1] - peaks[0]) / (PROBE_TOKENS[1] - PROBE_TOKENS[0]), 1.0)
    allocated = torch.cuda.memory_allocated(device)
    free, total = torch.cuda.mem_get_info(device)
    unused = torch.cuda.memory_reserved(device) - allocated
    return MemoryProbe(bytes_per_token=per_token, fixed_bytes=max(peaks[0] - per_token * PROBE_TOKENS[0], 0.0),
                       allocated_bytes=float(allocated), available_bytes=float(free + unused), total_bytes=float(total))


def measured_max_tokens(score: Callable[[list[TrainSample]], torch.Tensor], module: torch.nn.Module, pad_id: int,
                        device: torch.device, parameters: list[torch.nn.Parameter]) -> int:
    """The tokens per packed micro-batch that fit the card, from probe passes through the trainer's own scoring.

    Args:
        score: The trainer's log-probs and entropy of a packed micro-batch of these samples, with their gradients.
        module: The policy's model, whose gradients each probe pass frees.
        pad_id: The token the probe sequences are made of.
        device: The trainer's card.
        parameters: The trainable weights, whose optimizer states are not yet on the card.
    """

    def run_pass(tokens: int) -> None:
        rows = 8  # sequences of equal length, as a packed micro-batch of short completions holds
        length = tokens // rows - 2
        samples = [TrainSample(prompt_ids=(pad_id,) * 2, completion_ids=(pad_id,) * length,
                               sampling_logprobs=(0.0,) * length, advantage=0.0, policy_version=0)] * rows
        score(samples).float().mean().backward()
        module.zero_grad(set_to_none=True)

    measured = probe(run_pass, device)
    tokens = budget(measured, optimizer_state_bytes(parameters))
    log.info("%s", describe(measured, tokens))
    return tokens


def budget(measured: MemoryProbe, optimizer_state_bytes: float) -> int:
    """The largest power of two of tokens whose pass fits what is left once the optimizer's states exist."""
    room = measured.available_bytes - optimizer_state_bytes - measured.fixed_bytes - MARGIN * measured.total_bytes
    fits = int(room / measured.bytes_per_token) if room > 0 else 0
    tokens = FEWEST_TOKENS
    while tokens * 2 <= min(fits, MOST_TOKENS):
        tokens *= 2
    return tokens


def optimizer_state_bytes(parameters: list[torch.nn.Parameter]) -> float:
    """AdamW's two moments per trainable weight, in the weights' dtype; allocated at the first update, so not yet
    on the card when the probe runs."""
    return float(sum(2 * p.numel() * p.element_size() for p in parameters))


def describe(measured: MemoryProbe, tokens: int) -> str:
    gib = 2**30
    return (f"{tokens} tokens per packed micro-batch from free memory ({measured.bytes_per_token / 2**20:.2f} MiB a "
            f"token, {measured.available_bytes / gib:.1f} GiB free of {measured.total_bytes / gib:.0f}; "
            "trainer.batching.max_tokens)")
