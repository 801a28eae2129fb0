"""Overrides checked before Hydra runs: unknown options and keys named with the nearest allowed ones, all at once;
nothing else judged."""

import subprocess
import sys

from grpo_pipe.config.overrides import override_problems, unknown_key_problems


def test_every_unknown_key_is_named_with_the_nearest_allowed_names() -> None:
    problems = unknown_key_problems(["trainer.lrr=1", "run.tempreature=0.5", "trainer.steps=2"])
    assert [p.split(";")[:2] for p in problems] == [
        ["trainer.lrr: unknown key", " nearest: trainer.optimisation.lr"],
        ["run.tempreature: unknown key", " nearest: run.temperature"],
    ]


def test_a_key_that_lives_in_a_settings_group_is_found_by_its_name() -> None:
    problems = unknown_key_problems(["rollout.kv_cache_gib=0.5", "trainer.lr=1e-4"])
    assert [p.split(";")[:2] for p in problems] == [
        ["rollout.kv_cache_gib: unknown key", " nearest: rollout.memory.kv_cache_gib"],
        ["trainer.lr: unknown key", " nearest: trainer.optimisation.lr"],
    ]


def test_keys_of_the_option_the_command_picks_are_known() -> None:
    assert unknown_key_problems(["data=jsonl", "data.train_path=tasks.jsonl", "+sweeps=reward_weights"]) == []


def test_sweeps_and_appended_keys_are_left_to_hydra() -> None:
    assert unknown_key_problems(["-m", "data=jsonl,hf", "data.train_path=tasks.jsonl"]) == []  # keys differ per job
    assert unknown_key_problems(["-m", "reward.wrong=0.0,-0.2"]) == []
    assert unknown_key_problems(["+trainer.extra=1"]) == []  # appended on purpose: the validator judges it


def test_an_unknown_group_option_is_named_with_the_nearest_and_every_allowed_one() -> None:
    assert override_problems(["weight_bridge=ncl"]) == [
        "weight_bridge=ncl: unknown option; nearest: nccl; allowed: checkpoint, ipc, lora, nccl, reload"]
    assert override_problems(["-m", "weight_bridge=reload,lora,nccll"])[0].startswith("weight_bridge=nccll: unknown option")
    assert override_problems(["experiment=null", "debug=tiny", "+sweeps=reward_weights"]) == []


def test_options_and_keys_are_all_reported_together_and_a_wrong_options_keys_are_not_judged() -> None:
    problems = override_problems(["weight_bridge=ncl", "weight_bridge.bucket_mb=64", "curriculum=kde_bucket",
                                  "trainer.lrr=1"])
    assert [p.split(":")[0] for p in problems] == ["weight_bridge=ncl", "curriculum=kde_bucket", "trainer.lrr"]


def test_the_command_reports_every_kind_of_mistake_in_one_block_with_exit_code_2() -> None:
    # An unknown option, an unknown key, a value of the wrong type and a budget that does not fit: one try, one block.
    done = subprocess.run([sys.executable, "-m", "grpo_pipe", "weight_bridge=ncl", "trainer.lrr=1", "reward.wrong=abc",
                           "run.max_new_tokens=999999"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("Invalid config:\n") and done.stderr.count("Invalid config:") == 1, done.stderr
    assert "nearest: nccl" in done.stderr and "nearest: trainer.optimisation.lr" in done.stderr
    assert "reward.wrong='abc': expected a number" in done.stderr
    assert "run.max_new_tokens=999999 leaves no room for a prompt" in done.stderr


def test_a_sweeps_values_are_left_to_each_job() -> None:
    from grpo_pipe.config.overrides import problems_beside
    from grpo_pipe.runner.components import build

    assert problems_beside(["-m", "weight_bridge=reload,lora", "reward.wrong=abc"], [], build) == []
    assert problems_beside(["reward.wrong=abc", "trainer.lrr=1"], ["trainer.lrr: unknown key"], build) == [
        "reward.wrong='abc': expected a number"]
