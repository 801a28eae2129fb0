"""reward=python: a TRL-style function gets per-completion columns (metadata included); None and bad returns."""

from pathlib import Path

import pytest

from grpo_pipe.rewards.python_fn import PythonFunctionReward, RewardFunctionError
from grpo_pipe.types import Completion, RequestTelemetry, RolloutGroup, Task

SEEN: dict = {}


def record_and_score(completions, prompts, answers, level, **kwargs):
    SEEN.update(completions=completions, prompts=prompts, answers=answers, level=level, extra=sorted(kwargs))
    return [None if c == "skip" else float(c == a) + 0.1 * lv for c, a, lv in zip(completions, answers, level)]


def only_completions(completions):
    return [0.5] * len(completions)


def wrong_length(completions, **_):
    return [1.0]


def trl_accuracy(completions, answer, **kwargs):
    """The shape TRL's documentation uses: the dataset's `answer` column under its own name."""
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def raises(completions, **_):
    raise KeyError("level")


def infinite(completions, **_):
    return [float("inf")] * len(completions)


def not_a_number(completions, **_):
    return [float("nan")] * len(completions)


def misspelt(completions, answr):
    return [0.0] * len(completions)


def _completion(text: str) -> Completion:
    return Completion(token_ids=(1, 2), logprobs=(-0.1, -0.2), text=text, finish_reason="stop", policy_version=0,
                      telemetry=RequestTelemetry(prompt_tokens=3, generated_tokens=2, cached_prompt_tokens=0))


def _groups() -> list[RolloutGroup]:
    first = Task(uid="a", question="q1", answer="7", metadata={"level": 1})
    second = Task(uid="b", question="q2", answer="8", metadata={"level": 2}, messages=({"role": "user", "content": "q2"},))
    return [
        RolloutGroup(first, (1,), (_completion("7"), _completion("6"))),
        RolloutGroup(second, (1,), (_completion("8"), _completion("skip"))),
    ]


def test_function_gets_columns_per_completion_and_none_counts_as_none_value() -> None:
    reward = PythonFunctionReward(fn=f"{__name__}:record_and_score", none_value=-1.0, success_at=1.0, completions="text")
    out = reward(_groups())
    assert out.values == pytest.approx([1.1, 0.1, 1.2, -1.0])
    assert out.correct == [True, False, True, False]
    assert out.terms["record_and_score/applies"] == [1.0, 1.0, 1.0, 0.0]
    assert SEEN["answers"] == ["7", "7", "8", "8"] and SEEN["level"] == [1, 1, 2, 2]
    assert SEEN["prompts"][0] == "q1" and SEEN["prompts"][2] == [{"role": "user", "content": "q2"}]
    assert SEEN["extra"] == ["answer", "completion_ids"]


def conversational(completions, answer, **_):
    """TRL's conversational reward: a completion is a list of messages."""
    return [float(c[-1]["content"] == a) for c, a in zip(completions, answer)]


def test_completions_are_message_lists_where_the_prompt_is_chat_messages_as_in_trl() -> None:
    text_prompt, chat_prompt = _groups()
    assert PythonFunctionReward(fn=f"{__name__}:conversational")([chat_prompt]).values == [1.0, 0.0]
    with pytest.raises(RewardFunctionError, match="raised TypeError"):  # text prompt, text completions, as in TRL
        PythonFunctionReward(fn=f"{__name__}:conversational")([text_prompt])
    assert PythonFunctionReward(fn=f"{__name__}:conversational", completions="messages")([text_prompt]).values == [1.0, 0.0]
    assert PythonFunctionReward(fn=f"{__name__}:trl_accuracy", completions="text")([chat_prompt]).values == [1.0, 0.0]


def test_an_episodes_completion_is_its_turns_in_order() -> None:
    from grpo_pipe.rewards.python_fn import completion_messages
    from grpo_pipe.types import EpisodeLog, Turn

    turns = (Turn(role="assistant", text="<calculator>3 * 25</calculator>", tool="calculator"), Turn(role="tool", text="75",
                                                                                                     tool="calculator"),
             Turn(role="assistant", text="#### 75"))
    episode = Completion(token_ids=(1,), logprobs=(0.0,), text="#### 75", finish_reason="stop", policy_version=0,
                         telemetry=RequestTelemetry(prompt_tokens=1, generated_tokens=1,
                                                    cached_prompt_tokens=0), episode=EpisodeLog(turns=turns, model_turns=2,
                                                                                                tool_calls=1))
    assert completion_messages(episode) == [
        {"role": "assistant", "content": "<calculator>3 * 25</calculator>"},
        {"role": "tool", "content": "75", "name": "calculator"},
        {"role": "assistant", "content": "#### 75"},
    ]


def test_a_bad_completion_shape_is_named() -> None:
    bad = PythonFunctionReward(fn=f"{__name__}:conversational", completions="json")  # type: ignore[arg-type]
    assert bad.config_problems()[0].startswith("completions='json': allowed: auto")  # under `reward.` in the job


def test_function_receives_only_the_arguments_it_names() -> None:
    out = PythonFunctionReward(fn=f"{__name__}:only_completions", name="half", success_at=None)(_groups())
    assert out.values == [0.5] * 4 and out.correct is None and "half" in out.terms


def test_a_function_from_a_file_path(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text("def score(completions, **kw):\n    return [len(c) for c in completions]\n")
    reward = PythonFunctionReward(fn=f"{tmp_path}/mine.py:score", completions="text")
    assert reward.config_problems() == [] and reward(_groups()).values == [1.0, 1.0, 1.0, 4.0]


def test_a_wrong_number_of_values_is_an_error() -> None:
    with pytest.raises(RewardFunctionError, match="returned 1 values for 4 completions"):
        PythonFunctionReward(fn=f"{__name__}:wrong_length")(_groups())


@pytest.mark.parametrize("spec", ["no_colon", "no_such_module_xyz:score", f"{__name__}:missing", "nofile.py:score"])
def test_unimportable_functions_are_config_problems(spec: str) -> None:
    (problem,) = PythonFunctionReward(fn=spec).config_problems()
    assert problem.startswith(f"fn={spec!r}: cannot be imported")
    assert "allowed: 'package.module:function' or 'path/to/file.py:function'" in problem


def test_a_trl_shaped_function_gets_the_answer_column_under_its_own_name() -> None:
    out = PythonFunctionReward(fn=f"{__name__}:trl_accuracy", completions="text")(_groups())
    assert out.values == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize(("fn", "says"), [
    ("raises", "raised KeyError: 'level'"),
    ("infinite", "returned inf for task a (completion 'The answer is 0.'); allowed: a finite number or None"),
    ("not_a_number", "returned nan for task a (completion 'The answer is 0.'); allowed: a finite number or None"),
    ("misspelt", "takes answr, which the data does not give; it can take: answer, answers, completion_ids, completions, "
                 "level, prompts (or **kwargs)"),
])
def test_a_broken_function_is_found_on_a_few_rows_before_the_engine_starts(fn: str, says: str) -> None:
    tasks = [g.task for g in _groups()]
    (problem,) = PythonFunctionReward(fn=f"{__name__}:{fn}", completions="text").try_on(tasks)
    assert problem.startswith(f"fn='{__name__}:{fn}'") and says in problem, problem
    assert PythonFunctionReward(fn=f"{__name__}:trl_accuracy", completions="text").try_on(tasks) == []


def test_non_finite_values_are_errors_wherever_the_reward_is_computed_naming_task_and_completion() -> None:
    for fn, value in (("infinite", "inf"), ("not_a_number", "nan")):
        with pytest.raises(RewardFunctionError, match=f"returned {value} for task a \\(completion '7'\\); allowed: "
                                                      "a finite number or None"):
            PythonFunctionReward(fn=f"{__name__}:{fn}", completions="text")(_groups())


def test_a_reward_that_raises_fails_the_job_in_seconds_before_any_model_loads(tmp_path: Path) -> None:
    """From outside, as a user meets it: the command fails with the config error's one block naming the
    function and what it raised; no engine started, no model was loaded."""
    import subprocess
    import sys

    from tests.conftest import REPO, TINY

    (tmp_path / "mine.py").write_text("def score(completions, answer, **kw):\n    return [1 / 0 for _ in completions]\n")
    command = [sys.executable, "-m", "grpo_pipe", *TINY, "reward=python", f"reward.fn={tmp_path}/mine.py:score",
               "logger=none", f"hydra.run.dir={tmp_path}/run"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    flat = " ".join(out.split())  # the console log wraps long lines
    assert done.returncode != 0
    assert "mine.py:score': called on 4 rows of the data with the completion" in flat, out[-2000:]
    assert "raised ZeroDivisionError: division by zero" in flat
    assert "vLLM engine up" not in out and "Loading weights" not in out


def test_a_reward_that_fails_only_on_real_completions_stops_the_run_with_one_paragraph(tmp_path: Path) -> None:
    """It passes the early try (the placeholder) and fails on the first real completion: the console gets one paragraph
    naming the function, the task and the completion; the traceback goes to the run's log file."""
    import subprocess
    import sys

    from tests.conftest import REPO, TINY

    (tmp_path / "mine.py").write_text(
        "def score(completions, **kw):\n    return [0.0 if c == 'The answer is 0.' else float('-inf') for c in completions]\n")
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "grpo_pipe", *TINY, "reward=python", f"reward.fn={tmp_path}/mine.py:score",
               "logger=none", f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    flat = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, flat[-2000:]
    assert "Stopped: reward function" in flat and "mine.py:score returned -inf for task" in flat and "(completion " in flat
    assert "Traceback" not in done.stdout + done.stderr
    assert "Traceback" in (run_dir / "grpo_pipe.log").read_text()


def test_a_weighted_reward_tries_its_user_code_parts_and_names_them() -> None:
    from grpo_pipe.rewards.correctness import CorrectnessReward
    from grpo_pipe.rewards.weighted import WeightedReward

    weighted = WeightedReward({"mine": PythonFunctionReward(fn=f"{__name__}:raises"), "right": CorrectnessReward()},
                              {"mine": 1.0, "right": 1.0})
    (problem,) = weighted.try_on([g.task for g in _groups()])
    assert problem.startswith(f"rewards.mine.fn='{__name__}:raises'") and "raised KeyError" in problem
    assert weighted.source_files() == [Path(__file__)]
