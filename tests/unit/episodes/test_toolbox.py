"""Everything wrong with a tool or an environment class is found before any model loads, and named."""

from __future__ import annotations

import pytest

from grpo_pipe.episodes.tool_episodes import ToolEpisodes
from grpo_pipe.episodes.toolbox import function_tools, tool_schema

TOOLS = "tests/fixtures/tools/my_tools.py"


def _problems(**settings) -> list[str]:
    return ToolEpisodes(**settings).config_problems()


def test_a_users_typed_function_is_a_tool_with_its_schema() -> None:
    tools = function_tools([f"{TOOLS}:lookup"], {})
    schema = tool_schema(tools["lookup"], "lookup")["function"]
    assert schema["name"] == "lookup" and schema["parameters"]["required"] == ["city"]
    assert schema["parameters"]["properties"]["year"]["type"] == "integer"
    assert tools["lookup"]("Oslo") == "Oslo had 1000 people in 2020"


@pytest.mark.parametrize(("settings", "expected"), [
    ({"tools": ["tests/fixtures/tools/broken.py:lookup"]}, "does not import: ModuleNotFoundError"),
    ({"tools": ["tests/fixtures/tools/nowhere.py:lookup"]}, "tests/fixtures/tools/nowhere.py: no such file"),
    ({"tools": [f"{TOOLS}:search"]}, "has no 'search'; it defines: "),
    ({"tools": [f"{TOOLS}:untyped"]}, "tool 'untyped': "),
    ({"tools": [f"{TOOLS}:undocumented"]}, "tool 'undocumented': "),
    ({"tools": [f"{TOOLS}:odd_default"]}, "the default of 'when'"),
    ({"tools": ["abacus"]}, "'abacus': not a shipped tool (calculator, python)"),
    ({"environment_class": "tests/fixtures/environments/no_reset.py:Shop"}, "Shop has no reset(task) method"),
    ({}, "set exactly one of tools"),
    ({"tools": [f"{TOOLS}:lookup"], "tool_options": {"calculator": {"max_operations": 1}}}, "tool_options has settings"),
])
def test_bad_tools_are_named_before_anything_loads(settings: dict, expected: str) -> None:
    problems = _problems(**settings)
    assert any(expected in p for p in problems), problems


def test_limits_are_checked_where_they_are_set() -> None:
    assert ToolEpisodes(tools=["calculator"], max_turns=0, tool_timeout_s=0).config_problems() == [
        "environment.max_turns=0: must be >= 1", "environment.tool_timeout_s=0: must be > 0"]


def test_an_environment_class_offers_its_public_methods_as_tools() -> None:
    episodes = ToolEpisodes(environment_class="tests/fixtures/environments/counter.py:Counter")
    assert episodes.config_problems() == []
    assert [tool.name for tool in episodes.tools] == ["add"]
    assert episodes.tools[0].schema["function"]["parameters"]["properties"] == {
        "amount": {"type": "integer", "description": "How much to add."}}
