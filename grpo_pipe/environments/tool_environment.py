"""`environment=tools` and `environment=python`: episodes in which the model calls tools over several turns.

One batch of episodes runs as rounds of turns. Each round sends every live episode's next turn to the engine in
one call, continuing from the episode's own tokens (prompt, model turns, environment turns: with prefix caching a
turn costs its new tokens); then every call of the round runs at once, each with a timeout; then the chat
template's glue and each result are appended as tokens. An episode ends when the model answers without a call,
when the environment says it is done, or at a limit (`max_turns`, `max_episode_tokens`), which is counted.

What the trainer gets per episode is one completion: every token after the prompt, exactly as the engine sampled
it or was fed it, `sampled_by_model` marking the model's; the model's tokens keep their engine log-probs and the
policy version that sampled them (a sync that lands between two turns shows as a version switch). The episode's record
and the completion made of it live in `environments/episode.py`; how a call is written and read, in
`environments/call_formats.py`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from grpo_pipe.config.errors import failed
from grpo_pipe.data.prompts import chat_messages
from grpo_pipe.environments.call_formats import CallFormat, ParsedTurn, TagCalls
from grpo_pipe.environments.calling import Call, ToolResult, call_all
from grpo_pipe.environments.chat_glue import ChatGlue
from grpo_pipe.environments.episode import Episode
from grpo_pipe.environments.toolbox import (
    EpisodeTools,
    Tool,
    ToolSpecError,
    environment_tools,
    function_tools,
    load_object,
    method_schema,
    start_environment,
    tool_schema,
)
from grpo_pipe.interfaces import PendingRollout, RolloutEngine
from grpo_pipe.runtime.stopping import GenerationInterrupted
from grpo_pipe.types import Completion, GeneratedBatch, SamplingSettings, Task, Turn, derive_seed

log = logging.getLogger(__name__)


class ToolEnvironment:
    """Tool-using episodes; tools from `tools` (functions) or `environment_class` (one instance per episode).

    The model may call tools for up to `max_turns` turns; the reward scores the whole episode (its final answer).

    Args:
        tools: Shipped tools by name (`calculator`: exact arithmetic, `python`: a sandboxed interpreter) or
            `FILE.py:NAME` functions of your own.
        tool_options: Settings of the shipped tools, by name: `{calculator: {max_operations: 1}, python: {wall_s: 5}}`.
        environment_class: (`environment=python`) `FILE.py:CLASS` whose public methods are the tools, one instance per
            episode.
        call_format: How calls are written and read: `TagCalls` (tools in the system prompt) or `HermesCalls` (the
            template's tools); None = `TagCalls`.
        max_turns: Model turns per episode; an episode still calling a tool after the last one ends (counted).
        max_episode_tokens: Tokens after the prompt (model and environment turns); prompt + this must fit
            `rollout.max_model_len`.
        max_result_chars: A longer tool result is cut, and says so.
        tool_timeout_s: A tool still running after this is abandoned and answers with a timeout (counted).
        demonstration: Messages shown between the system prompt and the task: a worked example of a call.
        background: Run a batch's episodes beside the trainer; None: exactly when the engine may run ahead.
    """

    def __init__(
        self,
        *,
        tools: Sequence[str] | None = None,
        tool_options: Mapping[str, Mapping[str, Any]] | None = None,
        environment_class: str | None = None,
        call_format: CallFormat | None = None,
        max_turns: int = 4,
        max_episode_tokens: int = 256,
        max_result_chars: int = 1000,
        tool_timeout_s: float = 10.0,
        demonstration: Sequence[Mapping[str, str]] = (),
        background: bool | None = None,
    ) -> None:
        self.tool_specs = list(tools or [])
        self.tool_options = {name: dict(opts) for name, opts in (tool_options or {}).items()}
        self.environment_class = environment_class
        self.call_format: CallFormat = call_format or TagCalls()
        self.max_turns = max_turns  # model turns per episode
        self.max_episode_tokens = max_episode_tokens  # tokens after the prompt: model and environment turns together
        self.max_result_chars = max_result_chars  # a longer tool result is cut, and says so
        self.tool_timeout_s = tool_timeout_s
        self.demonstration = [dict(m) for m in demonstration]  # messages shown before the task (a worked example)
        # Run a batch's episodes on a thread of their own, so the trainer trains meanwhile; None: the runner decides
        # (components: exactly when the engine itself generates in the background, or runs elsewhere and may run ahead).
        self.background = background
        self.tools: list[Tool] = []
        self._callables: dict[str, Callable[..., Any]] = {}
        self._class: type | None = None
        self._glue: ChatGlue | None = None
        self._tokenizer: Any = None
        self._system_prompt = ""
        self._closed = threading.Event()
        self._last_job: Future[GeneratedBatch] | None = None
        self._warned_reset_reply = False

    # -- set-up -----------------------------------------------------------------------------------

    def config_problems(self) -> list[str]:
        """Everything wrong with the tools and limits, found before any model loads."""
        problems = failed(
            (self.max_turns >= 1, f"environment.max_turns={self.max_turns}: must be >= 1"),
            (self.max_episode_tokens >= 1, f"environment.max_episode_tokens={self.max_episode_tokens}: must be >= 1"),
            (self.max_result_chars >= 1, f"environment.max_result_chars={self.max_result_chars}: must be >= 1"),
            (self.tool_timeout_s > 0, f"environment.tool_timeout_s={self.tool_timeout_s}: must be > 0"),
        )
        if bool(self.tool_specs) == bool(self.environment_class):
            problems.append("set exactly one of tools (a list of functions) and environment_class (FILE.py:CLASS)")
            return problems
        try:
            self._load_tools()
        except ToolSpecError as err:  # the tools' problems come keyed (`tools: ...`, `tool_options.python.wall_s=...`)
            problems += err.problems if self.tool_specs else [f"environment_class: {p}" for p in err.problems]
        return problems

    def _load_tools(self) -> None:
        if self.tools:
            return
        if self.environment_class:
            cls = load_object(self.environment_class)
            methods = environment_tools(cls)
            self.tools = [Tool(name, method_schema(method, name)) for name, method in methods.items()]
            self._class, self._callables = cls, dict(methods)
            return
        self._callables = function_tools(self.tool_specs, self.tool_options)
        self.tools = [Tool(name, tool_schema(fn, name)) for name, fn in self._callables.items()]

    def setup(self, tokenizer: PreTrainedTokenizerBase, system_prompt: str, max_model_len: int) -> None:
        self._load_tools()
        self._tokenizer = tokenizer
        instructions = self.call_format.instructions(self.tools)
        self._system_prompt = with_instructions(system_prompt, instructions)
        self._glue = ChatGlue(tokenizer, self._system_prompt)
        self._glue.after_turn(self.call_format.result_message("0"), model_ended_turn=False)  # the template can do it

    def completion_budget(self, max_new_tokens: int) -> int:
        return self.max_episode_tokens

    def render_prompt(self, task: Task) -> tuple[int, ...]:
        if self._tokenizer is None:
            raise RuntimeError("environment used before setup()")
        messages = episode_messages(self._system_prompt, self.demonstration, task)
        schemas = [tool.schema for tool in self.tools] if self.call_format.template_renders_tools else None
        text = self._tokenizer.apply_chat_template(messages, tools=schemas, add_generation_prompt=True, tokenize=False)
        return tuple(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- running ----------------------------------------------------------------------------------

    def submit(self, engine: RolloutEngine, tasks: Sequence[Task], prompts: Sequence[Sequence[int]],
               samples: Sequence[int], sampling: SamplingSettings) -> PendingRollout:
        if not self.background:
            return self._run(engine, tasks, prompts, samples, sampling)
        job: Future[GeneratedBatch] = Future()
        after = self._last_job  # batches run in the order they were submitted, as the engine's calls do
        self._last_job = job

        def work() -> None:
            if after is not None:
                after.exception()  # wait for it; its failure is its own caller's to see
            try:
                job.set_result(self._run(engine, tasks, prompts, samples, sampling))
            except BaseException as err:
                job.set_exception(err)

        threading.Thread(target=work, name="grpo-episodes", daemon=True).start()  # never keeps the process alive
        return _Pending(job)

    def generate(self, engine: RolloutEngine, tasks: Sequence[Task], prompts: Sequence[Sequence[int]],
                 samples: Sequence[int], sampling: SamplingSettings) -> list[list[Completion]]:
        return self._run(engine, tasks, prompts, samples, sampling).completions

    def close(self) -> None:
        self._closed.set()  # running episodes stop before their next turn

    def _run(self, engine: RolloutEngine, tasks: Sequence[Task], prompts: Sequence[Sequence[int]],
             samples: Sequence[int], sampling: SamplingSettings) -> GeneratedBatch:
        started = time.time()
        sampling = self._with_stops(sampling)
        firsts = engine.generate(prompts, samples, replace(sampling, max_tokens=min(sampling.max_tokens,
                                                                                     self.max_episode_tokens)))
        episodes = [[self._start(task, tuple(prompt), completion) for completion in turn]
                    for task, prompt, turn in zip(tasks, prompts, firsts)]
        live = [e for group in episodes for e in group if e.ended_by is None]
        round_index = 0
        while live:
            self._act(live)
            live = [e for e in live if e.ended_by is None]
            if not live:
                break
            if self._closed.is_set():
                raise GenerationInterrupted("environment closed")
            round_index += 1
            budgets = tuple(min(sampling.max_tokens, self.max_episode_tokens - len(e.tokens)) for e in live)
            turn_sampling = replace(sampling, max_tokens_each=budgets,
                                    seed=None if sampling.seed is None else derive_seed(sampling.seed, 7919 * round_index))
            outputs = engine.generate([e.prompt + tuple(e.tokens) for e in live], [1] * len(live), turn_sampling)
            for episode, output in zip(live, outputs):
                self._append_model_turn(episode, output[0])
            live = [e for e in live if e.ended_by is None]  # answered, or at a limit: no call is run
        return GeneratedBatch([[e.finish() for e in group] for group in episodes], started, time.time())

    def _with_stops(self, sampling: SamplingSettings) -> SamplingSettings:
        stops = list(sampling.extra.get("stop", [])) + self.call_format.stop_strings(self.tools)
        return replace(sampling, extra={**sampling.extra, "stop": stops, "include_stop_str_in_output": True})

    def _start(self, task: Task, prompt: tuple[int, ...], first: Completion) -> Episode:
        try:
            tools = (start_environment(self._class, self._callables, task) if self._class is not None
                     else EpisodeTools(self._callables))
        except Exception as err:  # the user's environment: a failed reset ends this episode, counted, not the run
            log.warning("environment reset failed for task %s: %s: %s", task.uid, type(err).__name__, err)
            tools = None
        if tools is not None and tools.reset_reply is not None and not self._warned_reset_reply:
            self._warned_reset_reply = True
            log.warning("%s.reset() returned %r: the model does not see it (the prompt is the task's question, rendered "
                        "before the episode starts); put what it should read in the task", self.environment_class,
                        str(tools.reset_reply)[:80])
        episode = Episode(prompt=prompt, tools=tools)
        self._append_model_turn(episode, first)
        if tools is None:
            episode.tool_errors += 1
            episode.ended_by = "environment_error"
        return episode

    def _append_model_turn(self, episode: Episode, turn: Completion) -> None:
        offset = len(episode.tokens)
        if episode.first_version is None:
            episode.first_version = turn.policy_version
        elif turn.policy_version != episode.newest_version:  # a sync landed between two turns
            episode.switches.append((offset, turn.policy_version))
        episode.switches += [(offset + index, version) for index, version in turn.version_switches]
        episode.tokens += turn.token_ids
        episode.logprobs += turn.logprobs
        episode.sampled += [True] * len(turn.token_ids)
        episode.model_turns += 1
        episode.fed_tokens += turn.telemetry.prompt_tokens or len(episode.prompt) + offset
        episode.cached_tokens += turn.telemetry.cached_prompt_tokens
        episode.last_finish = turn.finish_reason
        text = self._decode(turn.token_ids)
        parsed = self.call_format.parse(text, self.tools) if episode.tools is not None else ParsedTurn()
        episode.turns.append(Turn(role="assistant", text=text, tool=parsed.name))
        episode.pending = parsed if parsed.acts else None
        if not parsed.acts:
            episode.answer = text
            episode.ended_by = "length" if turn.finish_reason == "length" else "answer"
        elif episode.model_turns >= self.max_turns:
            episode.ended_by = "max_turns"
        elif len(episode.tokens) >= self.max_episode_tokens:
            episode.ended_by = "token_budget"

    def _act(self, live: Sequence[Episode]) -> None:
        """Run every pending call of this round at once; append each result as the environment's tokens."""
        calls = [self._call_of(e) for e in live]
        results = call_all(calls, self.tool_timeout_s, self.max_result_chars)
        for episode, result in zip(live, results):
            self._append_result(episode, result)

    def _call_of(self, episode: Episode) -> Call:
        parsed = episode.pending
        assert parsed is not None and episode.tools is not None
        if parsed.problem is not None or parsed.name is None:
            return Call(None, {}, problem=parsed.problem or "malformed call")
        return Call(episode.tools.tools[parsed.name], parsed.arguments)

    def _append_result(self, episode: Episode, result: ToolResult) -> None:
        assert self._glue is not None and episode.tools is not None
        episode.tool_calls += 1
        episode.tool_errors += result.outcome == "error"
        episode.tool_timeouts += result.outcome == "timeout"
        episode.tool_s += result.seconds
        name = episode.pending.name if episode.pending is not None else None
        episode.turns.append(Turn(role="tool", text=result.text, tool=name, outcome=result.outcome))
        model_ended = self._glue.ended_turn(tuple(episode.tokens))
        glue = self._glue.after_turn(self.call_format.result_message(result.text), model_ended)
        if len(episode.tokens) + len(glue) >= self.max_episode_tokens:  # no room left for the model's next turn
            episode.ended_by = "token_budget"
            return
        episode.tokens += glue
        episode.logprobs += [0.0] * len(glue)
        episode.sampled += [False] * len(glue)
        if episode.tools.done:
            episode.ended_by = "done"

    def _decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)


def with_instructions(system_prompt: str, instructions: str) -> str:
    """The system prompt of tool episodes: the job's own, then the call format's description of the tools."""
    return "\n\n".join(part for part in (system_prompt, instructions) if part)


def episode_messages(system_prompt: str, demonstration: Sequence[Mapping[str, str]], task: Task) -> list[dict[str, str]]:
    """An episode's prompt as messages: the system prompt, the worked example, then the task."""
    messages = chat_messages(system_prompt, task)
    at = 1 if messages and messages[0]["role"] == "system" else 0
    messages[at:at] = [dict(m) for m in demonstration]
    return messages


@dataclass(frozen=True)
class _Pending:
    job: Future[GeneratedBatch]

    def result(self) -> GeneratedBatch:
        return self.job.result()
