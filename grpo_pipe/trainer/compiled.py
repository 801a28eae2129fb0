"""Compiled decoder layers (`trainer.precision.compile`): which layers, when, and the batch shapes that keep one graph.

On a GPU the update of a small model is bound by kernel launches (SmolLM2-135M on an H200: 43 ms of GPU work in
190 ms of wall time, BENCHMARKS.md); torch.compile fuses them. Only the repeated layers are compiled: one layer's
graph serves them all, so compiling takes seconds, and the model's own mask and head code stays eager.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from grpo_pipe.trainer.batch import TrainSample, collate

log = logging.getLogger(__name__)

# The compiler specialises a layer's graph on whether the sequence length is a multiple of 8 (an alignment guard
# of Inductor's): a batch of the other kind compiles again mid-run, seconds each time (8 s at step 413 of a
# 5-minute SmolLM2 run on an H200). Every compiled micro-batch is padded to this multiple, so one kind exists.
COMPILED_WIDTH_MULTIPLE = 8

# Inductor's mix-order reduction (a fused norm backward for large inputs) guards the graph on the micro-batch's
# token count (>= 4096 and >= 5 Mi elements): the run's first real micro-batch, larger than the warm-up's, compiled
# again (9 s of the first step at Qwen2.5-0.5B on an H200), and a run whose micro-batches straddle the bound
# compiles once more mid-run. Padded micro-batches (a few thousand tokens, either side of the bound) go without it:
# one graph serves every size. Packed micro-batches keep it: they are the token budget (16 k) but for the last, and
# without it the weight gradients of the norms and biases, sums over every token, took 32% of the update's device
# time at 0.5B on an H200 (BENCHMARKS.md); set-up compiles both sides of the bound (`warm_up`).
PADDED_COMPILE_OPTIONS = {"triton.mix_order_reduction": False}
# Tokens of the large warm-up row (GPU only: the reduction is Triton's): above the mix-order reduction's bound
# (>= 4096 tokens and >= 5 Mi elements) for any hidden size of 427 or more.
LARGE_ROW_TOKENS = 12288


def compile_options(packed: bool) -> dict[str, Any]:
    """The compile options of a layout that this torch knows (older versions have no mix-order reduction, and
    refuse unknown keys)."""
    from torch._inductor import config

    def known(key: str) -> bool:
        section, _, name = key.rpartition(".")
        return hasattr(getattr(config, section) if section else config, name)

    return {} if packed else {key: value for key, value in PADDED_COMPILE_OPTIONS.items() if known(key)}


def compile_on(setting: bool | str, device: torch.device) -> bool:
    """`auto` = on a GPU, where the update of a model this small is bound by kernel launches (SmolLM2-135M on an
    H200: 0.18 -> 0.08 s per update, BENCHMARKS.md); not on a CPU, where compiling costs more than it saves."""
    return device.type == "cuda" if setting == "auto" else bool(setting)


def compile_layers(module: torch.nn.Module, packed: bool = False) -> None:
    """torch.compile each repeated block of the model (the longest `ModuleList`: its decoder layers) in place,
    so parameter names, and so checkpoints and weight bridges, stay the model's. Shapes change every micro-batch
    (batch and length), so the graph is traced with symbolic sizes from the start."""
    lists = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    blocks: list[torch.nn.Module] = list(max(lists, key=len)) if lists else [module]
    options = compile_options(packed)
    for block in blocks:
        block.compile(dynamic=True, options=options)


def warm_up(module: torch.nn.Module, pad_id: int, device: torch.device,
            autocast: Callable[[torch.device], AbstractContextManager[Any]], logits_to_keep: bool,
            score: Callable[[list[TrainSample]], torch.Tensor] | None = None) -> None:
    """Compile now, in set-up, not in the first step: a model the compiler cannot take fails before any
    training, and step times (and a time-budgeted run's training minutes) are the steady state's.

    Two micro-batches of width 2 + 6 = 8, as every compiled micro-batch is padded to a multiple of 8: one
    without padding and one with, since a padded model's attention gets no mask or a mask, and each is a graph.
    `score`: the trainer's own scoring of a micro-batch (packed: its attention takes no mask, and the head's fused
    log-softmax is compiled too); without it, the model's logits of padded micro-batches."""
    started = time.perf_counter()
    shapes: list[tuple[int, ...]] = [(6, 6), (6, 5)]
    if score is not None and device.type == "cuda":  # and a large row: the other side of the mix-order bound
        shapes.append((LARGE_ROW_TOKENS // 8 - 2,) * 8)
    for lengths in shapes:
        samples = [TrainSample(prompt_ids=(pad_id,) * 2, completion_ids=(pad_id,) * n, sampling_logprobs=(0.0,) * n,
                               advantage=0.0, policy_version=0) for n in lengths]
        if score is not None:
            score(samples).float().mean().backward()
            continue
        with autocast(device):
            logits = module(**collate(samples, pad_id, device, COMPILED_WIDTH_MULTIPLE).model_inputs(logits_to_keep)).logits
        logits.float().mean().backward()
    module.zero_grad(set_to_none=True)
    log.info("Compiled the model's layers in %.1fs (trainer.precision.compile)", time.perf_counter() - started)
