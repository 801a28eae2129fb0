"""The GRPO pipeline runner: validate, build the components, then

    for each step:  pick tasks -> roll out on the engine -> score -> one GRPO update -> sync weights

Only this module (and tests) read the config; components receive built objects and scalars.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grpo_pipe import step_metrics
from grpo_pipe.bridges.files import copy_tokenizer_files
from grpo_pipe.checkpointing import Checkpoint, config_differences, find_resume_checkpoint
from grpo_pipe.config.validate import ConfigError, instantiate_components, validate_config
from grpo_pipe.interfaces import ChecksItsConfig
from grpo_pipe.progress import StepProgress
from grpo_pipe.prompts import render_prompt
from grpo_pipe.rollout.errors import EngineGaveUp, EngineLost
from grpo_pipe.rollout.scheduler import Ledger, RolloutScheduler, TakenBatch
from grpo_pipe.run_state import LiveRun, LoopState, RunSettings
from grpo_pipe.stopping import GenerationInterrupted, StopRequest
from grpo_pipe.types import SamplingSettings

log = logging.getLogger(__name__)

# Built in this order; `policy` is built inside `trainer` (trainer.policy: ${policy}).
COMPONENT_GROUPS = (
    "run", "model", "data", "reward", "curriculum", "trainer", "rollout", "weight_bridge", "placement", "logger",
    "checkpoint",
)
VALIDATED_GROUPS = COMPONENT_GROUPS + ("policy", "loss", "optimizer")  # the last three are built inside `trainer`
PLAIN_KEYS = ("resume", "resume_accept")  # top-level settings that are not components
# Early stopping and the time budget end a run normally (final evaluation, FINISHED); a signal does not.
NORMAL_ENDS = ("early_stopping", "time_budget")


@dataclass
class JobContext:
    """Where this job writes, and whether it is one job of a sweep."""

    output_dir: Path
    run_name: str
    sweep_dir: str | None = None


@dataclass(frozen=True)
class RunResult:
    run_id: str | None
    rewards: list[float]  # mean reward per step
    final_eval: dict[str, float]
    model_path: Path
    ledger: Ledger  # where every generated group went: trained, dropped, or in flight at the end
    summary: dict[str, float]  # the end-of-run metrics (eval, reward quarters, overlap, loop time)
    stopped_by: str | None = None  # the signal that stopped the run early (a checkpoint was written)


def build(cfg: DictConfig) -> dict[str, Any]:
    """Validate the whole config, then construct every component (cheap: nothing loads here)."""
    validate_config(cfg, VALIDATED_GROUPS, PLAIN_KEYS)
    parts = instantiate_components(cfg, COMPONENT_GROUPS, nested=("policy", "loss", "optimizer"))
    # Paths, columns, importable functions: checked on the built components, still before anything loads.
    problems = [f"{g}.{p}" for g, part in parts.items() if isinstance(part, ChecksItsConfig) for p in part.config_problems()]
    if problems:
        raise ConfigError(problems)
    parts["rollout"] = parts["placement"].place(parts["rollout"])
    problems = parts["weight_bridge"].check(parts["rollout"], parts["trainer"].policy)
    problems += parts["placement"].check(parts["trainer"], parts["weight_bridge"])  # GPUs, cluster, trainer kind
    trainer, bridge = parts["trainer"], parts["weight_bridge"]
    if trainer.max_staleness < bridge.sync_every - 1:
        problems.append(
            f"trainer.max_staleness={trainer.max_staleness} < weight_bridge.sync_every - 1 = {bridge.sync_every - 1}: "
            "between syncs the engine lags up to sync_every - 1 versions; raise max_staleness or sync more often"
        )
    if parts["placement"].engine_needs_sleep_mode() and not parts["rollout"].enable_sleep_mode:
        problems.append(f"placement.sleep_level={parts['placement'].sleep_level} needs rollout.enable_sleep_mode=true")
    if problems:
        raise ConfigError(problems)
    return parts


def run(cfg: DictConfig, job: JobContext) -> RunResult:
    parts = build(cfg)
    resume_from = _resume_checkpoint(cfg, job)  # refuses a changed config before anything loads
    settings: RunSettings = parts["run"]
    tracker, checkpoints = parts["logger"], parts["checkpoint"]
    if resume_from is not None:
        checkpoints.root = resume_from.path.parent  # one run, one checkpoint folder, however many resumes
    else:
        checkpoints.attach(job.output_dir)
    resume_run_id = resume_from.loop_state()["mlflow_run_id"] if resume_from is not None else None
    tracker.start(
        settings.name or job.run_name,
        tags={"grpo_pipe.output_dir": str(job.output_dir)},
        sweep_dir=job.sweep_dir,
        resume_run_id=resume_run_id,
    )
    status = "FAILED"
    try:
        if resume_from is None:
            tracker.log_params(_flatten(OmegaConf.to_container(cfg, resolve=True)))
            _log_hydra_files(tracker, job.output_dir)
        with StopRequest(grace_s=parts["run"].shutdown_grace_s) as stop:
            result = _train(cfg, parts, job.output_dir, resume_from, stop)
        status = "KILLED" if result.stopped_by else "FINISHED"
        log.info(tracker.describe())
        return result
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        parts["weight_bridge"].close()
        parts["rollout"].shutdown()
        getattr(parts["trainer"], "close", lambda: None)()  # the sharded trainer's rank actors
        parts["placement"].close()
        tracker.close(status)


def _resume_checkpoint(cfg: DictConfig, job: JobContext) -> Checkpoint | None:
    if cfg.get("resume") is None:
        return None
    try:
        found = find_resume_checkpoint(str(cfg.resume), job.output_dir.parent)
    except FileNotFoundError as err:
        raise ConfigError([str(err)]) from None
    saved = OmegaConf.to_container(OmegaConf.create(found.config_yaml()))
    current = OmegaConf.to_container(cfg, resolve=True)
    accepted = set(cfg.get("resume_accept") or [])
    changed = [
        key for key in config_differences(saved, current)
        if key.split(".")[0] not in PLAIN_KEYS + ("hydra",) and not any(key == a or key.startswith(a + ".") for a in accepted)
    ]
    if changed:
        raise ConfigError([
            f"resume={cfg.resume}: the config differs from the checkpoint's ({found.path}) in: {', '.join(changed)}; "
            f"to accept, add resume_accept=[{','.join(changed)}]"
        ])
    log.info("Resuming from %s (step %d)", found.path, found.step)
    return found


def _train(
    cfg: DictConfig, parts: dict[str, Any], output_dir: Path, resume_from: Checkpoint | None, stop: StopRequest
) -> RunResult:
    live = _start(parts)
    live.scheduler.guard = stop.interruptible  # a stop signal abandons a generation in progress
    settings, trainer, tracker, curriculum = live.settings, parts["trainer"], parts["logger"], parts["curriculum"]
    first_step = 1 if resume_from is None else live.restore(resume_from)
    if resume_from is None:
        first_eval = live.evaluate()
        tracker.log_metrics(first_eval, step=0)
        _note_eval(live, 0, first_eval)
        log.info("Before training: %s", _fmt(first_eval))
    already_logged = tracker.logged_steps("policy/version")  # steps a crashed run logged past its checkpoint
    stopped_by: str | None = None
    loop_started = time.time()
    deadline = None if settings.max_minutes is None else loop_started + 60.0 * settings.max_minutes
    with StepProgress(trainer.steps, first_step=first_step - 1) as progress:
        for step in range(first_step, trainer.steps + 1):
            try:
                metrics = _one_step(step, parts, live.scheduler, live.state, settings.samples_to_log)
            except EngineGaveUp:
                if live.state.trained_through > 0:  # keep the work done so far, then fail loudly
                    live.save_checkpoint(cfg, live.state.trained_through)
                raise
            except GenerationInterrupted:  # the abandoned batch was for this step: the last finished one is step - 1
                stopped_by = stop.reason
                if step > 1:
                    live.save_checkpoint(cfg, step - 1)
                log.warning("Stopped during step %d's generation (%s)", step, stopped_by)
                break
            early_stop = _maybe_evaluate(live, step, metrics)
            if step not in already_logged:
                tracker.log_metrics(metrics, step=step)
            for report in curriculum.take_reports(output_dir / "curriculum"):
                tracker.log_artifact(report, "curriculum")
            live.state.step_rewards.append(metrics["train/reward/mean"])
            progress.update(step, metrics)
            out_of_time = deadline is not None and time.time() >= deadline
            stopped_by = stop.reason or ("early_stopping" if early_stop else None) or ("time_budget" if out_of_time else None)
            if parts["checkpoint"].due(step, trainer.steps) or stopped_by:
                live.save_checkpoint(cfg, step)
            if stopped_by:
                log.warning("Stopping after step %d (%s)", step, stopped_by)
                break
    return _finish(live, time.time() - loop_started, ended_by=stopped_by)


def _start(parts: dict[str, Any]) -> LiveRun:
    """Load the model, start the engine and the trainer, connect the bridge."""
    data, curriculum, trainer = parts["data"], parts["curriculum"], parts["trainer"]
    engine, bridge, placement, settings = parts["rollout"], parts["weight_bridge"], parts["placement"], parts["run"]
    model_path = parts["model"].materialize()
    tokenizer = _tokenizer(model_path)
    curriculum.attach(data.train_tasks())
    eval_tasks = list(data.eval_tasks())[: settings.eval_size]
    eval_prompts = [render_prompt(tokenizer, data.system_prompt, t) for t in eval_tasks]
    parts["logger"].log_metrics({"data/skipped_rows": float(len(getattr(data, "skipped", ())))}, step=0)
    engine.connect(model_path, bridge.engine_options())
    parts["reward"].setup(model_path, engine.weight_dtype)
    trainer.setup(model_path, placement.trainer_device(), pad_id=tokenizer.pad_token_id or 0)
    bridge.connect(engine, trainer.policy)
    seed = settings.seed if settings.seeded_sampling else None
    sampling = SamplingSettings(settings.temperature, settings.top_p, settings.max_new_tokens, seed)
    scheduler = RolloutScheduler(
        engine,
        curriculum.next_batch,
        lambda task: tuple(render_prompt(tokenizer, data.system_prompt, task)),
        sampling,
        total_steps=trainer.steps,
        max_staleness=trainer.max_staleness,
        stale_policy=trainer.stale_policy,
        prompt_limit=engine.max_model_len - settings.max_new_tokens,
        overlong_prompts=settings.overlong_prompts,
    )
    return LiveRun(parts, settings, model_path, tokenizer, scheduler, eval_prompts, eval_tasks, LoopState())


def _maybe_evaluate(live: LiveRun, step: int, metrics: dict[str, float]) -> bool:
    """Held-out evaluation every `eval_every` steps; True when early stopping says stop."""
    settings = live.settings
    if not settings.eval_every or step % settings.eval_every != 0 or step == live.parts["trainer"].steps:
        return False
    evaluation = live.evaluate()
    metrics.update(evaluation)
    live.state.last_eval = (step, evaluation)
    _note_eval(live, step, metrics)
    patience = settings.early_stop_patience
    return patience > 0 and live.state.evals_without_improvement >= patience


def _note_eval(live: LiveRun, step: int, metrics: Mapping[str, float]) -> None:
    """Track the best evaluation; a new best is exported as `best/` (an HF folder)."""
    checkpoints, policy = live.parts["checkpoint"], live.parts["trainer"].policy
    if checkpoints.best_metric is None or checkpoints.best_metric not in metrics:
        return
    live.state.eval_history.append((step, float(metrics[checkpoints.best_metric])))

    def export(folder: Path) -> None:
        policy.save_pretrained(folder)
        copy_tokenizer_files(live.model_path, folder)

    improved = checkpoints.consider_best(metrics, export) if step > 0 else _set_baseline(checkpoints, metrics)
    live.state.evals_without_improvement = 0 if improved else live.state.evals_without_improvement + 1


def _set_baseline(checkpoints: Any, metrics: Mapping[str, float]) -> bool:
    checkpoints.best_value = float(metrics[checkpoints.best_metric])  # the untrained model: nothing to export
    return True


def _finish(live: LiveRun, loop_s: float, ended_by: str | None) -> RunResult:
    state, tracker, trainer = live.state, live.parts["logger"], live.parts["trainer"]
    stopped_by = None if ended_by in (None, *NORMAL_ENDS) else ended_by  # a signal: no final evaluation
    last_step = len(state.step_rewards)
    evaluated_now = not stopped_by and state.last_eval[0] != last_step
    final_eval = live.evaluate() if evaluated_now else ({} if stopped_by else state.last_eval[1])
    summary = {
        **(final_eval if evaluated_now else {}),
        **step_metrics.quarter_summary(state.step_rewards),
        **step_metrics.overlap_summary(live.scheduler, state.train_spans, state.wait_s, loop_s),
        "summary/in_flight_updated_fraction": state.samples_updated_in_flight / max(state.samples, 1),
    }
    if last_step < trainer.steps and ended_by == "early_stopping":
        summary["summary/early_stopped_at"] = float(last_step)
    if last_step < trainer.steps and ended_by == "time_budget":
        summary["summary/time_budget_stopped_at"] = float(last_step)
    if evaluated_now:
        _note_eval(live, last_step, final_eval)
    tracker.log_metrics(summary, step=last_step)
    tracker.log_table(state.table, "samples.json")
    log.info("After training: %s", _fmt(summary))
    return RunResult(
        getattr(tracker, "run_id", None), state.step_rewards, final_eval, live.model_path, live.scheduler.ledger, summary,
        stopped_by,
    )


def _one_step(
    step: int, parts: dict[str, Any], scheduler: RolloutScheduler, state: LoopState, keep: int
) -> dict[str, float]:
    curriculum, trainer = parts["curriculum"], parts["trainer"]
    engine, bridge, placement, reward = parts["rollout"], parts["weight_bridge"], parts["placement"], parts["reward"]
    started = time.perf_counter()
    taken, dropped = _next_batch(step, parts, scheduler, state)
    groups = taken.groups
    scored = reward(groups)
    uids = [g.task.uid for g in groups for _ in g.completions]
    gen_s = taken.generated.finished_s - taken.generated.started_s
    metrics = {**step_metrics.rollout_metrics(groups, gen_s), **step_metrics.reward_metrics(scored)}
    state.samples += len(uids)
    state.samples_updated_in_flight += sum(bool(c.version_switches) for g in groups for c in g.completions)
    metrics.update(step_metrics.async_metrics(taken, dropped, scheduler))
    # Difficulty is how well a task is solved: latency and length terms would drown it (and are noise here).
    metrics.update(curriculum.update(uids, scored.difficulty_signal) or {})
    placement.before_train(engine)
    train_started = time.time()
    metrics.update(trainer.step(groups, scored.values, scheduler.sampling.temperature))
    state.train_spans.append((train_started, time.time()))
    metrics.update(step_metrics.memory_metrics())
    state.trained_through = step
    if trainer.version % bridge.sync_every == 0 and trainer.version > state.pushed_version:
        placement.before_sync(engine)
        try:
            metrics.update(bridge.push(trainer.policy, trainer.version).as_metrics())
            state.pushed_version = trainer.version
        except EngineLost as err:
            _recover_engine(parts, scheduler, state, err)  # re-syncs the current weights itself
    # Hand the engine its next work now, so it generates while this process logs and scores.
    placement.before_rollout(engine)
    scheduler.fill(trainer.version, state.pushed_version, steps_done=step)
    metrics["policy/version"] = float(trainer.version)
    metrics["engine/restarts"] = float(state.engine_restarts)
    metrics["time/step_s"] = time.perf_counter() - started
    state.table.extend(step_metrics.sample_rows(step, groups, scored, keep))
    return metrics


def _next_batch(
    step: int, parts: dict[str, Any], scheduler: RolloutScheduler, state: LoopState
) -> tuple[TakenBatch, int]:
    """The next batch with something left to train on; batches dropped whole are skipped (and counted)."""
    trainer, engine, placement = parts["trainer"], parts["rollout"], parts["placement"]
    dropped = 0
    while True:
        placement.before_rollout(engine)
        scheduler.fill(trainer.version, state.pushed_version, steps_done=step - 1)
        try:
            taken = scheduler.take(trainer.version)
        except EngineLost as err:
            _recover_engine(parts, scheduler, state, err)
            continue
        state.wait_s += taken.wait_s
        dropped += len(taken.dropped)
        if taken.groups:
            return taken, dropped
        log.warning("Step %d: every group of a batch was too stale and dropped; taking the next one", step)


def _recover_engine(parts: dict[str, Any], scheduler: RolloutScheduler, state: LoopState, err: EngineLost) -> None:
    """Restart dead engines (the placement backs off and limits how often), give them the current
    weights, and re-issue every request that was in flight."""
    engine, bridge, trainer = parts["rollout"], parts["weight_bridge"], parts["trainer"]
    state.engine_restarts += 1
    log.error("Engine lost (%s); restart %d", err, state.engine_restarts)
    parts["placement"].restart_engines(engine, state.engine_restarts)
    bridge.close()
    bridge.connect(engine, trainer.policy)
    if trainer.version > 0:
        bridge.push(trainer.policy, trainer.version)
    state.pushed_version = trainer.version
    reissued = scheduler.requeue_lost()
    log.warning("Engine back; weights v%d re-synced, %d batch(es) re-issued", trainer.version, reissued)


def _tokenizer(model_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, Mapping):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            if key == "hydra":
                continue
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): tree}


def _log_hydra_files(tracker: Any, output_dir: Path) -> None:
    hydra_dir = output_dir / ".hydra"
    if hydra_dir.is_dir():
        tracker.log_artifact(hydra_dir, "hydra")


def _fmt(metrics: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:.3f}" for k, v in metrics.items())
