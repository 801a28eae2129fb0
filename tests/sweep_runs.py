"""A sweep run as a user runs it (`python -m grpo_pipe +sweeps=<name> ...`, no `-m`: the sweep sets it), with an MLflow
store of its own, and its parent and child runs read back."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from tests.conftest import REPO


@dataclass(frozen=True, kw_only=True)
class SweepRuns:
    output: str  # what the sweep printed
    client: MlflowClient
    parents: list[Any]  # mlflow Run objects tagged grpo_pipe.role=parent
    children: list[Any]  # runs with a parent


def run_sweep(tmp_path: Path, arguments: list[str]) -> SweepRuns:
    """Run the sweep to its end (a failure shows its output's tail) and read its runs from the store."""
    store = f"sqlite:///{tmp_path}/mlflow.db"
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_pipe", *arguments, f"logger.tracking_uri={store}",
         f"logger.artifact_location={tmp_path}/artifacts", f"hydra.sweep.dir={tmp_path}/sweep"],
        cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=store)
    runs = client.search_runs([client.get_experiment_by_name("grpo_pipe").experiment_id])
    return SweepRuns(output=proc.stdout, client=client,
                     parents=[r for r in runs if r.data.tags.get("grpo_pipe.role") == "parent"],
                     children=[r for r in runs if r.data.tags.get("mlflow.parentRunId")])
