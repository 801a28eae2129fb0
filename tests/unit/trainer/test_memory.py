"""Memory figures come only from a CUDA device the trainer runs on in this process (the GPU case: tests/gpu/trainer)."""

import torch

from grpo_pipe.trainer.memory import memory_metrics


def test_a_trainer_on_a_cpu_or_in_other_processes_reports_no_memory_here() -> None:
    assert memory_metrics(torch.device("cpu")) == {}
    assert memory_metrics(None) == {}  # a sharded trainer: its ranks report their own
