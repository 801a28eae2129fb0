"""The GRPO recipe: one object that runs the algorithm over the job's components.

    setup -> (restore) -> evaluate -> train: train_step x N (with evaluations, checkpoints) -> cleanup

`train_step` is the algorithm; the step's bookkeeping lives in `StepRecorder`, held-out evaluation,
best-so-far and early stopping in `HeldOutEvaluation`, the bridge contract in `bridges.contract`. What the
loaded data must pass before the recipe starts is `runner.data_checks`; what a run hands back, `runner.run_result`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from grpo_pipe.bridges.contract import push_weights, sync_due
from grpo_pipe.checkpoint.store import Checkpoint
from grpo_pipe.environments.transcripts import write_episode_page
from grpo_pipe.evaluation.by_group import in_turn
from grpo_pipe.evaluation.held_out import fit_held_out
from grpo_pipe.evaluation.schedule import HeldOutEvaluation
from grpo_pipe.interfaces import (
    HasSourceFiles,
    ProvidesRollouts,
    ReportsEvaluations,
    RolloutSource,
    ShardedState,
)
from grpo_pipe.models.custom_code import loader_options
from grpo_pipe.rollout.errors import EngineGaveUp, EngineLost
from grpo_pipe.rollout.ledger import ledger_metrics
from grpo_pipe.runner.components import Components
from grpo_pipe.runner.data_checks import data_fingerprint
from grpo_pipe.runner.progress import StepProgress, format_metrics
from grpo_pipe.runner.run_result import RunResult
from grpo_pipe.runner.step_recorder import MismatchWatch, StepRecorder
from grpo_pipe.runtime.halt import halt_point
from grpo_pipe.runtime.stopping import GenerationInterrupted, StopRequest
from grpo_pipe.trainer.errors import TrainerLost
from grpo_pipe.types import RolloutGroup, SamplingSettings, SyncStats, TakenBatch

log = logging.getLogger(__name__)

# Early stopping and the time budget end a run normally (final evaluation, FINISHED); a signal does not.
NORMAL_ENDS = ("early_stopping", "time_budget")


class GRPORecipe:
    """The GRPO algorithm over one job's components: `setup`, `train` (a `train_step` each step), `cleanup`.

    Args:
        parts: The job's built components.
        config_yaml: The resolved config, saved with every checkpoint.
        output_dir: The job's folder: the samples table, environment logs, curriculum reports, episode pages.
        overrides: The job's command line, saved with every checkpoint (`resume=<dir>` alone continues).
    """

    def __init__(self, *, parts: Components, config_yaml: str, output_dir: Path, overrides: Sequence[str] = ()) -> None:
        self.parts = parts
        self.config_yaml = config_yaml
        self.overrides = list(overrides)
        self.output_dir = output_dir
        self.engine = parts.rollout
        self.pushed_version = 0  # the newest policy version the engine has been given
        self.trained_through = 0  # the last step whose optimizer update is done
        self.engine_restarts = 0
        watch = MismatchWatch(parts.run.mismatch_warn, type(parts.weight_bridge).__name__)
        # The samples table goes to the run folder step by step (logged to MLflow at the end, as before).
        self.recorder = StepRecorder(parts.run.samples_to_log, watch, samples_file=output_dir / "samples.jsonl")

    def setup(self) -> None:
        """Load the model, start the engine and the trainer, connect the bridge, prepare the evaluation."""
        p, settings = self.parts, self.parts.run
        train_tasks, eval_tasks = p.data.train_tasks(), list(p.data.eval_tasks())  # checked by the pipeline already
        self.model_path = p.model.materialize()
        tokenizer = p.model.tokenizer()
        p.curriculum.attach(train_tasks)
        p.logger.log_metrics({"data/skipped_rows": float(len(p.data.skipped))}, step=0)
        p.logger.log_params(data_fingerprint(train_tasks, eval_tasks))  # which rows trained, beside the data's path
        for source in p.reward.source_files() if isinstance(p.reward, HasSourceFiles) else []:
            p.logger.log_artifact(source, "reward")  # the user's own scoring code, as it was for this run
        self.engine.connect(self.model_path, {**p.weight_bridge.engine_options(), **loader_options(self.model_path)})
        p.reward.setup(self.model_path, self.engine.weight_dtype)
        device = p.placement.trainer_device()
        p.trainer.setup(self.model_path, device, pad_id=tokenizer.pad_token_id or 0)
        # A sharded trainer's ranks are processes of their own, and report their memory with their metrics.
        self.recorder.trainer_device = None if isinstance(p.trainer, ShardedState) else device
        p.weight_bridge.connect(self.engine, p.trainer.policy)
        p.environment.setup(tokenizer, p.data.system_prompt, self.engine.max_model_len)
        render = p.environment.render_prompt  # the task in the chat template, with the tools where there are any
        seed = settings.seed if settings.seeded_sampling else None
        self.sampling = SamplingSettings(temperature=settings.temperature, top_p=settings.top_p,
                                         max_tokens=settings.max_new_tokens, seed=seed,
                                         extra=dict(settings.sampling_extra))
        self.scheduler: RolloutSource
        if isinstance(p.environment, ProvidesRollouts):  # environment services sample and score on their own
            self.scheduler = p.environment.rollout_source(
                self.engine, self.sampling, max_staleness=p.max_staleness, total_steps=p.trainer.steps,
                log_dir=self.output_dir / "environments")
        else:
            self.scheduler = p.rollout_scheduler.build(
                self.engine, p.curriculum.next_batch, render, self.sampling, total_steps=p.trainer.steps,
                prompt_limit=self.engine.max_model_len - p.environment.completion_budget(settings.max_new_tokens),
                overlong_prompts=settings.overlong_prompts, environment=p.environment,
            )
        # Groups of held-out tasks (lengths) take turns before the cut: each keeps its share, and the few episodes
        # shown to people hold one of each.
        eval_tasks = in_turn(eval_tasks, eval_tasks)[: settings.eval_size]
        if isinstance(p.environment, ProvidesRollouts):
            # Its groups are scored by the environments (reward=environment): the data's tasks as single turns would
            # all score `missing`. The environments' own evaluations are logged instead (env_eval/*).
            log.info("Held-out evaluation: the environments' own (env_eval/*); the data's held-out tasks are not run")
            eval_tasks = []
        eval_limit = self.engine.max_model_len - p.environment.completion_budget(settings.eval_max_new_tokens)
        eval_prompts, eval_tasks = fit_held_out([render(t) for t in eval_tasks], eval_tasks, eval_limit,
                                                settings.overlong_prompts)
        self.held_out = HeldOutEvaluation(
            prompts=eval_prompts, tasks=eval_tasks, reward=p.reward, plan=settings.eval_plan(),
            eval_every=settings.eval_every, patience=settings.early_stop_patience, checkpoints=p.checkpoint,
            export_best=self._export_policy, environment=p.environment,
        )

    def train(self, first_step: int, stop: StopRequest) -> RunResult:
        """Steps `first_step`..`trainer.steps`, until done, out of time, early-stopped or asked to stop."""
        p, steps = self.parts, self.parts.trainer.steps
        already_logged = p.logger.logged_steps("policy/version")  # steps a crashed run logged past its checkpoint
        loop_started, ended_by = time.time(), None  # a signal, early stopping or the time budget
        max_minutes = p.run.max_minutes
        deadline = None if max_minutes is None else loop_started + 60.0 * max_minutes
        self.scheduler.guard = stop.interruptible  # a stop signal abandons a generation in progress
        with StepProgress(steps, first_step=first_step - 1) as progress:
            for step in range(first_step, steps + 1):
                try:
                    metrics = self._step_or_save(step)
                except GenerationInterrupted:  # the abandoned batch was this step's: the last finished is step - 1
                    ended_by = stop.reason
                    self._save_interrupted(step, ended_by)
                    break
                if self.held_out.due(step, steps):
                    metrics.update(self.evaluate(step))
                if step not in already_logged:
                    p.logger.log_metrics(metrics, step=step)
                p.logger.set_tags({"grpo_pipe.last_step": str(step)})  # where a run killed outright stopped
                for report in p.curriculum.take_reports(self.output_dir / "curriculum"):
                    p.logger.log_artifact(report, "curriculum")
                progress.update(step, metrics)
                out_of_time = deadline is not None and time.time() >= deadline
                early = self.held_out.should_stop and self.held_out.last.step == step
                ended_by = stop.reason or ("early_stopping" if early else None) or ("time_budget" if out_of_time else None)
                if p.checkpoint.due(step, steps) or ended_by:
                    self.save(step)
                if ended_by:
                    log.warning("Stopping after step %d (%s)", step, ended_by)
                    break
        return self._finish(time.time() - loop_started, ended_by=ended_by)

    def train_step(self, step: int) -> dict[str, float]:
        """One GRPO step. Rollouts for this step were scheduled during the previous one."""
        p, rec = self.parts, self.recorder
        rec.begin()
        with rec.phase("rollouts"):
            halt_point("generation", step)                                  # (a test's kill point; no-op otherwise)
            groups = self._take_rollouts(step)                              # 1. pick tasks, roll out (scheduler)
        with rec.phase("reward"):
            halt_point("reward", step)                                      # (a test's kill point; no-op otherwise)
            scored = p.reward(groups)                                       # 2. score every completion
        rec.scores(step, groups, scored)
        with rec.phase("curriculum"):
            # Difficulty is how well a task is solved: latency and length terms would drown it.
            rec.add(p.curriculum.update(_uids(groups), scored.difficulty_signal))  # 3. the curriculum learns
        with rec.phase("placement"):
            p.placement.before_train(self.engine)                           # 4. the device to the trainer
        with rec.training():                                                # 5. advantages + one update
            rec.add(p.trainer.step(groups, scored.values, self.sampling.temperature))
        self.trained_through = step
        halt_point("update", step)                                          # (a test's kill point; no-op otherwise)
        rec.synced(self._sync_if_due())                                     # 6. new weights to the engine
        with rec.phase("schedule"):
            self._schedule_rollouts(steps_done=step)                        # 7. the engine's next work, now
        rec.add(self._environment_evaluations())
        rec.add(ledger_metrics(self.scheduler.ledger))  # where every group went so far, across resumes
        return rec.end(step, p.trainer.version, self.engine_restarts)

    def _environment_evaluations(self) -> dict[str, float]:
        """What environments that evaluate on their own reported since the last step; their files kept with the run."""
        if not isinstance(self.scheduler, ReportsEvaluations):
            return {}
        metrics, files = self.scheduler.take_evaluations()
        for report in files:
            self.parts.logger.log_artifact(report, "environment_evaluations")
        return metrics

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out greedy evaluation; notes the best so far (and exports it)."""
        self.parts.placement.before_rollout(self.engine)
        metrics = self.held_out.run(self.engine, step)
        page = write_episode_page(self.held_out.last_completions, self.held_out.tasks, step, self.output_dir / "episodes")
        if page is not None:  # episodes: a few of them as a person reads them
            self.parts.logger.log_artifact(page, "episodes")
        return metrics

    def save(self, step: int) -> None:
        """Write the whole training state for `step` (atomically, through the checkpoint store)."""
        p = self.parts
        loop_state = {
            "step": step,
            "mlflow_run_id": p.logger.run_id,
            "pushed_version": self.pushed_version,
            "curriculum": p.curriculum.state_dict(),
            "scheduler": self.scheduler.snapshot(),
            "step_rewards": self.recorder.step_rewards,
            "overrides": self.overrides,
            **self.held_out.state_dict(),
        }
        # A sharded trainer's ranks write their own shards: its whole state is never gathered into this process.
        started = time.perf_counter()
        trainer_state = p.trainer if isinstance(p.trainer, ShardedState) else p.trainer.state_dict()
        saved = p.checkpoint.save(step, trainer_state, loop_state, self.config_yaml)
        if saved is not None:  # None: the write failed and checkpoint.on_save_error=warn let the run go on
            # The command that continues the run from here: what a person (or a chaos test) runs after a kill.
            log.info("Checkpoint written in %.1f s: %s; continue with: python -m grpo_pipe resume=%s",
                     time.perf_counter() - started, saved.path, saved.path.parent)
            p.logger.set_tags({"grpo_pipe.last_checkpoint": str(saved.path), "grpo_pipe.last_checkpoint_step": str(step)})

    def restore(self, checkpoint: Checkpoint) -> int:
        """Put trainer, curriculum, scheduler and engine back where the checkpoint left them; returns the next step."""
        p, loop = self.parts, checkpoint.loop_state()
        checkpoint.restore_trainer(p.trainer)
        p.curriculum.load_state_dict(loop["curriculum"])
        self.recorder.step_rewards = list(loop["step_rewards"])
        self.held_out.load_state_dict(loop)
        if loop["pushed_version"] > 0:
            # The engine started on the base weights: give it the checkpoint's. With sync_every > 1 these are
            # newer than what the engine served at the checkpoint (only they were saved): samples get fresher.
            self._sync()
        tasks_by_uid = {t.uid: t for t in p.data.train_tasks()}
        p.placement.before_rollout(self.engine)
        self.scheduler.restore(loop["scheduler"], tasks_by_uid)
        return int(loop["step"]) + 1

    def cleanup(self) -> None:
        """Release the bridge, the engine(s) and what the placement started (always, in `finally`)."""
        self.parts.environment.close()  # episodes still running stop before their next turn
        self.parts.weight_bridge.close()
        self.engine.shutdown()
        self.parts.trainer.close()  # a sharded trainer's rank actors; nothing for a single device
        self.parts.placement.close()

    # -- the steps' parts -------------------------------------------------------------------------

    def _step_or_save(self, step: int) -> dict[str, float]:
        try:
            return self.train_step(step)
        except EngineGaveUp:
            if self.trained_through > 0:  # keep the work done so far, then fail loudly
                self.save(self.trained_through)
            raise
        except TrainerLost:  # nothing to save: the trainer's state went with the rank
            latest = self.parts.checkpoint.latest()
            log.error("The trainer was lost during step %d; the last checkpoint is %s", step,
                      latest.path if latest is not None else "none: resuming would start from the beginning")
            raise

    def _save_interrupted(self, step: int, reason: str | None) -> None:
        if step > 1:
            self.save(step - 1)
        log.warning("Stopped during step %d's generation (%s)", step, reason)

    def _schedule_rollouts(self, steps_done: int) -> None:
        self.parts.placement.before_rollout(self.engine)
        self.scheduler.fill(self.parts.trainer.version, self.pushed_version, steps_done=steps_done)

    def _take_rollouts(self, step: int) -> list[RolloutGroup]:
        """The next batch with something left to train on; batches dropped whole are skipped (and counted)."""
        dropped = 0
        while True:
            self._schedule_rollouts(steps_done=step - 1)
            try:
                taken: TakenBatch = self.scheduler.take(self.parts.trainer.version)
            except EngineLost as err:
                self._recover_engine(err)
                continue
            self.recorder.waited(taken)
            dropped += len(taken.dropped)
            if taken.groups:
                self.recorder.rollouts(taken, dropped, self.scheduler, self.parts.trainer.version)
                return taken.groups
            log.warning("Step %d: every group of a batch was too stale and dropped; taking the next one", step)

    def _sync_if_due(self) -> SyncStats | None:
        version = self.parts.trainer.version
        if not sync_due(version, self.pushed_version, self.parts.weight_bridge.sync_every):
            return None
        try:
            return self._sync()
        except EngineLost as err:
            self._recover_engine(err)  # re-syncs the current weights itself
            return None

    def _sync(self) -> SyncStats:
        """Push the trainer's current weights; the engine serves them from its next request on."""
        p = self.parts
        p.placement.before_sync(self.engine)
        halt_point("sync", p.trainer.version)                               # (a test's kill point; no-op otherwise)
        stats = push_weights(p.weight_bridge, self.engine, p.trainer.policy, p.trainer.version)
        self.pushed_version = p.trainer.version
        return stats

    def _recover_engine(self, err: EngineLost) -> None:
        """Restart dead engines (the placement backs off and limits how often), give them the current
        weights, and re-issue every request that was in flight."""
        p = self.parts
        self.engine_restarts += 1
        log.error("Engine lost (%s); restart %d", err, self.engine_restarts)
        p.placement.restart_engines(self.engine, self.engine_restarts)
        p.weight_bridge.close()
        p.weight_bridge.connect(self.engine, p.trainer.policy)
        if p.trainer.version > 0:
            push_weights(p.weight_bridge, self.engine, p.trainer.policy, p.trainer.version)
        self.pushed_version = p.trainer.version
        reissued = self.scheduler.requeue_lost()
        log.warning("Engine back; weights v%d re-synced, %d batch(es) re-issued", p.trainer.version, reissued)

    def _finish(self, loop_s: float, ended_by: str | None) -> RunResult:
        p, rec = self.parts, self.recorder
        stopped_by = None if ended_by in (None, *NORMAL_ENDS) else ended_by  # a signal: no final evaluation
        last_step = len(rec.step_rewards)
        evaluated_now = not stopped_by and self.held_out.last.step != last_step
        final_eval = self.evaluate(last_step) if evaluated_now else ({} if stopped_by else self.held_out.last.metrics)
        summary = {**(final_eval if evaluated_now else {}), **rec.summary(self.scheduler, loop_s)}
        if last_step < p.trainer.steps and ended_by in NORMAL_ENDS:
            key = "early_stopped_at" if ended_by == "early_stopping" else "time_budget_stopped_at"
            summary[f"summary/{key}"] = float(last_step)
        p.logger.log_metrics(summary, step=last_step)
        p.logger.log_table(rec.table, "samples.json")
        log.info("After training: %s", format_metrics(summary))
        objective = p.run.objective_value({**final_eval, **summary})
        latest = p.checkpoint.latest()
        resume_dir = latest.path.parent.parent if latest is not None else None  # <run>/checkpoints/step-N -> <run>
        return RunResult(run_id=p.logger.run_id, rewards=rec.step_rewards, final_eval=final_eval,
                         ledger=self.scheduler.ledger, summary=summary, stopped_by=stopped_by, objective=objective,
                         resume_dir=resume_dir)

    def _export_policy(self, folder: Path) -> None:
        self.parts.trainer.policy.save_pretrained(folder)
        self.parts.model.copy_tokenizer(folder)


def _uids(groups: Sequence[RolloutGroup]) -> list[str]:
    """One task uid per completion, in the order rewards are given."""
    return [g.task.uid for g in groups for _ in g.completions]
