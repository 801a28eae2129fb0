"""Bad tools, environment classes and episode limits fail before any model loads, in the one error list."""

import subprocess
import sys

import pytest

from grpo_pipe.config.errors import ConfigError
from grpo_pipe.runner.pipeline import build
from tests.conftest import TINY

TOOLS = "tests/fixtures/tools"


def _problems(cfg) -> list[str]:
    with pytest.raises(ConfigError) as err:
        build(cfg)
    return err.value.problems


def test_episode_limits_are_named_at_once(compose_cfg) -> None:
    cfg = compose_cfg(["environment=tools", "environment.max_turns=0", "environment.max_episode_tokens=600"])
    problems = "\n".join(_problems(cfg))  # the tiny engine's max_model_len is 512
    assert "environment.max_episode_tokens=600 leaves no room for a prompt in rollout.max_model_len=512" in problems
    assert "environment.max_turns=0: must be >= 1" in problems


def test_every_bad_tool_is_named_at_once(compose_cfg) -> None:
    cfg = compose_cfg(["environment=tools", f"environment.tools=[{TOOLS}/broken.py:lookup,{TOOLS}/my_tools.py:untyped]"])
    problems = "\n".join(_problems(cfg))
    assert f"environment.tools: '{TOOLS}/broken.py:lookup': {TOOLS}/broken.py does not import: ModuleNotFoundError" in problems
    assert "environment.tools: tool 'untyped': " in problems


def test_an_environment_class_without_reset_is_refused(compose_cfg) -> None:
    cfg = compose_cfg(["environment=python", "environment.environment_class=tests/fixtures/environments/no_reset.py:Shop"])
    assert _problems(cfg) == ["environment.environment_class: Shop has no reset(task) method: it starts an episode"]


def test_a_good_tool_config_builds_and_episodes_follow_the_engine_into_the_background(compose_cfg) -> None:
    parts = build(compose_cfg(["environment=tools", f"environment.tools=[calculator,{TOOLS}/my_tools.py:lookup]"]))
    assert [tool.name for tool in parts.environment.tools] == ["calculator", "lookup"]  # type: ignore[attr-defined]
    assert parts.environment.background is False  # type: ignore[attr-defined]  # the synchronous loop
    ahead = build(compose_cfg(["environment=tools", "rollout_scheduler.max_staleness=1"]))
    assert ahead.environment.background is True  # type: ignore[attr-defined]  # the engine generates behind the trainer


def test_the_command_names_a_bad_tool_setting_in_the_one_list_and_leaves_no_folder(tmp_path) -> None:
    """From outside, as a user meets it: rc 2, one block, no traceback, and no outputs/ folder left in the directory
    the job ran from (the shipped tool's constructor judges nothing; its rules are in the one list)."""
    command = [sys.executable, "-m", "grpo_pipe", *TINY, "environment=tools", "environment.tools=[python]",
               "+environment.tool_options.python.wall_s=0"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith("Invalid config:\n") and "Traceback" not in done.stdout + done.stderr, done.stderr
    assert "  - environment.tool_options.python.wall_s=0: must be >= 0.001" in done.stderr
    assert not (tmp_path / "outputs").exists()
