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
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_pipe.tracking.comparison_plots import write_page, write_plots
from grpo_pipe.tracking.mlflow_records import MAX_PARAM_CHARS
from grpo_pipe.tracking.mlflow_tracker import DESCRIPTION_TAG, SWEEP_TAG
from grpo_pipe.tracking.run_tags import SWEEP_SPEC_TAG, sweep_run_name
from grpo_pipe.tracking.sweep_runs import ChildResult, read_children, swept_keys
from grpo_pipe.tracking.verdict import Verdict, verdict

log = logging.getLogger(__name__)

ARTIFACT_DIR = "comparison"
TABLE_FILE = "comparison.json"
BEST_RUN_TAG = "grpo_pipe.best_run_id"
BEST_LABEL_TAG = "grpo_pipe.best_run"
VERDICT_TAG = "grpo_pipe.verdict"  # the answer with its margin, one sentence


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
            "setup_min": c.setup_min,
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
    children = read_children(client, parent_id)
    if not children:
        log.warning("MLflow run %s has no child runs: no comparison written", parent_id)
        return children
    rows = table_rows(children)
    best = best_child(children)
    answer = verdict(children, swept_keys(children))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _write_table(rows, folder / TABLE_FILE)
        plots = write_plots(children, folder)
        write_page(rows, plots, best, answer, folder / "comparison.html")
        client.log_artifacts(parent_id, str(folder), ARTIFACT_DIR)  # same names: a rerun replaces, never appends
    _register_table(client, parent_id, f"{ARTIFACT_DIR}/{TABLE_FILE}")
    _log_swept_params(client, parent_id, children)
    if best is not None:
        client.log_metric(parent_id, f"best/{best.objective}", best.last[best.objective])
        client.set_tag(parent_id, BEST_RUN_TAG, best.run_id)  # one of them, when several tie
        client.set_tag(parent_id, BEST_LABEL_TAG, best_label(children, best))
    _describe_parent(client, parent_id, children, answer)
    log.info("Comparison of %d runs written on MLflow run %s (%s/)", len(children), parent_id, ARTIFACT_DIR)
    return children


def _describe_parent(client: Any, parent_id: str, children: Sequence[ChildResult], answer: Verdict | None) -> None:
    """The parent's name says what the sweep varied, its description the answer with its margin (the run list
    and the run's page in the MLflow UI show both)."""
    tags = client.get_run(parent_id).data.tags
    swept = swept_keys(children)
    spec = tags.get(SWEEP_SPEC_TAG) or " ".join(
        f"{k}={','.join(dict.fromkeys(c.overrides[k] for c in children if k in c.overrides))}" for k in swept)
    client.set_tag(parent_id, "mlflow.runName", sweep_run_name(spec, tags.get(SWEEP_TAG, parent_id)))
    lines = [f"Sweep over `{spec}`: {len(children)} runs."]
    if answer is None:
        lines.append("No run logged its objective.")
    else:
        client.set_tag(parent_id, VERDICT_TAG, answer.text[:MAX_PARAM_CHARS])
        lines += ["", f"**{answer.text}**", "", f"{answer.objective} ({answer.direction}), final value per setting:"]
        lines += [f"- {point.shown()}" for point in answer.points]
    lines += ["", f"Table, plots and page: artifacts `{ARTIFACT_DIR}/`."]
    client.set_tag(parent_id, DESCRIPTION_TAG, "\n".join(lines))


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
