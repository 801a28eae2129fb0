"""The GRPO pipeline runner: validate, build the components, then

    for each step:  pick tasks -> roll out on the engine -> score -> one GRPO update -> sync weights

Only this module (and tests) read the config; components receive built objects and scalars.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from grpo_pipe.config.validate import ConfigError, validate_config
from grpo_pipe.evaluation import evaluate
from grpo_pipe.progress import StepProgress
from grpo_pipe.prompts import render_prompt
from grpo_pipe.rollout.scheduler import Ledger, RolloutScheduler, TakenBatch, covered_seconds, overlap_seconds
from grpo_pipe.types import RewardOutput, RolloutGroup, SamplingSettings

log = logging.getLogger(__name__)

# Built in this order; `policy` is built inside `trainer` (trainer.policy: ${policy}).
COMPONENT_GROUPS = ("run", "model", "data", "reward", "curriculum", "trainer", "rollout", "weight_bridge", "placement", "logger")
VALIDATED_GROUPS = COMPONENT_GROUPS + ("policy",)


@dataclass(frozen=True)
class RunSettings:
    """Settings of the run itself (`run.*`)."""

    name: str | None = None  # MLflow run name; None = this job's overrides
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 96
    eval_every: int = 0
    eval_size: int = 64
    eval_max_new_tokens: int = 96
    samples_to_log: int = 16


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


def build(cfg: DictConfig) -> dict[str, Any]:
    """Validate the whole config, then construct every component (cheap: nothing loads here)."""
    validate_config(cfg, VALIDATED_GROUPS)
    parts: dict[str, Any] = {}
    for group in COMPONENT_GROUPS:
        log.info("Instantiating %s <%s>", group, cfg[group]._target_)
        parts[group] = instantiate(cfg[group], _convert_="all")
    parts["rollout"] = parts["placement"].place(parts["rollout"])
    problems = parts["weight_bridge"].check(parts["rollout"], parts["trainer"].policy)
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
    settings: RunSettings = parts["run"]
    tracker = parts["logger"]
    tracker.start(settings.name or job.run_name, tags={"grpo_pipe.output_dir": str(job.output_dir)}, sweep_dir=job.sweep_dir)
    status = "FAILED"
    try:
        tracker.log_params(_flatten(OmegaConf.to_container(cfg, resolve=True)))
        _log_hydra_files(tracker, job.output_dir)
        result = _train(cfg, parts, settings, tracker, job.output_dir)
        status = "FINISHED"
        log.info(tracker.describe())
        return result
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        parts["weight_bridge"].close()
        parts["rollout"].shutdown()
        parts["placement"].close()
        tracker.close(status)


@dataclass
class _LoopState:
    """What the loop carries from step to step."""

    pushed_version: int = 0  # the newest policy version the engine has been given
    train_spans: list[tuple[float, float]] = field(default_factory=list)  # wall clock, trainer busy
    wait_s: float = 0.0  # trainer time spent waiting for rollouts
    table: list[dict[str, Any]] = field(default_factory=list)


def _train(cfg: DictConfig, parts: dict[str, Any], settings: RunSettings, tracker: Any, output_dir: Path) -> RunResult:
    data, curriculum, trainer = parts["data"], parts["curriculum"], parts["trainer"]
    engine, bridge, placement, reward = parts["rollout"], parts["weight_bridge"], parts["placement"], parts["reward"]
    model_path = parts["model"].materialize()
    tokenizer = _tokenizer(model_path)
    curriculum.attach(data.train_tasks())
    eval_tasks = list(data.eval_tasks())[: settings.eval_size]
    eval_prompts = [render_prompt(tokenizer, data.system_prompt, t) for t in eval_tasks]
    tracker.log_metrics({"data/skipped_rows": float(len(getattr(data, "skipped", ())))}, step=0)

    engine.connect(model_path, bridge.engine_options())
    reward.setup(model_path, engine.weight_dtype)
    trainer.setup(model_path, placement.trainer_device(), pad_id=tokenizer.pad_token_id or 0)
    bridge.connect(engine, trainer.policy)
    sampling = SamplingSettings(settings.temperature, settings.top_p, settings.max_new_tokens)
    scheduler = RolloutScheduler(
        engine,
        curriculum.next_batch,
        lambda task: tuple(render_prompt(tokenizer, data.system_prompt, task)),
        sampling,
        total_steps=trainer.steps,
        max_staleness=trainer.max_staleness,
        stale_policy=trainer.stale_policy,
    )

    first_eval = evaluate(engine, eval_prompts, eval_tasks, settings.eval_max_new_tokens)
    tracker.log_metrics(first_eval, step=0)
    log.info("Before training: %s", _fmt(first_eval))
    step_rewards: list[float] = []
    state = _LoopState()
    loop_started = time.time()
    with StepProgress(trainer.steps) as progress:
        for step in range(1, trainer.steps + 1):
            metrics = _one_step(step, parts, scheduler, state, settings.samples_to_log)
            if settings.eval_every and step % settings.eval_every == 0 and step < trainer.steps:
                metrics.update(evaluate(engine, eval_prompts, eval_tasks, settings.eval_max_new_tokens))
            tracker.log_metrics(metrics, step=step)
            for report in curriculum.take_reports(output_dir / "curriculum"):
                tracker.log_artifact(report, "curriculum")
            step_rewards.append(metrics["train/reward/mean"])
            progress.update(step, metrics)
    loop_s = time.time() - loop_started
    placement.before_rollout(engine)
    final_eval = evaluate(engine, eval_prompts, eval_tasks, settings.eval_max_new_tokens)
    summary = {**final_eval, **_quarter_summary(step_rewards), **_overlap_summary(scheduler, state, loop_s)}
    tracker.log_metrics(summary, step=trainer.steps)
    tracker.log_table(state.table, "samples.json")
    log.info("After training: %s", _fmt(summary))
    return RunResult(getattr(tracker, "run_id", None), step_rewards, final_eval, model_path, scheduler.ledger)


def _one_step(
    step: int, parts: dict[str, Any], scheduler: RolloutScheduler, state: _LoopState, keep: int
) -> dict[str, float]:
    curriculum, trainer = parts["curriculum"], parts["trainer"]
    engine, bridge, placement, reward = parts["rollout"], parts["weight_bridge"], parts["placement"], parts["reward"]
    started = time.perf_counter()
    taken, dropped = _next_batch(step, parts, scheduler, state)
    groups = taken.groups
    scored = reward(groups)
    uids = [g.task.uid for g in groups for _ in g.completions]
    gen_s = taken.generated.finished_s - taken.generated.started_s
    metrics = {**_rollout_metrics(groups, gen_s), **_reward_metrics(scored)}
    metrics.update(_async_metrics(taken, dropped, scheduler))
    metrics.update(curriculum.update(uids, scored.values) or {})
    placement.before_train(engine)
    train_started = time.time()
    metrics.update(trainer.step(groups, scored.values, scheduler.sampling.temperature))
    state.train_spans.append((train_started, time.time()))
    metrics.update(_memory_metrics())
    if trainer.version % bridge.sync_every == 0 and trainer.version > state.pushed_version:
        placement.before_sync(engine)
        metrics.update(bridge.push(trainer.policy, trainer.version).as_metrics())
        state.pushed_version = trainer.version
    # Hand the engine its next work now, so it generates while this process logs and scores.
    placement.before_rollout(engine)
    scheduler.fill(trainer.version, state.pushed_version, steps_done=step)
    metrics["policy/version"] = float(trainer.version)
    metrics["time/step_s"] = time.perf_counter() - started
    state.table.extend(_sample_rows(step, groups, scored, keep))
    return metrics


def _next_batch(
    step: int, parts: dict[str, Any], scheduler: RolloutScheduler, state: _LoopState
) -> tuple[TakenBatch, int]:
    """The next batch with something left to train on; batches dropped whole are skipped (and counted)."""
    trainer, engine, placement = parts["trainer"], parts["rollout"], parts["placement"]
    dropped = 0
    while True:
        placement.before_rollout(engine)
        scheduler.fill(trainer.version, state.pushed_version, steps_done=step - 1)
        taken = scheduler.take(trainer.version)
        state.wait_s += taken.wait_s
        dropped += len(taken.dropped)
        if taken.groups:
            return taken, dropped
        log.warning("Step %d: every group of a batch was too stale and dropped; taking the next one", step)


def _async_metrics(taken: TakenBatch, dropped: int, scheduler: RolloutScheduler) -> dict[str, float]:
    metrics = {
        "async/staleness_mean": sum(taken.staleness) / len(taken.staleness),
        "async/staleness_max": float(max(taken.staleness)),
        "async/groups_dropped": float(dropped),
        "async/groups_dropped_total": float(sum(scheduler.ledger.dropped.values())),
        "async/trainer_wait_s": taken.wait_s,
        "async/engine_idle_s": taken.engine_gap_s,
        "async/queue_depth": float(taken.queue_depth),
    }
    for lag in range(scheduler.max_staleness + 1):  # the staleness histogram, one series per lag
        metrics[f"async/staleness_hist/{lag}"] = float(taken.staleness.count(lag))
    return metrics


def _overlap_summary(scheduler: RolloutScheduler, state: _LoopState, loop_s: float) -> dict[str, float]:
    """How much generation and training ran at the same time, over the whole loop."""
    train_s = covered_seconds(state.train_spans)
    gen_s = covered_seconds(scheduler.generation_intervals)
    return {
        "summary/loop_s": loop_s,
        "summary/overlap_fraction": overlap_seconds(state.train_spans, scheduler.generation_intervals) / max(train_s, 1e-9),
        "summary/engine_idle_fraction": max(1.0 - gen_s / max(loop_s, 1e-9), 0.0),
        "summary/trainer_idle_fraction": state.wait_s / max(loop_s, 1e-9),
        "summary/groups_dropped": float(sum(scheduler.ledger.dropped.values())),
    }


def _memory_metrics() -> dict[str, float]:
    """GPU memory in use on this process's device (all processes) and this process's own peak."""
    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    return {"memory/device_used_gib": (total - free) / 2**30, "memory/trainer_peak_gib": peak / 2**30}


def _rollout_metrics(groups: Sequence[RolloutGroup], gen_s: float) -> dict[str, float]:
    completions = [c for g in groups for c in g.completions]
    tokens = sum(len(c.token_ids) for c in completions)
    return {
        "rollout/time_s": gen_s,
        "rollout/tokens_per_s": tokens / gen_s if gen_s > 0 else 0.0,
        "rollout/generated_tokens_mean": tokens / max(len(completions), 1),
        "rollout/truncated_fraction": sum(c.finish_reason == "length" for c in completions) / max(len(completions), 1),
        "rollout/policy_version_min": float(min(c.policy_version for c in completions)),
        "rollout/policy_version_max": float(max(c.policy_version for c in completions)),
        "rollout/cached_prompt_fraction": sum(g.completions[0].telemetry.cached_prompt_tokens for g in groups)
        / max(sum(len(g.prompt_token_ids) for g in groups), 1),
    }


def _reward_metrics(scored: RewardOutput) -> dict[str, float]:
    values = scored.values
    mean = sum(values) / len(values)
    metrics = {
        "train/reward/mean": mean,
        "train/reward/std": (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5,
    }
    for name, term in scored.terms.items():
        metrics[f"train/reward/{name}"] = sum(term) / len(term)
    if scored.correct is not None:
        metrics["train/accuracy"] = sum(scored.correct) / len(scored.correct)
    return metrics


def _sample_rows(step: int, groups: Sequence[RolloutGroup], scored: RewardOutput, keep: int) -> list[dict[str, Any]]:
    rows, index = [], 0
    for group in groups:
        for completion in group.completions:
            if len(rows) < keep:
                rows.append(
                    {
                        "step": step,
                        "question": group.task.question,
                        "reference": group.task.answer,
                        "completion": completion.text,
                        "reward": scored.values[index],
                        "policy_version": completion.policy_version,
                    }
                )
            index += 1
    return rows


def _quarter_summary(rewards: Sequence[float]) -> dict[str, float]:
    quarter = max(len(rewards) // 4, 1)
    return {
        "summary/reward_first_quarter": sum(rewards[:quarter]) / quarter,
        "summary/reward_last_quarter": sum(rewards[-quarter:]) / quarter,
    }


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
