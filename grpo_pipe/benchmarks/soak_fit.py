"""The soak's fits: a figure's least-squares slope per hour with its 95% interval and a verdict against 1% of its
level per hour, over the samples after warm-up, and the derived series (a step's peak and low, two-minute medians, the
late half, step time beside the host probe) that `grpo_pipe.benchmarks.soak` reports."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

FLAT_PER_HOUR = 0.01  # a figure whose slope stays within 1% of its level per hour is flat
WINDOW_S = 120.0  # the level of a figure by windows of two minutes (`*_window_median`)
SAMPLES_PER_STEP = 3  # a step's peak and low need this many samples inside it; one sample is neither
# Host memory figures fitted also by window medians and over the late half: the sum, the job's own process, the rest
# (the engine's core process and workers: one of them stepped up 20 MiB once in three GPU soaks), the file-backed part.
RSS_FIGURES = ("rss_mib", "job_rss_mib", "others_rss_mib", "rss_shared_mib")
STEP_UP_MIB = 8.0  # a rise of one minute's median over the last that `step_ups` lists (quiet processes move ~1 MiB)


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
    for name in [n for n in (*RSS_FIGURES, "gpu_mib") if n in figures]:
        medians = window_medians([(r["t"], r[name]) for r in kept], WINDOW_S)
        trends.append(trend(f"{name}_window_median", [(t - started) / 3600 for t, _ in medians], [v for _, v in medians]))
    if kept:
        trends.extend(_late_half(kept, [n for n in RSS_FIGURES if n in figures], started))
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


@dataclass(frozen=True, kw_only=True)
class StepUp:
    """A rise of a memory figure from one minute to the next, larger than the figure's noise.

    Args:
        figure: The figure's name.
        minute: Minutes from the start to the middle of the later minute.
        rise_mib: The later minute's median less the earlier one's.
    """

    figure: str
    minute: float
    rise_mib: float


def step_ups(kept: Sequence[dict[str, float]], names: Sequence[str], started: float,
             at_least_mib: float = STEP_UP_MIB) -> list[StepUp]:
    """Each rise of at least `at_least_mib` between the medians of two consecutive minutes, per figure. A slope says
    how fast a figure grew, not how: three GPU soaks fitted vLLM's engine process as growing where it had stepped up
    20 MiB once at minute 18-22 and held. Whether such a step repeats is what an hour's soak must tell, and a list of
    the steps says it directly."""
    found = []
    for name in names:
        medians = window_medians([(r["t"], r[name]) for r in kept if name in r], 60.0)
        found += [StepUp(figure=name, minute=(t - started) / 60, rise_mib=later - earlier)
                  for (_, earlier), (t, later) in zip(medians, medians[1:]) if later - earlier >= at_least_mib]
    return found
