"""The recipe's step with in-memory fakes of our own Protocols (unit tier: no engine, no model, no MLflow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_pipe.runner.recipe import GRPORecipe
from grpo_pipe.runtime.stopping import StopRequest
from tests.fakes import fake_components


def _recipe(tmp_path: Path, **kwargs: Any) -> GRPORecipe:
    recipe = GRPORecipe(parts=fake_components(tmp_path, **kwargs), config_yaml="config: {}\n", output_dir=tmp_path)
    recipe.setup()
    return recipe


def _fakes(recipe: GRPORecipe) -> Any:
    """The components as their fake classes, with what they recorded (not only their Protocols)."""
    return recipe.parts


def test_a_step_trains_on_scored_rollouts_then_syncs_and_records(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    metrics = recipe.train_step(1)
    parts: Any = recipe.parts  # the fakes, with what they recorded
    # Two tasks x two samples; the fake engine answers right on even samples: half the rewards are 1.
    assert parts.trainer.seen == [(0, [1.0, 0.0, 1.0, 0.0])]
    assert parts.curriculum.updates == [["t/0", "t/0", "t/1", "t/1"]]
    # The contract is kept by the caller: one push of version 1, and the engine serves it.
    assert parts.weight_bridge.pushed == [1] and parts.rollout.served_version == 1
    assert metrics["train/reward/mean"] == 0.5 and metrics["train/accuracy"] == 0.5
    assert metrics["policy/version"] == 1.0 and metrics["sync/policy_version"] == 1.0
    assert metrics["sync/total_s"] >= 0.0 and metrics["curriculum/updates"] == 1.0
    assert recipe.recorder.step_rewards == [0.5] and len(recipe.recorder.table) == 4
    # The ledger after the step: its two groups trained, the next step's two already in flight (scheduled in step 7).
    assert {k: v for k, v in metrics.items() if k.startswith("ledger/")} == {
        "ledger/submitted": 4.0, "ledger/trained": 2.0, "ledger/dropped": 0.0, "ledger/in_flight": 2.0,
        "ledger/repeated": 0.0, "ledger/balanced": 1.0}


def test_on_policy_loop_trains_every_step_on_the_previous_version(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, steps=3)
    for step in (1, 2, 3):
        recipe.train_step(step)
    versions_trained_on = [v for v, _ in _fakes(recipe).trainer.seen]
    assert versions_trained_on == [0, 1, 2]
    ledger = recipe.scheduler.ledger
    assert ledger.balanced() and ledger.trained == 6 and ledger.in_flight == 0


def test_sync_every_two_pushes_every_other_version(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, steps=4, max_staleness=1, sync_every=2)
    for step in (1, 2, 3, 4):
        recipe.train_step(step)
    assert _fakes(recipe).weight_bridge.pushed == [2, 4]
    assert recipe.pushed_version == 4 == _fakes(recipe).rollout.served_version


def test_train_evaluates_saves_and_reports_a_result(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, steps=2)
    assert recipe.evaluate(0)["eval/accuracy"] == 1.0  # greedy = sample 0: always right
    with StopRequest() as stop:
        result = recipe.train(1, stop)
    assert result.rewards == [0.5, 0.5] and result.stopped_by is None and result.run_id == "fake-run"
    assert result.final_eval["eval/accuracy"] == 1.0
    assert result.summary["summary/reward_first_quarter"] == 0.5
    assert result.objective == 1.0  # run.objective (eval/accuracy by default), what `main` hands a sweeper
    assert [c.name for c in (tmp_path / "checkpoints").iterdir()] == ["step-000002"]  # the last step, always
    logged_steps = [step for step, _ in _fakes(recipe).logger.metrics]
    assert logged_steps == [0, 1, 2, 2]  # data/skipped_rows, two steps, the summary


def test_a_new_best_is_exported_with_the_model_sources_tokenizer_files(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    recipe.evaluate(1)  # no baseline yet: the first evaluation is the best so far
    best = tmp_path / "checkpoints" / "best"
    assert sorted(f.name for f in best.iterdir()) == ["best.json", "tokenizer.json", "weights"]


def test_a_stop_asked_during_training_finishes_the_step_saves_it_and_skips_the_final_evaluation(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, steps=5)
    trainer = _fakes(recipe).trainer
    with StopRequest() as stop:
        train_step = trainer.step

        def step_then_signal(*args: Any) -> dict[str, float]:  # SIGTERM arrives while step 2 trains
            if trainer.version == 1:
                stop.reason = "SIGTERM"
            return train_step(*args)

        trainer.step = step_then_signal
        result = recipe.train(1, stop)
    assert result.stopped_by == "SIGTERM" and result.rewards == [0.5, 0.5] and result.final_eval == {}
    assert [c.name for c in (tmp_path / "checkpoints").iterdir()] == ["step-000002"]
    assert "eval/accuracy" not in result.summary


def test_restore_puts_the_loop_back_where_the_checkpoint_left_it(tmp_path: Path) -> None:
    first = _recipe(tmp_path / "a", steps=3)
    first.train_step(1)
    first.save(1)
    checkpoint = _fakes(first).checkpoint.latest()
    assert checkpoint is not None
    second = _recipe(tmp_path / "b", steps=3)
    assert second.restore(checkpoint) == 2
    assert second.parts.trainer.version == 1 == second.parts.rollout.served_version
    assert second.recorder.step_rewards == [0.5]
    assert _fakes(second).curriculum.position == _fakes(first).curriculum.position


def test_a_sources_own_evaluations_join_the_steps_metrics_and_their_files_the_run(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    report = tmp_path / "metrics.json"
    report.write_text("{}")
    reports = [({"env_eval/0/accuracy": 0.75}, [report]), ({}, [])]
    recipe.scheduler.take_evaluations = lambda: reports.pop(0)  # type: ignore[attr-defined]  # as environment=atropos's
    assert recipe.train_step(1)["env_eval/0/accuracy"] == 0.75
    assert "env_eval/0/accuracy" not in recipe.train_step(2)  # reported once
    assert (report, "environment_evaluations") in _fakes(recipe).logger.artifacts
