"""The TRL peer's reward is the job's own: TRL's tool episodes (message lists) read as our episodes and scored by the
same reward, the first of each call kept as rows of our samples table."""

from __future__ import annotations

from typing import Any

from hydra.utils import instantiate

from grpo_pipe.benchmarks.trl_job import job_reward
from grpo_pipe.environments.call_formats import TagCalls
from grpo_pipe.types import Task

TASK = Task(uid="arithmetic/0", question="Calculate 14 + 3 * 25.", answer="89", metadata={"steps": [75, 89]})


def _call(expression: str, result: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": "",
             "tool_calls": [{"function": {"name": "calculator", "arguments": {"expression": expression}}}]},
            {"role": "tool", "name": "calculator", "content": f"<tool_response>{result}</tool_response>"}]


def test_trls_episodes_get_the_jobs_reward_and_are_kept_as_samples(compose_cfg) -> None:
    reward = instantiate(compose_cfg(["reward=calculator_steps"]).reward, _convert_="all")
    samples: list[dict[str, Any]] = []
    score = job_reward(reward, [TASK], TagCalls(), samples, keep=1)
    solved = [*_call("3 * 25", "75"), *_call("14 + 75", "89"), {"role": "assistant", "content": "#### 89"}]
    one_step = [*_call("3 * 25", "75"), {"role": "assistant", "content": "#### 75"}]
    assert score([solved, one_step], task_index=[0, 0]) == [1.0 + 0.5, 0.5 * 0.5]  # correctness + half the steps' share
    assert score([one_step], task_index=[0]) == [0.25]
    assert [row["step"] for row in samples] == [1, 2]  # one row kept per call, numbered by TRL's scoring calls
    assert [t["text"] for t in samples[0]["turns"] if t["role"] == "tool"] == ["75", "89"]
