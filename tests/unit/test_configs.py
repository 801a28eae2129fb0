"""Every option of every config group composes, validates and instantiates (cheaply, nothing loads)."""

import functools
import inspect
import typing

import pytest
from hydra.utils import get_object, instantiate

from grpo_pipe import interfaces
from grpo_pipe.config.validate import validate_config
from grpo_pipe.runner.pipeline import PLAIN_KEYS, VALIDATED_GROUPS
from tests.conftest import CONF

OPTIONS = [
    (group, path.stem)
    for group in sorted(VALIDATED_GROUPS)
    if (CONF / group).is_dir()
    for path in sorted((CONF / group).glob("*.yaml"))
]


def test_every_group_has_options() -> None:
    groups = {g for g, _ in OPTIONS}
    assert {"model", "weight_bridge", "reward", "curriculum", "placement", "data", "logger"} <= groups


# Options with required (`???`) values: what a user must add on the command line.
REQUIRED = {
    ("model", "hf"): ["model.path=some/model"],
    ("data", "jsonl"): ["data.train_path=tasks.jsonl"],
    ("data", "hf"): ["data.name=some/dataset"],
    ("reward", "python"): ["reward.fn=my_rewards:score"],
    ("environment", "python"): ["environment.environment_class=tests/fixtures/environments/counter.py:Counter"],
    ("environment", "verifiers"): ["environment.name=vf_sums"],
}


# The Protocol each group's options must satisfy: what the recipe and trainer use them through.
GROUP_PROTOCOLS = {
    "model": interfaces.ModelSource, "data": interfaces.TaskSource, "reward": interfaces.Reward,
    "curriculum": interfaces.Curriculum, "trainer": interfaces.Trainer, "rollout": interfaces.RolloutEngine,
    "weight_bridge": interfaces.WeightBridge, "placement": interfaces.Placement, "logger": interfaces.Tracker,
    "checkpoint": interfaces.CheckpointStore, "policy": interfaces.Policy, "loss": interfaces.PolicyLoss,
    "rollout_scheduler": interfaces.RolloutSourceFactory,  # what it builds: tests/integration/rollout/test_scheduler.py
    "environment": interfaces.Environment,
}


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_instantiates_an_instance_of_its_groups_protocol(compose_cfg, group: str, option: str) -> None:
    cfg = compose_cfg([f"{group}={option}", *REQUIRED.get((group, option), [])])
    validate_config(cfg, VALIDATED_GROUPS, PLAIN_KEYS)
    component = instantiate(cfg[group], _convert_="all")
    # A `_partial_` option (the optimizer) is completed by the trainer: its factory names the class. A factory function
    # (environment=verifiers) says the class it builds in its return type.
    built = component.func.__name__ if isinstance(component, functools.partial) else type(component).__name__
    target = get_object(str(cfg[group]._target_))
    made = target.__name__ if inspect.isclass(target) else typing.get_type_hints(target).get("return", target).__name__
    assert built in str(cfg[group]._target_) or built == made
    if group in GROUP_PROTOCOLS:
        assert isinstance(component, GROUP_PROTOCOLS[group]), f"{group}={option} is no {GROUP_PROTOCOLS[group].__name__}"


def test_every_component_group_has_a_protocol_checked_here() -> None:
    partial_or_plain = {"run", "optimizer"}  # settings, torch's optimizer
    assert set(VALIDATED_GROUPS) - partial_or_plain == set(GROUP_PROTOCOLS)


# Options that merge into the whole config (`# @package _global_`): named sets of overrides, picked without `+`.
GLOBAL_OPTIONS = [(group, path.stem) for group in ("experiment", "debug") for path in sorted((CONF / group).glob("*.yaml"))]


@pytest.mark.parametrize(("group", "option"), GLOBAL_OPTIONS, ids=[f"{g}={o}" for g, o in GLOBAL_OPTIONS])
def test_global_option_composes_validates_and_changes_only_settings(compose_cfg, group: str, option: str) -> None:
    cfg = compose_cfg([f"{group}={option}"], tiny=False)
    validate_config(cfg, VALIDATED_GROUPS, PLAIN_KEYS)  # no stray top-level key: the file merges into the groups
    plain = compose_cfg([], tiny=False)
    assert set(cfg.keys()) == set(plain.keys())
    assert cfg != plain


TINY_SPLITS = {"reasoning_gym": {"train_size": 64, "eval_size": 16}, "arithmetic": {"train_size": 64, "eval_size": 16},
               "jsonl": {"max_train": 64, "max_eval": 16}}  # conf/debug/data/; gsm8k and hf keep their own sizes


@pytest.mark.parametrize("group", ["data", "model", "reward"])
def test_the_tiny_debug_option_composes_with_every_option_of_data_model_and_reward(compose_cfg, group: str) -> None:
    for option in [o for g, o in OPTIONS if g == group]:
        cfg = compose_cfg(["debug=tiny", f"{group}={option}", *REQUIRED.get((group, option), [])], tiny=False)
        validate_config(cfg, VALIDATED_GROUPS, PLAIN_KEYS)  # no key debug=tiny set is unknown to the chosen option
        assert cfg.trainer.steps == 2, option
        if group == "model":
            continue
        assert cfg.model._target_.endswith("TinyRandomModel"), option
        for key, value in TINY_SPLITS.get(option if group == "data" else "reasoning_gym", {}).items():
            assert cfg.data[key] == value, (option, key)
    plain = compose_cfg(["data=jsonl", "data.train_path=t.jsonl"], tiny=False)
    assert plain.data.max_train is None  # the small splits come with debug=tiny only


def test_the_bridge_list_is_the_config_group() -> None:
    from grpo_pipe.bridges.contract import configured_bridges

    assert configured_bridges() == [o for g, o in OPTIONS if g == "weight_bridge"]
    assert {"reload", "lora", "nccl", "checkpoint", "ipc"} <= set(configured_bridges())


def test_the_ipc_bridge_trains_in_the_engines_dtype_unless_told_otherwise(compose_cfg) -> None:
    # One shared copy of the weights: `weight_bridge=ipc` alone is a complete choice in a sweep.
    assert compose_cfg(["weight_bridge=ipc"]).trainer.precision.dtype == "bfloat16"
    assert compose_cfg(["weight_bridge=ipc", "trainer.precision.dtype=float32"]).trainer.precision.dtype == "float32"
    assert compose_cfg(["weight_bridge=reload"]).trainer.precision.dtype == compose_cfg([]).trainer.precision.dtype
