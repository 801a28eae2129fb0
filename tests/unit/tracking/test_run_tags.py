"""Tags a run carries and the objective a job returns: logic only (the unit tier)."""

from __future__ import annotations

import pytest

from grpo_pipe.rollout.sampling_params import PASSED_THROUGH
from grpo_pipe.runner.settings import RunSettings, objective_problem
from grpo_pipe.tracking.run_tags import run_tags
from grpo_pipe.tracking.sweep_runs import parse_overrides


def test_run_tags_name_commit_command_overrides_and_choices() -> None:
    tags = run_tags(["python", "-m", "grpo_pipe", "a=1,2"], {"weight_bridge": "lora", "hydra/sweeper": "basic",
                                                            "experiment": None}, ["a=1,2"])
    assert tags["grpo_pipe.choice.weight_bridge"] == "lora" and "grpo_pipe.choice.experiment" not in tags
    assert not [k for k in tags if "hydra" in k]
    assert tags["grpo_pipe.command"] == "python -m grpo_pipe a=1,2"
    assert parse_overrides(tags["grpo_pipe.overrides"]) == {"a": "1,2"}  # a value with a comma survives
    assert len(tags.get("grpo_pipe.git_commit", "x" * 40)) >= 40  # this checkout is a git repository
    from importlib import metadata

    assert tags["grpo_pipe.version"] == metadata.version("grpo_pipe")  # also where no git commit exists (a wheel)


def test_objective_names_are_checked_before_anything_loads() -> None:
    assert objective_problem("eval/accuracy") is None and objective_problem("summary/step_s") is None
    assert objective_problem("eval/reward/latency_ms") is None and objective_problem("eval/pass_at_4") is None
    problem = objective_problem("eval/acuracy")
    assert problem is not None and problem.startswith("objective='eval/acuracy': allowed:")
    assert RunSettings(objective="summary/nope").config_problems() == [objective_problem("summary/nope")]
    settings = RunSettings(objective="summary/step_s", objective_direction="minimize")
    assert settings.objective_value({"summary/step_s": 2.5}) == 2.5
    assert settings.objective_value({}) != settings.objective_value({})  # NaN: a failed trial to a sweeper


def test_an_unknown_objective_is_a_config_error_before_anything_loads(compose_cfg) -> None:
    from grpo_pipe.config.errors import ConfigError
    from grpo_pipe.runner.components import build

    with pytest.raises(ConfigError, match=r"run\.objective='eval/acuracy': allowed: eval/accuracy"):
        build(compose_cfg(["run.objective=eval/acuracy"]))
    with pytest.raises(ConfigError, match=r"run\.objective_direction"):
        build(compose_cfg(["run.objective_direction=up"]))


def test_sampling_settings_the_trainer_does_not_follow_are_refused_with_the_reason() -> None:
    problems = RunSettings(top_k=50, repetition_penalty=1.1).config_problems()
    (problem,) = [p for p in problems if p]
    assert problem.startswith("run.top_k=50, run.repetition_penalty=1.1: not supported")
    assert "every importance ratio would be off" in problem
    assert not [p for p in RunSettings().config_problems() if p]


def test_vllm_sampling_parameters_pass_through_only_where_the_distribution_stays_the_trainers(compose_cfg) -> None:
    from grpo_pipe.config.errors import ConfigError
    from grpo_pipe.runner.components import build

    ok = RunSettings(sampling_extra={"stop": ["\n\n"], "stop_token_ids": [2], "ignore_eos": False})
    assert not [p for p in ok.config_problems() if p]
    problems = [p for p in RunSettings(sampling_extra={"presence_penalty": 0.5, "n": 4, "stop_token_id": [2]})
                .config_problems() if p]
    assert len(problems) == 3
    penalty, n, typo = problems
    assert penalty.startswith("run.sampling_extra.presence_penalty: changes the distribution")
    assert n.startswith("run.sampling_extra.n: set by curriculum.samples_per_prompt")
    assert "did you mean stop_token_ids" in typo and typo.endswith("allowed: " + ", ".join(PASSED_THROUGH))
    with pytest.raises(ConfigError) as caught:  # before anything loads, each key named once, in full
        build(compose_cfg(["+run.sampling_extra.presence_penalty=0.5"]))
    assert caught.value.problems == [penalty]


def test_a_sweeps_children_are_named_by_what_differs() -> None:
    from grpo_pipe.tracking.run_tags import job_run_name, swept_keys

    argv = ["-m", "+sweeps=compare_bridges", "model=tiny_random", "trainer.steps=2"]
    swept = swept_keys(argv, {"weight_bridge": "reload,lora,nccl,checkpoint"})
    job = ["+sweeps=compare_bridges", "model=tiny_random", "trainer.steps=2", "weight_bridge=lora"]
    assert job_run_name(job, swept) == "weight_bridge=lora"
    swept = swept_keys(["-m", "reward.wrong=0.0,-0.2", "run.seed=range(0,3)", "model=tiny_random"], None)
    assert job_run_name(["reward.wrong=-0.2", "run.seed=1", "model=tiny_random"], swept) == "reward.wrong=-0.2,run.seed=1"
    assert job_run_name(["model=tiny_random", "trainer.steps=2"], []) == "model=tiny_random,trainer.steps=2"
    assert job_run_name([], []) == "default"


def test_a_sweep_parent_is_named_by_what_it_varies_and_its_folder() -> None:
    from grpo_pipe.tracking.run_tags import sweep_run_name, sweep_spec

    argv = ["-m", "weight_bridge=reload,lora", "trainer.steps=2", "reward.wrong=0.0,-0.2"]
    spec = sweep_spec(argv, {"trainer.optimisation.lr": "interval(1e-6, 1e-4)"})
    assert spec == "weight_bridge=reload,lora reward.wrong=0.0,-0.2 trainer.optimisation.lr=interval(1e-6, 1e-4)"
    assert sweep_run_name(spec, "/x/outputs/multiruns/2026-11-27_15-41-09") == (
        f"sweep {spec} (2026-11-27_15-41-09)")
    assert sweep_run_name("", "/x/2026-11-27") == "sweep 2026-11-27"
    assert len(sweep_run_name("k=" + "a," * 100, "/x/d")) < 140


def test_a_list_value_is_not_a_sweep_and_the_command_line_replaces_a_shipped_sweeps_list() -> None:
    from grpo_pipe.tracking.run_tags import job_run_name, sweep_spec, swept_keys

    # The Atropos sweep's command: one environment command (a list holding commas), three bridges.
    env = "environment.environments=[[env.py,serve,--env.data_dir,/d,--env.format_score,'0.2']]"
    argv = ["+sweeps=compare_bridges", "weight_bridge=ipc,lora,reload", env, "trainer.steps=10"]
    shipped = {"weight_bridge": "reload,lora,nccl,checkpoint"}
    assert swept_keys(argv, shipped) == ["weight_bridge"]
    assert sweep_spec(argv, shipped) == "weight_bridge=ipc,lora,reload"
    assert job_run_name(["+sweeps=compare_bridges", env, "weight_bridge=lora"], swept_keys(argv, shipped)) == (
        "weight_bridge=lora")
    assert swept_keys(["k=choice(1,2)", "j=range(0,3)", "x=[1,2]", "y='a,b'"], None) == ["k", "j"]
