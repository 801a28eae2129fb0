"""The engine's generation thread: order, and a bounded stop (unit tier)."""

from __future__ import annotations

import logging
import threading

import pytest

from grpo_pipe.rollout import background
from grpo_pipe.rollout.background import BackgroundGenerator


def test_calls_run_in_the_order_given_on_one_thread_that_is_not_the_callers() -> None:
    generator = BackgroundGenerator()
    threads: list[int] = []

    def call(index: int) -> int:
        threads.append(threading.get_ident())
        return index

    jobs = [generator.run(call, i) for i in range(5)]
    assert [job.result(timeout=30) for job in jobs] == list(range(5))
    assert len(set(threads)) == 1 and threads[0] != threading.get_ident()
    generator.stop()
    with pytest.raises(RuntimeError):  # a stopped generator takes no more calls
        generator.run(call, 5)


def test_stop_waits_a_bounded_time_for_a_stuck_call_and_drops_the_calls_behind_it(monkeypatch, caplog) -> None:
    monkeypatch.setattr(background, "BACKGROUND_STOP_S", 0.05)
    release = threading.Event()
    generator = BackgroundGenerator()
    stuck = generator.run(release.wait)  # an engine step that does not end
    queued = generator.run(lambda: "never")
    with caplog.at_level(logging.WARNING, logger=background.__name__):
        generator.stop()
    assert queued.cancelled() and not stuck.done()
    assert "did not stop within" in caplog.text
    release.set()
    assert stuck.result(timeout=30) is True
