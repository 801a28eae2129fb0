"""A sweep's child runs read back from MLflow: the parent found by its sweep folder or run id, each child reduced
to its overrides, final metrics and the curves a comparison shows. The comparison (`comparison.py`) and its
plots (`comparison_plots.py`) both read these; neither is imported by this module."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_pipe.tracking.mlflow_tracker import ROLE_TAG, SWEEP_TAG
from grpo_pipe.tracking.run_tags import OVERRIDES_TAG

SYNC_PHASES = ("gather_s", "transport_s", "load_s")  # they add up to a push's time; pause_s overlaps them
REWARD_SUMMARY_KEYS = {"mean", "std"}  # train/reward/<these> are not terms of the reward


@dataclass(kw_only=True)
class ChildResult:
    """One child run of the sweep, reduced to what the comparison shows.

    Args:
        run_id: The MLflow run's id.
        name: The run's name (its id where it has none).
        status: The run's MLflow status (`FINISHED`, `FAILED`, ...).
        overrides: The job's command-line overrides, key -> value.
        objective: The metric key the sweep optimises (`run.objective`).
        direction: `maximize` or `minimize`.
        last: The latest value of every metric.
        curves: Metric key -> [(step, value)].
        clock: Metric key -> [(minutes since start, value)].
        label: The swept values that tell it apart, set once all children are known.
    """

    run_id: str
    name: str
    status: str
    overrides: dict[str, str]
    objective: str
    direction: str
    last: dict[str, float]
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    clock: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    label: str = ""

    @property
    def setup_min(self) -> float | None:
        """Minutes from the run's start to its first training step (the engine's and the trainer's set-up)."""
        first = self.clock.get("train/reward/mean", [])
        return first[0][0] if first else None

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
    started_ms = run.info.start_time or 0
    for key in sorted(wanted & set(last)):
        history = client.get_metric_history(run.info.run_id, key)
        child.curves[key] = sorted((m.step, m.value) for m in history)
        child.clock[key] = sorted(((m.timestamp - started_ms) / 60_000, m.value) for m in history)
    return child


def swept_keys(children: Sequence[ChildResult]) -> list[str]:
    """Override keys whose values differ between children (all of one child's, when it is alone)."""
    keys = sorted({k for c in children for k in c.overrides})
    if len(children) < 2:
        return keys
    return [k for k in keys if len({c.overrides.get(k) for c in children}) > 1]
