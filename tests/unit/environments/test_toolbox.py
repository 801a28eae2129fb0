"""Everything wrong with a tool or an environment class is found before any model loads, and named."""

from __future__ import annotations

import pytest

from grpo_pipe.config.validate import component_problems
from grpo_pipe.environments.tool_environment import ToolEnvironment
from grpo_pipe.environments.toolbox import function_tools, shipped_tools, tool_schema
from grpo_pipe.environments.tools.calculator import Calculator
from grpo_pipe.environments.tools.python import PythonSandbox

TOOLS = "tests/fixtures/tools/my_tools.py"


def _problems(**settings) -> list[str]:
    return ToolEnvironment(**settings).config_problems()


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
    ({"tools": [f"{TOOLS}:lookup"], "tool_options": {"calculator": {"max_operations": 1}}},
     "tool_options.calculator: settings for a tool that is not among the tools (lookup)"),
    ({"tools": [f"{TOOLS}:lookup"], "tool_options": {"lookup": {"year": 1}}}, "tool_options.lookup: lookup is a function"),
])
def test_bad_tools_are_named_before_anything_loads(settings: dict, expected: str) -> None:
    problems = _problems(**settings)
    assert any(expected in p for p in problems), problems


def test_limits_are_checked_where_they_are_set() -> None:
    assert ToolEnvironment(tools=["calculator"], max_turns=0, tool_timeout_s=0).config_problems() == [
        "environment.max_turns=0: must be >= 1", "environment.tool_timeout_s=0: must be > 0"]


def test_an_environment_class_offers_its_public_methods_as_tools() -> None:
    episodes = ToolEnvironment(environment_class="tests/fixtures/environments/counter.py:Counter")
    assert episodes.config_problems() == []
    assert [tool.name for tool in episodes.tools] == ["add"]
    assert episodes.tools[0].schema["function"]["parameters"]["properties"] == {
        "amount": {"type": "integer", "description": "How much to add."}}


def test_the_shipped_tools_are_the_modules_of_the_tools_package_that_define_one() -> None:
    assert shipped_tools() == {"calculator": Calculator, "python": PythonSandbox}


# One bad value for each setting of each shipped tool, and what the one error list says of it.
BAD_SHIPPED_SETTINGS = [
    ("calculator", "max_operations", 0, "must be null (no limit) or >= 1"),
    ("calculator", "max_digits", 0, "allowed 1 <= max_digits <= "),
    ("python", "cpu_s", 0, "must be >= 0.001"),
    ("python", "wall_s", 0, "must be >= 0.001"),
    ("python", "memory_mb", 1, "must be >= 64"),
    ("python", "output_bytes", 0, "must be >= 1"),
    ("python", "max_processes", -1, "must be >= 0"),
]


def test_every_setting_of_every_shipped_tool_has_a_bad_value_below() -> None:
    import inspect

    covered = {(tool, key) for tool, key, _, _ in BAD_SHIPPED_SETTINGS}
    assert covered == {(name, key) for name, cls in shipped_tools().items() for key in inspect.signature(cls).parameters}


@pytest.mark.parametrize(("tool", "key", "value", "rule"), BAD_SHIPPED_SETTINGS)
def test_a_bad_shipped_tool_setting_is_named_in_the_one_error_list(tool: str, key: str, value: int, rule: str) -> None:
    episodes = ToolEnvironment(tools=[tool], tool_options={tool: {key: value}})
    problems = component_problems("environment", episodes, ["environment"])  # as the collector reports it
    assert len(problems) == 1 and problems[0].startswith(f"environment.tool_options.{tool}.{key}={value}: {rule}"), problems


@pytest.mark.parametrize(("options", "expected"), [
    ({"wall_s": "soon"}, "environment.tool_options.python.wall_s='soon': expected a number"),
    ({"wall": 5}, "environment.tool_options.python.wall: unknown setting for PythonSandbox; allowed: cpu_s, "),
])
def test_a_shipped_tool_setting_of_the_wrong_type_or_name_is_named(options: dict, expected: str) -> None:
    problems = component_problems("environment", ToolEnvironment(tools=["python"], tool_options={"python": options}),
                                  ["environment"])
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_a_users_tool_class_keeps_its_own_rules_and_its_settings_are_checked() -> None:
    def problems(options: dict) -> list[str]:
        return ToolEnvironment(tools=[f"{TOOLS}:Scaler"], tool_options={"Scaler": options}).config_problems()

    assert problems({"factor": 3}) == []
    assert problems({"factor": 0}) == ["tool_options.Scaler.factor=0: must be >= 1"]
    assert problems({"factor": 1.5}) == ["tool_options.Scaler.factor=1.5: expected an integer"]
    assert problems({"scale": 2})[0].startswith("tool_options.Scaler.scale: unknown setting for Scaler; allowed: factor")
    assert function_tools([f"{TOOLS}:Scaler"], {"Scaler": {"factor": 3}})["Scaler"](value=2) == "6"
