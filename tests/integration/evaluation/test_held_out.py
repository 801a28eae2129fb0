"""Evaluation scores held-out completions with the run's own reward; pass@k from k samples per task.

The engine here is a small in-memory RolloutEngine that answers from a script, so the numbers are exact."""

from collections.abc import Sequence

import pytest

from grpo_pipe.evaluation.held_out import EvalPlan, evaluate, metric_problem
from grpo_pipe.rewards.python_fn import PythonFunctionReward
from grpo_pipe.types import Completion, RequestTelemetry, SamplingSettings, Task

TASKS = [Task(uid="a", question="qa", answer="yes"), Task(uid="b", question="qb", answer="yes"), Task(uid="c", question="qc",
                                                                                                      answer="yes")]
# Greedy answers per task, then the k=4 sampled answers per task.
GREEDY = {1: "yes", 2: "no", 3: "no"}
SAMPLED = {1: ["no", "yes", "no", "no"], 2: ["no", "no", "no", "no"], 3: ["yes", "yes", "no", "yes"]}


class ScriptedEngine:
    served_version = 0

    def generate(self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings):
        def done(text: str) -> Completion:
            return Completion(token_ids=(1, 2, 3), logprobs=(-0.1,) * 3, text=text, finish_reason="stop", policy_version=0,
                              telemetry=RequestTelemetry(prompt_tokens=1, generated_tokens=3, cached_prompt_tokens=0))

        if sampling.temperature == 0.0:
            return [[done(GREEDY[p[0]])] for p in prompts]
        return [[done(t) for t in SAMPLED[p[0]][:n]] for p, n in zip(prompts, samples)]


def says_yes(completions, answers, **_):
    return [2.0 if c == a else -1.0 for c, a in zip(completions, answers)]


PROMPTS = [(1,), (2,), (3,)]


def test_greedy_metrics_come_from_the_reward() -> None:
    reward = PythonFunctionReward(fn=f"{__name__}:says_yes", success_at=2.0)
    metrics = evaluate(ScriptedEngine(), PROMPTS, TASKS, reward, EvalPlan(max_tokens=8, metric="reward"))
    assert metrics["eval/accuracy"] == pytest.approx(1 / 3)
    assert metrics["eval/reward/mean"] == pytest.approx(0.0) and metrics["eval/score"] == pytest.approx(0.0)
    assert metrics["eval/reward/says_yes"] == pytest.approx(0.0)
    assert "eval/pass_at_4" not in metrics


def test_pass_at_k() -> None:
    reward = PythonFunctionReward(fn=f"{__name__}:says_yes", success_at=2.0)
    metrics = evaluate(ScriptedEngine(), PROMPTS, TASKS, reward, EvalPlan(max_tokens=8, pass_k=4))
    assert metrics["eval/score"] == metrics["eval/accuracy"] == pytest.approx(1 / 3)
    assert metrics["eval/pass_at_4"] == pytest.approx(2 / 3)  # tasks a and c have a solved sample
    assert metrics["eval/pass_at_1"] == pytest.approx(4 / 12)


def test_metric_names() -> None:
    assert metric_problem("accuracy") is None and metric_problem("reward/says_yes") is None
    assert metric_problem("acc") == (
        "eval_metric='acc': allowed: 'accuracy', 'reward', or 'reward/<term>' (a term the reward logs)"
    )
