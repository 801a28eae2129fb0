"""The TRL peer's budget clock on a fake clock: snapshots at the marks, saving time left out, a stop past the budget."""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerControl, TrainerState, TrainingArguments

from grpo_pipe.benchmarks.trl_clock import WallClockBudget


def test_budget_snapshots_at_marks_excludes_saving_time_and_stops_past_the_budget(tmp_path: Path) -> None:
    now = [3.0]  # seconds since train_trl was called; each snapshot takes 5 s to write
    saved: list[str] = []

    def save(model: object, folder: Path) -> None:
        saved.append(folder.name)
        now[0] += 5.0

    budget = WallClockBudget(save=save, out_dir=tmp_path, budget_s=30.0, mark_every_s=10.0, called=0.0,
                             clock=lambda: now[0])
    args, state, control = TrainingArguments(output_dir=str(tmp_path)), TrainerState(), TrainerControl()
    budget.on_step_begin(args, state, control, model=None)  # snapshot-0 written from 3 s to 8 s: training starts at 8
    stops = []
    for step, step_s in enumerate([7.0, 5.0, 9.0, 10.0], start=1):  # training seconds: 7, 12, 21, 31
        now[0] += step_s
        state.global_step = step
        budget.on_step_end(args, state, control, model=None)
        stops.append(control.should_training_stop)
    budget.on_train_end(args, state, control, model=None)
    assert [(s.train_s, s.step) for s in budget.snapshots] == [(0.0, 0), (12.0, 2), (21.0, 3), (31.0, 4)]
    assert [s.path for s in budget.snapshots] == [tmp_path / f"snapshot-{k}" for k in range(4)]
    assert saved == ["snapshot-0", "snapshot-1", "snapshot-2", "snapshot-3"]  # none added at the end: step 4 has one
    assert stops == [False, False, False, True]
    assert budget.startup_s == 3.0 and budget.last_step_s == 31.0
