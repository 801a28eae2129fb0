"""The records an `Outbox` carries to MLflow: how each is made from a log call and how it is sent.

A record is plain JSON (it may be written to a file and sent by another process): metrics keep the step and the
time they were logged at, so a late delivery files them where they belong.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_pipe.tracking.outbox import Record

MAX_PARAM_CHARS = 6000  # MLflow's limit on one param value
MAX_PARAMS_PER_BATCH = 100  # MLflow's limits on one log_batch call
MAX_METRICS_PER_BATCH = 1000


def metric_records(metrics: Mapping[str, float], step: int, now_ms: int | None = None) -> list[Record]:
    """Finite values only (MLflow stores NaN, but a chart of NaNs says nothing), stamped now."""
    stamp = int(time.time() * 1000) if now_ms is None else now_ms
    items = [[k, float(v), stamp, step] for k, v in metrics.items() if v is not None and math.isfinite(float(v))]
    return [{"kind": "batch", "metrics": items[i : i + MAX_METRICS_PER_BATCH]}
            for i in range(0, len(items), MAX_METRICS_PER_BATCH)]


def param_records(params: Mapping[str, Any]) -> list[Record]:
    items = [[k, str(v)[:MAX_PARAM_CHARS]] for k, v in params.items()]
    return [{"kind": "batch", "params": dict(items[i : i + MAX_PARAMS_PER_BATCH])}
            for i in range(0, len(items), MAX_PARAMS_PER_BATCH)]


def tag_record(tags: Mapping[str, str]) -> Record:
    return {"kind": "batch", "tags": {k: str(v) for k, v in tags.items()}}


def artifact_record(path: Path, artifact_path: str | None) -> Record:
    return {"kind": "artifact", "path": str(Path(path).resolve()), "artifact_path": artifact_path}


def table_record(rows: Sequence[Mapping[str, Any]], artifact_file: str) -> Record:
    columns = {key: [row.get(key) for row in rows] for key in rows[0]}
    return {"kind": "table", "data": columns, "artifact_file": artifact_file}


def end_record(status: str, parent_run_id: str | None) -> Record:
    """The run ends (and the sweep's parent with it: a later child of the same sweep re-opens it)."""
    return {"kind": "end", "status": status, "end_time": int(time.time() * 1000), "parent_run_id": parent_run_id}


def send(client: Any, run_id: str, record: Record) -> None:
    """One record to the store through an `MlflowClient`; raises what the client raises."""
    from mlflow.entities import Metric, Param, RunTag

    kind = record["kind"]
    if kind == "batch":
        client.log_batch(
            run_id,
            metrics=[Metric(k, v, ts, step) for k, v, ts, step in record.get("metrics", [])],
            params=[Param(k, v) for k, v in record.get("params", {}).items()],
            tags=[RunTag(k, v) for k, v in record.get("tags", {}).items()],
        )
    elif kind == "artifact":
        path = Path(record["path"])
        if not path.exists():
            return  # removed since it was logged: nothing left to send
        if path.is_dir():
            client.log_artifacts(run_id, str(path), record["artifact_path"])
        else:
            client.log_artifact(run_id, str(path), record["artifact_path"])
    elif kind == "table":
        client.log_table(run_id, data=record["data"], artifact_file=record["artifact_file"])
    elif kind == "end":
        client.set_terminated(run_id, status=record["status"], end_time=record["end_time"])
        if record["parent_run_id"] is not None:
            client.update_run(record["parent_run_id"], status=record["status"])
    else:
        raise ValueError(f"unknown tracking record kind {kind!r}")
