"""Calling tools: all calls of a turn at once, each with a timeout, and whatever a tool does becomes an observation.

A call runs on a daemon thread of its own, so one that hangs delays the batch by at most `timeout_s` and never
keeps the process from exiting (a Python function cannot be killed: it is abandoned and counted; the `python`
tool runs in a process of its own, which its own limits kill). What a tool prints goes to a bounded buffer that
is dropped, not to the console.
"""

from __future__ import annotations

import io
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from grpo_pipe.environments.tools.errors import ToolError

PRINT_BUFFER_CHARS = 64_000  # what a tool may print before the rest is dropped unseen


@dataclass(frozen=True)
class ToolResult:
    """What the model sees as a tool's answer, and how the call went.

    Args:
        text: The answer the model sees (an error message for a failed call).
        outcome: How the call went: `ok`, `error`, `timeout` or `truncated`.
        seconds: How long the call took.
    """

    text: str
    outcome: str
    seconds: float


@dataclass(frozen=True)
class Call:
    """One call to make: the callable and its arguments (or, for a malformed call, the problem to report).

    Args:
        fn: The tool to call; None for a malformed call.
        arguments: Its keyword arguments.
        problem: What is wrong with a malformed call, reported to the model as its result; None: nothing.
    """

    fn: Callable[..., Any] | None
    arguments: Mapping[str, Any]
    problem: str | None = None


def call_all(calls: Sequence[Call], timeout_s: float, max_chars: int) -> list[ToolResult]:
    """Run every call concurrently; return a result per call, in order, within about `timeout_s`."""
    started = time.perf_counter()
    slots: list[ToolResult | None] = [None] * len(calls)
    threads = []
    with _printed_output_dropped():
        for index, call in enumerate(calls):
            if call.problem is not None or call.fn is None:
                slots[index] = ToolResult(f"error: {call.problem}", "error", 0.0)
                continue
            thread = threading.Thread(target=_run, args=(call, slots, index, max_chars), daemon=True,
                                      name=f"grpo-tool-{index}")
            thread.start()
            threads.append(thread)
        deadline = started + timeout_s
        for thread in threads:
            thread.join(max(deadline - time.perf_counter(), 0.0))
    return [slot if slot is not None else ToolResult(f"error: the tool did not answer within {timeout_s:g} s", "timeout",
                                                     time.perf_counter() - started)
            for slot in slots]


def _run(call: Call, slots: list[ToolResult | None], index: int, max_chars: int) -> None:
    started = time.perf_counter()
    try:
        assert call.fn is not None
        value = call.fn(**call.arguments)
    except ToolError as err:  # the tool's own message for the model
        slots[index] = ToolResult(f"error: {err}", "error", time.perf_counter() - started)
        return
    except BaseException as err:  # a tool that fails is an observation, whatever it raised
        slots[index] = ToolResult(f"error: {type(err).__name__}: {err}", "error", time.perf_counter() - started)
        return
    seconds = time.perf_counter() - started
    if not isinstance(value, str):
        slots[index] = ToolResult(f"error: the tool returned {type(value).__name__}, not a string", "error", seconds)
        return
    slots[index] = truncated(value, max_chars, seconds)


def truncated(text: str, max_chars: int, seconds: float) -> ToolResult:
    """The result within its budget, saying so when it was cut."""
    if len(text) <= max_chars:
        return ToolResult(text, "ok", seconds)
    return ToolResult(f"{text[:max_chars]}\n[truncated: {max_chars} of {len(text)} characters shown]", "truncated", seconds)


class _ThreadRoutedStream(io.TextIOBase):
    """stdout/stderr while tools run: a tool thread's writes go to a bounded buffer; other threads' to the console."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.dropped = threading.local()

    def write(self, text: str) -> int:
        if threading.current_thread().name.startswith("grpo-tool-"):
            kept = getattr(self.dropped, "chars", 0)
            self.dropped.chars = min(kept + len(text), PRINT_BUFFER_CHARS)  # counted, never held
            return len(text)
        return self.console.write(text)

    def flush(self) -> None:
        self.console.flush()


_ROUTING_LOCK = threading.Lock()


@contextmanager
def _printed_output_dropped() -> Iterator[None]:
    with _ROUTING_LOCK:
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _ThreadRoutedStream(saved[0]), _ThreadRoutedStream(saved[1])
    try:
        yield
    finally:
        with _ROUTING_LOCK:
            sys.stdout, sys.stderr = saved
