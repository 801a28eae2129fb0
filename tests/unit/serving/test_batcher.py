"""Single requests reach the engine in batched rounds: everything that waited while the engine was busy goes in the
next call, grouped by sampling settings, each prompt with its own budget; a failing engine fails only its round."""

from __future__ import annotations

import threading
import time

import pytest

from grpo_pipe.serving.batcher import EndpointClosed, Request, RequestBatcher, SamplingKey
from tests.fakes import GatedEngine

KEY = SamplingKey(temperature=1.0, top_p=1.0)


def _wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def test_requests_that_wait_while_the_engine_works_go_in_one_call_each_with_its_budget() -> None:
    engine = GatedEngine()
    batcher = RequestBatcher(engine=engine)  # type: ignore[arg-type]
    try:
        first = batcher.submit(Request(prompt=(1, 2, 3), samples=1, max_tokens=8, key=KEY))
        assert engine.entered.wait(30)  # the engine is busy with the first request
        waiting = [batcher.submit(Request(prompt=(4, 5, 6, 7), samples=2, max_tokens=budget, key=KEY)) for budget in (2, 3)]
        other = batcher.submit(Request(prompt=(9, 9), samples=1, max_tokens=8, key=SamplingKey(temperature=0.0, top_p=1.0)))
        _wait_until(lambda: batcher.waiting == 3)
        engine.gate.set()
        assert [c.token_ids for c in first.result(30)] == [(3, 2, 1)]
        assert [[c.token_ids for c in f.result(30)] for f in waiting] == [[(7, 6), (7, 6)], [(7, 6, 5), (7, 6, 5)]]
        assert other.result(30)[0].policy_version == 3
    finally:
        batcher.close()
    # the first call, then one per sampling setting for everything that waited, each prompt with its own budget
    assert [len(prompts) for prompts, _ in engine.calls] == [1, 2, 1]
    assert engine.calls[1][1].max_tokens_each == (2, 3) and engine.calls[2][1].temperature == 0.0


def test_a_seeded_request_is_sampled_alone() -> None:
    engine = GatedEngine()
    engine.gate.set()
    batcher = RequestBatcher(engine=engine)  # type: ignore[arg-type]
    try:
        engine.gate.clear()
        blocker = batcher.submit(Request(prompt=(1,), samples=1, max_tokens=4, key=KEY))
        assert engine.entered.wait(30)
        seeded = [batcher.submit(Request(prompt=(2, 3), samples=1, max_tokens=4, key=KEY, seed=7)),
                  batcher.submit(Request(prompt=(4, 5), samples=1, max_tokens=4, key=KEY))]
        _wait_until(lambda: batcher.waiting == 2)
        engine.gate.set()
        for future in [blocker, *seeded]:
            future.result(30)
    finally:
        batcher.close()
    assert [(prompts, s.seed) for prompts, s in engine.calls[1:]] == [([(4, 5)], None), ([(2, 3)], 7)]


def test_an_engine_failure_fails_its_round_and_the_next_round_is_served() -> None:
    engine = GatedEngine()
    engine.fail = True
    batcher = RequestBatcher(engine=engine)  # type: ignore[arg-type]
    try:
        failed = batcher.submit(Request(prompt=(1, 2), samples=1, max_tokens=4, key=KEY))
        engine.gate.set()
        with pytest.raises(RuntimeError, match="engine died"):
            failed.result(30)
        engine.fail = False
        assert batcher.submit(Request(prompt=(1, 2), samples=1, max_tokens=4, key=KEY)).result(30)[0].token_ids == (2, 1)
    finally:
        batcher.close()


def test_closing_fails_what_still_waits_with_a_clear_error() -> None:
    engine = GatedEngine()
    batcher = RequestBatcher(engine=engine)  # type: ignore[arg-type]
    batcher.submit(Request(prompt=(1,), samples=1, max_tokens=4, key=KEY))
    assert engine.entered.wait(30)
    waiting = batcher.submit(Request(prompt=(2,), samples=1, max_tokens=4, key=KEY))
    _wait_until(lambda: batcher.waiting == 1)
    closer = threading.Thread(target=batcher.close)
    closer.start()
    with pytest.raises(EndpointClosed, match="shut down before this request was served"):
        waiting.result(30)
    engine.gate.set()
    closer.join(30)
    with pytest.raises(EndpointClosed, match="shutting down"):
        batcher.submit(Request(prompt=(3,), samples=1, max_tokens=4, key=KEY))


def test_a_paused_batcher_finishes_its_round_holds_the_rest_and_resumes() -> None:
    engine = GatedEngine()
    batcher = RequestBatcher(engine=engine)  # type: ignore[arg-type]
    try:
        first = batcher.submit(Request(prompt=(1, 2), samples=1, max_tokens=4, key=KEY))
        assert engine.entered.wait(30)
        pausing = threading.Thread(target=batcher.pause)
        pausing.start()
        held = batcher.submit(Request(prompt=(3, 4), samples=1, max_tokens=4, key=KEY))
        _wait_until(lambda: batcher.paused)  # paused before the round in flight ends
        engine.gate.set()
        pausing.join(30)
        assert not pausing.is_alive() and first.result(30)[0].token_ids == (2, 1)  # pause waited for the round
        assert not held.done() and batcher.waiting == 1 and len(engine.calls) == 1  # the engine is the owner's now
        batcher.resume()
        assert held.result(30)[0].token_ids == (4, 3)
    finally:
        engine.gate.set()
        batcher.close()


def test_a_burst_of_requests_is_gathered_into_one_call() -> None:
    """The first request of a burst does not take the engine alone: the round waits for the rest (here up to a long
    gather_s, ended as soon as a full call's worth has arrived, so the result does not depend on the machine's speed)."""
    engine = GatedEngine()
    engine.gate.set()
    batcher = RequestBatcher(engine=engine, max_prompts_per_call=3, gather_s=60.0)  # type: ignore[arg-type]
    try:
        burst = [batcher.submit(Request(prompt=(i, 1), samples=1, max_tokens=4, key=KEY)) for i in range(3)]
        for future in burst:
            future.result(30)
    finally:
        batcher.close()
    assert [len(prompts) for prompts, _ in engine.calls] == [3]
