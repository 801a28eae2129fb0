"""The components of one job, built from the config: one typed field per config group.

`build` validates the whole config, then instantiates each group's `_target_` (cheap: nothing loads
here) and checks the combinations no single component can judge on its own. Every problem is reported
at once, before any model or engine loads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from omegaconf import DictConfig

from grpo_pipe.config.errors import ConfigError
from grpo_pipe.config.validate import component_problems, instantiate_components, validate_config
from grpo_pipe.interfaces import (
    CheckpointStore,
    Curriculum,
    Environment,
    GeneratesInBackground,
    ModelSource,
    Placement,
    ProvidesRollouts,
    RecordsRequestTimestamps,
    Reward,
    RolloutEngine,
    RolloutSourceFactory,
    TaskSource,
    Tracker,
    Trainer,
    WeightBridge,
    reads_request_timestamps,
)
from grpo_pipe.rewards.environment import EnvironmentReward
from grpo_pipe.runner.settings import RunSettings

log = logging.getLogger(__name__)

# Built in this order; `policy` is built inside `trainer` (trainer.policy: ${policy}).
COMPONENT_GROUPS = (
    "run", "model", "data", "reward", "curriculum", "trainer", "rollout", "rollout_scheduler", "environment",
    "weight_bridge", "placement", "logger", "checkpoint",
)
VALIDATED_GROUPS = COMPONENT_GROUPS + ("policy", "loss", "optimizer")  # the last three are built inside `trainer`
PLAIN_KEYS = ("resume", "resume_accept")  # top-level settings that are not components


@dataclass(kw_only=True)
class Components:
    """One built object per config group, typed by the Protocol the recipe uses it through.

    Args:
        run: The settings of the run itself (`run.*`).
        model: Where the model's folder comes from.
        data: The train and held-out tasks.
        reward: Scores the completions.
        curriculum: Which tasks each step samples, and how many completions of each.
        trainer: The policy and its optimisation step.
        rollout: The engine as the placement placed it: the engine itself, or a handle to replicas.
        rollout_scheduler: The scheduler's settings; the recipe builds the scheduler (engine, tasks, prompts).
        environment: One turn per rollout, or tool-using episodes.
        weight_bridge: How the trained weights reach the engine.
        placement: Where the trainer and the engine run.
        logger: The tracker every metric, parameter and artifact goes through.
        checkpoint: Where checkpoints are written and found.
    """

    run: RunSettings
    model: ModelSource
    data: TaskSource
    reward: Reward
    curriculum: Curriculum
    trainer: Trainer
    rollout: RolloutEngine
    rollout_scheduler: RolloutSourceFactory
    environment: Environment
    weight_bridge: WeightBridge
    placement: Placement
    logger: Tracker
    checkpoint: CheckpointStore

    @property
    def max_staleness(self) -> int:
        return self.rollout_scheduler.max_staleness


def build(cfg: DictConfig) -> Components:
    """Validate the whole config, then construct every component (cheap: nothing loads here)."""
    validate_config(cfg, VALIDATED_GROUPS, PLAIN_KEYS)
    built = instantiate_components(cfg, COMPONENT_GROUPS, nested=("policy", "loss", "optimizer"))
    # Paths, columns, importable functions: checked on the built components, still before anything loads.
    problems = [p for group, part in built.items() for p in component_problems(group, part, VALIDATED_GROUPS)]
    parts = Components(**built)
    problems += combination_problems(parts)  # before `place`: judged on the engine as configured; with the above
    if problems:
        raise ConfigError(problems)
    problems += record_timestamps_if_read(parts.rollout, parts.reward)  # before `place`: engine actors get a copy
    configured = parts.rollout
    parts.rollout = parts.placement.place(configured)
    problems += generate_in_background_if_ahead(configured, parts.rollout is configured, parts)
    run_episodes_in_background_if_ahead(parts)
    problems += parts.weight_bridge.check(parts.rollout, parts.trainer.policy)
    problems += parts.placement.check(parts.trainer)  # GPUs, cluster, trainer kind
    if problems:
        raise ConfigError(problems)
    return parts


def combination_problems(parts: Components) -> list[str]:
    """Settings that are each valid but do not work together."""
    problems = []
    staleness, sync_every = parts.max_staleness, parts.weight_bridge.sync_every
    if 0 <= staleness < sync_every - 1:  # a negative one is the scheduler settings' own problem
        problems.append(
            f"rollout_scheduler.max_staleness={staleness} < weight_bridge.sync_every - 1 = {sync_every - 1}: "
            "between syncs the engine lags up to sync_every - 1 versions; raise max_staleness or sync more often"
        )
    if isinstance(parts.environment, ProvidesRollouts) and not isinstance(parts.reward, EnvironmentReward):
        problems.append(f"environment={type(parts.environment).__name__}: the environments score their groups; train on "
                        f"their scores with reward=environment (got {type(parts.reward).__name__})")
    if parts.placement.sleep_level > 0 and not parts.rollout.enable_sleep_mode:
        problems.append(f"placement.sleep_level={parts.placement.sleep_level} needs rollout.memory.enable_sleep_mode=true")
    return problems


def generate_in_background_if_ahead(engine: RolloutEngine, kept_here: bool, parts: Components) -> list[str]:
    """`rollout.layout.background=null`: an engine the placement kept in this process generates on a thread of its own
    exactly when the scheduler may run ahead of training (max_staleness >= 1) and the engine keeps its memory
    while the trainer runs; then the next batch is generated while the trainer trains. Without it a colocated
    engine generates only when the loop waits for it, and max_staleness >= 1 would make samples stale for nothing."""
    if not isinstance(engine, GeneratesInBackground):
        return []
    staleness, sleep_level = parts.max_staleness, parts.placement.sleep_level
    if engine.background is None:
        engine.background = kept_here and staleness >= 1 and sleep_level == 0
        return []
    if not engine.background:
        return []
    problems = []
    if not kept_here:
        problems.append("rollout.layout.background=true: this placement runs the engines elsewhere, where they already "
                        "generate while the trainer trains; allowed: null or false")
    if staleness < 1:
        problems.append("rollout.layout.background=true with rollout_scheduler.max_staleness=0: the loop waits for every batch "
                        "before training on it, so nothing would overlap; allowed: rollout_scheduler.max_staleness >= 1")
    if sleep_level > 0:
        problems.append(f"rollout.layout.background=true with placement.sleep_level={sleep_level}: the engine cannot generate "
                        "while it sleeps for the trainer; allowed: placement.sleep_level=0")
    return problems


def run_episodes_in_background_if_ahead(parts: Components) -> None:
    """`environment.background=null`: a batch's episodes run on a thread of their own exactly when the engine takes
    calls while the trainer trains: an engine that generates in the background, or one the placement runs elsewhere,
    with a scheduler that may run ahead. Otherwise episodes run where they are submitted, as one engine call does."""
    episodes, engine = parts.environment, parts.rollout
    if not isinstance(episodes, GeneratesInBackground) or episodes.background is not None:
        return
    engine_background = engine.background if isinstance(engine, GeneratesInBackground) else None
    episodes.background = bool(engine_background) if engine_background is not None else parts.max_staleness >= 1


def record_timestamps_if_read(engine: RolloutEngine, reward: Reward) -> list[str]:
    """`rollout.features.request_timestamps=null`: the engine records per-request timestamps exactly when the reward
    reads them (they cost decode speed); an explicit false under a reward that reads them is a problem."""
    if not isinstance(engine, RecordsRequestTimestamps):
        return []
    reads = reads_request_timestamps(reward)
    if engine.request_timestamps is None:
        engine.request_timestamps = reads
    elif reads and not engine.request_timestamps:
        return ["rollout.features.request_timestamps=false: the reward reads per-request timestamps (its latency term); "
                "allowed: true or null"]
    return []
