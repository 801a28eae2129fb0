"""The learning benchmark's grader: a tool job's snapshots are graded by running its episodes (tools and all) on the
transformers engine, greedy for every snapshot and sampled for the first and the last; on the tiny random model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from grpo_pipe.benchmarks.curves import Curve, Snapshot
from grpo_pipe.benchmarks.hf_engine import HFEngine
from grpo_pipe.benchmarks.learning import Grader, grade_curve
from grpo_pipe.data.prompts import render_prompt
from grpo_pipe.environments.tool_environment import ToolEnvironment
from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.types import Completion, RewardOutput, RolloutGroup, SamplingSettings, Task
from tests.fixtures.call_formats import EveryTurnCalls

TASKS = [Task(uid=f"t/{i}", question=f"what is {i} + 4", answer=str(i + 4)) for i in range(3)]


class CalledTheTool:
    """Counts an episode as solved when a call came back with 5 (`EveryTurnCalls` asks for 2 + 3); keeps what it saw."""

    def __init__(self) -> None:
        self.seen: list[Completion] = []

    def setup(self, model_path: Path, kv_dtype: torch.dtype) -> None:
        pass

    def __call__(self, groups: Sequence[RolloutGroup]) -> RewardOutput:
        completions = [c for g in groups for c in g.completions]
        self.seen += completions
        solved = [c.episode is not None and any(t.role == "tool" and t.text == "5" for t in c.episode.turns)
                  for c in completions]
        return RewardOutput(values=[float(s) for s in solved], correct=solved)


@pytest.fixture(scope="module")
def model_path() -> Path:
    return TinyRandomModel().materialize()


def _episode_grader(model_path: Path, reward: Any, sampled_k: int = 2) -> Grader:
    episodes = ToolEnvironment(tools=["calculator"], call_format=EveryTurnCalls(), max_turns=2, max_episode_tokens=120)
    episodes.setup(AutoTokenizer.from_pretrained(model_path), "Use the calculator.", 512)
    return Grader(tasks=TASKS, prompts=[episodes.render_prompt(t) for t in TASKS], reward=reward, max_new_tokens=8,
                  environment=episodes, sampled_k=sampled_k, seed=0)


def test_a_tool_job_is_graded_on_its_episodes_greedy_and_sampled(model_path: Path) -> None:
    reward = CalledTheTool()
    grader = _episode_grader(model_path, reward)
    assert grader.greedy(model_path) == 1.0
    assert [c.episode.model_turns if c.episode else 0 for c in reward.seen] == [2, 2, 2]  # a call, then the last turn
    assert all(c.episode and c.episode.ended_by == "max_turns" for c in reward.seen)
    assert all(len(c.token_ids) <= 120 and not all(c.loss_mask) for c in reward.seen)  # tool tokens in the episode
    reward.seen.clear()
    assert grader.sampled(model_path) == 1.0 and len(reward.seen) == 2 * len(TASKS)


def test_every_snapshot_is_graded_greedy_and_the_first_and_last_sampled(model_path: Path) -> None:
    reward = CalledTheTool()
    curve = Curve(tool="grpo_pipe", snapshots=[Snapshot(60.0 * i, i, model_path) for i in range(3)], step_rewards=[0.5, 0.5],
                  train_s=120.0, startup_s=1.0)
    grade_curve(curve, _episode_grader(model_path, reward))
    assert curve.accuracy == [1.0, 1.0, 1.0] and curve.sampled == {0: 1.0, 2: 1.0}
    assert len(reward.seen) == 3 * len(TASKS) + 2 * 2 * len(TASKS)
    curve = Curve(tool="trl", snapshots=curve.snapshots, step_rewards=[], train_s=0.0, startup_s=0.0)
    grade_curve(curve, _episode_grader(model_path, reward, sampled_k=0))
    assert curve.sampled == {}


def test_tasks_that_name_their_length_are_graded_per_length_with_their_call_counts(model_path: Path) -> None:
    grouped = [Task(uid=f"g/{i}", question=f"what is {i} + 4", answer=str(i + 4),
                    metadata={"eval_group": f"terms_{2 + i % 2}", "operations": 1 + i % 2}) for i in range(4)]
    episodes = ToolEnvironment(tools=["calculator"], call_format=EveryTurnCalls(), max_turns=2, max_episode_tokens=120)
    episodes.setup(AutoTokenizer.from_pretrained(model_path), "Use the calculator.", 512)
    grader = Grader(tasks=grouped, prompts=[episodes.render_prompt(t) for t in grouped], reward=CalledTheTool(),
                    max_new_tokens=8, environment=episodes, sampled_k=0, seed=0)
    curve = Curve(tool="grpo_pipe", snapshots=[Snapshot(0.0, 0, model_path)], step_rewards=[], train_s=0.0, startup_s=0.0)
    grade_curve(curve, grader)
    groups = curve.by_group[0]
    # Every episode makes one call (EveryTurnCalls, two turns): it matches the one-operation tasks, not the two
    assert groups["eval/accuracy/terms_2"] == groups["eval/accuracy/terms_3"] == 1.0
    assert groups["eval/calls_match/terms_2"] == 1.0 and groups["eval/calls_match/terms_3"] == 0.0
    assert groups["eval/calls_match"] == 0.5


class ParityOfLength:
    """Solved when the text has an even length (the random model never answers right); keeps the texts it saw."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def setup(self, model_path: Path, kv_dtype: torch.dtype) -> None:
        pass

    def __call__(self, groups: Sequence[RolloutGroup]) -> RewardOutput:
        texts = [c.text for g in groups for c in g.completions]
        self.texts += texts
        return RewardOutput(values=[0.0] * len(texts), correct=[len(t) % 2 == 0 for t in texts])


def test_a_one_turn_job_keeps_its_grader_and_samples_on_an_engine_that_decodes_as_it_does(model_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = [render_prompt(tokenizer, "Answer.", t) for t in TASKS]
    reward = ParityOfLength()
    grader = Grader(tasks=TASKS, prompts=prompts, reward=reward, max_new_tokens=8, environment=None, sampled_k=3, seed=0)
    grader.greedy(model_path)  # `grade`, as before episodes
    engine = HFEngine(batch_size=2)
    engine.connect(model_path)
    greedy = engine.generate(prompts, [1] * len(TASKS), SamplingSettings(temperature=0.0, max_tokens=8))
    assert reward.texts == [c[0].text for c in greedy]  # the sampled figures come from the same decoding
    reward.texts.clear()
    assert 0.0 <= grader.sampled(model_path) <= 1.0 and len(reward.texts) == 3 * len(TASKS)
