"""The comparison of a sweep, written on its MLflow parent run: what a person opens to read the sweep's answer.

From the parent (found by its sweep folder or its run id) the children are read back through MlflowClient,
so this works the same on a sqlite store and through a tracking server. On the parent it writes:
- `comparison/comparison.json`: an MLflow table, one row per child (overrides, objective, reward quarters,
  seconds per step, tokens/s, median sync time and its phases, bytes moved, peak memory, status);
- `comparison/*.png` and `comparison/comparison.html` (the plots and the table in one page);
- params: each swept key with its values; metrics: `best/<objective>`; tags: which child was best.
Everything is rewritten from the children each time, so `python -m grpo_pipe.report` can regenerate it.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_pipe.tracking.mlflow_tracker import MAX_PARAM_CHARS, ROLE_TAG, SWEEP_TAG
from grpo_pipe.tracking.run_tags import OVERRIDES_TAG

log = logging.getLogger(__name__)

ARTIFACT_DIR = "comparison"
TABLE_FILE = "comparison.json"
SYNC_PHASES = ("gather_s", "transport_s", "load_s")  # they add up to a push's time; pause_s overlaps them
REWARD_SUMMARY_KEYS = {"mean", "std"}  # train/reward/<these> are not terms of the reward
BEST_RUN_TAG = "grpo_pipe.best_run_id"
BEST_LABEL_TAG = "grpo_pipe.best_run"


@dataclass
class ChildResult:
    """One child run of the sweep, reduced to what the comparison shows."""

    run_id: str
    name: str
    status: str
    overrides: dict[str, str]
    objective: str
    direction: str
    last: dict[str, float]  # latest value of every metric
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # key -> [(step, value)]
    label: str = ""  # the swept values that tell it apart, set once all children are known

    def median(self, key: str) -> float | None:
        values = [v for _, v in self.curves.get(key, [])]
        return statistics.median(values) if values else None

    def total(self, key: str) -> float | None:
        values = [v for _, v in self.curves.get(key, [])]
        return sum(values) if values else None

    def peak(self, key: str) -> float | None:
        values = [v for _, v in self.curves.get(key, [])]
        return max(values) if values else None

    def best(self, key: str) -> float | None:
        values = [v for _, v in self.curves.get(key, [])]
        if not values:
            return None
        return min(values) if self.direction == "minimize" else max(values)

    def reward_terms(self) -> list[str]:
        prefix = "train/reward/"
        return sorted(
            k[len(prefix):] for k in self.last if k.startswith(prefix) and "/" not in k[len(prefix):]
            and k[len(prefix):] not in REWARD_SUMMARY_KEYS
        )


def find_parent(client: Any, target: str) -> str:
    """The parent run's id: `target` is a parent run id or a sweep folder (the tag its jobs share)."""
    folder = Path(target).expanduser()
    if not folder.exists():
        run = client.get_run(target)  # raises MlflowException naming the id when there is no such run
        return run.info.run_id
    experiments = [e.experiment_id for e in client.search_experiments()]
    query = f"tags.`{SWEEP_TAG}` = '{folder.resolve()}' and tags.`{ROLE_TAG}` = 'parent'"
    found = client.search_runs(experiments, filter_string=query, max_results=1) if experiments else []
    if not found:
        raise LookupError(f"no MLflow parent run has {SWEEP_TAG}={folder.resolve()} in {client.tracking_uri}")
    return found[0].info.run_id


def parse_overrides(raw: str) -> dict[str, str]:
    """`grpo_pipe.overrides` (a JSON list of `key=value`) as a dict; `+`/`~` prefixes dropped."""
    try:
        items = json.loads(raw)
    except json.JSONDecodeError:
        items = raw.split(",") if raw else []  # a run name written from override_dirname
    pairs = [str(item).split("=", 1) for item in items if "=" in str(item)]
    return {key.lstrip("+~"): value for key, value in pairs}


def read_children(client: Any, parent_id: str) -> list[ChildResult]:
    """Every child of `parent_id` with the metric histories the comparison needs, in start order."""
    parent = client.get_run(parent_id)
    runs = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'",
        order_by=["attributes.start_time ASC"],
    )
    children = [_child(client, run) for run in runs]
    swept = swept_keys(children)
    for child in children:
        child.label = ", ".join(f"{k}={child.overrides[k]}" for k in swept if k in child.overrides) or child.name
    return children


def _child(client: Any, run: Any) -> ChildResult:
    params, tags = run.data.params, run.data.tags
    objective = params.get("run.objective", "eval/accuracy")
    last = dict(run.data.metrics)
    child = ChildResult(
        run_id=run.info.run_id, name=run.info.run_name or run.info.run_id, status=run.info.status,
        overrides=parse_overrides(tags.get(OVERRIDES_TAG, run.info.run_name or "")), objective=objective,
        direction=params.get("run.objective_direction", "maximize"), last=last,
    )
    wanted = {"train/reward/mean", "eval/score", objective, "time/step_s", "rollout/tokens_per_s",
              "memory/trainer_peak_gib", "system/system_memory_usage_megabytes"}
    wanted |= {k for k in last if k.startswith("sync/") or k.startswith("train/reward/")}
    for key in sorted(wanted & set(last)):
        history = client.get_metric_history(run.info.run_id, key)
        child.curves[key] = sorted((m.step, m.value) for m in history)
    return child


def swept_keys(children: Sequence[ChildResult]) -> list[str]:
    """Override keys whose values differ between children (all of one child's, when it is alone)."""
    keys = sorted({k for c in children for k in c.overrides})
    if len(children) < 2:
        return keys
    return [k for k in keys if len({c.overrides.get(k) for c in children}) > 1]


def table_rows(children: Sequence[ChildResult]) -> list[dict[str, Any]]:
    """One row per child; a number the child did not log is None (an empty cell)."""
    rows = []
    for c in children:
        row: dict[str, Any] = {
            "run": c.label, "status": c.status, "overrides": " ".join(f"{k}={v}" for k, v in c.overrides.items()),
            "objective": c.objective, "objective_final": c.last.get(c.objective), "objective_best": c.best(c.objective),
            "eval_score_final": c.last.get("eval/score"),
            "reward_first_quarter": c.last.get("summary/reward_first_quarter"),
            "reward_last_quarter": c.last.get("summary/reward_last_quarter"),
            "step_s": c.median("time/step_s"), "rollout_tokens_per_s": c.median("rollout/tokens_per_s"),
            "sync_total_s": c.median("sync/total_s"),
        }
        for key in sorted(k for k in c.curves if k.startswith("sync/") and k.endswith("_s") and k != "sync/total_s"):
            row[key.replace("/", "_")] = c.median(key)  # sync_gather_s, sync_transport_s, sync_load_s, sync_pause_s
        row["sync_bytes_total"] = c.total("sync/bytes")
        row["peak_trainer_gib"] = c.peak("memory/trainer_peak_gib")
        system_mb = c.peak("system/system_memory_usage_megabytes")
        row["peak_system_memory_gib"] = None if system_mb is None else system_mb / 1024
        row["run_id"] = c.run_id
        rows.append(row)
    columns = list(dict.fromkeys(k for row in rows for k in row))  # a child without sync/pause_s still gets the column
    return [{k: _cell(row.get(k)) for k in columns} for row in rows]


def _cell(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def best_child(children: Sequence[ChildResult]) -> ChildResult | None:
    """The child with the best final objective (its own direction); None when no child logged it."""
    scored = [c for c in children if c.last.get(c.objective) is not None and math.isfinite(c.last[c.objective])]
    if not scored:
        return None
    sign = -1.0 if scored[0].direction == "minimize" else 1.0
    return max(scored, key=lambda c: sign * c.last[c.objective])


def best_label(children: Sequence[ChildResult], best: ChildResult) -> str:
    """The best child's label; a first place shared is no answer, so then `tie: <every run that shares it>`."""
    tied = [c for c in children if c.last.get(c.objective) == best.last[best.objective]]
    return best.label if len(tied) == 1 else "tie: " + ", ".join(c.label for c in tied)


def write_comparison(client: Any, parent_id: str) -> list[ChildResult]:
    """Read the children of `parent_id` and (re)write the table, plots, page, params and best metric on it."""
    from grpo_pipe.tracking.comparison_plots import write_page, write_plots

    children = read_children(client, parent_id)
    if not children:
        log.warning("MLflow run %s has no child runs: no comparison written", parent_id)
        return children
    rows = table_rows(children)
    best = best_child(children)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _write_table(rows, folder / TABLE_FILE)
        plots = write_plots(children, folder)
        write_page(rows, plots, best, folder / "comparison.html")
        client.log_artifacts(parent_id, str(folder), ARTIFACT_DIR)  # same names: a rerun replaces, never appends
    _register_table(client, parent_id, f"{ARTIFACT_DIR}/{TABLE_FILE}")
    _log_swept_params(client, parent_id, children)
    if best is not None:
        client.log_metric(parent_id, f"best/{best.objective}", best.last[best.objective])
        client.set_tag(parent_id, BEST_RUN_TAG, best.run_id)  # one of them, when several tie
        client.set_tag(parent_id, BEST_LABEL_TAG, best_label(children, best))
    log.info("Comparison of %d runs written on MLflow run %s (%s/)", len(children), parent_id, ARTIFACT_DIR)
    return children


def _write_table(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """The file MLflow's `log_table` writes (pandas' split orientation), written whole instead of appended to."""
    columns = list(rows[0])
    path.write_text(json.dumps({"columns": columns, "data": [[row[c] for c in columns] for row in rows]}))


def _register_table(client: Any, run_id: str, artifact_file: str) -> None:
    """List the file among the run's tables, as `log_table` does, so the UI's table views find it."""
    key = "mlflow.loggedArtifacts"
    listed = json.loads(client.get_run(run_id).data.tags.get(key, "[]"))
    entry = {"path": artifact_file, "type": "table"}
    if entry not in listed:
        client.set_tag(run_id, key, json.dumps([*listed, entry]))


def _log_swept_params(client: Any, parent_id: str, children: Sequence[ChildResult]) -> None:
    """Each swept key with its values in run order. Params cannot change: one already set differently is kept."""
    existing = client.get_run(parent_id).data.params
    for key in swept_keys(children):
        value = ",".join(dict.fromkeys(c.overrides[key] for c in children if key in c.overrides))[:MAX_PARAM_CHARS]
        if key not in existing:
            client.log_param(parent_id, key, value)
        elif existing[key] != value:
            log.warning("Parent param %s stays %r (MLflow params are immutable); now %r", key, existing[key], value)
