"""The trainer's settings groups: the defaults a null leaves, and each group's rules beside its fields."""

from __future__ import annotations

import torch

from grpo_pipe.trainer.schedule import WarmupSchedule
from grpo_pipe.trainer.settings import BatchingSettings, OptimisationSettings, PrecisionSettings


def test_no_optimizer_configured_is_adamw_without_weight_decay_at_the_settings_lr() -> None:
    optimizer = OptimisationSettings(lr=2e-3).make_optimizer([torch.nn.Parameter(torch.zeros(2))])
    assert isinstance(optimizer, torch.optim.AdamW)
    group = optimizer.param_groups[0]
    assert group["lr"] == 2e-3 and group["betas"] == (0.9, 0.999) and group["weight_decay"] == 0.0


def test_the_schedule_spans_every_update_of_the_run() -> None:
    settings = OptimisationSettings(lr=1.0, updates_per_batch=2, lr_schedule=WarmupSchedule(name="linear"))
    optimizer = settings.make_optimizer([torch.nn.Parameter(torch.zeros(2))])
    scheduler = settings.make_scheduler(optimizer, steps=3)  # 3 batches x 2 updates: the LR reaches 0 after 6
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    assert scheduler.get_last_lr()[0] > 0.0
    optimizer.step()
    scheduler.step()
    assert scheduler.get_last_lr()[0] == 0.0


def test_each_group_names_its_own_keys_and_the_schedule_it_was_given() -> None:
    problems = OptimisationSettings(lr=0, lr_schedule=WarmupSchedule(warmup_steps=-1)).config_problems()
    assert [p.split(":")[0] for p in problems] == ["trainer.optimisation.lr=0",
                                                    "trainer.optimisation.lr_schedule.warmup_steps=-1"]
    assert BatchingSettings(micro_batch_size=None).config_problems() == []  # null: the device's default
    assert BatchingSettings(micro_batch_size=0).config_problems()[0].startswith("trainer.batching.micro_batch_size=0")
    assert PrecisionSettings(compile="sometimes").config_problems()[0].startswith(  # type: ignore[arg-type]
        "trainer.precision.compile=sometimes")
