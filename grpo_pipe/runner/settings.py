"""The settings of the run itself (`run.*`): what the recipe needs beyond its components."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from grpo_pipe.evaluation.held_out import EvalPlan, metric_problem
from grpo_pipe.rollout.sampling_params import sampling_extra_problems

log = logging.getLogger(__name__)

# End-of-run numbers a job can return to a sweeper (RunResult.final_eval and .summary).
SUMMARY_OBJECTIVES = (
    "reward_first_quarter", "reward_last_quarter", "step_s", "loop_s", "overlap_fraction", "engine_idle_fraction",
    "trainer_idle_fraction", "groups_dropped", "in_flight_updated_fraction",
)
EVAL_OBJECTIVE = re.compile(r"eval/(accuracy|score|generated_tokens_mean|truncated_fraction|pass_at_\d+|reward/[\w./-]+)")


def objective_problem(objective: str) -> str | None:
    """Why `objective` cannot name an end-of-run metric, or None."""
    if EVAL_OBJECTIVE.fullmatch(objective) or objective.removeprefix("summary/") in SUMMARY_OBJECTIVES:
        return None
    return (
        f"objective={objective!r}: allowed: eval/accuracy, eval/score, eval/reward/mean, eval/reward/<term>, "
        f"eval/pass_at_<k>, eval/generated_tokens_mean, eval/truncated_fraction, or "
        + ", ".join(f"summary/{name}" for name in SUMMARY_OBJECTIVES)
    )


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """Settings of the run itself (`run.*`).

    Args:
        name: MLflow run name; None: this job's overrides.
        seed: Seeds the model's initialisation where random, the data's order, and every batch's sampling.
        temperature: Sampling temperature; the trainer's log-probs use the same.
        top_p: Accepted at 1.0 only: the trainer's log-probs follow the plain softmax at `temperature`.
        max_new_tokens: Tokens one model turn may generate.
        eval_every: Steps between held-out evaluations; 0: before the first step and after the last only.
        eval_size: Held-out tasks per evaluation.
        eval_max_new_tokens: Tokens one held-out answer may generate.
        early_stop_patience: Stop after this many evaluations without a new best; 0: never.
        max_minutes: Time budget of the training loop: the run ends normally after the step that passes it.
        overlong_prompts: Prompts that leave no room for `max_new_tokens`: `skip` (counted) or `truncate`.
        samples_to_log: Completions of each step kept for the run's `samples.json`.
        seeded_sampling: Every batch sampled with a seed derived from `seed`: reproducible and resumable.
        shutdown_grace_s: After a stop signal the process ends within this, finished or not.
        eval_metric: What `eval/score` is: `accuracy` (the reward's notion of solved), `reward`, or `reward/<term>`.
        eval_pass_k: Sampled completions per held-out task for `eval/pass_at_<k>`; 0: greedy only.
        objective: What the job returns to a sweeper (Optuna) and what a sweep's comparison ranks by.
        objective_direction: `maximize` or `minimize` the objective.
        mismatch_warn: On-policy batches whose mean |log pi_trainer - log pi_sampler| passes this warn (once): the
            engine is not serving the trainer's weights (a broken sync), or the two sides compute differently; None:
            never.
        top_k: Accepted at 0 only (as `top_p`).
        min_p: Accepted at 0.0 only (as `top_p`).
        repetition_penalty: Accepted at 1.0 only (as `top_p`).
        sampling_extra: Other vLLM sampling parameters, passed through where they leave the distribution alone
            (`stop`, `ignore_eos`, ...).
    """

    name: str | None = None
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 96
    eval_every: int = 0
    eval_size: int = 64
    eval_max_new_tokens: int = 96
    early_stop_patience: int = 0
    max_minutes: float | None = None
    overlong_prompts: Literal["skip", "truncate"] = "skip"
    samples_to_log: int = 16
    seeded_sampling: bool = True
    shutdown_grace_s: float = 30.0
    eval_metric: str = "accuracy"
    eval_pass_k: int = 0
    objective: str = "eval/accuracy"
    objective_direction: Literal["maximize", "minimize"] = "maximize"
    mismatch_warn: float | None = 0.1
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    sampling_extra: Mapping[str, Any] = field(default_factory=dict)

    def config_problems(self) -> list[str]:
        problems = [metric_problem(self.eval_metric), objective_problem(self.objective)]
        problems += sampling_extra_problems(self.sampling_extra)
        unmatched = [f"run.{name}={value}" for name, value, neutral in (
            ("top_p", self.top_p, 1.0), ("top_k", self.top_k, 0), ("min_p", self.min_p, 0.0),
            ("repetition_penalty", self.repetition_penalty, 1.0)) if value != neutral]
        if unmatched:
            problems.append(
                f"{', '.join(unmatched)}: not supported: the trainer computes each token's log-prob from the plain "
                "softmax at run.temperature, so the engine would sample from a distribution the loss does not know and "
                "every importance ratio would be off; allowed: top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0")
        if self.mismatch_warn is not None and self.mismatch_warn <= 0:
            problems.append(f"run.mismatch_warn={self.mismatch_warn}: must be > 0, or null for no warning")
        return [p for p in problems if p]

    def objective_value(self, end_metrics: Mapping[str, float]) -> float:
        """The objective out of the run's end-of-run metrics; NaN (a failed trial to Optuna) when it was not logged."""
        value = end_metrics.get(self.objective)
        if value is None or not math.isfinite(value):
            log.warning("run.objective=%s was not logged by this run; returning NaN", self.objective)
            return math.nan
        return float(value)

    def eval_plan(self) -> EvalPlan:
        return EvalPlan(max_tokens=self.eval_max_new_tokens, metric=self.eval_metric, pass_k=self.eval_pass_k,
                        temperature=self.temperature, seed=self.seed,
                        extra=dict(self.sampling_extra))
