"""Our tool episodes in TRL 1.16's terms, so its `GRPOTrainer(tools=...)` runs the same task as our job: the same
prompt tokens, calls written and read the same way, the same tool behind them, results fed back as the same tokens.

TRL's tool loop needs three things from the tokenizer, none of which SmolLM2's plain ChatML template has:
- a chat template that renders a call (`tool_calls`) and a `tool` message: `tool_chat_template` is the model's own
  ChatML with a call rendered as `<NAME>ARGUMENT</NAME>` (a JSON object where the tool is unknown or takes several
  parameters, as `TagCalls` reads it); the tools themselves are not rendered (our system prompt describes them);
- a response template that reads a call back (`tokenizer.response_template`, transformers' parser): `<NAME>` opens
  a call whose text up to `</NAME>` is the one argument, the rest up to end-of-turn is content;
- plain typed functions with a Google docstring: each of our tools, called through our own `call_all` (the same
  timeout, truncation and error text) and its result wrapped by the call format (`<tool_response>V</tool_response>`).

Where TRL's episode necessarily differs from ours (see also `trl_peer`):
- Our turn ends at the call's closing tag (a stop string) and the end-of-turn token after it is the environment's,
  masked from the loss; TRL appends a tool result only after an end-of-turn token (its `_get_tool_suffix_ids` cuts the
  template at the last EOS), so TRL's turns run without stop strings and the model ends a call turn itself. Where it
  writes `</calculator><|im_end|>` (as the demonstration shows) the tokens are identical to ours, but TRL trains on
  that `<|im_end|>`, and a turn that goes on after the call keeps what it wrote (TRL runs every call it then reads).
- A tag left open where a turn ran out of tokens is a call to TRL (its parser closes the call at the end of the text)
  and is run; ours is an error observation ("not closed"). Several calls in one turn are all run by TRL; ours has
  seen only the first (the stop string ends the turn there).
Everything else matches: the tool result and the template's glue are masked from the loss in both; the result
text, errors included, comes from the same code; an episode that ends on a call (TRL's last tool round, our
`max_turns`) or out of tokens has no answer in either.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from grpo_pipe.config.errors import ConfigError
from grpo_pipe.environments.call_formats import CallFormat
from grpo_pipe.environments.calling import Call, call_all
from grpo_pipe.environments.tool_environment import episode_messages, with_instructions
from grpo_pipe.environments.toolbox import Tool, function_tools
from grpo_pipe.interfaces import Environment
from grpo_pipe.types import EpisodeLog, Task, Turn


@runtime_checkable
class EnvironmentWithTools(Environment, Protocol):
    """An environment with tools (`environment=tools`): the settings the grader and the TRL peer mirror."""

    @property
    def tool_specs(self) -> Sequence[str]: ...  # shipped names or FILE.py:NAME of plain functions

    @property
    def tool_options(self) -> Mapping[str, Mapping[str, Any]]: ...

    @property
    def environment_class(self) -> str | None: ...

    @property
    def call_format(self) -> CallFormat: ...

    @property
    def demonstration(self) -> Sequence[Mapping[str, str]]: ...

    @property
    def tools(self) -> Sequence[Tool]: ...  # loaded once the runner checked its config (`components.build`)

    @property
    def max_turns(self) -> int: ...

    @property
    def max_episode_tokens(self) -> int: ...

    @property
    def max_result_chars(self) -> int: ...

    @property
    def tool_timeout_s(self) -> float: ...


# ChatML that renders a call as `<NAME>ARGUMENT</NAME>`; @DEFAULT_SYSTEM@ is the model template's own system message
# for a conversation that brings none (empty where it adds none).
_TEMPLATE = """\
{%- if messages and messages[0]['role'] != 'system' -%}{{- @DEFAULT_SYSTEM@ -}}{%- endif -%}
{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\\n' -}}
{%- if message['content'] is string -%}{{- message['content'] -}}{%- endif -%}
{%- for call in message.get('tool_calls') or [] -%}
{%- set function = call['function'] if call['function'] is defined else call -%}
{%- set arguments = function['arguments'] -%}
{%- set ns = namespace(raw=false) -%}
{%- if tools and arguments is mapping and arguments | length == 1 -%}
{%- for tool in tools -%}
{%- set spec = tool['function'] if tool['function'] is defined else tool -%}
{%- if spec['name'] == function['name'] and spec['parameters']['properties'] | length == 1 -%}
{%- set ns.raw = true -%}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{{- '<' + function['name'] + '>' -}}
{%- if ns.raw -%}{{- arguments.values() | first -}}
{%- elif arguments is string -%}{{- arguments -}}
{%- else -%}{{- arguments | tojson -}}
{%- endif -%}
{{- '</' + function['name'] + '>' -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"""

_PYTHON_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                                  "object": dict}


@dataclass(frozen=True, kw_only=True)
class ToolPeer:
    """What TRL's tool loop is given: the tools, the chat template and the response template, and the prompts.

    Args:
        functions: The tools as plain functions, for `GRPOTrainer(tools=...)`.
        chat_template: The tokenizer's chat template that renders tool calls and results as the environment does.
        response_template: How transformers' parser reads a call back from a completion.
        system_prompt: The job's system prompt with the call format's description of the tools.
        demonstration: The messages of the environment's worked example, placed before each task.
    """

    functions: list[Callable[..., str]]
    chat_template: str
    response_template: dict[str, Any]
    system_prompt: str
    demonstration: list[dict[str, str]]

    def conversation(self, task: Task) -> list[dict[str, str]]:
        """The task's prompt as messages, exactly as `ToolEnvironment.render_prompt` builds them before rendering."""
        return episode_messages(self.system_prompt, self.demonstration, task)

    def tokenizer(self, model_path: Path) -> Any:
        """The model's tokenizer with the tool chat template and the response template (TRL's `processing_class`)."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        tokenizer.chat_template = self.chat_template
        tokenizer.response_template = self.response_template
        return tokenizer

    def prompt_ids(self, tokenizer: Any, conversations: Sequence[list[dict[str, str]]]) -> list[list[int]]:
        """The prompt ids TRL generates from: its own call (`GRPOTrainer._tokenize_prompts`, no environments)."""
        rendered = tokenizer.apply_chat_template(conversation=list(conversations), tools=self.functions,
                                                 add_generation_prompt=True, tokenize=True, return_dict=True)
        return [list(ids) for ids in rendered["input_ids"]]


def tool_peer(environment: EnvironmentWithTools, tokenizer: Any, system_prompt: str) -> ToolPeer:
    """TRL's view of `episodes` for the model whose (ChatML) tokenizer this is; ConfigError naming every setting TRL's
    tool loop cannot mirror."""
    problems = tool_peer_problems(environment)
    if problems:
        raise ConfigError([f"environment: the TRL peer cannot run these episodes: {p}" for p in problems])
    parameter = environment.tools[0].parameters[0]
    callables = function_tools(list(environment.tool_specs), environment.tool_options)  # the same tools, built the same way
    instructions = environment.call_format.instructions(environment.tools)
    return ToolPeer(
        functions=[trl_function(tool, callables[tool.name], environment) for tool in environment.tools],
        chat_template=tool_chat_template(tokenizer),
        response_template=response_template([t.name for t in environment.tools], parameter, tokenizer.eos_token),
        system_prompt=with_instructions(system_prompt, instructions),
        demonstration=[dict(m) for m in environment.demonstration],
    )


def tool_peer_problems(environment: EnvironmentWithTools) -> list[str]:
    """Why TRL's tool loop could not run the same episodes (empty: it can)."""
    problems = []
    if environment.environment_class:
        problems.append(f"environment_class={environment.environment_class!r}: the peer runs plain function tools only")
    tools, call_format = list(environment.tools), environment.call_format
    if call_format.template_renders_tools or call_format.stop_strings(tools) != [f"</{t.name}>" for t in tools]:
        problems.append(f"call_format={type(call_format).__name__}: the peer reads <NAME>ARGUMENT</NAME> calls (TagCalls)")
    if call_format.result_message("V")["role"] != "tool":
        problems.append(f"call_format result role {call_format.result_message('V')['role']!r}: TRL sends results as "
                        "'tool' messages")
    names = {tuple(tool.parameters) for tool in tools}
    if len(names) != 1 or len(next(iter(names), ())) != 1:
        problems.append("tools " + ", ".join(f"{t.name}({', '.join(t.parameters)})" for t in tools)
                        + ": the peer's response template reads one argument, of the same name for every tool")
    return problems


def tool_chat_template(tokenizer: Any) -> str:
    """ChatML with calls (see the module docstring); it keeps the system message the model's template adds when a
    conversation has none."""
    probe = [{"role": "user", "content": "\u2063Q\u2063"}]
    rendered = tokenizer.apply_chat_template(probe, tokenize=False)
    default_system = rendered[: rendered.find("<|im_start|>user\n")] if "<|im_start|>user\n" in rendered else ""
    return _TEMPLATE.replace("@DEFAULT_SYSTEM@", json.dumps(default_system))


def response_template(tool_names: Sequence[str], parameter: str, eos_token: str) -> dict[str, Any]:
    """transformers' response template for `<NAME>ARGUMENT</NAME>` calls of one-argument tools named `parameter`."""
    names = "|".join(re.escape(name) for name in tool_names)
    return {
        "defaults": {"role": "assistant"},
        "start_anchor": "<|im_start|>assistant\n",
        "fields": {
            "tool_calls": {
                "open_pattern": f"<(?P<name>{names})>",
                "close_pattern": f"</(?:{names})>",
                "repeats": True,
                "content": "text",  # stripped, as TagCalls reads a one-argument call
                "transform": {"type": "function", "function": {"name": "{name}", "arguments": {parameter: "{content}"}}},
            },
            "content": {"close_pattern": re.escape(eos_token) + r"\s*", "content": "text"},
        },
    }


def trl_function(tool: Tool, fn: Callable[..., Any], environment: EnvironmentWithTools) -> Callable[..., str]:
    """`tool` as TRL takes one: a function named after it, typed and documented from its schema (so TRL's schema
    is ours), that runs `fn` as our episodes do and returns the result message's content."""
    function = tool.schema["function"]
    properties: dict[str, Any] = function["parameters"].get("properties", {})

    def call(**arguments: Any) -> str:
        result = call_all([Call(fn, arguments)], environment.tool_timeout_s, environment.max_result_chars)[0]
        return environment.call_format.result_message(result.text)["content"]

    hints = {name: _PYTHON_TYPES.get(spec.get("type", "string"), str) for name, spec in properties.items()}
    call.__name__ = call.__qualname__ = tool.name
    call.__annotations__ = {**hints, "return": str}
    call.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=hint) for name, hint in hints.items()],
        return_annotation=str)
    args = "\n".join(f"    {name}: {spec.get('description', name)}" for name, spec in properties.items())
    call.__doc__ = f"{function.get('description', tool.name)}\n\nArgs:\n{args}\n"
    return call


def final_answer(messages: Sequence[Mapping[str, Any]]) -> str:
    """What our checker grades in a TRL episode: the last assistant turn's text when it called no tool (an episode
    that ends on a call, at TRL's iteration limit or out of tokens, has no answer, as ours then has none)."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return ""
    content = last.get("content")
    return content if isinstance(content, str) else ""


def episode_log(messages: Sequence[Mapping[str, Any]], call_format: CallFormat) -> EpisodeLog:
    """A TRL episode's completion messages as our `EpisodeLog`, tool results unwrapped from the call format's result
    message: what a reward that reads an episode's turns (e.g. `reward=calculator_steps`) sees in ours."""
    head, _, tail = call_format.result_message("\0")["content"].partition("\0")
    turns: list[Turn] = []
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else ""
        if message.get("role") == "tool":
            text = text.removeprefix(head).removesuffix(tail) if text.startswith(head) and text.endswith(tail) else text
            turns.append(Turn(role="tool", text=text, tool=message.get("name"),
                              outcome="error" if text.startswith("error:") else "ok"))
        elif message.get("role") == "assistant":  # TRL keeps a turn's calls apart from its text: show them as written
            calls = "".join(_written_call(call) for call in message.get("tool_calls") or [])
            turns.append(Turn(role="assistant", text=calls + text if calls else text, tool=_called_name(message)))
    tool_turns = [t for t in turns if t.role == "tool"]
    return EpisodeLog(turns=tuple(turns), model_turns=len(turns) - len(tool_turns), tool_calls=len(tool_turns),
                      tool_errors=sum(t.outcome == "error" for t in tool_turns), answer=final_answer(messages))


def _written_call(call: Mapping[str, Any]) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments")
    argument = (next(iter(arguments.values())) if isinstance(arguments, Mapping) and len(arguments) == 1
                else json.dumps(arguments) if not isinstance(arguments, str) else arguments)
    return f"<{function.get('name')}>{argument}</{function.get('name')}>"


def _called_name(message: Mapping[str, Any]) -> str | None:
    calls = message.get("tool_calls") or []
    return calls[0].get("function", calls[0]).get("name") if calls else None
