"""The clock the TRL peer trains under, and the snapshots it takes (`trl_peer.train_trl`).

The clock starts when the first optimizer step starts (model load and vLLM start-up are `startup_s`) and
stops while a snapshot is written. `snapshot-0` holds the starting weights at 0 s; later ones are taken at the
first step end past each mark and at the end (the step that passes `budget_s` ends training). Each snapshot is the
policy in bf16 with the tokenizer's files, an HF model folder another module grades as it grades our own pipeline's.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """One weight snapshot of TRL's policy.

    Args:
        train_s: Training wall-clock when it was taken (snapshot writing excluded).
        step: Optimizer updates done.
        path: An HF model folder: bf16 safetensors, config and tokenizer files.
    """

    train_s: float
    step: int
    path: Path


def snapshot_writer(tokenizer: Any) -> Callable[[PreTrainedModel, Path], None]:
    """Writes the model's weights in bf16 (the trainer keeps fp32 masters) with the tokenizer files."""

    def save(model: PreTrainedModel, folder: Path) -> None:
        copies: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}  # one per tensor: tied weights stay tied
        state = {}
        for name, tensor in model.state_dict().items():
            key = (tensor.data_ptr(), tuple(tensor.shape))
            if key not in copies:
                copies[key] = tensor.detach().to("cpu", torch.bfloat16) if tensor.is_floating_point() else tensor
            state[name] = copies[key]
        model.save_pretrained(folder, state_dict=state)  # drops the tied aliases
        config = json.loads((folder / "config.json").read_text())
        config["dtype"] = "bfloat16"  # save_pretrained writes the live (fp32) dtype; dtype="auto" should load bf16
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        tokenizer.save_pretrained(folder)

    return save


@dataclass(kw_only=True, eq=False)
class WallClockBudget(TrainerCallback):
    """Measures training wall-clock, snapshots at each mark and at the end, stops once the budget is spent.

    Args:
        save: Writes the model to a snapshot folder.
        out_dir: Where the snapshot folders go.
        budget_s: Training seconds after which training stops.
        mark_every_s: Training seconds between snapshots.
        called: `clock()` when `train_trl` was called (start-up is counted from it).
        clock: The clock, in seconds.
    """

    save: Callable[[PreTrainedModel, Path], None]
    out_dir: Path
    budget_s: float
    mark_every_s: float
    called: float
    clock: Callable[[], float] = time.perf_counter
    snapshots: list[Snapshot] = field(init=False, default_factory=list)
    startup_s: float = field(init=False, default=0.0)
    started: float | None = field(init=False, default=None)  # clock() at the first step's start
    paused_s: float = field(init=False, default=0.0)  # seconds spent writing snapshots after the start
    next_mark_s: float = field(init=False)  # the training seconds of the next snapshot: mark_every_s at first
    last_step_s: float = field(init=False, default=0.0)  # training seconds at the end of the last step

    def __post_init__(self) -> None:
        self.next_mark_s = self.mark_every_s

    def train_s(self) -> float:
        return 0.0 if self.started is None else self.clock() - self.started - self.paused_s

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.started is None:
            self.startup_s = self.clock() - self.called
            self._snapshot(kwargs["model"], 0.0, state.global_step)
            self.started = self.clock()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        train_s = self.last_step_s = self.train_s()
        control.should_training_stop = control.should_training_stop or train_s >= self.budget_s
        if train_s >= self.next_mark_s or control.should_training_stop:
            self._snapshot(kwargs["model"], train_s, state.global_step)
            self.next_mark_s = (train_s // self.mark_every_s + 1) * self.mark_every_s

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.snapshots and self.snapshots[-1].step != state.global_step:  # ended by something else than the budget
            self._snapshot(kwargs["model"], self.last_step_s, state.global_step)

    def _snapshot(self, model: PreTrainedModel, train_s: float, step: int) -> None:
        began = self.clock()
        folder = self.out_dir / f"snapshot-{len(self.snapshots)}"
        self.save(model, folder)
        self.snapshots.append(Snapshot(train_s=train_s, step=step, path=folder))
        if self.started is not None:  # snapshot-0 is written before the clock starts
            self.paused_s += self.clock() - began
        log.info("TRL peer: snapshot %s at %.1f s of training, step %d", folder.name, train_s, step)
