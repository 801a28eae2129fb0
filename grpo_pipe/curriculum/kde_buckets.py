"""KDE bucket curriculum: more samples per prompt for tasks the policy finds hard.

Prompts come in shuffled passes over the train split, as in the uniform curriculum; only the group
size changes. Per task, the mean reward of each step's samples is smoothed by an EMA. Every
`refit_every` prompts (a "curriculum epoch"; default one pass over the split) the EMA rewards are
min-max normalised, a Gaussian KDE is fit and its valleys cut them into at most `n_buckets` buckets
(see `buckets.py`). Each bucket samples `samples_per_prompt × (1 + α·(1 − normalised mean reward))`
completions per prompt. Larger groups cost time, not memory: the trainer accumulates gradients over
fixed-size micro-batches whatever the group size.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from grpo_pipe.config.errors import failed
from grpo_pipe.curriculum.buckets import Bandwidth, Bucket, BucketFit, bucket_index, fit_buckets, rollouts_for
from grpo_pipe.curriculum.passes import ShuffledPasses
from grpo_pipe.curriculum.report import render_text, write_report
from grpo_pipe.types import Task

log = logging.getLogger(__name__)


class KdeBucketCurriculum:
    """`curriculum=kde_buckets`: harder tasks get more samples per prompt.

    A per-task EMA of rewards; every `refit_every` prompts the EMA rewards are min-max normalised, a Gaussian KDE is
    fit and its valleys cut them into buckets; a bucket's group size is
    `samples_per_prompt × (1 + alpha·(1 − normalised mean reward))`. A report is written at each refit.

    Args:
        prompts_per_step: Prompts (groups) per step.
        samples_per_prompt: The base group size: the easiest bucket gets about this many.
        alpha: The hardest bucket gets up to `(1 + alpha) × samples_per_prompt`.
        n_buckets: At most this many buckets (the `n_buckets − 1` deepest KDE valleys).
        ema_decay: Weight of a task's reward history against its latest step.
        refit_every: Prompts between refits; None = one pass over the train split.
        bandwidth: The KDE bandwidth: `scott`, `silverman` or a number (scipy's `bw_method`).
        seed: The order of the shuffled passes (`run.seed` by default).
    """

    def __init__(
        self,
        *,
        prompts_per_step: int = 8,
        samples_per_prompt: int = 4,
        alpha: float = 1.5,
        n_buckets: int = 4,
        ema_decay: float = 0.7,
        refit_every: int | None = None,
        bandwidth: Bandwidth = "scott",
        seed: int = 0,
    ) -> None:
        self.prompts_per_step = prompts_per_step
        self.samples_per_prompt = samples_per_prompt  # the base group size
        self.alpha = alpha
        self.n_buckets = n_buckets
        self.ema_decay = ema_decay  # weight of the history: ema = decay·ema + (1 − decay)·step mean
        self.refit_every = refit_every
        self.bandwidth: Bandwidth = bandwidth
        self.seed = seed
        self.passes = ShuffledPasses(seed)
        self.ema: dict[str, float] = {}  # task uid -> smoothed reward
        self.epoch = 0  # bucket fits done
        self.prompts_since_fit = 0
        self.boundaries: list[float] = []  # reward scale, ascending
        self.buckets: list[Bucket] = []  # empty until the first fit
        self._last_samples: list[int] = []
        self._pending: list[tuple[int, BucketFit]] = []  # reports not yet written

    def config_problems(self) -> list[str]:
        return failed(
            (self.prompts_per_step >= 1, f"curriculum.prompts_per_step={self.prompts_per_step} must be >= 1"),
            (self.samples_per_prompt >= 2,
             f"curriculum.samples_per_prompt={self.samples_per_prompt} must be >= 2 (GRPO compares samples)"),
            (self.alpha >= 0, f"curriculum.alpha={self.alpha} must be >= 0"),
            (self.n_buckets >= 1, f"curriculum.n_buckets={self.n_buckets} must be >= 1"),
            (0.0 <= self.ema_decay < 1.0, f"curriculum.ema_decay={self.ema_decay} must be in [0, 1)"),
            (self.refit_every is None or self.refit_every >= 1,
             f"curriculum.refit_every={self.refit_every} must be >= 1 or null (one pass over the split)"),
        )

    @property
    def refit_period(self) -> int:
        """Prompts between bucket fits."""
        return self.refit_every or len(self.tasks)

    @property
    def default_rollouts(self) -> int:
        """Tasks without a reward yet, or before the first fit, count as middle difficulty:
        neither favoured nor starved until there is evidence."""
        return rollouts_for(0.5, self.samples_per_prompt, self.alpha)

    @property
    def tasks(self) -> list[Task]:
        return self.passes.tasks

    def attach(self, tasks: Sequence[Task]) -> None:
        self.passes.attach(tasks)

    def samples_for(self, uid: str) -> int:
        if uid not in self.ema or not self.buckets:
            return self.default_rollouts
        return self.buckets[bucket_index(self.boundaries, self.ema[uid])].rollouts

    def next_batch(self) -> list[tuple[Task, int]]:
        batch = [(task, self.samples_for(task.uid)) for task in self.passes.take(self.prompts_per_step)]
        self.prompts_since_fit += len(batch)
        self._last_samples = [n for _, n in batch]
        return batch

    def update(self, uids: Sequence[str], rewards: Sequence[float]) -> dict[str, float]:
        """Fold this step's mean reward per task into its EMA; refit the buckets when a period is over."""
        if len(uids) != len(rewards):
            raise ValueError(f"update got {len(uids)} uids but {len(rewards)} rewards")
        per_task: dict[str, list[float]] = defaultdict(list)
        for uid, reward in zip(uids, rewards):
            per_task[uid].append(float(reward))
        for uid, values in per_task.items():
            mean = sum(values) / len(values)
            old = self.ema.get(uid)
            self.ema[uid] = mean if old is None else self.ema_decay * old + (1.0 - self.ema_decay) * mean
        if self.tasks and self.prompts_since_fit >= self.refit_period:
            self._refit()
        return {
            "curriculum/epoch": float(self.epoch),
            "curriculum/buckets": float(len(self.buckets)),  # 0 until the first fit
            "curriculum/seen_fraction": len(self.ema) / max(len(self.tasks), 1),
            "curriculum/samples_per_prompt": float(np.mean(self._last_samples)) if self._last_samples else 0.0,
        }

    def _refit(self) -> None:
        fit = fit_buckets(list(self.ema.values()), self.n_buckets, self.samples_per_prompt, self.alpha, self.bandwidth)
        fit = replace(fit, unseen_tasks=sum(task.uid not in self.ema for task in self.tasks))
        self.epoch += 1
        self.prompts_since_fit = 0
        self.boundaries, self.buckets = list(fit.boundaries), list(fit.buckets)
        self._pending.append((self.epoch, fit))
        log.info("KDE buckets refit\n%s", render_text(fit, self.epoch))

    def take_reports(self, output_dir: Path) -> list[Path]:
        written: list[Path] = []
        for epoch, fit in self._pending:
            written.extend(write_report(fit, epoch, output_dir))
        self._pending = []
        return written

    def state_dict(self) -> dict[str, Any]:
        return {
            "pass_index": self.passes.pass_index,
            "position": self.passes.position,
            "ema": dict(self.ema),
            "epoch": self.epoch,
            "prompts_since_fit": self.prompts_since_fit,
            "boundaries": list(self.boundaries),
            "buckets": [asdict(b) for b in self.buckets],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.passes.restore(int(state["pass_index"]), int(state["position"]))
        self.ema = {str(uid): float(v) for uid, v in state["ema"].items()}
        self.epoch = int(state["epoch"])
        self.prompts_since_fit = int(state["prompts_since_fit"])
        self.boundaries = [float(b) for b in state["boundaries"]]
        self.buckets = [Bucket(**b) for b in state["buckets"]]
