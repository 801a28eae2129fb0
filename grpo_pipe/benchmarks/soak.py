"""Soak: run a job for a given time and say, figure by figure, whether it stays flat after warm-up.

    python -m grpo_pipe.benchmarks.soak --minutes 120 --warmup-minutes 10 --out soak/ -- trainer.steps=1000000

The job is the command itself (`python -m grpo_pipe <overrides> run.max_minutes=<minutes>`: it ends normally when
its time is up, with its final evaluation). Every `--every` seconds the driver samples, over every process of the
run (the job and everything below it): resident memory (RSS, summed; the job's own process; the others, such as the
engine's core process; and the part of the sum that is file-backed or shared memory, so that a step in a library or
kernel image loaded late reads apart from one in the heap), open file
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
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import psutil

from grpo_pipe.benchmarks.job_processes import Job, kill_left, start_job, still_alive
from grpo_pipe.benchmarks.soak_fit import (
    StepUp,
    Trend,
    after_warmup,
    paired_windows,
    report,
    step_host_correlation,
    step_ups,
)

PENDING_JOURNAL = "mlflow_pending.jsonl"
STEPS_FILE = "steps.jsonl"  # (end time, seconds) of every step, written when the job has ended
STEP_FIGURES = ("job_rss_mib", "others_rss_mib", "rss_shared_mib")  # quiet enough by the minute to show a step
PROBE_LOOPS = 100_000  # the host probe's fixed work: ~10 ms of interpreter time on an idle core


def sample(job: Job, folder: Path) -> dict[str, float]:
    """One sample of every figure, now."""
    rss = shared = fds = threads = 0
    own_rss = 0.0
    processes = job.processes()
    for process in processes:
        try:
            with process.oneshot():
                memory = process.memory_info()
                rss += memory.rss
                shared += getattr(memory, "shared", 0)  # Linux: file-backed and shared-memory pages
                fds += process.num_fds()
                threads += process.num_threads()
                if process.pid == job.pid:
                    own_rss = memory.rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    row = {"t": time.time(), "rss_mib": rss / 2**20, "job_rss_mib": own_rss / 2**20,
           "others_rss_mib": (rss - own_rss) / 2**20, "rss_shared_mib": shared / 2**20, "open_fds": float(fds),
           "threads": float(threads), "processes": float(len(processes)),
           "mlflow_store_mib": _size(folder / "mlflow.db") / 2**20,
           "artifacts_mib": _size(folder / "artifacts") / 2**20,
           "run_folder_mib": _size(folder / "run") / 2**20,
           "outbox_journal_kib": _size(folder / "run" / PENDING_JOURNAL) / 2**10,
           "host_probe_ms": host_probe_ms()}
    row.update(_gpu_figures({p.pid for p in processes}))
    return row


def _with_others(row: dict[str, float]) -> dict[str, float]:
    """A sample of a soak from before `others_rss_mib` was sampled gets it from the sum and the job's own."""
    if "others_rss_mib" in row or "job_rss_mib" not in row:
        return row
    return {**row, "others_rss_mib": row["rss_mib"] - row["job_rss_mib"]}


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
        rows = [_with_others(json.loads(line)) for line in (folder / "samples.jsonl").read_text().splitlines()
                if line.strip()]
        trends, correlation, ups = conclusions(rows, recorded_step_times(folder), rows[0]["t"], 60.0 * args.warmup_minutes)
        _print(trends, correlation, ups)
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
    trends, correlation, ups = conclusions(rows, steps, started, 60.0 * args.warmup_minutes)
    result = {"returncode": job.proc.returncode, "minutes": (time.time() - started) / 60, "samples": len(rows),
              "left_alive": left, "step_host_correlation": correlation, "step_ups": [asdict(u) for u in ups],
              "trends": [{**asdict(t), "percent_per_h": t.percent_per_h} for t in trends]}
    (folder / "report.json").write_text(json.dumps(result, indent=1))
    _print(trends, correlation, ups)
    print(json.dumps({k: v for k, v in result.items() if k != "trends"}))
    return 0 if job.proc.returncode == 0 and not left else 1


def conclusions(rows: Sequence[dict[str, float]], steps: Sequence[tuple[float, float]], started: float,
                warmup_s: float) -> tuple[list[Trend], float | None, list[StepUp]]:
    """The trends, the correlation of step time with the host probe, and the memory step-ups after warm-up."""
    kept, late = after_warmup(rows, steps, warmup_s, started)
    ups = step_ups(kept, STEP_FIGURES, started)  # a figure the samples lack has no minutes, so no step-ups
    return report(rows, steps, started, warmup_s), step_host_correlation(paired_windows(kept, late)), ups


def _print(trends: Sequence[Trend], correlation: float | None, ups: Sequence[StepUp]) -> None:
    print(f"{'figure':<22} {'n':>4} {'level':>10} {'slope/h':>10} {'95% interval/h':>24} {'%/h':>7}  verdict")
    for t in trends:
        print(f"{t.figure:<22} {t.samples:>4} {t.level:>10.2f} {t.slope_per_h:>+10.3f} "
              f"[{t.low_per_h:>+10.3f}, {t.high_per_h:>+10.3f}] {t.percent_per_h:>+7.2f}  {t.verdict}")
    if correlation is not None:
        print(f"step time against the host probe, by two-minute windows: r = {correlation:+.2f}")
    print("memory step-ups after warm-up (one minute's median over the last): "
          + ("; ".join(f"{u.figure} {u.rise_mib:+.0f} MiB at minute {u.minute:.1f}" for u in ups) or "none"))


if __name__ == "__main__":
    sys.exit(main())
