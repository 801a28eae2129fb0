"""The entry point of a job: validate and build the components, resume or start the tracked run,
then hand over to the recipe (`grpo_pipe.runner.recipe.GRPORecipe`), which runs the algorithm.

Only this module (and tests) read the config; components receive built objects and scalars.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, ListConfig, OmegaConf

from grpo_pipe.checkpoint.resume import config_differences, find_resume_checkpoint
from grpo_pipe.checkpoint.store import Checkpoint, CorruptCheckpointError
from grpo_pipe.config.errors import InputError
from grpo_pipe.interfaces import Tracker
from grpo_pipe.runner.components import PLAIN_KEYS, VALIDATED_GROUPS, Components, build
from grpo_pipe.runner.data_checks import check_data_and_reward
from grpo_pipe.runner.progress import format_metrics
from grpo_pipe.runner.recipe import GRPORecipe
from grpo_pipe.runner.run_result import RunResult
from grpo_pipe.runtime.stopping import StopRequest
from grpo_pipe.types import Ledger, TrackedRun

__all__ = ["PLAIN_KEYS", "VALIDATED_GROUPS", "Components", "JobContext", "RunResult", "build", "run"]

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class JobContext:
    """Where this job writes, and whether it is one job of a sweep.

    Args:
        output_dir: The job's folder: its checkpoints, logs and samples.
        run_name: The tracked run's name when `run.name` sets none (in a sweep, what this job varies).
        sweep_dir: The sweep's folder when the job is one of a sweep; None: a single run.
        tags: Tags of the tracked run: commit, command line, chosen options (`tracking/run_tags`).
        overrides: The job's command-line overrides, kept in every checkpoint: `resume=<dir>` alone continues.
        resume_from: The checkpoint `resume=` picked, when the command line already did (and verified it).
    """

    output_dir: Path
    run_name: str
    sweep_dir: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    resume_from: Checkpoint | None = None


def run(cfg: DictConfig, job: JobContext) -> RunResult:
    """Run one job: build, resume or start the tracked run, set up, train, evaluate; always clean up."""
    parts = build(cfg)
    resume_from = _resume_checkpoint(cfg, job)  # refuses a changed config before anything loads
    if resume_from is not None and resume_from.step >= parts.trainer.steps:
        return _already_finished(resume_from, parts.trainer.steps)
    # The data and the user's reward, seconds in: a mistake there fails before the tracked run exists (no FAILED run)
    check_data_and_reward(parts, parts.data.train_tasks(), list(parts.data.eval_tasks()))
    tracker = parts.logger
    if resume_from is not None:
        parts.checkpoint.resume_in(resume_from.path.parent)
    else:
        parts.checkpoint.attach(job.output_dir)
    tracker.start(TrackedRun(
        name=run_name(parts.run.name, job),
        tags={"grpo_pipe.output_dir": str(job.output_dir), **job.tags},
        sweep_dir=job.sweep_dir,
        resume_run_id=resume_from.loop_state()["mlflow_run_id"] if resume_from is not None else None,
        output_dir=job.output_dir,
    ))
    if resume_from is not None:  # the steps after this checkpoint are done again
        tracker.set_tags({"grpo_pipe.resumed_from_step": str(resume_from.step)})
    config_yaml = OmegaConf.to_yaml(OmegaConf.create(_plain(cfg)))
    recipe = GRPORecipe(parts=parts, config_yaml=config_yaml, output_dir=job.output_dir, overrides=job.overrides)
    status, reason = "FAILED", ""
    stop = StopRequest(grace_s=parts.run.shutdown_grace_s)
    try:
        if resume_from is None:
            tracker.log_params(_flatten(_plain(cfg)))
            _log_hydra_files(tracker, job.output_dir)
        with stop:
            result = _setup_and_train(recipe, resume_from, stop)
        status = "KILLED" if result.stopped_by else "FINISHED"
        log.info(tracker.describe())
        return result
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception as err:
        reason = f"{type(err).__name__}: {err}"
        raise
    finally:
        _finish(tracker, recipe, status, stop, reason)


def run_name(name: str | None, job: JobContext) -> str:
    """The MLflow run's name: `run.name` where the user set one; in a sweep, followed by what this job varies, so
    children of an experiment that names its runs (`experiment=calculator`) are still told apart."""
    if not name:
        return job.run_name
    return f"{name}: {job.run_name}" if job.sweep_dir else name


def _finish(tracker: Tracker, recipe: GRPORecipe, status: str, stop: StopRequest, reason: str) -> None:
    """Record the run's outcome (and what failed), then release the engine and the trainer.

    In this order because a stop's grace deadline may end the process during the engine's shutdown (a loaded
    machine, an engine that hangs), as may a job's own time limit while a rank hangs in a collective: the outcome
    and its reason must be recorded by then. During a stop the tracker may wait for an absent server for half the
    grace left, so that the engine still gets the other half."""
    remaining = stop.remaining_s()
    try:
        if reason:
            tracker.set_tags({"grpo_pipe.error": reason[:5000]})
        tracker.close(status, within_s=None if remaining is None else remaining / 2)
    finally:
        because = f" ({reason.splitlines()[0][:300]})" if reason else ""
        log.info("Run %s%s; shutting down the engine and the trainer", status.lower(), because)  # seconds, not a hang
        recipe.cleanup()


def _already_finished(checkpoint: Checkpoint, steps: int) -> RunResult:
    """`resume=` on a run that trained all its steps: said, and nothing touched (no evaluation, no metric)."""
    loop = checkpoint.loop_state()
    log.warning("resume: the run finished: its checkpoint %s is at step %d of trainer.steps=%d; nothing to continue "
                "(to train further: trainer.steps=N with resume_accept=[trainer.steps])", checkpoint.path,
                checkpoint.step, steps)
    return RunResult(run_id=loop.get("mlflow_run_id"), rewards=list(loop.get("step_rewards", [])), final_eval={},
                     ledger=Ledger(), summary={}, resume_dir=checkpoint.path.parent.parent)


def _setup_and_train(recipe: GRPORecipe, resume_from: Checkpoint | None, stop: StopRequest) -> RunResult:
    recipe.setup()
    if resume_from is not None:
        first_step = recipe.restore(resume_from)
    else:
        first_step = 1
        first_eval = recipe.evaluate(0)
        recipe.parts.logger.log_metrics(first_eval, step=0)
        log.info("Before training: %s", format_metrics(first_eval))
    return recipe.train(first_step, stop)


def _resume_checkpoint(cfg: DictConfig, job: JobContext) -> Checkpoint | None:
    if cfg.get("resume") is None:
        return None
    try:  # verifying reads every byte of the checkpoint: once per job
        found = job.resume_from or find_resume_checkpoint(str(cfg.resume), job.output_dir.parent)
    except (FileNotFoundError, CorruptCheckpointError) as err:
        raise InputError([str(err)]) from None
    saved = _plain(OmegaConf.create(found.config_yaml()))
    current = _plain(cfg)
    accepted = set(cfg.get("resume_accept") or [])
    changed = [
        key for key in config_differences(saved, current)
        if key.split(".")[0] not in PLAIN_KEYS + ("hydra",) and not any(key == a or key.startswith(a + ".") for a in accepted)
    ]
    if changed:
        raise InputError([
            f"resume={cfg.resume}: the config differs from the checkpoint's ({found.path}) in: {', '.join(changed)}; "
            f"to accept, add resume_accept=[{','.join(changed)}]"
        ])
    log.info("Resuming from %s (step %d)", found.path, found.step)
    return found


def _plain(cfg: DictConfig | ListConfig) -> dict[str, Any]:
    """The config resolved into plain dicts and lists."""
    return cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, Mapping):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            if key == "hydra":
                continue
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): tree}


def _log_hydra_files(tracker: Tracker, output_dir: Path) -> None:
    hydra_dir = output_dir / ".hydra"
    if hydra_dir.is_dir():
        tracker.log_artifact(hydra_dir, "hydra")
