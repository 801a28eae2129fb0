"""Marks a multirun's MLflow parent run finished when the sweep ends.

Only cosmetic bookkeeping lives here: Hydra turns a callback's exception into a warning, so nothing
that must happen for correctness may depend on it (children attach to the parent themselves).
"""

from __future__ import annotations

import logging
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class EndSweepRun(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        target = str(config.logger.get("_target_", ""))
        if not target.endswith("MlflowTracker"):
            return
        from mlflow.tracking import MlflowClient

        from grpo_pipe.tracking.mlflow_tracker import ROLE_TAG, SWEEP_TAG, _absolute_sqlite

        client = MlflowClient(tracking_uri=_absolute_sqlite(config.logger.tracking_uri))
        experiment = client.get_experiment_by_name(config.logger.experiment)
        if experiment is None:
            return
        sweep_dir = str(config.hydra.sweep.dir)
        query = f"tags.`{SWEEP_TAG}` = '{sweep_dir}' and tags.`{ROLE_TAG}` = 'parent'"
        for run in client.search_runs([experiment.experiment_id], filter_string=query):
            client.set_terminated(run.info.run_id, status="FINISHED")
            log.info("Sweep parent MLflow run %s finished", run.info.run_id)
