"""A few held-out episodes as a person reads them (a markdown page per evaluation): the task, each turn with its tool
call and result, how the episode ended, and its answer against the reference. What the model learned to do."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from grpo_pipe.types import Completion, Task

EPISODES_SHOWN = 6


def write_episode_page(completions: Sequence[Completion], tasks: Sequence[Task], step: int, folder: Path) -> Path | None:
    """`folder/step-<step>.md` with the first few episodes; None (nothing written) when these were not episodes."""
    shown = [(task, c) for task, c in zip(tasks, completions) if c.episode is not None][:EPISODES_SHOWN]
    if not shown:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"# Held-out episodes at step {step}", "",
             f"The first {len(shown)} of {len(completions)} greedy episodes of this evaluation.", ""]
    for number, (task, completion) in enumerate(shown, 1):
        lines += episode_markdown(number, task, completion)
    page = folder / f"step-{step}.md"
    page.write_text("\n".join(lines), encoding="utf-8")
    return page


def episode_markdown(number: int, task: Task, completion: Completion) -> list[str]:
    episode = completion.episode
    assert episode is not None
    lines = [f"## Episode {number}: `{task.uid}`", "", f"**Task:** {task.question}", ""]
    for turn in episode.turns:
        who = "model" if turn.role == "assistant" else f"tool `{turn.tool}` ({turn.outcome})"
        lines += [f"**{who}:**", "", "```text", turn.text.replace("```", "'''"), "```", ""]
    lines += [f"**Ended by:** {episode.ended_by}; {episode.model_turns} model turn(s), {episode.tool_calls} tool "
              f"call(s), {episode.tool_errors} error(s), {episode.tool_timeouts} timeout(s)",
              f"**Answer:** `{episode.answer.strip() or '(none)'}`; **reference:** `{task.answer}`", ""]
    return lines
