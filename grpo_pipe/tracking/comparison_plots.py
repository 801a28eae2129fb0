"""The sweep comparison's pictures (matplotlib, Agg: no display needed) and the one HTML page holding them.

Plots: reward and eval curves overlaid per child; the held-out score against wall-clock minutes (which
configuration learns fastest per minute); a stacked bar of the sync time's phases per child; throughput per
child; and, when the reward has terms (reward-weight sweeps), each term per child. Time charts whose values
span a decade or more (a checkpoint sync beside an in-memory one) are drawn on a log scale.
The page embeds the PNGs (base64), so it shows whole wherever it is opened: a file, or an MLflow server.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_pipe.tracking.sweep_runs import SYNC_PHASES, ChildResult
from grpo_pipe.tracking.verdict import Verdict

DPI = 110


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # a job or CI machine has no display
    import matplotlib.pyplot as plt

    return plt


def write_plots(children: Sequence[ChildResult], folder: Path) -> dict[str, Path]:
    """Every plot that has data, by title; the files are PNGs in `folder`."""
    plots = {
        "Reward and evaluation per run": _curves(children, folder / "curves.png"),
        "Held-out score against wall-clock time": _score_by_time(children, folder / "score_by_time.png"),
        "Sync time per push, by phase (median)": _sync_breakdown(children, folder / "sync_breakdown.png"),
        "Throughput per run (median)": _throughput(children, folder / "throughput.png"),
        "Reward terms per run": _reward_terms(children, folder / "reward_terms.png"),
    }
    return {title: path for title, path in plots.items() if path is not None}


def _curves(children: Sequence[ChildResult], path: Path) -> Path:
    plt = _pyplot()
    eval_key = _eval_key(children)
    fig, (reward_ax, eval_ax) = plt.subplots(1, 2, figsize=(12, 4.2))
    for index, child in enumerate(children):
        _line(reward_ax, child.curves.get("train/reward/mean", []), child.label, index)
        _line(eval_ax, child.curves.get(eval_key, []), child.label, index)
    reward_ax.set(title="train/reward/mean", xlabel="step")
    eval_ax.set(title=eval_key, xlabel="step (0 = before training)")
    reward_ax.legend(fontsize=8, loc="best")
    return _save(fig, path)


def _score_by_time(children: Sequence[ChildResult], path: Path) -> Path | None:
    """Each child's evaluations against the minutes since its first training step: per step, a slow run can look
    as good as a fast one; per minute it does not. Set-up (engine start, model load: longer for the first job of a
    sweep, whose caches are cold) is left out, so that it does not decide the race; the table shows it."""
    eval_key = _eval_key(children)
    if not any(len(c.clock.get(eval_key, [])) > 1 for c in children):
        return None  # evaluated once or never: no curve to draw
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for index, child in enumerate(children):
        _line(ax, since_first_step(child.clock.get(eval_key, []), child.setup_min), child.label, index)
    ax.set(title=f"{eval_key} against wall-clock time", xlabel="minutes of training (from each run's first step)")
    ax.legend(fontsize=8, loc="best")
    return _save(fig, path)


def spans_decades(values: Sequence[float | None]) -> bool:
    """Positive values whose largest is at least ten times the smallest: on a linear axis the small ones vanish."""
    positive = [v for v in values if v is not None and v > 0]
    return len(positive) > 1 and max(positive) >= 10 * min(positive)


def _eval_key(children: Sequence[ChildResult]) -> str:
    """The first child's objective when it is an evaluation metric, else the configured eval score."""
    objective = children[0].objective
    return objective if objective.startswith("eval/") else "eval/score"


def since_first_step(points: Sequence[tuple[float, float]], setup_min: float | None) -> list[tuple[float, float]]:
    """(minutes since start, value) as minutes since the first step; the evaluation before training sits at 0."""
    offset = setup_min or 0.0
    return [(max(minutes - offset, 0.0), value) for minutes, value in points]


# Runs that score the same draw the same line: each its own marker and dash, a little transparent, so that a line
# hidden under another still shows.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DASHES = ("-", "--", ":", "-.")


def _line(ax: Any, points: Sequence[tuple[float, float]], label: str, index: int) -> None:
    if points:
        ax.plot([s for s, _ in points], [v for _, v in points], label=label, alpha=0.8, markersize=5,
                marker=MARKERS[index % len(MARKERS)], linestyle=DASHES[index % len(DASHES)], markerfacecolor="none")


def _sync_breakdown(children: Sequence[ChildResult], path: Path) -> Path | None:
    """Stacked phases (gather, transport, load, then what the total holds beyond them); pause as a marker."""
    if not any(c.median("sync/total_s") is not None for c in children):
        return None  # no child synced (e.g. one step, sync_every > 1)
    plt = _pyplot()
    labels = [c.label for c in children]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(children)), 4.2))
    bottoms = [0.0] * len(children)
    for phase in SYNC_PHASES:
        heights = [c.median(f"sync/{phase}") or 0.0 for c in children]
        ax.bar(labels, heights, bottom=bottoms, label=phase)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    other = [max((c.median("sync/total_s") or 0.0) - b, 0.0) for c, b in zip(children, bottoms)]
    ax.bar(labels, other, bottom=bottoms, label="other (total - phases)", color="lightgrey")
    pauses = [c.median("sync/pause_s") for c in children]
    if any(p is not None for p in pauses):
        ax.scatter(labels, [p or 0.0 for p in pauses], marker="_", s=600, color="black", zorder=3,
                   label="pause_s (generation unavailable)")
    log_scale = spans_decades([c.median("sync/total_s") for c in children])
    if log_scale:
        ax.set_yscale("log")
    ax.set(ylabel="seconds" + (" (log scale)" if log_scale else ""), title="sync/total_s by phase")
    ax.legend(fontsize=8)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    return _save(fig, path)


def _throughput(children: Sequence[ChildResult], path: Path) -> Path:
    plt = _pyplot()
    labels = [c.label for c in children]
    fig, (tok_ax, step_ax) = plt.subplots(1, 2, figsize=(max(10, 2.4 * len(children)), 4.2))
    tok_ax.bar(labels, [c.median("rollout/tokens_per_s") or 0.0 for c in children], color="tab:green")
    tok_ax.set(title="rollout/tokens_per_s", ylabel="tokens / s")
    step_ax.bar(labels, [c.median("time/step_s") or 0.0 for c in children], color="tab:purple")
    log_scale = spans_decades([c.median("time/step_s") for c in children])
    if log_scale:
        step_ax.set_yscale("log")
    step_ax.set(title="time/step_s", ylabel="seconds" + (" (log scale)" if log_scale else ""))
    for ax in (tok_ax, step_ax):
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    return _save(fig, path)


def _reward_terms(children: Sequence[ChildResult], path: Path) -> Path | None:
    terms = sorted({t for c in children for t in c.reward_terms()})
    if not terms:
        return None  # a reward without terms: the reward curve says it all
    plt = _pyplot()
    columns = min(3, len(terms))
    rows = -(-len(terms) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.4 * rows), squeeze=False)
    for ax, term in zip(axes.flat, terms):
        for index, child in enumerate(children):
            _line(ax, child.curves.get(f"train/reward/{term}", []), child.label, index)
        ax.set(title=f"train/reward/{term}", xlabel="step")
    for ax in list(axes.flat)[len(terms):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    _pyplot().close(fig)
    return path


def write_page(
    rows: Sequence[Mapping[str, Any]], plots: Mapping[str, Path], best: ChildResult | None, answer: Verdict | None,
    path: Path,
) -> None:
    """One self-contained page: the answer with its margin, the best run, the table, then every plot."""
    headline = "No run logged its objective." if best is None else (
        f"Best by {html.escape(best.objective)} ({html.escape(best.direction)}): <b>{html.escape(best.label)}</b> "
        f"= {best.last[best.objective]:.4g}{_ties(rows, best)}"
    )
    if answer is not None:
        points = "".join(f"<li>{html.escape(p.shown())}</li>" for p in answer.points)
        headline = f"<b>{html.escape(answer.text)}</b></p><ul>{points}</ul><p>{headline}"
    figures = "\n".join(
        f'<h2>{html.escape(title)}</h2><img alt="{html.escape(title)}" src="data:image/png;base64,'
        f'{base64.b64encode(png.read_bytes()).decode()}">'
        for title, png in plots.items()
    )
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>Sweep comparison</title><style>"
        "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:3px 5px;text-align:right}th{background:#f3f3f3;max-width:7em;"
        "overflow-wrap:anywhere;font-weight:normal}div.wide{max-width:100%;overflow-x:auto}"
        "td:first-child{text-align:left;font-weight:bold}img{max-width:100%}</style></head><body>"
        f"<h1>Sweep comparison: {len(rows)} runs</h1><p>{headline}</p>{_table(rows, best)}{figures}</body></html>"
    )


def _ties(rows: Sequence[Mapping[str, Any]], best: ChildResult) -> str:
    """A first place shared with others is no answer: say so."""
    others = sum(row["objective_final"] == best.last[best.objective] for row in rows) - 1
    return f" (tied with {others} other run{'s' if others > 1 else ''})" if others > 0 else ""


def _table(rows: Sequence[Mapping[str, Any]], best: ChildResult | None) -> str:
    columns = [c for c in rows[0] if c not in ("overrides", "run_id")]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        f"<tr{' style=background:#e8f5e9' if best is not None and row['run_id'] == best.run_id else ''}>"
        + "".join(f"<td>{html.escape(_format(row[c]))}</td>" for c in columns)
        + "</tr>"
        for row in rows
    )
    return f"<div class='wide'><table id='comparison'><tr>{head}</tr>{body}</table></div>"


def _format(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
