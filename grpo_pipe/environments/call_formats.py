"""How a model writes a tool call, and how the call is read back: a component of its own (`environment.call_format`).

- `TagCalls` (for chat templates that render no tools, e.g. SmolLM2's plain ChatML): the call is
  `<NAME>ARGUMENT</NAME>`; a one-parameter tool takes its argument as is (`<calculator>12 * 34</calculator>`), any
  other tool a JSON object of its arguments. The tools and the format are described in the system prompt. The result
  comes back as the content of a `tool` message, `<tool_response>RESULT</tool_response>`.
- `HermesCalls` (for templates that render tools themselves, e.g. Qwen2.5's): `<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>`, the tools passed to `apply_chat_template(tools=...)`.

A turn is cut at the first call's closing tag (a stop string), so a turn holds at most one call. A call that cannot
be read (unknown tool, bad JSON, missing or unexpected arguments, a tag left open) is a problem the model sees as
an error observation, never an exception. `CallFormat` states what every format does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from grpo_pipe.environments.toolbox import Tool


@dataclass(frozen=True)
class ParsedTurn:
    """What a model turn asked for: a call (name and arguments), a malformed call (`problem`), or nothing.

    Args:
        name: The tool the turn calls; None: no call.
        arguments: The call's arguments by name.
        problem: Why the call is malformed, as the model is told; None: it is not.
    """

    name: str | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict)
    problem: str | None = None

    @property
    def acts(self) -> bool:
        """Whether the turn called a tool (well-formed or not): the episode goes on."""
        return self.name is not None or self.problem is not None


class CallFormat(Protocol):
    """How calls are written and read: what `TagCalls` and `HermesCalls` both do, and all that `ToolEnvironment`
    asks of `environment.call_format`."""

    template_renders_tools: bool

    def stop_strings(self, tools: Sequence[Tool]) -> list[str]:
        """Where the engine stops a turn: the end of a call, so the result comes next.

        Args:
            tools: The episode's tools.
        """
        ...

    def instructions(self, tools: Sequence[Tool]) -> str:
        """What the system prompt says about calling the tools (empty where the chat template renders them).

        Args:
            tools: The episode's tools.
        """
        ...

    def parse(self, text: str, tools: Sequence[Tool]) -> ParsedTurn:
        """The calls in a model turn (and a final answer, or a malformed call).

        Args:
            text: The turn's text as the model wrote it.
            tools: The episode's tools, to tell a call from text.
        """
        ...

    def result_message(self, result: str) -> dict[str, str]:
        """The chat message that gives the model a tool's result.

        Args:
            result: The tool's result (or error) as text.
        """
        ...


class TagCalls:
    """`<NAME>ARGUMENT</NAME>` calls, tools described in the system prompt (see the module's description).

    Args:
        result_role: The role of the message that carries a tool's result (the chat template renders it).
        result_template: How a result is written into that message (`{result}` is replaced).
        instructions: Replaces the generated description of the tools in the system prompt when set.
    """

    template_renders_tools = False

    def __init__(self, result_role: str = "tool", result_template: str = "<tool_response>{result}</tool_response>",
                 instructions: str | None = None) -> None:
        self.result_role = result_role  # the role of the message that carries a result (the template renders it)
        self.result_template = result_template
        self.custom_instructions = instructions  # replaces the generated description of the tools when set

    def stop_strings(self, tools: Sequence[Tool]) -> list[str]:
        return [f"</{tool.name}>" for tool in tools]

    def instructions(self, tools: Sequence[Tool]) -> str:
        if self.custom_instructions is not None:
            return self.custom_instructions
        lines = ["You can call these tools. To call one, write <NAME>ARGUMENT</NAME> and stop; the result comes back "
                 "as <tool_response>RESULT</tool_response>. A tool with several parameters takes a JSON object."]
        for tool in tools:
            function = tool.schema["function"]
            params = ", ".join(f"{name}: {spec.get('type', 'any')}"
                               for name, spec in function["parameters"].get("properties", {}).items())
            lines.append(f"- {tool.name}({params}): {function.get('description', '').strip()}")
        return "\n".join(lines)

    def parse(self, text: str, tools: Sequence[Tool]) -> ParsedTurn:
        by_name = {tool.name: tool for tool in tools}
        opened = re.search(r"<(" + "|".join(map(re.escape, by_name)) + r")>", text) if by_name else None
        if opened is None:
            return ParsedTurn()
        name = opened.group(1)
        closing = text.find(f"</{name}>", opened.end())
        if closing < 0:
            return ParsedTurn(problem=f"the call <{name}> was not closed with </{name}>")
        raw = text[opened.end() : closing].strip()
        tool = by_name[name]
        if len(tool.parameters) == 1 and not raw.startswith("{"):
            return _checked(tool, {tool.parameters[0]: _scalar(raw, tool)})
        return _checked(tool, _json_arguments(raw, name))

    def result_message(self, result: str) -> dict[str, str]:
        return {"role": self.result_role, "content": self.result_template.format(result=result)}


class HermesCalls:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, tools rendered by the model's own chat template.

    Args:
        result_role: The role of the message that carries a tool's result (the chat template renders it).
    """

    template_renders_tools = True

    def __init__(self, result_role: str = "tool") -> None:
        self.result_role = result_role

    def stop_strings(self, tools: Sequence[Tool]) -> list[str]:
        return ["</tool_call>"]

    def instructions(self, tools: Sequence[Tool]) -> str:
        return ""  # the chat template describes the tools

    def parse(self, text: str, tools: Sequence[Tool]) -> ParsedTurn:
        opened = text.find("<tool_call>")
        if opened < 0:
            return ParsedTurn()
        closing = text.find("</tool_call>", opened)
        if closing < 0:
            return ParsedTurn(problem="the call <tool_call> was not closed with </tool_call>")
        try:
            call = json.loads(text[opened + len("<tool_call>") : closing])
        except json.JSONDecodeError as err:
            return ParsedTurn(problem=f"the call is not valid JSON ({err.msg})")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return ParsedTurn(problem='a call is {"name": ..., "arguments": {...}}')
        tool = next((t for t in tools if t.name == call["name"]), None)
        if tool is None:
            return ParsedTurn(problem=f"no tool named {call['name']!r}; tools: {', '.join(t.name for t in tools)}")
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            arguments = _json_arguments(arguments, tool.name)
        return _checked(tool, arguments if isinstance(arguments, dict) else {"": arguments})

    def result_message(self, result: str) -> dict[str, str]:
        return {"role": self.result_role, "content": result}


def _json_arguments(raw: str, name: str) -> Any:
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError as err:
        return ParsedTurn(problem=f"the arguments of {name} are not a JSON object ({err.msg})")


def _scalar(raw: str, tool: Tool) -> Any:
    """A one-parameter tool's argument as written, read as JSON when the parameter is not a string."""
    kind = tool.schema["function"]["parameters"]["properties"][tool.parameters[0]].get("type")
    if kind == "string":
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw  # _checked's type check names the problem


_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}


def _checked(tool: Tool, arguments: Any) -> ParsedTurn:
    """The call, or the problem with its arguments (missing, unexpected, of the wrong type)."""
    if isinstance(arguments, ParsedTurn):
        return arguments
    if not isinstance(arguments, dict):
        return ParsedTurn(problem=f"the arguments of {tool.name} must be a JSON object")
    parameters = tool.schema["function"]["parameters"]
    properties, required = parameters.get("properties", {}), parameters.get("required", [])
    missing = [name for name in required if name not in arguments]
    unexpected = [name for name in arguments if name not in properties]
    if missing or unexpected:
        said = [f"missing {', '.join(missing)}" if missing else "", f"unexpected {', '.join(unexpected)}" if unexpected else ""]
        return ParsedTurn(problem=f"{tool.name} takes ({', '.join(properties)}): {'; '.join(s for s in said if s)}")
    for name, value in arguments.items():
        expected = _JSON_TYPES.get(properties[name].get("type", ""))
        if expected is not None and (not isinstance(value, expected) or (expected is int and isinstance(value, bool))):
            return ParsedTurn(problem=f"{tool.name}: {name} must be of type {properties[name]['type']}, got {value!r}")
    return ParsedTurn(name=tool.name, arguments=arguments)
