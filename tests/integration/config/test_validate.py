"""Bad config fails fast, before any model loads, naming the key and what is allowed."""

import dataclasses
import subprocess
import sys

import pytest

from grpo_pipe.config.errors import ConfigError
from grpo_pipe.runner.pipeline import VALIDATED_GROUPS, build
from tests.conftest import REPO


def _problems(cfg) -> list[str]:
    with pytest.raises(ConfigError) as err:
        build(cfg)
    return err.value.problems


def test_wrong_type_literal_and_unknown_key_are_all_reported_at_once(compose_cfg) -> None:
    cfg = compose_cfg(["trainer.optimisation.lr=abc", "loss.aggregation=mean", "+trainer.optimisation.lrr=1",
                       "rollout.max_model_len=1.5"])
    problems = "\n".join(_problems(cfg))
    assert "trainer.optimisation.lr='abc': expected a number" in problems
    assert "loss.aggregation='mean': allowed values: 'sequence_mean', 'constant', 'token_mean'" in problems
    assert "trainer.optimisation.lrr: unknown setting for OptimisationSettings; allowed:" in problems and " lr," in problems
    assert "rollout.max_model_len=1.5: expected an integer" in problems


def test_unknown_top_level_key_is_reported(compose_cfg) -> None:
    cfg = compose_cfg(["+trainr.lr=1"])
    assert any(p.startswith("trainr: unknown top-level key; allowed: checkpoint, curriculum, data,") for p in _problems(cfg))


def test_required_missing_value_is_reported(compose_cfg) -> None:
    cfg = compose_cfg(["logger.experiment=???"])
    assert any("logger.experiment: required value `???`" in p for p in _problems(cfg))


def test_cross_component_problem_is_a_config_error(compose_cfg) -> None:
    cfg = compose_cfg(["rollout.layout.device_ids='1'"])  # the engine on another GPU: reload cannot share memory with it
    assert any("rollout.layout.device_ids='1'" in p and "use weight_bridge=nccl" in p for p in _problems(cfg))


def test_sleep_needs_sleep_mode(compose_cfg) -> None:
    cfg = compose_cfg(["placement.sleep_level=1"])
    assert any("rollout.memory.enable_sleep_mode=true" in p for p in _problems(cfg))


SERVING_REWARD = ("+reward.rewards.serving={_target_: grpo_pipe.rewards.inference_aware.InferenceAwareReward, "
                  "task_score: {_target_: grpo_pipe.rewards.correctness.CorrectnessReward}}")


@pytest.mark.parametrize(("overrides", "recorded"), [
    ([], False),  # correctness reads no timestamps
    (["reward=weighted"], False),
    (["reward=inference_aware"], True),  # its latency term
    (["reward=weighted", SERVING_REWARD, "+reward.weights.serving=1.0"], True),  # one of the weighted rewards reads them
    (["rollout.features.request_timestamps=true"], True),  # asked for, read or not
])
def test_the_engine_records_request_timestamps_when_asked_or_when_the_reward_reads_them(
    compose_cfg, overrides: list[str], recorded: bool
) -> None:
    assert build(compose_cfg(overrides)).rollout.request_timestamps is recorded


def test_a_reward_that_reads_timestamps_refuses_an_engine_told_not_to_record_them(compose_cfg) -> None:
    cfg = compose_cfg(["reward=inference_aware", "rollout.features.request_timestamps=false"])
    assert any(p.startswith("rollout.features.request_timestamps=false: the reward reads per-request timestamps")
               for p in _problems(cfg))


def test_nested_component_of_a_reward_is_validated(compose_cfg) -> None:
    cfg = compose_cfg(["reward=inference_aware", "+reward.task_score.wrongg=1", "reward.task_score.correct=yes"])
    problems = "\n".join(_problems(cfg))
    assert (
        "reward.task_score.wrongg: unknown setting for CorrectnessReward; allowed: correct, unparsable, verifier, wrong"
        in problems
    )
    assert "reward.task_score.correct='yes': expected a number" in problems


def test_null_nested_component_is_reported(compose_cfg) -> None:
    cfg = compose_cfg(["reward=inference_aware", "reward.task_score=null"])
    assert any("reward.task_score=None: expected a component config with `_target_` building Reward" in p
               for p in _problems(cfg))


def test_the_default_config_validates(compose_cfg) -> None:
    parts = build(compose_cfg(tiny=False))
    assert set(VALIDATED_GROUPS) - {"policy", "loss", "optimizer"} <= {f.name for f in dataclasses.fields(parts)}
    assert parts.trainer.loss.max_tokens == 64  # Dr.GRPO's constant defaults to run.max_new_tokens


@pytest.mark.parametrize("key", ["run.max_new_tokens", "run.eval_max_new_tokens"])
def test_a_generation_budget_beyond_the_engine_context_names_both_keys(compose_cfg, key: str) -> None:
    problems = _problems(compose_cfg([f"{key}=5000", "rollout.max_model_len=512"]))
    assert any(p.startswith(f"{key}=5000") and "rollout.max_model_len=512" in p and f"{key} <= 511" in p
               for p in problems), problems


def test_missing_data_folder_and_file_fail_before_anything_loads(compose_cfg, tmp_path) -> None:
    problems = _problems(compose_cfg(["data=gsm8k", "data.path=/nonexistent"]))
    assert problems == ["data.path='/nonexistent': no such folder"]
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "test.jsonl").write_text("")
    problems = _problems(compose_cfg(["data=gsm8k", f"data.path={folder}"]))
    assert problems == [f"data.train_file='train.jsonl': no such file in data.path='{folder}'; found: test.jsonl"]


def test_constructor_range_checks_are_collected_in_the_one_format(compose_cfg) -> None:
    problems = _problems(compose_cfg(["trainer.steps=-1", "trainer.optimisation.updates_per_batch=0",
                                      "curriculum.samples_per_prompt=1", "loss.kl_coef=-0.1"]))
    text = "\n".join(problems)
    assert "trainer.steps=-1: must be >= 1" in text and "trainer.optimisation.updates_per_batch=0: must be >= 1" in text
    assert "curriculum.samples_per_prompt=1" in text and "loss.kl_coef=-0.1: must be >= 0" in text
    assert "full_key" not in text and "Error in call to target" not in text


def test_cross_field_file_and_constructor_problems_come_in_one_list(compose_cfg) -> None:
    problems = _problems(compose_cfg(["run.max_new_tokens=5000", "data=gsm8k", "data.path=/nonexistent",
                                      "trainer.steps=-1", "curriculum.samples_per_prompt=1"]))
    assert [p.split("=", 1)[0] for p in problems] == [
        "run.max_new_tokens", "data.path", "curriculum.samples_per_prompt", "trainer.steps"]


@pytest.mark.parametrize("loss", ["grpo", "dr_grpo", "dapo"])
def test_every_loss_preset_builds(compose_cfg, loss: str) -> None:
    assert type(build(compose_cfg([f"loss={loss}"])).trainer.loss).__name__ == "PolicyGradientLoss"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("weight_bridge=lorra", "weight_bridge=lorra: unknown option; nearest: lora"),
        ("trainer.optimisation.lr=abc", "trainer.optimisation.lr='abc': expected a number"),
        ("run.max_new_tokens=5000", "run.max_new_tokens=5000 leaves no room for a prompt in rollout.max_model_len=1024"),
    ],
)
def test_cli_typo_exits_non_zero_before_any_engine_or_model_code_is_imported(override: str, expected: str,
                                                                            tmp_path) -> None:
    """Judged by what the process imported, not by its time (which a loaded machine stretches): the error comes
    before vLLM or transformers' model code is even imported, so before anything loads."""
    report = "import atexit, runpy, sys; atexit.register(lambda: print('IMPORTED', 'vllm' in sys.modules, " \
             "'transformers.modeling_utils' in sys.modules, file=sys.stderr)); " \
             f"sys.argv = ['grpo_pipe', {override!r}, 'hydra.run.dir={tmp_path}']; " \
             "runpy.run_module('grpo_pipe', run_name='__main__')"
    proc = subprocess.run(
        [sys.executable, "-c", report],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,  # a hang guard, not a figure
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    assert proc.returncode != 0
    assert expected in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "IMPORTED False False" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize(("overrides", "background"), [
    ([], False),  # on-policy: the loop waits for every batch, nothing to overlap
    (["rollout_scheduler.max_staleness=1"], True),  # the next batch is generated while the trainer trains
    (["rollout_scheduler.max_staleness=1", "rollout.layout.background=false"], False),  # asked not to
])
def test_a_colocated_engine_generates_in_the_background_exactly_when_the_scheduler_may_run_ahead(
    compose_cfg, overrides: list[str], background: bool
) -> None:
    assert build(compose_cfg(overrides)).rollout.background is background


@pytest.mark.parametrize(("overrides", "problem"), [
    (["rollout.layout.background=true"], "rollout.layout.background=true with rollout_scheduler.max_staleness=0"),
    (["rollout.layout.background=true", "rollout_scheduler.max_staleness=1", "placement.sleep_level=1",
      "rollout.memory.enable_sleep_mode=true"], "rollout.layout.background=true with placement.sleep_level=1"),
])
def test_background_generation_that_cannot_overlap_is_refused(compose_cfg, overrides: list[str], problem: str) -> None:
    assert any(p.startswith(problem) and "allowed:" in p for p in _problems(compose_cfg(overrides)))
