"""Whatever a tool does becomes an observation: it raises, returns a non-string, hangs, prints or returns megabytes."""

from __future__ import annotations

import threading

from grpo_pipe.environments.calling import Call, call_all
from grpo_pipe.environments.tools.errors import ToolError


def test_every_failure_of_a_tool_is_an_observation_and_the_batch_waits_at_most_the_timeout(capsys) -> None:
    release = threading.Event()

    def hangs() -> str:
        release.wait(60)
        return "late"

    def raises() -> str:
        raise KeyError("no such city")

    def refuses() -> str:
        raise ToolError("the calculator takes one operation per call")

    def prints() -> str:
        print("x" * 5_000_000)
        return "done"

    calls = [Call(lambda: "fine", {}), Call(raises, {}), Call(refuses, {}), Call(lambda: 42, {}), Call(hangs, {}),
             Call(lambda: "y" * 3000, {}), Call(prints, {}), Call(None, {}, problem="no tool named 'lookup'")]
    results = call_all(calls, timeout_s=0.5, max_chars=100)
    release.set()
    assert [r.outcome for r in results] == ["ok", "error", "error", "error", "timeout", "truncated", "ok", "error"]
    assert results[0].text == "fine"
    assert results[1].text == "error: KeyError: 'no such city'"
    assert results[2].text == "error: the calculator takes one operation per call"
    assert results[3].text == "error: the tool returned int, not a string"
    assert results[4].text == "error: the tool did not answer within 0.5 s"
    assert results[5].text == "y" * 100 + "\n[truncated: 100 of 3000 characters shown]"
    assert results[7].text == "error: no tool named 'lookup'"
    assert "xxxxx" not in capsys.readouterr().out  # what a tool prints never reaches the console


def test_calls_run_concurrently() -> None:
    # Each call returns only once all six are running at the same time: called one after the other, the first would
    # wait for the others until the barrier breaks (an error observation), however fast or loaded the machine.
    everyone = threading.Barrier(6, timeout=60)

    def meets() -> str:
        everyone.wait()
        return "ok"

    results = call_all([Call(meets, {}) for _ in range(6)], timeout_s=120, max_chars=10)
    assert [r.text for r in results] == ["ok"] * 6
