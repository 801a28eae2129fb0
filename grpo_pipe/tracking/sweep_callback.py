"""When a multirun ends: mark its MLflow parent run finished and write the comparison of its children on it.

Hydra turns a callback's exception into a warning, so nothing that must happen for correctness may depend
on this (children attach to the parent themselves), and a failure here is logged in full: the comparison
can be written again later with `python -m grpo_pipe.report <sweep folder>`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class EndSweepRun(Callback):
    """Hydra callback (`hydra.callbacks.end_sweep`): when a multirun ends, the parent run is marked finished and the
    comparison of its children is written on it. Takes no arguments; does nothing unless `logger=mlflow`.
    """

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        target = str(config.logger.get("_target_", ""))
        if not target.endswith("MlflowTracker"):
            return
        from mlflow.tracking import MlflowClient

        from grpo_pipe.tracking.comparison import write_comparison
        from grpo_pipe.tracking.mlflow_tracker import (
            ROLE_TAG,
            SWEEP_TAG,
            describe_store,
            resolve_tracking_uri,
            run_link,
        )
        from grpo_pipe.tracking.sweep_runs import swept_keys
        from grpo_pipe.tracking.verdict import verdict

        client = MlflowClient(tracking_uri=resolve_tracking_uri(config.logger.get("tracking_uri")))
        experiment = client.get_experiment_by_name(config.logger.experiment)
        if experiment is None:
            return
        sweep_dir = str(Path(config.hydra.sweep.dir).resolve())
        query = f"tags.`{SWEEP_TAG}` = '{sweep_dir}' and tags.`{ROLE_TAG}` = 'parent'"
        for run in client.search_runs([experiment.experiment_id], filter_string=query):
            parent_id = run.info.run_id
            answer = None
            try:
                _log_sweep_files(client, parent_id, Path(sweep_dir))
                children = write_comparison(client, parent_id)
                answer = verdict(children, swept_keys(children))
            except Exception:
                log.exception("Comparison of sweep %s failed; retry: python -m grpo_pipe.report %s", sweep_dir, parent_id)
            client.set_terminated(parent_id, status="FINISHED")
            # The answer and the link on lines of their own (print, not the console log): a terminal or a pipe keeps
            # them whole, and the answer is read where the sweep ran, not only on the parent run.
            print(f"Sweep finished: {answer.text if answer is not None else 'no run logged its objective.'}\n"
                  "Its comparison is on the parent run:\n"
                  f"{describe_store(str(client.tracking_uri), experiment.name, experiment.experiment_id, parent_id)}"
                  f"\n  the parent run: {run_link(str(client.tracking_uri), experiment.experiment_id, parent_id)}",
                  flush=True)


# What the sweeper writes beside the jobs: the sweep's own config, and Optuna's best trial.
SWEEP_FILES = ("multirun.yaml", "optimization_results.yaml")


def _log_sweep_files(client: Any, parent_id: str, sweep_dir: Path) -> None:
    for name in SWEEP_FILES:
        if (sweep_dir / name).is_file():
            client.log_artifact(parent_id, str(sweep_dir / name), "sweep")
