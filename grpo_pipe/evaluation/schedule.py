"""Held-out evaluation in one place: when to evaluate, the best model so far (exported as `best/`),
and early stopping when evaluations stop improving."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_pipe.evaluation.held_out import EvalPlan, evaluate_completions
from grpo_pipe.interfaces import CheckpointStore, Environment, Reward, RolloutEngine
from grpo_pipe.types import Completion, Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LastEvaluation:
    """The latest held-out evaluation: at which step, and what it measured.

    Args:
        step: The step it ran after (0: before training, or none yet).
        metrics: What it measured, by metric key.
    """

    step: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(kw_only=True, eq=False)
class HeldOutEvaluation:
    """Greedy accuracy on the held-out split every `eval_every` steps, before and after training.

    Args:
        prompts: The held-out prompts as token ids, one per task.
        tasks: The held-out tasks, in the order of `prompts`.
        reward: Scores held-out completions: the run's own reward.
        plan: The token budget, which metric is the score, pass@k.
        eval_every: Evaluate every this many steps; 0 = only before and after training.
        patience: Evaluations without a new best before the run stops; 0 = never.
        checkpoints: Keeps the best value and writes `best/`.
        export_best: Writes the current policy as a Hugging Face folder into the given path.
        environment: Runs held-out tasks as the training rollouts run (tools allowed); None: one engine call each.
    """

    prompts: Sequence[tuple[int, ...]]
    tasks: Sequence[Task]
    reward: Reward
    plan: EvalPlan
    eval_every: int
    patience: int
    checkpoints: CheckpointStore
    export_best: Callable[[Path], None]
    environment: Environment | None = None
    history: list[tuple[int, float]] = field(init=False, default_factory=list)  # (step, best_metric value)
    without_improvement: int = field(init=False, default=0)
    last: LastEvaluation = field(init=False, default_factory=LastEvaluation)
    # The latest evaluation's greedy completions, one per task.
    last_completions: list[Completion] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.prompts, self.tasks = list(self.prompts), list(self.tasks)  # copies: the caller's lists may change

    def due(self, step: int, last_step: int) -> bool:
        """Mid-run evaluations only: the last step is evaluated by the run's end."""
        return bool(self.eval_every) and step % self.eval_every == 0 and step != last_step

    def run(self, engine: RolloutEngine, step: int) -> dict[str, float]:
        """Evaluate now and note the result (a new best is exported; step 0 is the baseline)."""
        metrics, self.last_completions = evaluate_completions(engine, self.prompts, self.tasks, self.reward, self.plan,
                                                              self.environment)
        self.last = LastEvaluation(step, metrics)
        self._note(step, metrics)
        return metrics

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.without_improvement >= self.patience

    def _note(self, step: int, metrics: Mapping[str, float]) -> None:
        name = self.checkpoints.best_metric
        if name is None or name not in metrics:
            return
        self.history.append((step, float(metrics[name])))
        if step == 0:  # the untrained model: the baseline to beat, nothing to export
            self.checkpoints.set_best(float(metrics[name]))
            improved = True
        else:
            improved = self.checkpoints.consider_best(metrics, self.export_best)
        self.without_improvement = 0 if improved else self.without_improvement + 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "eval_history": self.history,
            "evals_without_improvement": self.without_improvement,
            "best_value": self.checkpoints.best_value,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history = [(int(s), float(v)) for s, v in state["eval_history"]]
        self.without_improvement = int(state["evals_without_improvement"])
        self.checkpoints.set_best(state["best_value"])
