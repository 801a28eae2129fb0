"""Every option of every config group composes, validates and instantiates (cheaply, nothing loads)."""

import functools

import pytest
from hydra.utils import instantiate

from grpo_pipe import interfaces
from grpo_pipe.config.validate import validate_config
from grpo_pipe.pipeline import PLAIN_KEYS, VALIDATED_GROUPS
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
}


# The Protocol each group's options must satisfy: what the recipe and trainer use them through.
GROUP_PROTOCOLS = {
    "model": interfaces.ModelSource, "data": interfaces.TaskSource, "reward": interfaces.Reward,
    "curriculum": interfaces.Curriculum, "trainer": interfaces.Trainer, "rollout": interfaces.RolloutEngine,
    "weight_bridge": interfaces.WeightBridge, "placement": interfaces.Placement, "logger": interfaces.Tracker,
    "checkpoint": interfaces.CheckpointStore, "policy": interfaces.Policy, "loss": interfaces.PolicyLoss,
    "rollout_scheduler": interfaces.RolloutSourceFactory,  # what it builds: tests/rollout/test_scheduler.py
}


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_instantiates_an_instance_of_its_groups_protocol(compose_cfg, group: str, option: str) -> None:
    cfg = compose_cfg([f"{group}={option}", *REQUIRED.get((group, option), [])])
    validate_config(cfg, VALIDATED_GROUPS, PLAIN_KEYS)
    component = instantiate(cfg[group], _convert_="all")
    # A `_partial_` option (the rollout scheduler) is completed by the recipe: its factory names the class.
    built = component.func.__name__ if isinstance(component, functools.partial) else type(component).__name__
    assert built in str(cfg[group]._target_)
    if group in GROUP_PROTOCOLS:
        assert isinstance(component, GROUP_PROTOCOLS[group]), f"{group}={option} is no {GROUP_PROTOCOLS[group].__name__}"


def test_every_component_group_has_a_protocol_checked_here() -> None:
    partial_or_plain = {"run", "optimizer"}  # settings, torch's optimizer
    assert set(VALIDATED_GROUPS) - partial_or_plain == set(GROUP_PROTOCOLS)


EXPERIMENTS = sorted(path.stem for path in (CONF / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_composes_validates_and_changes_only_settings(compose_cfg, experiment: str) -> None:
    cfg = compose_cfg([f"experiment={experiment}"], tiny=False)
    validate_config(cfg, VALIDATED_GROUPS, PLAIN_KEYS)  # no stray top-level key: the file merges into the groups
    plain = compose_cfg([], tiny=False)
    assert set(cfg.keys()) == set(plain.keys())
    assert cfg != plain


def test_the_bridge_list_is_the_config_group() -> None:
    from grpo_pipe.bridges.contract import configured_bridges

    assert configured_bridges() == [o for g, o in OPTIONS if g == "weight_bridge"]
    assert {"reload", "lora", "nccl", "checkpoint", "ipc"} <= set(configured_bridges())
