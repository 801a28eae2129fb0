"""Bad config fails fast, before any model loads, naming the key and what is allowed."""

import dataclasses
import subprocess
import sys
import time

import pytest

from grpo_pipe.config.validate import ConfigError
from grpo_pipe.pipeline import VALIDATED_GROUPS, build
from tests.conftest import REPO


def _problems(cfg) -> list[str]:
    with pytest.raises(ConfigError) as err:
        build(cfg)
    return err.value.problems


def test_wrong_type_literal_and_unknown_key_are_all_reported_at_once(compose_cfg) -> None:
    cfg = compose_cfg(["trainer.lr=abc", "trainer.aggregation=mean", "+trainer.lrr=1", "rollout.max_model_len=1.5"])
    problems = "\n".join(_problems(cfg))
    assert "trainer.lr='abc': expected a number" in problems
    assert "trainer.aggregation='mean': allowed values: 'grpo', 'dr_grpo'" in problems
    assert "trainer.lrr: unknown setting for GRPOTrainer; allowed:" in problems and " lr," in problems
    assert "rollout.max_model_len=1.5: expected an integer" in problems


def test_unknown_top_level_key_is_reported(compose_cfg) -> None:
    cfg = compose_cfg(["+trainr.lr=1"])
    assert any(p.startswith("trainr: unknown top-level key; allowed: checkpoint, curriculum, data,") for p in _problems(cfg))


def test_required_missing_value_is_reported(compose_cfg) -> None:
    cfg = compose_cfg(["logger.experiment=???"])
    assert any("logger.experiment: required value `???`" in p for p in _problems(cfg))


def test_cross_component_problem_is_a_config_error(compose_cfg) -> None:
    cfg = compose_cfg(["rollout.in_process=false"])
    assert any("rollout.in_process=true" in p for p in _problems(cfg))


def test_sleep_needs_sleep_mode(compose_cfg) -> None:
    cfg = compose_cfg(["placement.sleep_level=1"])
    assert any("rollout.enable_sleep_mode=true" in p for p in _problems(cfg))


def test_nested_component_of_a_reward_is_validated(compose_cfg) -> None:
    cfg = compose_cfg(["reward=inference_aware", "+reward.task_score.wrongg=1", "reward.task_score.correct=yes"])
    problems = "\n".join(_problems(cfg))
    assert "reward.task_score.wrongg: unknown setting for CorrectnessReward; allowed: correct, unparsable, wrong" in problems
    assert "reward.task_score.correct='yes': expected a number" in problems


def test_null_nested_component_is_reported(compose_cfg) -> None:
    cfg = compose_cfg(["reward=inference_aware", "reward.task_score=null"])
    assert any("reward.task_score=None: expected a component config with `_target_` building Reward" in p
               for p in _problems(cfg))


def test_the_default_config_validates(compose_cfg) -> None:
    parts = build(compose_cfg(tiny=False))
    assert set(VALIDATED_GROUPS) - {"policy"} <= {f.name for f in dataclasses.fields(parts)}


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("weight_bridge=lorra", "Available options in 'weight_bridge'"),
        ("trainer.lr=abc", "trainer.lr='abc': expected a number"),
    ],
)
def test_cli_typo_exits_non_zero_in_seconds(override: str, expected: str, tmp_path) -> None:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_pipe", override, f"hydra.run.dir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    elapsed = time.perf_counter() - started
    assert proc.returncode != 0
    assert expected in proc.stdout + proc.stderr
    assert elapsed < 30, f"config error took {elapsed:.1f}s"
