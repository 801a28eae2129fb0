"""What a person wants to see of a step's (or an evaluation's) episodes, as metrics: turns, tool calls, errors and
timeouts, time in tools, the environment's share of the tokens, and episodes ended by a limit."""

from __future__ import annotations

from collections.abc import Sequence

from grpo_pipe.types import Completion


def episode_metrics(completions: Sequence[Sequence[Completion]], prefix: str = "episodes") -> dict[str, float]:
    """`<prefix>/...` over every completion that was an episode; {} when none was (single-turn runs log nothing new)."""
    logs = [c.episode for group in completions for c in group if c.episode is not None]
    if not logs:
        return {}
    count = len(logs)
    tokens = sum(len(c.token_ids) for group in completions for c in group if c.episode is not None)
    environment_tokens = sum(e.environment_tokens for e in logs)
    return {
        f"{prefix}/turns_mean": sum(e.model_turns for e in logs) / count,
        f"{prefix}/tool_calls_mean": sum(e.tool_calls for e in logs) / count,
        f"{prefix}/tool_calls": float(sum(e.tool_calls for e in logs)),
        f"{prefix}/tool_errors": float(sum(e.tool_errors for e in logs)),
        f"{prefix}/tool_timeouts": float(sum(e.tool_timeouts for e in logs)),
        f"{prefix}/tool_s": sum(e.tool_s for e in logs),
        f"{prefix}/environment_token_share": environment_tokens / tokens if tokens else 0.0,
        f"{prefix}/environment_tokens": float(environment_tokens),
        f"{prefix}/ended_by_limit": float(sum(e.hit_limit for e in logs)),
        f"{prefix}/answered_fraction": sum(e.ended_by == "answer" for e in logs) / count,
    }
