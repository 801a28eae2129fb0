"""The settings of the run itself (`run.*`): what the recipe needs beyond its components."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grpo_pipe.evaluation import EvalPlan, metric_problem


@dataclass(frozen=True)
class RunSettings:
    """Settings of the run itself (`run.*`)."""

    name: str | None = None  # MLflow run name; None = this job's overrides
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 96
    eval_every: int = 0
    eval_size: int = 64
    eval_max_new_tokens: int = 96
    early_stop_patience: int = 0  # stop after this many evaluations without a new best; 0 = never
    max_minutes: float | None = None  # time budget for the training loop: the run ends normally after the step that passes it
    overlong_prompts: Literal["skip", "truncate"] = "skip"  # prompts that leave no room for max_new_tokens
    samples_to_log: int = 16
    seeded_sampling: bool = True  # every batch sampled with a seed derived from `seed`: reproducible, resumable
    shutdown_grace_s: float = 30.0  # after a stop signal the process ends within this, finished or not
    eval_metric: str = "accuracy"  # eval/score: accuracy (the reward's notion of solved) | reward | reward/<term>
    eval_pass_k: int = 0  # k sampled completions per held-out task for eval/pass_at_<k>; 0 = greedy only

    def config_problems(self) -> list[str]:
        problem = metric_problem(self.eval_metric)
        return [problem] if problem else []

    def eval_plan(self) -> EvalPlan:
        return EvalPlan(self.eval_max_new_tokens, self.eval_metric, self.eval_pass_k, self.temperature, self.seed)
