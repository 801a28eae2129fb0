"""The live state of one training run: its settings, what the loop carries from step to step, and how
all of it is written to a checkpoint and put back on resume."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf

from grpo_pipe.checkpointing import Checkpoint
from grpo_pipe.evaluation import EvalPlan, evaluate, metric_problem
from grpo_pipe.rollout.scheduler import RolloutScheduler

log = logging.getLogger(__name__)


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
    early_stop_patience: int = 0  # stop after this many evaluations without a new best; 0 = never
    max_minutes: float | None = None  # time budget for the training loop: the run ends normally after the step that passes it
    overlong_prompts: Literal["skip", "truncate"] = "skip"  # prompts that leave no room for max_new_tokens
    samples_to_log: int = 16
    seeded_sampling: bool = True  # every batch sampled with a seed derived from `seed`: reproducible, resumable
    shutdown_grace_s: float = 30.0  # after a stop signal the process ends within this, finished or not
    eval_metric: str = "accuracy"  # eval/score: accuracy (the reward's notion of solved) | reward | reward/<term>
    eval_pass_k: int = 0  # k sampled completions per held-out task for eval/pass_at_<k>; 0 = greedy only

    def config_problems(self) -> list[str]:
        problem = metric_problem(self.eval_metric)
        return [problem] if problem else []

    def eval_plan(self) -> EvalPlan:
        return EvalPlan(self.eval_max_new_tokens, self.eval_metric, self.eval_pass_k, self.temperature, self.seed)


@dataclass
class LoopState:
    """What the loop carries from step to step (and what a checkpoint records of it)."""

    pushed_version: int = 0  # the newest policy version the engine has been given
    train_spans: list[tuple[float, float]] = field(default_factory=list)  # wall clock, trainer busy
    wait_s: float = 0.0  # trainer time spent waiting for rollouts
    table: list[dict[str, Any]] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)  # mean reward per step, from step 1
    eval_history: list[tuple[int, float]] = field(default_factory=list)  # (step, best_metric value)
    evals_without_improvement: int = 0
    trained_through: int = 0  # the last step whose optimizer update is done
    last_eval: tuple[int, dict[str, float]] = (0, {})  # (step, metrics) of the latest evaluation
    engine_restarts: int = 0
    # This process's loop only, like train_spans: samples trained on, and those new weights reached mid-way.
    samples: int = 0
    samples_updated_in_flight: int = 0


@dataclass
class LiveRun:
    """The live objects of one training run."""

    parts: dict[str, Any]
    settings: RunSettings
    model_path: Path
    tokenizer: Any
    scheduler: RolloutScheduler
    eval_prompts: list[tuple[int, ...]]
    eval_tasks: list[Any]
    state: LoopState

    def evaluate(self) -> dict[str, float]:
        self.parts["placement"].before_rollout(self.parts["rollout"])
        return evaluate(
            self.parts["rollout"], self.eval_prompts, self.eval_tasks, self.parts["reward"], self.settings.eval_plan()
        )

    def save_checkpoint(self, cfg: DictConfig, step: int) -> None:
        """Write the whole training state for `step` (atomically, through the checkpoint manager)."""
        parts, state = self.parts, self.state
        loop_state = {
            "step": step,
            "mlflow_run_id": parts["logger"].run_id,
            "pushed_version": state.pushed_version,
            "curriculum": parts["curriculum"].state_dict(),
            "scheduler": self.scheduler.snapshot(),
            "step_rewards": state.step_rewards,
            "eval_history": state.eval_history,
            "evals_without_improvement": state.evals_without_improvement,
            "best_value": parts["checkpoint"].best_value,
        }
        config_yaml = OmegaConf.to_yaml(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)))
        saved = parts["checkpoint"].save(step, parts["trainer"].state_dict(), loop_state, config_yaml)
        log.info("Checkpoint written: %s", saved.path)

    def restore(self, checkpoint: Checkpoint) -> int:
        """Put trainer, curriculum, scheduler and engine back where the checkpoint left them; returns the next step."""
        parts, state = self.parts, self.state
        loop = checkpoint.loop_state()
        parts["trainer"].load_state_dict(checkpoint.trainer_state())
        parts["curriculum"].load_state_dict(loop["curriculum"])
        state.step_rewards = list(loop["step_rewards"])
        state.eval_history = [tuple(e) for e in loop["eval_history"]]
        state.evals_without_improvement = int(loop["evals_without_improvement"])
        parts["checkpoint"].best_value = loop["best_value"]
        if loop["pushed_version"] > 0:
            # The engine started on the base weights: give it the checkpoint's. With sync_every > 1 these are
            # newer than what the engine served at the checkpoint (only they were saved): samples get fresher.
            parts["placement"].before_sync(parts["rollout"])
            parts["weight_bridge"].push(parts["trainer"].policy, parts["trainer"].version)
            state.pushed_version = parts["trainer"].version
        tasks_by_uid = {t.uid: t for t in parts["data"].train_tasks()}
        parts["placement"].before_rollout(parts["rollout"])
        self.scheduler.restore(loop["scheduler"], tasks_by_uid)
        return int(loop["step"]) + 1
