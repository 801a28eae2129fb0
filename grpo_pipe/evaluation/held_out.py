"""Held-out evaluation that measures what the run optimises: completions are scored by the run's own
reward, so reward and evaluation cannot drift apart, whatever the reward is.

Greedy, one completion per task:
- `eval/accuracy`: the fraction the reward counts as solved (its `correct` flags: a correct number, a
  reasoning-gym score of 1, a user function's value >= its `success_at`); absent when it has no such notion.
- `eval/reward/mean` and `eval/reward/<term>`: the reward and its terms, as in training.
- `eval/score`: the mean of the metric the run names (`run.eval_metric`): `accuracy`, `reward`, or
  `reward/<term>`; what to pick the best checkpoint or stop early by.
Sampled, when `run.eval_pass_k` = k > 0: k completions per task at the training temperature;
`eval/pass_at_<k>` = fraction of tasks with at least one solved completion, `eval/pass_at_1` = fraction of solved
completions (the unbiased pass@1 estimate from the same samples).
Per group, where tasks name one (`by_group`: task lengths, e.g. `eval/accuracy/terms_3`): accuracy, mean reward, and
whether solved episodes made as many calls as their task has operations.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from grpo_pipe.data.prompts import a_few, cut_to
from grpo_pipe.environments.metrics import episode_metrics
from grpo_pipe.evaluation.by_group import group_metrics
from grpo_pipe.interfaces import Environment, Reward, RolloutEngine
from grpo_pipe.types import (
    Completion,
    RewardOutput,
    RolloutGroup,
    SamplingSettings,
    Task,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class EvalPlan:
    """How to evaluate (from `run.*`).

    Args:
        max_tokens: The token budget of each held-out completion.
        metric: Which measure is the score: `accuracy`, `reward` or `reward/<term>`.
        pass_k: Samples per task for pass@k; 0 = greedy only.
        temperature: The sampling temperature of the pass@k samples.
        seed: The seed of the pass@k samples; None: unseeded.
        extra: Further sampling settings (`run.sampling_extra`), e.g. where held-out answers stop, as in training.
    """

    max_tokens: int
    metric: str = "accuracy"
    pass_k: int = 0
    temperature: float = 1.0
    seed: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


def fit_held_out(
    prompts: Sequence[tuple[int, ...]], tasks: Sequence[Task], limit: int, overlong: Literal["skip", "truncate"],
) -> tuple[list[tuple[int, ...]], list[Task]]:
    """The held-out prompts that leave room for the evaluation's budget in the engine, by the rule training uses
    (`run.overlong_prompts`): `skip` drops the others (one warning, naming a few), `truncate` cuts them from the left.
    An engine refuses a prompt that does not fit: unchecked, one long task would end the run at its first evaluation."""
    if overlong == "truncate":
        return [cut_to(p, limit) for p in prompts], list(tasks)
    kept = [(p, t) for p, t in zip(prompts, tasks) if len(p) <= limit]
    skipped = [f"{t.uid} ({len(p)} tokens)" for p, t in zip(prompts, tasks) if len(p) > limit]
    if skipped:
        log.warning("%d of %d held-out task(s) left out of every evaluation, prompt longer than the %d tokens that fit "
                    "the engine beside the evaluation's budget: %s (raise rollout.max_model_len, or "
                    "run.overlong_prompts=truncate)", len(skipped), len(prompts), limit, a_few(skipped))
    return [p for p, _ in kept], [t for _, t in kept]


def metric_problem(metric: str) -> str | None:
    """Why `metric` cannot name an evaluation metric, or None."""
    if metric in ("accuracy", "reward") or (metric.startswith("reward/") and len(metric) > len("reward/")):
        return None
    return f"eval_metric={metric!r}: allowed: 'accuracy', 'reward', or 'reward/<term>' (a term the reward logs)"


def evaluate(
    engine: RolloutEngine, prompts: Sequence[tuple[int, ...]], tasks: Sequence[Task], reward: Reward, plan: EvalPlan,
    environment: Environment | None = None,
) -> dict[str, float]:
    """Greedy metrics, plus pass@k when the plan asks for it; {} without held-out tasks. With `environment`, held-out
    tasks run as episodes too (tools allowed), graded by the same reward."""
    return evaluate_completions(engine, prompts, tasks, reward, plan, environment)[0]


def evaluate_completions(
    engine: RolloutEngine, prompts: Sequence[tuple[int, ...]], tasks: Sequence[Task], reward: Reward, plan: EvalPlan,
    environment: Environment | None = None,
) -> tuple[dict[str, float], list[Completion]]:
    """`evaluate`, and the greedy completions it scored (a few episodes are shown to people)."""
    if not tasks:
        return {}, []
    greedy = SamplingSettings(temperature=0.0, top_p=1.0, max_tokens=plan.max_tokens, extra=plan.extra)
    completions = [r[0] for r in _generate(engine, environment, tasks, prompts, 1, greedy)]  # [T]
    scored = reward(_groups(prompts, tasks, [[c] for c in completions]))
    metrics = {
        **_reward_metrics(scored),
        "eval/generated_tokens_mean": sum(len(c.token_ids) for c in completions) / len(completions),
        "eval/truncated_fraction": sum(c.finish_reason == "length" for c in completions) / len(completions),
    }
    score_key = _metric_key(plan.metric)
    if score_key in metrics:
        metrics["eval/score"] = metrics[score_key]
    else:
        log.warning("run.eval_metric=%s: the reward reports no %s; eval/score not logged", plan.metric, score_key)
    metrics.update(group_metrics(tasks, completions, scored))
    metrics.update(episode_metrics([completions], prefix="eval/episodes"))
    if plan.pass_k > 0:
        metrics.update(pass_at_k(engine, prompts, tasks, reward, plan, environment))
    return metrics, completions


def pass_at_k(
    engine: RolloutEngine, prompts: Sequence[tuple[int, ...]], tasks: Sequence[Task], reward: Reward, plan: EvalPlan,
    environment: Environment | None = None,
) -> dict[str, float]:
    """k sampled completions per task; pass@k and pass@1 by the reward's notion of solved."""
    k = plan.pass_k
    sampling = SamplingSettings(temperature=plan.temperature, top_p=1.0, max_tokens=plan.max_tokens, seed=plan.seed,
                                extra=plan.extra)
    samples = _generate(engine, environment, tasks, prompts, k, sampling)  # [T][k]
    scored = reward(_groups(prompts, tasks, samples))
    if scored.correct is None:
        log.warning("run.eval_pass_k=%d: the reward has no notion of a solved task; pass@k not logged", k)
        return {}
    solved = [scored.correct[i * k : (i + 1) * k] for i in range(len(tasks))]  # [T][k]
    return {
        f"eval/pass_at_{k}": sum(any(s) for s in solved) / len(solved),
        "eval/pass_at_1": sum(sum(s) for s in solved) / (k * len(solved)),
    }


def _generate(engine: RolloutEngine, environment: Environment | None, tasks: Sequence[Task],
              prompts: Sequence[tuple[int, ...]], samples: int, sampling: SamplingSettings) -> list[list[Completion]]:
    if environment is None:
        return engine.generate(prompts, [samples] * len(prompts), sampling)
    return environment.generate(engine, tasks, prompts, [samples] * len(prompts), sampling)


def _metric_key(metric: str) -> str:
    """The logged key a `run.eval_metric` name stands for."""
    return {"accuracy": "eval/accuracy", "reward": "eval/reward/mean"}.get(metric, f"eval/{metric}")


def _groups(
    prompts: Sequence[tuple[int, ...]], tasks: Sequence[Task], completions: Sequence[Sequence[Completion]]
) -> list[RolloutGroup]:
    return [RolloutGroup(t, tuple(p), tuple(c)) for p, t, c in zip(prompts, tasks, completions)]


def _reward_metrics(scored: RewardOutput) -> dict[str, float]:
    values = scored.values
    metrics = {"eval/reward/mean": sum(values) / len(values)}
    for name, term in scored.terms.items():
        metrics[f"eval/reward/{name}"] = sum(term) / len(term)
    if scored.correct is not None:
        metrics["eval/accuracy"] = sum(scored.correct) / len(scored.correct)
    return metrics
