"""What a person watches: a live bar (step, reward, accuracy, tokens/s, ETA) and one log line per step."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping
from types import TracebackType

from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

log = logging.getLogger("grpo_pipe.runner.progress")


def console_handler() -> logging.Handler:
    """The job's console: rich on a terminal (log lines print above the live bar); to a file or a pipe plain lines,
    one per record, never wrapped (rich would wrap at 80 columns there and split a printed command in two)."""
    if sys.stdout.isatty():
        return RichHandler(show_path=False, markup=False)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", datefmt="%H:%M:%S"))
    return handler


def shown(value: float | None, spec: str) -> str:
    """`value` formatted, or n/a where it could not be computed (absent, NaN)."""
    return "n/a" if value is None or math.isnan(value) else format(value, spec)


def format_metrics(metrics: Mapping[str, float]) -> str:
    """`key=value, ...` with three decimals: the before/after-training log lines."""
    return ", ".join(f"{k}={v:.3f}" for k, v in metrics.items())


def summary_line(step: int, total: int, metrics: Mapping[str, float]) -> str:
    return (
        f"step {step}/{total} | reward {shown(metrics.get('train/reward/mean'), '.3f')}"
        f" | acc {shown(metrics.get('train/accuracy'), '.2f')}"
        f" | loss {shown(trained(metrics, 'train/loss'), '+.4f')}"
        f" | mismatch {shown(metrics.get('mismatch/logprob_abs_mean'), '.4f')}"
        f" clip {shown(trained(metrics, 'train/clip_fraction'), '.3f')}"
        f" | gen {metrics.get('rollout/tokens_per_s', 0.0):.0f} tok/s"
        + train_speed(metrics)
        + f" | step {metrics.get('time/step_s', 0.0):.1f}s"
        f" | sync {metrics.get('sync/total_s', 0.0) * 1000:.0f}ms v{int(metrics.get('policy/version', 0))}"
        f" | lag {metrics.get('async/staleness_mean', 0.0):.1f} queue {int(metrics.get('async/queue_depth', 0))}"
        f" dropped {int(metrics.get('async/groups_dropped_total', 0))}"
        f" | wait {metrics.get('async/trainer_wait_s', 0.0):.1f}s"
        + (f" | gpu {metrics['memory/device_used_gib']:.1f} GiB used" if "memory/device_used_gib" in metrics else "")
        + (episode_part(metrics) if "episodes/turns_mean" in metrics else "")
    )


def train_speed(metrics: Mapping[str, float]) -> str:
    """The update's tokens per second and MFU ("mfu n/a" where the device's peak is not known), when it ran."""
    if "train/tokens_per_s" not in metrics:
        return ""
    return (f" | train {metrics['train/tokens_per_s']:.0f} tok/s"
            f" mfu {shown(metrics.get('train/mfu', math.nan) * 100, '.1f')}{'%' if 'train/mfu' in metrics else ''}")


def trained(metrics: Mapping[str, float], key: str) -> float | None:
    """A training figure of a step in which some sample had an advantage; None otherwise (the loss of such a step
    is 0 by definition, not a measurement)."""
    idle = metrics.get("train/update_applied", 1.0) == 0.0 or metrics.get("train/active_samples", 1.0) == 0.0
    return None if idle else metrics.get(key)


def episode_part(metrics: Mapping[str, float]) -> str:
    """The step line's episodes: turns and calls per episode, failed calls, time in tools, environment tokens."""
    return (f" | turns {metrics['episodes/turns_mean']:.1f} calls {metrics['episodes/tool_calls_mean']:.1f}"
            f" errors {int(metrics['episodes/tool_errors'])} timeouts {int(metrics['episodes/tool_timeouts'])}"
            f" tools {metrics['episodes/tool_s']:.1f}s env {metrics['episodes/environment_token_share']:.0%}"
            f" limit {int(metrics['episodes/ended_by_limit'])}")


class StepProgress:
    """Context manager around the training loop.

    Args:
        total_steps: The steps of the whole run.
        first_step: Steps already done (a resumed run starts the bar there).
    """

    def __init__(self, total_steps: int, first_step: int = 0) -> None:
        self.total = total_steps
        self._progress = Progress(
            TextColumn("[bold]GRPO"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )
        self._task = self._progress.add_task("train", total=total_steps, completed=first_step, stats="")

    def __enter__(self) -> StepProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        stats = (
            f"reward {shown(metrics.get('train/reward/mean'), '.3f')} "
            f"acc {shown(metrics.get('train/accuracy'), '.2f')} "
            f"{metrics.get('rollout/tokens_per_s', 0.0):.0f} tok/s "
            f"lag {metrics.get('async/staleness_mean', 0.0):.1f}"
        )
        self._progress.update(self._task, completed=step, stats=stats)
        log.info(summary_line(step, self.total, metrics))
