"""MLflow tracking. One run per job; a multirun gets one parent run with one child run per job.

Jobs of one sweep find their parent by a tag holding the sweep directory, so this works with any
Hydra launcher (sequential or parallel) without state shared between jobs.

What a person sees first in the MLflow UI is arranged here: the experiment is marked as model training
(not GenAI), and the few numbers that answer "did it learn, and how fast" are copied under `Headline/`,
which sorts before every lower-case section of the chart view.

A tracking server may go away during a run: creating the run needs it (a server that does not answer then is a
`InputError` before any model loads: nothing is lost yet), but after that every log call only queues a record
that an `Outbox` delivers in the background, retrying with back-off; see `tracking/outbox.py`. What is still
undelivered when the run ends is written to `mlflow_pending.jsonl` in the job's folder, with the command that
uploads it. The run's progress is kept in tags as it goes (`grpo_pipe.last_step`, `grpo_pipe.last_checkpoint`),
and a resume records how the earlier attempt ended, so a run killed outright (SIGKILL, out of memory) shows where
it stopped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_pipe.config.errors import InputError
from grpo_pipe.runtime.env import bound_mlflow_http_waits, mlflow_tracking_uri
from grpo_pipe.tracking import mlflow_records as records
from grpo_pipe.tracking.outbox import PENDING_FILE, UPLOAD_COMMAND, Outbox, store_refused, write_pending
from grpo_pipe.tracking.run_tags import SWEEP_SPEC_TAG, sweep_run_name
from grpo_pipe.types import TrackedRun

log = logging.getLogger(__name__)

SWEEP_TAG = "grpo_pipe.sweep_dir"
ROLE_TAG = "grpo_pipe.role"
DESCRIPTION_TAG = "mlflow.note.content"  # the run's description in the MLflow UI (markdown)
ATTEMPT_TAG = "grpo_pipe.attempt"  # 1 for a new run, +1 on each resume of it
LAST_STEP_TAG = "grpo_pipe.last_step"  # the last step whose metrics were logged (the recipe keeps it current)
# MLflow 3 opens an experiment in its GenAI view unless it is marked as model development.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
# The 3.17 UI reads the view from this URL parameter (or the browser's last choice), not from the tag.
TRAINING_VIEW_QUERY = "workflowType=machine_learning"
# Copies that lead the chart view: MLflow groups charts by the prefix before `/`, sorted by character
# code, so an upper-case `Headline/` section comes before `async/`, `eval/`, `rollout/`, `sync/`, ...
HEADLINE = {
    "train/reward/mean": "Headline/reward",
    "eval/accuracy": "Headline/eval_accuracy",
    "sync/total_s": "Headline/sync_s",
    "rollout/tokens_per_s": "Headline/rollout_tokens_per_s",
    "train/mfu": "Headline/train_mfu",
    "time/step_s": "Headline/step_s",
}


def is_local_store(uri: str) -> bool:
    """A store this process writes itself (sqlite, files), as opposed to a tracking server."""
    return not uri.startswith(("http://", "https://", "databricks"))


def _absolute_sqlite(uri: str) -> str:
    """`sqlite:///outputs/x.db` is relative to the cwd; pin it so a later `cd` cannot split the store."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix) :].startswith("/"):
        path = Path(uri[len(prefix) :]).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return prefix + str(path)
    return uri


def resolve_tracking_uri(configured: str | None = None) -> str:
    """The store every part of a job writes to and reads from (tracker, sweep callback, report), one rule:
    the configured URI, else `MLFLOW_TRACKING_URI`, else the sqlite default; a relative sqlite path pinned."""
    return _absolute_sqlite(mlflow_tracking_uri(configured))


class MlflowTracker:
    """Logs params, metrics, artifacts and tables to an MLflow tracking server or sqlite store.

    Where runs go, first match wins: `tracking_uri`, the `MLFLOW_TRACKING_URI` environment variable, then
    `sqlite:///outputs/mlflow.db`.

    Args:
        tracking_uri: An MLflow tracking URI (`sqlite:///path.db`, `http://host:port`, ...); None: as above.
        experiment: The MLflow experiment runs are logged under.
        artifact_location: Where a local store keeps artifacts (a tracking server keeps them where it was told).
        system_metrics: Log MLflow's `system/*` metrics: CPU, memory, disk, network, GPU (with nvidia-ml-py).
        system_metrics_interval_s: Seconds between system samples; a run shorter than this logs none.
        retry_max_s: A tracking server that does not answer: records are kept and sent again, waiting 1 s, 2 s,
            4 s, ... up to this between tries; training goes on.
        flush_timeout_s: At the end, how long to wait for an absent server before writing what is left to
            `<job folder>/mlflow_pending.jsonl` (uploaded later with `python -m grpo_pipe.tracking.upload FILE`).
    """

    def __init__(
        self,
        *,
        tracking_uri: str | None = None,
        experiment: str = "grpo_pipe",
        artifact_location: str | None = "outputs/mlartifacts",
        system_metrics: bool = True,
        system_metrics_interval_s: int = 10,
        retry_max_s: float = 60.0,
        flush_timeout_s: float = 60.0,
    ) -> None:
        self.tracking_uri = resolve_tracking_uri(tracking_uri)
        self.experiment = experiment
        # A server stores artifacts where it was told to (and serves them); only a local store needs a folder.
        self.artifact_location: str | None = None
        if artifact_location is not None and is_local_store(self.tracking_uri):
            self.artifact_location = Path(artifact_location).resolve().as_uri()
        self.system_metrics = system_metrics
        self.system_metrics_interval_s = system_metrics_interval_s
        self.retry_max_s = retry_max_s
        self.flush_timeout_s = flush_timeout_s
        self.run_id: str | None = None
        self.parent_run_id: str | None = None
        self.pending_file: Path | None = None  # where undelivered records go at the end (the job's folder)
        self._experiment_id_cached: str | None = None
        self._client: Any = None
        self._monitor: Any = None
        self._outbox: Outbox | None = None

    def config_problems(self) -> list[str]:
        """A local store or artifact folder this process cannot write: named before anything loads, not met as a
        traceback at the first metric."""
        problems = []
        if self.tracking_uri.startswith("sqlite:///"):
            database = Path(self.tracking_uri.removeprefix("sqlite:///"))
            if problem := _unwritable(database.parent):
                problems.append(f"tracking_uri={self.tracking_uri}: {problem}")
        if self.artifact_location is not None and self.artifact_location.startswith("file://"):
            if problem := _unwritable(Path(self.artifact_location.removeprefix("file://"))):
                problems.append(f"artifact_location={self.artifact_location}: {problem}")
        return problems

    def start(self, run: TrackedRun) -> None:
        """A new run, or with `run.resume_run_id` the same run continued (a resumed job). Talks to the store directly:
        a server that does not answer here is an `InputError` (nothing has run yet, so nothing is lost)."""
        from mlflow.tracking import MlflowClient

        bound_mlflow_http_waits()
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        self.pending_file = None if run.output_dir is None else Path(run.output_dir) / PENDING_FILE
        try:
            self._open_run(run)
        except Exception as err:
            if store_refused(err) or is_local_store(self.tracking_uri):
                raise
            raise InputError([
                f"logger.tracking_uri={self.tracking_uri}: the tracking server does not answer ({err}). Nothing has "
                "run yet: start the server (or choose another with logger.tracking_uri=..., or logger=none) and run "
                "the same command again"
            ]) from None
        self._outbox = Outbox(send=lambda record: records.send(self._client, self._run(), record), target=self.tracking_uri,
                              max_backoff_s=self.retry_max_s, journal=self.pending_file, journal_header=self._header())
        self._outbox.start()
        self._start_system_metrics(resumed=run.resume_run_id is not None)

    def _open_run(self, run: TrackedRun) -> None:
        if run.resume_run_id is not None:
            self._continue_run(run.resume_run_id)
            return
        experiment_id = self._experiment_id()
        all_tags = {**run.tags, ATTEMPT_TAG: "1"}
        if run.sweep_dir is not None:
            self.parent_run_id = self._find_or_create_parent(experiment_id, run.sweep_dir,
                                                             run.tags.get(SWEEP_SPEC_TAG, ""))
            all_tags["mlflow.parentRunId"] = self.parent_run_id
            all_tags[ROLE_TAG] = "child"
        created = self._client.create_run(experiment_id, run_name=run.name, tags=all_tags)
        self.run_id = created.info.run_id

    def _continue_run(self, run_id: str) -> None:
        """Note how the earlier attempt ended, then mark the run RUNNING again. A run still RUNNING was never
        closed: its process was killed outright (SIGKILL, out of memory, the machine lost)."""
        earlier = self._client.get_run(run_id)
        attempt = int(earlier.data.tags.get(ATTEMPT_TAG, "1"))
        status = earlier.info.status
        ended = "killed (never closed: SIGKILL, out of memory or machine lost)" if status == "RUNNING" else status
        last_step = earlier.data.tags.get(LAST_STEP_TAG, "none")
        self._client.log_batch(run_id, tags=[
            _tag(f"grpo_pipe.attempt_{attempt}.ended", f"{ended} after step {last_step}"),
            _tag(ATTEMPT_TAG, str(attempt + 1)),
        ])
        log.info("MLflow run %s: attempt %d ended %s after step %s; attempt %d begins", run_id, attempt, ended,
                 last_step, attempt + 1)
        self._client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        self.parent_run_id = earlier.data.tags.get("mlflow.parentRunId")
        self._experiment_id_cached = earlier.info.experiment_id  # `describe()` at the end needs no server

    def _experiment_id(self) -> str:
        if self._experiment_id_cached is None:
            self._experiment_id_cached = self._find_or_create_experiment()
        return self._experiment_id_cached

    def _find_or_create_experiment(self) -> str:
        found = self._client.get_experiment_by_name(self.experiment)
        if found is None:
            try:
                found_id = self._client.create_experiment(self.experiment, artifact_location=self.artifact_location)
            except Exception:  # created concurrently by another job of the sweep
                found_id = self._client.get_experiment_by_name(self.experiment).experiment_id
            found = self._client.get_experiment(found_id)
        if found.tags.get(EXPERIMENT_KIND_TAG) != MODEL_TRAINING_KIND:
            self._client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
        return found.experiment_id

    def _start_system_metrics(self, resumed: bool) -> None:
        """MLflow's CPU / memory / disk / network (and GPU, with nvidia-ml-py) sampler, in a thread of this process."""
        if not self.system_metrics:
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self._monitor = SystemMetricsMonitor(
            self._run(), sampling_interval=self.system_metrics_interval_s, resume_logging=resumed,
            tracking_uri=self.tracking_uri,
        )
        self._monitor.start()

    def _find_or_create_parent(self, experiment_id: str, sweep_dir: str, spec: str) -> str:
        """The sweep's parent run, named by what the sweep varies; its description says so until the comparison
        at the sweep's end replaces it with the answer."""
        query = f"tags.`{SWEEP_TAG}` = '{sweep_dir}' and tags.`{ROLE_TAG}` = 'parent'"
        existing = self._client.search_runs([experiment_id], filter_string=query, max_results=1)
        if existing:
            self._client.update_run(existing[0].info.run_id, status="RUNNING")
            return existing[0].info.run_id
        description = f"Sweep over `{spec}`, running; the comparison and its answer are written here when it ends."
        parent = self._client.create_run(experiment_id, run_name=sweep_run_name(spec, sweep_dir), tags={
            SWEEP_TAG: sweep_dir, ROLE_TAG: "parent", SWEEP_SPEC_TAG: spec, DESCRIPTION_TAG: description,
        })
        return parent.info.run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        for record in records.param_records(params):
            self._put(record)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        with_headline = {**metrics, **{HEADLINE[k]: v for k, v in metrics.items() if k in HEADLINE}}
        for record in records.metric_records(with_headline, step):
            self._put(record)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._put(records.tag_record(tags))

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self._put(records.artifact_record(path, artifact_path))

    def log_table(self, rows: Sequence[Mapping[str, Any]], artifact_file: str) -> None:
        if rows:
            self._put(records.table_record(rows, artifact_file))

    def _put(self, record: records.Record) -> None:
        if self._outbox is None:
            raise RuntimeError("tracker used before start()")
        self._outbox.put(record)

    def logged_steps(self, key: str) -> set[int]:
        """Steps at which `key` was logged in this run (a resumed run does not log a step twice)."""
        return {m.step for m in self._client.get_metric_history(self._run(), key)}

    def describe(self) -> str:
        return describe_store(self.tracking_uri, self.experiment, self._experiment_id(), self.run_id)

    def close(self, status: str = "FINISHED", within_s: float | None = None) -> None:
        """End the run: deliver what is pending (waiting at most `flush_timeout_s`, or `within_s` if shorter, for an
        absent server); what still could not be delivered goes to `mlflow_pending.jsonl`, with the command that
        uploads it."""
        if self._monitor is not None:
            self._monitor.finish()  # before the run ends: it logs its last samples to the run
            self._monitor = None
        if self._outbox is None or self.run_id is None:
            return
        self._outbox.put(records.end_record(status, self.parent_run_id))
        wait_s = self.flush_timeout_s if within_s is None else min(self.flush_timeout_s, within_s)
        undelivered = self._outbox.close(wait_s)
        self._outbox = None
        if not undelivered:
            return
        if self.pending_file is None:
            log.error("The tracking server %s did not come back: %d record(s) of run %s are lost",
                      self.tracking_uri, len(undelivered), self.run_id)
            return
        write_pending(undelivered, self.pending_file, self._header())
        log.warning(
            "The tracking server %s did not come back within %.0f s: %d record(s) of run %s are kept in %s. "
            "Upload them when it answers: %s %s", self.tracking_uri, wait_s, len(undelivered),
            self.run_id, self.pending_file, UPLOAD_COMMAND, self.pending_file,
        )

    def _header(self) -> dict[str, Any]:
        """The pending file's first line: where its records go."""
        return {"kind": "header", "tracking_uri": self.tracking_uri, "run_id": self.run_id}

    def _run(self) -> str:
        if self.run_id is None:
            raise RuntimeError("tracker used before start()")
        return self.run_id


def _tag(key: str, value: str) -> Any:
    from mlflow.entities import RunTag

    return RunTag(key, value)


def _unwritable(folder: Path) -> str | None:
    """Why `folder` (created if missing, as MLflow would) cannot take files; None when it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"cannot create {folder} ({err.strerror}); allowed: a folder this user can write"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable by this user; allowed: a folder this user can write"
    return None


def run_link(store: str, experiment_id: str, run_id: str) -> str:
    """The address of one run's page in the MLflow UI (a local store: the UI started as `describe_store` says)."""
    base = "http://127.0.0.1:5000" if is_local_store(store) else store.rstrip("/")
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def describe_store(store: str, experiment: str, experiment_id: str, run_id: str | None) -> str:
    """Where the run is and the link that opens MLflow on the training view of its experiment."""
    if is_local_store(store):
        base = "http://127.0.0.1:5000"
        serve = f"  start the UI: mlflow ui --backend-store-uri {store} --host 127.0.0.1 --port 5000\n"
    else:
        base, serve = store.rstrip("/"), ""
    return (
        f"MLflow run {run_id} (experiment '{experiment}') in {store}\n"
        f"{serve}  open: {base}/#/experiments/{experiment_id}?{TRAINING_VIEW_QUERY}"
    )
