"""`python -m grpo_pipe.report <sweep folder | parent run id> [--tracking-uri URI]`

(Re)writes a sweep's comparison on its MLflow parent run (table, plots, HTML page, swept params, best
objective): after a sweep whose end-of-sweep callback failed, or once a failed child has been re-run.
The store is --tracking-uri, else $MLFLOW_TRACKING_URI, else sqlite:///outputs/mlflow.db.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

log = logging.getLogger("grpo_pipe.report")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grpo_pipe.report", description="(Re)write a sweep's comparison on its MLflow parent run."
    )
    parser.add_argument("target", help="the sweep's folder (hydra.sweep.dir) or its parent run's id")
    parser.add_argument("--tracking-uri", default=None, help="MLflow store; default $MLFLOW_TRACKING_URI, then sqlite:///outputs/mlflow.db")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from mlflow.tracking import MlflowClient

    from grpo_pipe.tracking.comparison import ARTIFACT_DIR, write_comparison
    from grpo_pipe.tracking.mlflow_tracker import describe_store, resolve_tracking_uri
    from grpo_pipe.tracking.sweep_runs import find_parent

    uri = resolve_tracking_uri(args.tracking_uri)
    client = MlflowClient(tracking_uri=uri)
    try:
        parent_id = find_parent(client, args.target)
    except LookupError as err:
        log.error("%s", err)
        return 2
    children = write_comparison(client, parent_id)
    if not children:
        return 1
    parent = client.get_run(parent_id)
    experiment = client.get_experiment(parent.info.experiment_id)
    log.info("%s", describe_store(uri, experiment.name, experiment.experiment_id, parent_id))
    log.info("  the comparison: artifacts %s/comparison.html and %s/comparison.json of run %s",
             ARTIFACT_DIR, ARTIFACT_DIR, parent_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
