"""A non-finite gradient, looked into: which gradients, and which forward line made the first NaN.

Found only once the gradient norm is non-finite, so a healthy step pays nothing for it
(`trainer.optimisation.diagnose_non_finite`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch


def second_pass(run_pass: Callable[[], object], module: torch.nn.Module | None) -> str:
    """The pass that gave a non-finite gradient, again on the same batch and weights under autograd's anomaly
    mode: the backward function that first returned NaN and the forward line that made it; or that the second
    pass was finite, i.e. a fault that does not repeat (concurrency, a kernel's nondeterminism), not the numbers.
    Costs one slower pass, only on a bad step."""
    with warnings.catch_warnings(record=True) as caught:  # anomaly mode warns with the forward call's stack
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly(check_nan=True):
                run_pass()
        except RuntimeError as err:
            message = str(err).strip().splitlines()[0]
            if "returned nan values" not in message:
                return f"; a second pass could not look into it: {message}"
            return f"; a second pass under anomaly detection: {message}{forward_site(caught)}"
    if non_finite_gradients(module):
        return "; a second pass gave non-finite gradients again, with no NaN from any backward function (infinite values)"
    return "; a second pass over the same batch and weights gave finite gradients: the fault does not repeat"


def non_finite_gradients(module: torch.nn.Module | None, shown: int = 4) -> str:
    """Where a non-finite gradient is: " in N of M gradients, first: name, ..." (empty without a module to name).
    Found only once the norm is non-finite, so a healthy step pays nothing for it."""
    if module is None:
        return ""
    grads = [(name, p.grad) for name, p in module.named_parameters() if p.grad is not None]
    bad = [name for name, grad in grads if not bool(torch.isfinite(grad).all())]
    if not bad:
        return ""
    return f" in {len(bad)} of {len(grads)} gradients, first: {', '.join(bad[:shown])}"


def forward_site(caught: Sequence[warnings.WarningMessage]) -> str:
    """" (forward: file line N, in function: code)": the innermost frame outside torch of the forward call that
    anomaly mode blamed (a model's line, or ours), from the warning it raises with that call's stack; empty without."""
    torch_dir = str(Path(torch.__file__).parent)
    for record in caught:
        text = str(record.message)
        if "Traceback of forward call" not in text:
            continue
        lines = [line.strip() for line in text.splitlines()]
        frames = [(line, lines[i + 1] if i + 1 < len(lines) else "") for i, line in enumerate(lines)
                  if line.startswith('File "') and torch_dir not in line]
        if not frames:
            return ""
        frame, code = frames[-1]
        _, path, rest = frame.split('"', 2)
        return f" (forward: {Path(path).name}{rest.rstrip()}: {code})"
    return ""
