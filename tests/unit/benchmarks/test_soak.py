"""The soak command's verdicts: a least-squares slope with its 95% interval against 1% of the level per hour."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from grpo_pipe.benchmarks.soak import main
from grpo_pipe.benchmarks.soak_fit import report, trend

HOURS = [i / 60 for i in range(60)]  # a sample a minute for an hour
WIGGLE = [(-1) ** i * 0.5 for i in range(60)]  # +-0.5 around the level


def test_a_level_that_only_wiggles_is_flat() -> None:
    found = trend("rss_mib", HOURS, [1000 + w for w in WIGGLE])
    assert found.verdict == "flat" and found.level == pytest.approx(1000, abs=0.01)
    assert found.low_per_h < 0 < found.high_per_h and max(-found.low_per_h, found.high_per_h) < 10


def test_two_percent_an_hour_grows_and_a_fall_as_fast_shrinks() -> None:
    growing = trend("rss_mib", HOURS, [1000 + 20 * t + w for t, w in zip(HOURS, WIGGLE)])
    assert growing.verdict == "grows" and growing.slope_per_h == pytest.approx(20, abs=0.5)
    assert growing.percent_per_h == pytest.approx(2.0, abs=0.1)
    assert trend("rss_mib", HOURS, [1000 - 20 * t + w for t, w in zip(HOURS, WIGGLE)]).verdict == "shrinks"


def test_too_few_or_too_noisy_samples_are_undecided() -> None:
    assert trend("threads", [0.0, 0.1], [10.0, 11.0]).verdict == "undecided"
    assert math.isnan(trend("threads", [0.0, 0.1], [10.0, 11.0]).slope_per_h)
    noisy = trend("step_s", HOURS[:6], [1.0, 3.0, 0.5, 2.5, 1.0, 3.0])
    assert noisy.verdict == "undecided" and noisy.low_per_h < 0 < noisy.high_per_h


def test_the_report_leaves_out_warm_up_and_what_follows_the_last_step() -> None:
    rows = [{"t": 100.0 + 60 * i, "rss_mib": 500.0 if i < 5 or i > 50 else 1000.0 + WIGGLE[i]} for i in range(60)]
    steps = [(100.0 + 60 * i, 1.0) for i in range(51)]  # the last step at minute 50; then evaluation and shutdown
    trends = {t.figure: t for t in report(rows, steps, started=100.0, warmup_s=300.0)}
    assert trends["rss_mib"].samples == 46 and trends["rss_mib"].verdict == "flat"
    assert trends["step_s"].samples == 46 and trends["step_s"].verdict == "flat"


def test_warm_up_counts_from_the_first_step_so_a_slow_start_up_is_not_fitted_as_growth() -> None:
    # Start-up (engine load, compile) takes 4 minutes, GPU memory rising through it; then 30 steps a minute, flat.
    rows = [{"t": 60.0 * i, "gpu_mib": 1000.0 * min(i, 4) + 80000.0 + WIGGLE[i]} for i in range(40)]
    steps = [(240.0 + 60.0 * k, 60.0) for k in range(1, 36)]  # the first step starts at minute 4, the last ends at 39
    trends = {t.figure: t for t in report(rows, steps, started=0.0, warmup_s=120.0)}
    assert trends["gpu_mib"].samples == 34 and trends["gpu_mib"].verdict == "flat"  # minutes 6 to 39
    from_launch = {t.figure: t for t in report(rows, [], started=0.0, warmup_s=120.0)}
    assert from_launch["gpu_mib"].samples == 38 and from_launch["gpu_mib"].slope_per_h > 0  # the start-up's rise


def _swinging_job(peak_per_h: float) -> tuple[list[dict[str, float]], list[tuple[float, float]]]:
    """Two hours of 60-s steps sampled every 5 s; RSS swings 5-8 GiB within each step (generation, then the update),
    its peak rising by `peak_per_h` MiB an hour."""
    rows = [{"t": 5.0 * i, "rss_mib": 5000.0 + 3000.0 * ((i % 12) / 11) + peak_per_h * 5.0 * i / 3600} for i in range(1440)]
    steps = [(60.0 * k + 59.0, 59.0) for k in range(120)]
    return rows, steps


def test_a_step_peak_shows_what_the_swing_within_a_step_hides() -> None:
    flat = {t.figure: t for t in report(*_swinging_job(0.0), started=0.0, warmup_s=600.0)}
    assert flat["rss_mib_step_peak"].verdict == "flat" and flat["rss_mib_step_low"].verdict == "flat"
    assert flat["rss_mib_step_peak"].level == pytest.approx(8000.0) and flat["rss_mib_step_low"].level == pytest.approx(5000.0)
    growing = {t.figure: t for t in report(*_swinging_job(160.0), started=0.0, warmup_s=600.0)}  # 2% of 8 GiB an hour
    assert growing["rss_mib_step_peak"].verdict == "grows"
    assert growing["rss_mib_step_peak"].slope_per_h == pytest.approx(160.0, rel=0.05)


def test_report_only_reads_the_saved_step_times_without_an_mlflow_store(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows, steps = _swinging_job(0.0)
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(list(s)) + "\n" for s in steps))
    assert main(["--minutes", "120", "--warmup-minutes", "10", "--out", str(tmp_path), "--report-only"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["step_s"].split()[1] == "110" and lines["step_s"].endswith("flat")  # 120 steps less 10 minutes
    assert lines["rss_mib_step_peak"].endswith("flat") and not (tmp_path / "mlflow.db").exists()


def test_steps_shorter_than_the_sampling_period_report_no_peak_or_low() -> None:
    # 2-s steps sampled every 5 s (a small model on a GPU): a step holds one sample or none, so it has no peak.
    rows = [{"t": 5.0 * i, "rss_mib": 5000.0 + WIGGLE[i % 60]} for i in range(720)]
    steps = [(2.0 * k + 2.0, 2.0) for k in range(1800)]
    trends = {t.figure: t for t in report(rows, steps, started=0.0, warmup_s=300.0)}
    assert trends["rss_mib"].verdict == "flat"
    assert "rss_mib_step_peak" not in trends and "rss_mib_step_low" not in trends


def test_window_medians_pass_over_single_spikes_that_leave_a_raw_fit_undecided() -> None:
    # A flat 5 GiB sampled every 5 s for 30 minutes, one sample in thirty 600 MiB high (a batch being built).
    rows = [{"t": 5.0 * i, "rss_mib": 5000.0 + (600.0 if i % 30 == 7 else 0.0) + WIGGLE[i % 60]} for i in range(360)]
    steps = [(2.0 * k + 2.0, 2.0) for k in range(900)]
    trends = {t.figure: t for t in report(rows, steps, started=0.0, warmup_s=0.0)}
    assert trends["rss_mib"].verdict == "undecided"
    assert trends["rss_mib_window_median"].verdict == "flat" and trends["rss_mib_window_median"].samples == 14
    rising = [{**r, "rss_mib": r["rss_mib"] + 2.0 * r["t"] / 60} for r in rows]  # +120 MiB an hour, 2.4% of the level
    assert {t.figure: t for t in report(rising, steps, started=0.0, warmup_s=0.0)}["rss_mib_window_median"].verdict == "grows"


def test_window_medians_leave_out_the_last_partial_window() -> None:
    from grpo_pipe.benchmarks.soak_fit import window_medians

    points = [(float(t), float(t)) for t in range(0, 250, 10)]  # 0..240 s: two full windows of 120 s, then one sample
    assert window_medians(points, 120.0) == [(60.0, 55.0), (180.0, 175.0)]
    assert window_medians([], 120.0) == []


def test_window_medians_counted_from_a_given_start_share_their_windows() -> None:
    from grpo_pipe.benchmarks.soak_fit import window_medians

    points = [(float(t), 1.0) for t in range(0, 380, 10)]  # the last at 370 s, inside a third window
    assert [t for t, _ in window_medians(points, 120.0, first=30.0)] == [90.0, 210.0]  # 30-150, 150-270; 270-390 not full
    assert window_medians(points, 120.0, first=30.0) == [(90.0, 1.0), (210.0, 1.0)]


def test_a_rise_that_stops_is_flat_in_the_late_half_and_a_leak_is_not() -> None:
    # 40 minutes sampled every 5 s: a warm-up that outlasts the 5-minute warm-up (80 MiB, time constant 6 minutes),
    # and a leak of 2% of the level an hour.
    rows = [{"t": 5.0 * i, "rss_mib": 4000.0 + 80.0 * (1 - math.exp(-5.0 * i / 360)) + WIGGLE[i % 60]}
            for i in range(480)]
    steps = [(2.0 * k + 2.0, 2.0) for k in range(1200)]
    settling = {t.figure: t for t in report(rows, steps, started=0.0, warmup_s=300.0)}
    assert settling["rss_mib"].verdict == "grows" and settling["rss_mib_late_half"].verdict == "flat"
    leaking = [{**r, "rss_mib": 4000.0 + 80.0 * r["t"] / 3600 + WIGGLE[i % 60]} for i, r in enumerate(rows)]
    leak = {t.figure: t for t in report(leaking, steps, started=0.0, warmup_s=300.0)}
    assert leak["rss_mib_late_half"].verdict == "grows"
    assert leak["rss_mib_late_half"].slope_per_h == pytest.approx(80.0, rel=0.1)


def test_step_time_beside_the_host_probe_tells_a_busier_host_from_a_slower_job() -> None:
    from grpo_pipe.benchmarks.soak_fit import paired_windows, step_host_correlation

    # An hour of 2-s steps; from minute 20 the host takes on other work: the probe doubles, the steps take 30% longer.
    def busy(t: float) -> bool:
        return t >= 1200.0

    rows = [{"t": 5.0 * i, "rss_mib": 5000.0, "host_probe_ms": 10.0 * (2 if busy(5.0 * i) else 1) + WIGGLE[i % 60]}
            for i in range(720)]
    steps = [(2.0 * k + 2.0, 2.0 * (1.3 if busy(2.0 * k + 2.0) else 1.0)) for k in range(1800)]
    found = {t.figure: t for t in report(rows, steps, started=0.0, warmup_s=300.0)}
    assert found["step_s_window_median"].verdict == "grows" and found["host_probe_ms_window_median"].verdict == "grows"
    assert step_host_correlation(paired_windows(rows, steps)) == pytest.approx(1.0, abs=0.02)
    # The job itself slowing (4% an hour) on a steady host: the step time grows beside a flat probe.
    slower = [(t, 2.0 * (1 + 0.04 * t / 3600) + 0.01 * WIGGLE[k % 60]) for k, (t, _) in enumerate(steps)]
    steady = [{**r, "host_probe_ms": 10.0 + 0.3 * math.sin(1.7 * i)} for i, r in enumerate(rows)]  # jitter, no trend
    drift = {t.figure: t for t in report(steady, slower, started=0.0, warmup_s=300.0)}
    assert drift["step_s_window_median"].verdict == "grows"
    assert drift["step_s_window_median"].percent_per_h == pytest.approx(4.0, rel=0.1)
    assert drift["host_probe_ms_window_median"].verdict == "flat"
    unrelated = step_host_correlation(paired_windows(steady, slower))
    assert unrelated is not None and abs(unrelated) < 0.3


def test_soaks_from_before_the_probe_report_step_windows_without_it() -> None:
    from grpo_pipe.benchmarks.soak_fit import paired_windows, step_host_correlation

    rows = [{"t": 5.0 * i, "rss_mib": 5000.0} for i in range(360)]
    steps = [(2.0 * k + 2.0, 2.0) for k in range(900)]
    found = {t.figure: t for t in report(rows, steps, started=0.0, warmup_s=0.0)}
    assert found["step_s_window_median"].samples == 14 and "host_probe_ms_window_median" not in found
    assert step_host_correlation(paired_windows(rows, steps)) is None


def test_the_host_probe_times_real_work() -> None:
    from grpo_pipe.benchmarks.soak import host_probe_ms

    assert 0.0 < host_probe_ms() < 10_000.0


def test_gpu_figures_count_the_runs_processes_and_the_clock_of_their_cards_only() -> None:
    from grpo_pipe.benchmarks.soak import gpu_figures

    apps = "101, 80000, GPU-a\n102, 30000, GPU-a\n999, 50000, GPU-b\n"  # 999 is another user's job on card b
    cards = "GPU-a, 1965\nGPU-b, 1200\nGPU-c, [N/A]\n"
    assert gpu_figures(apps, cards, {101, 102}) == {"gpu_mib": 110000.0, "gpu_sm_mhz": 1965.0}
    assert gpu_figures(apps, cards, {7}) == {"gpu_mib": 0.0}


def test_report_only_prints_how_step_time_moved_with_the_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 30 minutes of 2-s steps; from minute 15 the host is busier (the probe doubles) and the steps take 30% longer.
    rows = [{"t": 5.0 * i, "rss_mib": 5000.0, "host_probe_ms": 20.0 if i >= 180 else 10.0} for i in range(360)]
    steps = [(2.0 * k + 2.0, 2.6 if 2.0 * k + 2.0 >= 900.0 else 2.0) for k in range(900)]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(list(s)) + "\n" for s in steps))
    assert main(["--minutes", "30", "--warmup-minutes", "0", "--out", str(tmp_path), "--report-only"]) == 0
    assert "step time against the host probe, by two-minute windows: r = +1.00" in capsys.readouterr().out.splitlines()


def test_the_memory_of_the_other_processes_is_fitted_apart_from_the_jobs() -> None:
    # Half an hour sampled every 10 s: the job's own process flat, the engine's process stepping up 20 MiB at minute 22.
    rows = [{"t": 10.0 * i, "rss_mib": 5000.0 + (20.0 if i >= 132 else 0.0), "job_rss_mib": 2300.0,
             "others_rss_mib": 2700.0 + (20.0 if i >= 132 else 0.0), "rss_shared_mib": 900.0} for i in range(180)]
    steps = [(10.0 * k + 10.0, 10.0) for k in range(179)]
    found = {t.figure: t for t in report(rows, steps, started=0.0, warmup_s=300.0)}
    assert found["job_rss_mib_window_median"].verdict == "flat"
    assert found["others_rss_mib_window_median"].verdict == "grows"
    assert found["rss_shared_mib_late_half"].verdict == "flat"
    assert found["others_rss_mib_late_half"].slope_per_h > 0


def test_a_step_up_is_listed_with_its_minute_and_a_creep_or_a_flat_figure_is_not() -> None:
    from grpo_pipe.benchmarks.soak_fit import StepUp, step_ups

    # Half an hour sampled every 10 s: the engine's process steps up 20 MiB at minute 22; the job's creeps 0.5 MiB a
    # minute (a slope, not a step); the file-backed part only wiggles.
    rows = [{"t": 10.0 * i, "others_rss_mib": 2700.0 + (20.0 if i >= 132 else 0.0) + WIGGLE[i % 60],
             "job_rss_mib": 2300.0 + 0.05 * i, "rss_shared_mib": 900.0 + WIGGLE[i % 60]} for i in range(180)]
    assert step_ups(rows, ["others_rss_mib", "job_rss_mib", "rss_shared_mib"], started=0.0) == [
        StepUp(figure="others_rss_mib", minute=22.5, rise_mib=20.0)]


def test_report_only_lists_the_step_ups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"t": 10.0 * i, "rss_mib": 5000.0, "job_rss_mib": 2300.0, "others_rss_mib": 2700.0 + (20.0 if i >= 132 else 0.0)}
            for i in range(180)]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps([10.0 * k + 10.0, 10.0]) + "\n" for k in range(179)))
    assert main(["--minutes", "30", "--warmup-minutes", "5", "--out", str(tmp_path), "--report-only"]) == 0
    printed = capsys.readouterr().out.splitlines()[-1]
    assert printed == "memory step-ups after warm-up (one minute's median over the last): others_rss_mib +20 MiB at minute 22.5"


def test_a_sample_splits_the_memory_of_a_real_process_tree_into_the_jobs_own_and_the_others(tmp_path: Path) -> None:
    import subprocess
    import sys

    from grpo_pipe.benchmarks.job_processes import Job
    from grpo_pipe.benchmarks.soak import sample

    # A parent that holds ~64 MiB and waits on a child of its own: the job's process and one other.
    script = ("import subprocess, sys, time; held = bytearray(64 * 2**20); "
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "print('ready', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        row = sample(Job(proc=proc, log=tmp_path / "job.log", marker=None), tmp_path)
    finally:
        for child in Job(proc=proc, log=tmp_path / "job.log", marker=None).processes()[1:]:
            child.kill()
        proc.kill()
        proc.wait()
    assert row["processes"] == 2.0 and row["job_rss_mib"] > 64.0
    assert row["others_rss_mib"] == pytest.approx(row["rss_mib"] - row["job_rss_mib"]) and 0.0 < row["others_rss_mib"] < 64.0
    assert 0.0 < row["rss_shared_mib"] < row["rss_mib"]  # the interpreter's mapped files
