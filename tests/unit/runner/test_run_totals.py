"""The loop's totals in bounded memory give the figures that keeping every step gave."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from grpo_pipe.rollout.scheduler import covered_seconds, overlap_seconds
from grpo_pipe.runner.run_totals import OverlapMeter, SamplesTable, StepTimes


def _spans(rng: random.Random, count: int, start: float) -> list[tuple[float, float]]:
    spans, now = [], start
    for _ in range(count):
        now += rng.uniform(0.0, 2.0)
        length = rng.uniform(0.1, 3.0)
        spans.append((now, now + length))
        now += length * rng.uniform(0.0, 1.0)  # some spans overlap the next
    return spans


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_overlap_meter_folds_old_spans_and_keeps_the_totals_exact(seed: int) -> None:
    rng = random.Random(seed)
    train, generation = _spans(rng, 2000, 0.0), _spans(rng, 2000, 0.5)
    meter = OverlapMeter(keep=16)
    for step, span in enumerate(train):  # as a loop adds them: a train span, then the engine's spans so far
        meter.add_train(span)
        meter.add_generation(generation[step : step + 1])
    assert len(meter.train) + len(meter.generation) <= 8 * 16  # bounded, not 4000
    assert meter.train_s() == pytest.approx(covered_seconds(train), rel=1e-9)
    assert meter.generation_s() == pytest.approx(covered_seconds(generation), rel=1e-9)
    assert meter.both_s() == pytest.approx(overlap_seconds(train, generation), rel=1e-9)


def test_step_times_give_exact_medians_up_to_their_bound_and_a_bounded_sample_after() -> None:
    times = StepTimes(kept=100)
    steps = [{"step_s": float(i % 17), "train": float(i % 5)} for i in range(101)]
    for phases in steps:
        times.add(phases)
    kept = times.for_medians()
    assert statistics.median(s["step_s"] for s in kept) == statistics.median(s["step_s"] for s in steps[1:])
    assert times.total_step_s == sum(s["step_s"] for s in steps) and times.first == steps[0]
    for phases in steps * 20:
        times.add(phases)
    assert len(times.for_medians()) == 100 and times.count == 101 * 21


def test_the_samples_table_writes_each_step_and_reads_the_rows_back_once(tmp_path: Path) -> None:
    table = SamplesTable(tmp_path / "samples.jsonl")
    assert table.rows() == []
    table.extend([{"step": 1, "text": "a"}, {"step": 1, "text": "b"}])
    table.extend([{"step": 2, "text": "c"}])
    assert len(table) == 3 and [r["text"] for r in table.rows()] == ["a", "b", "c"]
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 3
    in_memory = SamplesTable()
    in_memory.extend([{"step": 1}])
    assert in_memory.rows() == [{"step": 1}]
