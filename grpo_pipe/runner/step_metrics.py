"""The numbers logged for each step and at the end of a run, computed from what the step produced."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from grpo_pipe.interfaces import RolloutSource
from grpo_pipe.types import Completion, RewardOutput, RolloutGroup, TakenBatch

if TYPE_CHECKING:
    from grpo_pipe.runner.run_totals import OverlapMeter


def async_metrics(taken: TakenBatch, dropped: int, scheduler: RolloutSource) -> dict[str, float]:
    metrics = {
        "async/staleness_mean": sum(taken.staleness) / len(taken.staleness),
        "async/staleness_max": float(max(taken.staleness)),
        "async/groups_dropped": float(dropped),
        "async/groups_dropped_total": float(sum(scheduler.ledger.dropped.values())),
        "async/trainer_wait_s": taken.wait_s,
        "async/engine_idle_s": taken.engine_gap_s,
        "async/queue_depth": float(taken.queue_depth),
    }
    for lag in range(scheduler.max_staleness + 1):  # the staleness histogram, one series per lag
        metrics[f"async/staleness_hist/{lag}"] = float(taken.staleness.count(lag))
    return metrics


def overlap_summary(scheduler: RolloutSource, overlap: OverlapMeter, wait_s: float, loop_s: float) -> dict[str, float]:
    """How much generation and training ran at the same time, over the whole loop (running totals: `OverlapMeter`)."""
    train_s = overlap.train_s()
    gen_s = overlap.generation_s()
    return {
        "summary/loop_s": loop_s,
        "summary/overlap_fraction": overlap.both_s() / max(train_s, 1e-9),
        "summary/engine_idle_fraction": max(1.0 - gen_s / max(loop_s, 1e-9), 0.0),
        "summary/trainer_idle_fraction": wait_s / max(loop_s, 1e-9),
        "summary/groups_dropped": float(sum(scheduler.ledger.dropped.values())),
    }


def rollout_metrics(groups: Sequence[RolloutGroup], gen_s: float) -> dict[str, float]:
    completions = [c for g in groups for c in g.completions]
    tokens = sum(len(c.token_ids) for c in completions)
    return {
        "rollout/time_s": gen_s,
        "rollout/tokens_per_s": tokens / gen_s if gen_s > 0 else 0.0,
        "rollout/generated_tokens_mean": tokens / max(len(completions), 1),
        "rollout/truncated_fraction": sum(c.finish_reason == "length" for c in completions) / max(len(completions), 1),
        "rollout/policy_version_min": float(min(c.policy_version for c in completions)),
        "rollout/policy_version_max": float(max(c.newest_version for c in completions)),
        # In-flight weight updates: samples that newer weights took over mid-way, and their share of tokens.
        "rollout/in_flight_updated_fraction": sum(bool(c.version_switches) for c in completions) / max(len(completions), 1),
        "rollout/tokens_on_newer_weights_fraction": sum(
            len(c.token_ids) - c.version_switches[0][0] for c in completions if c.version_switches
        ) / max(tokens, 1),
        # Of the prompt tokens the engine read (an episode's every turn re-reads its history), the prefix cache's share.
        "rollout/cached_prompt_fraction": sum(c.telemetry.cached_prompt_tokens for c in completions)
        / max(sum(c.telemetry.prompt_tokens or len(g.prompt_token_ids) for g in groups for c in g.completions), 1),
    }


def reward_metrics(scored: RewardOutput) -> dict[str, float]:
    values = scored.values
    mean = sum(values) / len(values)
    metrics = {
        "train/reward/mean": mean,
        "train/reward/std": (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5,
    }
    for name, term in scored.terms.items():
        metrics[f"train/reward/{name}"] = sum(term) / len(term)
    if scored.correct is not None:
        metrics["train/accuracy"] = sum(scored.correct) / len(scored.correct)
    return metrics


def sample_rows(step: int, groups: Sequence[RolloutGroup], scored: RewardOutput, keep: int) -> list[dict[str, Any]]:
    rows, index = [], 0
    for group in groups:
        for completion in group.completions:
            if len(rows) < keep:
                rows.append(
                    {
                        "step": step,
                        "question": group.task.question,
                        "reference": group.task.answer,
                        "completion": completion.text,
                        "reward": scored.values[index],
                        "policy_version": completion.policy_version,
                        **episode_columns(completion),
                    }
                )
            index += 1
    return rows


def episode_columns(completion: Completion) -> dict[str, Any]:
    """An episode's turns as the samples table shows them (nothing for one turn): what the model did, in order."""
    if completion.episode is None:
        return {}
    return {"turns": [{"role": t.role, "text": t.text, **({"tool": t.tool, "outcome": t.outcome} if t.role == "tool" else {})}
                      for t in completion.episode.turns], "ended_by": completion.episode.ended_by}


def quarter_summary(rewards: Sequence[float]) -> dict[str, float]:
    quarter = max(len(rewards) // 4, 1)
    return {
        "summary/reward_first_quarter": sum(rewards[:quarter]) / quarter,
        "summary/reward_last_quarter": sum(rewards[-quarter:]) / quarter,
    }
