"""Soak: run a job for a given time and say, figure by figure, whether it stays flat after warm-up.

    python -m grpo_pipe.benchmarks.soak --minutes 120 --warmup-minutes 10 --out soak/ -- trainer.steps=1000000

The job is the command itself (`python -m grpo_pipe <overrides> run.max_minutes=<minutes>`: it ends normally when
its time is up, with its final evaluation). Every `--every` seconds the driver samples, over every process of the
run (the job and everything below it): resident memory (RSS, summed, and the job's own process), open file
descriptors, threads, processes; GPU memory of those processes and the lowest SM clock of their cards where
`nvidia-smi` exists; and the sizes on disk of the MLflow store, the artifacts, the run folder (checkpoints, reports)
and the tracker's outbox journal (written only while the tracking store does not answer; the outbox's queue in
memory shows in the job's RSS). Step times come from the run's own `time/step_s` metric. For each figure it prints
its level after warm-up (counted from the first step's start), the least-squares slope per hour with its 95%
interval, and a verdict:

- `flat`: the whole interval lies within +-1% of the level per hour (the issue's bar for RSS);
- `grows` / `shrinks`: the interval lies wholly above / below zero and the slope passes 1% of the level per hour;
- `undecided`: the interval is too wide to say (too few samples, or too noisy).

RSS is also taken once per step, at its peak and at its low within the step (`rss_mib_step_peak`, `..._step_low`): a
job's RSS swings by gigabytes within a step, which widens the interval of a fit to raw samples; the peak of every
step is taken at the same phase, so growth from one step to the next shows (steps that hold three samples or more:
two-second steps sampled every five seconds have no peak). RSS and GPU memory are also fitted by the median of each
two-minute window (`*_window_median`): short GPU steps and the odd sample taken while a batch is built or a checkpoint
written make raw samples noisy, the medians are not. RSS is fitted once more over the second half of the samples
after warm-up (`*_late_half`): a leak grows in both halves alike, where a warm-up that outlasts `--warmup-minutes`
grows early and stops.

Step time is also taken by two-minute medians (`step_s_window_median`), beside the host's own speed: every sample
times a fixed piece of single-threaded interpreter work (`host_probe_ms`, and its medians over the same windows),
and the command prints the correlation of the two by window. A small model's job is bound by the host's cores as
much as by its card, and a host shared with other work speeds up and slows down: a step-time slope that moves with
the probe is the host's, one beside a flat probe is the job's. The probe says that the host changed, not by how much
that slows the job, so step time is not divided by it. `--report-only` reports again on a folder already written
(its `samples.jsonl`, and `steps.jsonl` or the MLflow store), e.g. with another warm-up.

Sizes on disk that grow with the run by design (the MLflow store: one row per metric and step) are reported the same
way: their slope is the rate a user must plan space for, not a leak. Writes `samples.jsonl` and `report.json` under
`--out`, and the step times as `steps.jsonl`, so that `--report-only` needs neither the job nor its MLflow store.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from grpo_pipe.benchmarks.job_processes import Job, kill_left, start_job, still_alive

FLAT_PER_HOUR = 0.01  # a figure whose slope stays within 1% of its level per hour is flat
PENDING_JOURNAL = "mlflow_pending.jsonl"
STEPS_FILE = "steps.jsonl"  # (end time, seconds) of every step, written when the job has ended
WINDOW_S = 120.0  # the level of a figure by windows of two minutes (`*_window_median`)
SAMPLES_PER_STEP = 3  # a step's peak and low need this many samples inside it; one sample is neither
PROBE_LOOPS = 100_000  # the host probe's fixed work: ~10 ms of interpreter time on an idle core


@dataclass(frozen=True, kw_only=True)
class Trend:
    """How one figure moved over the soak: its level, its slope per hour and the verdict on it.

    Args:
        figure: The figure's name.
        samples: The samples the slope was fitted to.
        level: Mean after warm-up.
        slope_per_h: The least-squares slope, per hour.
        low_per_h: The 95% interval's low end of the slope.
        high_per_h: The 95% interval's high end of the slope.
        verdict: `flat`, `grows`, `shrinks` or `undecided`, against 1% of the level per hour.
    """

    figure: str
    samples: int
    level: float
    slope_per_h: float
    low_per_h: float
    high_per_h: float
    verdict: str

    @property
    def percent_per_h(self) -> float:
        return 100.0 * self.slope_per_h / self.level if self.level else math.nan


def trend(figure: str, hours: Sequence[float], values: Sequence[float]) -> Trend:
    """Least-squares slope of `values` over `hours`, its 95% interval (t quantile, normal above 30 points) and the
    verdict against 1% of the level per hour."""
    n = len(values)
    level = statistics.fmean(values) if values else math.nan
    if n < 3 or len(set(hours)) < 2:
        return Trend(figure=figure, samples=n, level=level, slope_per_h=math.nan, low_per_h=math.nan, high_per_h=math.nan,
                     verdict="undecided")
    mean_t = statistics.fmean(hours)
    sxx = sum((t - mean_t) ** 2 for t in hours)
    slope = sum((t - mean_t) * (v - level) for t, v in zip(hours, values)) / sxx
    residuals = [v - (level + slope * (t - mean_t)) for t, v in zip(hours, values)]
    stderr = math.sqrt(sum(r * r for r in residuals) / (n - 2) / sxx)
    half = _t95(n - 2) * stderr
    low, high = slope - half, slope + half
    bar = FLAT_PER_HOUR * abs(level)
    if max(abs(low), abs(high)) <= bar:
        verdict = "flat"
    elif low > 0 and slope > bar:
        verdict = "grows"
    elif high < 0 and -slope > bar:
        verdict = "shrinks"
    else:
        verdict = "undecided"
    return Trend(figure=figure, samples=n, level=level, slope_per_h=slope, low_per_h=low, high_per_h=high, verdict=verdict)


def _t95(df: int) -> float:
    """The two-sided 95% quantile of Student's t (a table to 30 degrees of freedom, the normal's beyond)."""
    table = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13, 2.12, 2.11,
             2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05, 2.04]
    return table[df - 1] if 1 <= df <= len(table) else 1.96


def sample(job: Job, folder: Path) -> dict[str, float]:
    """One sample of every figure, now."""
    rss = fds = threads = 0
    own_rss = 0.0
    processes = job.processes()
    for process in processes:
        try:
            with process.oneshot():
                memory = process.memory_info().rss
                rss += memory
                fds += process.num_fds()
                threads += process.num_threads()
                if process.pid == job.pid:
                    own_rss = memory
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    row = {"t": time.time(), "rss_mib": rss / 2**20, "job_rss_mib": own_rss / 2**20, "open_fds": float(fds),
           "threads": float(threads), "processes": float(len(processes)),
           "mlflow_store_mib": _size(folder / "mlflow.db") / 2**20,
           "artifacts_mib": _size(folder / "artifacts") / 2**20,
           "run_folder_mib": _size(folder / "run") / 2**20,
           "outbox_journal_kib": _size(folder / "run" / PENDING_JOURNAL) / 2**10,
           "host_probe_ms": host_probe_ms()}
    row.update(_gpu_figures({p.pid for p in processes}))
    return row


def host_probe_ms() -> float:
    """Milliseconds the host takes for a fixed piece of single-threaded interpreter work (the median of three): how
    busy or slow the host is, beside the step time. A job of a small model is bound by the host's cores as much as
    by its card: two soaks on two cards of one host measured their generation rates moving together minute by
    minute (correlation 0.8-0.9), so a host that got busier would read as the job's step time drifting. The probe
    sees what slows a core (other load, a lower clock); it does not see a shared card or memory bandwidth."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        total = 0
        for i in range(PROBE_LOOPS):
            total += i % 7
        times.append(time.perf_counter() - start)
    return 1000.0 * statistics.median(times)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _gpu_figures(pids: set[int]) -> dict[str, float]:
    """GPU memory used by `pids` and the lowest SM clock among the cards they use (`nvidia-smi`); nothing on a
    machine without it."""
    if shutil.which("nvidia-smi") is None:
        return {}
    apps = _nvidia_smi("--query-compute-apps=pid,used_memory,gpu_uuid")
    cards = _nvidia_smi("--query-gpu=uuid,clocks.sm")
    return gpu_figures(apps, cards, pids)


def _nvidia_smi(query: str) -> str:
    return subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                          check=False).stdout


def gpu_figures(apps: str, cards: str, pids: set[int]) -> dict[str, float]:
    """`gpu_mib`: the memory `pids` hold on every card, from `nvidia-smi`'s per-process rows (`apps`: pid, MiB,
    card); `gpu_sm_mhz`: the lowest SM clock (`cards`: card, MHz) among the cards those processes use, so that a
    card that throttles shows beside the step time it slows."""
    used, uuids = 0.0, set()
    for pid, mib, uuid in (line.split(", ") for line in apps.splitlines() if line.count(",") == 2):
        if int(pid) in pids:
            used += float(mib)
            uuids.add(uuid.strip())
    clocks = [float(mhz) for uuid, mhz in (line.split(", ") for line in cards.splitlines() if line.count(",") == 1)
              if uuid.strip() in uuids and mhz.strip().replace(".", "", 1).isdigit()]
    return {"gpu_mib": used, **({"gpu_sm_mhz": min(clocks)} if clocks else {})}


def step_times(folder: Path) -> list[tuple[float, float]]:
    """(wall-clock time, seconds) of every step the run logged (`time/step_s`)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("grpo_pipe")
    runs = [] if experiment is None else client.search_runs([experiment.experiment_id])
    if not runs:
        return []
    return [(m.timestamp / 1000.0, m.value) for m in client.get_metric_history(runs[0].info.run_id, "time/step_s")]


def recorded_step_times(folder: Path) -> list[tuple[float, float]]:
    """The step times a finished soak wrote (`steps.jsonl`), else those in its MLflow store: a folder brought back from
    another machine without its store still reports step time."""
    saved = folder / STEPS_FILE
    if saved.is_file():
        return [(t, s) for t, s in (json.loads(line) for line in saved.read_text().splitlines() if line.strip())]
    return step_times(folder)


def after_warmup(rows: Sequence[dict[str, float]], steps: Sequence[tuple[float, float]], warmup_s: float,
                 started: float) -> tuple[list[dict[str, float]], list[tuple[float, float]]]:
    """The samples and steps that `report` fits: from `warmup_s` after the first step's start (after `started`
    where no step was logged) up to the last step."""
    end = max((t for t, _ in steps), default=math.inf)
    origin = min((t - seconds for t, seconds in steps), default=started)
    kept = [r for r in rows if r["t"] - origin >= warmup_s and r["t"] <= end]
    return kept, [(t, s) for t, s in steps if t - origin >= warmup_s]


def report(rows: Sequence[dict[str, float]], steps: Sequence[tuple[float, float]], started: float,
           warmup_s: float) -> list[Trend]:
    """A trend per figure over the samples after warm-up and up to the last step (the final evaluation and the
    shutdown are not the steady state).

    Warm-up counts from the first step's start, not from `started`: loading the engine and compiling take one minute
    on an idle card and four beside other jobs, and a fixed offset from the launch would fit that start-up's rise of
    GPU memory as a slope. Without steps (none logged), it counts from `started`.
    """
    kept, late = after_warmup(rows, steps, warmup_s, started)
    figures = [k for k in rows[0] if k != "t"] if rows else []
    trends = [trend(name, [(r["t"] - started) / 3600 for r in kept], [r[name] for r in kept]) for name in figures]
    trends.append(trend("step_s", [(t - started) / 3600 for t, _ in late], [s for _, s in late]))
    for name in [n for n in ("rss_mib", "job_rss_mib") if n in figures]:
        for kind, pick in (("step_peak", max), ("step_low", min)):
            points = per_step(kept, late, name, pick)
            if points:  # steps shorter than three sampling periods have no peak to fit (2-s GPU steps at --every 5)
                trends.append(trend(f"{name}_{kind}", [(t - started) / 3600 for t, _ in points], [v for _, v in points]))
    for name in [n for n in ("rss_mib", "job_rss_mib", "gpu_mib") if n in figures]:
        medians = window_medians([(r["t"], r[name]) for r in kept], WINDOW_S)
        trends.append(trend(f"{name}_window_median", [(t - started) / 3600 for t, _ in medians], [v for _, v in medians]))
    if kept:
        trends.extend(_late_half(kept, [n for n in ("rss_mib", "job_rss_mib") if n in figures], started))
    trends.extend(_step_windows(kept, late, started))
    return trends


def _late_half(kept: Sequence[dict[str, float]], names: Sequence[str], started: float) -> list[Trend]:
    """The fit over the second half of the samples after warm-up (`*_late_half`). A leak grows as fast in either
    half; what is still warming up (allocator arenas, caches filling) grows early and stops, and a fit over the
    whole period gives it a slope it no longer has."""
    middle = (kept[0]["t"] + kept[-1]["t"]) / 2
    second = [r for r in kept if r["t"] >= middle]
    return [trend(f"{name}_late_half", [(r["t"] - started) / 3600 for r in second], [r[name] for r in second])
            for name in names]


def _step_windows(kept: Sequence[dict[str, float]], steps: Sequence[tuple[float, float]],
                  started: float) -> list[Trend]:
    """Step time and the host probe by two-minute medians over the same windows (`step_s_window_median`,
    `host_probe_ms_window_median`): whether the host itself ran steadily while the step time moved."""
    windows = paired_windows(kept, steps)
    trends = [trend("step_s_window_median", [(t - started) / 3600 for t, _, _ in windows], [s for _, s, _ in windows])]
    probed = [(t, p) for t, _, p in windows if not math.isnan(p)]
    if probed:
        trends.append(trend("host_probe_ms_window_median", [(t - started) / 3600 for t, _ in probed],
                            [p for _, p in probed]))
    return trends


def paired_windows(kept: Sequence[dict[str, float]],
                   steps: Sequence[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """(middle time, median step time, median host probe) of each full two-minute window from the first step after
    warm-up; the probe is NaN where the samples have none (soaks from before it)."""
    if not steps:
        return []
    first = min(t for t, _ in steps)
    probes = dict(window_medians([(r["t"], r["host_probe_ms"]) for r in kept if "host_probe_ms" in r], WINDOW_S,
                                 first=first))
    return [(t, v, probes.get(t, math.nan)) for t, v in window_medians(steps, WINDOW_S, first=first)]


def step_host_correlation(windows: Sequence[tuple[float, float, float]]) -> float | None:
    """Pearson's r between the windows' step time and host probe; None with fewer than three windows or no probe.
    Near 1, the step time moves with how busy the host is, and its slope says nothing about the job. The probe does
    not say by how much the host slows the job: on a 2-core machine one busy process beside the tiny job doubled
    the probe and made its steps 27 times longer (torch's threads wait on the core they lost)."""
    pairs = [(s, p) for _, s, p in windows if not math.isnan(p)]
    if len(pairs) < 3 or len({p for _, p in pairs}) < 2 or len({s for s, _ in pairs}) < 2:
        return None
    return statistics.correlation([s for s, _ in pairs], [p for _, p in pairs])


def window_medians(points: Sequence[tuple[float, float]], window_s: float,
                   first: float | None = None) -> list[tuple[float, float]]:
    """(middle time, median value) of each full `window_s` of `points`, counted from `first` (the first point's time
    unless given: two series counted from one `first` share their windows). A sample taken while a batch is built or
    a checkpoint written lies hundreds of MiB above the rest and widens a fit to raw samples; a window's median
    passes over it, so the medians' slope says whether the level itself moves."""
    if not points:
        return []
    first = points[0][0] if first is None else first
    windows: dict[int, list[float]] = {}
    for t, value in points:
        if t < first:
            continue
        windows.setdefault(int((t - first) // window_s), []).append(value)
    last_full = int((points[-1][0] - first) // window_s) - 1  # the last window may hold a few seconds only
    return [(first + (k + 0.5) * window_s, statistics.median(v)) for k, v in sorted(windows.items()) if k <= last_full]


def per_step(rows: Sequence[dict[str, float]], steps: Sequence[tuple[float, float]], name: str,
             pick: Callable[[list[float]], float]) -> list[tuple[float, float]]:
    """One value of `name` per step (its highest or lowest sample between the step's start and end): a job's RSS
    swings by gigabytes within a step (generation, then the update), so a trend of raw samples has a wide interval,
    where the peak of every step, taken at the same phase, shows growth from one step to the next. Only steps that
    hold `SAMPLES_PER_STEP` samples count: with one sample a step, "peak" and "low" would both be that sample.

    Args:
        rows: The samples, each with its wall-clock time `t`.
        steps: (end time, seconds) of each step.
        name: The figure to take.
        pick: `max` for the step's peak, `min` for its low.
    """
    points = []
    for end, seconds in steps:
        inside = [r[name] for r in rows if end - seconds <= r["t"] <= end]
        if len(inside) >= SAMPLES_PER_STEP:
            points.append((end, pick(inside)))
    return points


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, required=True, help="how long the job trains (run.max_minutes)")
    parser.add_argument("--warmup-minutes", type=float, default=5.0,
                        help="samples in this many minutes after the first step starts are left out")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, required=True, help="the run's folder: run, MLflow store, samples")
    parser.add_argument("overrides", nargs="*", help="the job's config overrides")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: report again on the samples and step times already under --out")
    args = parser.parse_args(argv)
    folder = args.out.resolve()
    if args.report_only:
        rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]
        steps = recorded_step_times(folder)
        warmup_s = 60.0 * args.warmup_minutes
        _print(report(rows, steps, rows[0]["t"], warmup_s))
        _print_correlation(step_host_correlation(paired_windows(*after_warmup(rows, steps, warmup_s, rows[0]["t"]))))
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    overrides = [*args.overrides, f"run.max_minutes={args.minutes}", f"hydra.run.dir={folder / 'run'}",
                 f"logger.tracking_uri=sqlite:///{folder / 'mlflow.db'}", f"logger.artifact_location={folder / 'artifacts'}"]
    started = time.time()
    job = start_job(overrides, folder / "job")
    rows, seen = [], []
    with (folder / "samples.jsonl").open("w") as out:
        while job.proc.poll() is None:
            row = sample(job, folder)
            seen = list({p.pid: p for p in [*seen, *job.processes()]}.values())
            rows.append(row)
            out.write(json.dumps(row) + "\n")
            out.flush()
            time.sleep(args.every)
    left = still_alive(seen)
    kill_left(seen)
    steps = step_times(folder)
    (folder / STEPS_FILE).write_text("".join(json.dumps([t, seconds]) + "\n" for t, seconds in steps))
    trends = report(rows, steps, started, 60.0 * args.warmup_minutes)
    correlation = step_host_correlation(paired_windows(*after_warmup(rows, steps, 60.0 * args.warmup_minutes, started)))
    result = {"returncode": job.proc.returncode, "minutes": (time.time() - started) / 60, "samples": len(rows),
              "left_alive": left, "step_host_correlation": correlation,
              "trends": [{**asdict(t), "percent_per_h": t.percent_per_h} for t in trends]}
    (folder / "report.json").write_text(json.dumps(result, indent=1))
    _print(trends)
    _print_correlation(correlation)
    print(json.dumps({k: v for k, v in result.items() if k != "trends"}))
    return 0 if job.proc.returncode == 0 and not left else 1


def _print_correlation(r: float | None) -> None:
    if r is not None:
        print(f"step time against the host probe, by two-minute windows: r = {r:+.2f}")


def _print(trends: Sequence[Trend]) -> None:
    print(f"{'figure':<22} {'n':>4} {'level':>10} {'slope/h':>10} {'95% interval/h':>24} {'%/h':>7}  verdict")
    for t in trends:
        print(f"{t.figure:<22} {t.samples:>4} {t.level:>10.2f} {t.slope_per_h:>+10.3f} "
              f"[{t.low_per_h:>+10.3f}, {t.high_per_h:>+10.3f}] {t.percent_per_h:>+7.2f}  {t.verdict}")


if __name__ == "__main__":
    sys.exit(main())
