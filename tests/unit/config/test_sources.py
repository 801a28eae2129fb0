"""Where the configs come from: the shipped conf/ and sweeps/ at the repository root, and a ./conf/ of the working
directory that adds the user's own options to the shipped ones (in-process composition and the real command)."""

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate

from grpo_pipe.config.sources import CONF_DIR, SWEEPS_DIR
from tests.conftest import REPO

OWN_REWARD = "_target_: grpo_pipe.rewards.correctness.CorrectnessReward\nwrong: -0.7\n"


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=True)


def _own_option(folder: Path, group: str, name: str, text: str) -> None:
    (folder / "conf" / group).mkdir(parents=True, exist_ok=True)
    (folder / "conf" / group / f"{name}.yaml").write_text(text)


def test_the_configs_are_read_at_the_repository_root_in_a_checkout() -> None:
    assert CONF_DIR == REPO / "conf" and SWEEPS_DIR == REPO / "sweeps"
    assert not (REPO / "grpo_pipe" / "conf").exists() and not (REPO / "grpo_pipe" / "sweeps").exists()  # one copy


def test_an_option_in_the_working_directorys_conf_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _own_option(tmp_path, "reward", "harsh", OWN_REWARD)
    monkeypatch.chdir(tmp_path)
    cfg = _compose(["reward=harsh"])
    assert cfg.reward.wrong == -0.7 and instantiate(cfg.reward).wrong == -0.7
    assert cfg.model._target_.endswith("GgufOrHubModel")  # everything else is still the shipped config


def test_a_shipped_name_stays_the_shipped_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _own_option(tmp_path, "reward", "correctness", OWN_REWARD)
    (tmp_path / "conf" / "config.yaml").write_text("defaults:\n  - reward: harsh\n")  # nor the switchboard
    monkeypatch.chdir(tmp_path)
    assert _compose([]).reward.wrong == 0.0


def test_no_conf_in_the_working_directory_is_fine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Hydra warns about a search path folder that is missing; there is none
        cfg = _compose(["hydra.searchpath=[]"])
    assert cfg.reward._target_.endswith("CorrectnessReward")
    with pytest.raises(ConfigCompositionException, match="reward/harsh"):
        _compose(["reward=harsh"])


def test_sweeps_are_the_group_sweeps_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _compose(["+sweeps=compare_bridges"])
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN" and cfg.hydra.sweeper.params.weight_bridge
    assert cfg.trainer.steps == 6
    optuna = _compose(["+sweeps=optuna_reward_weights"])  # a sweep that builds on another sweep by name
    assert optuna.hydra.sweeper.n_trials == 8 and optuna.reward._target_.endswith("InferenceAwareReward")


def test_the_readmes_own_option_example_composes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block = re.search(r"```yaml\n# \./conf/(\w+)/(\w+)\.yaml\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert block, "README: the ./conf/<group>/<name>.yaml example"
    group, name, text = block.groups()
    _own_option(tmp_path, group, name, text)
    monkeypatch.chdir(tmp_path)
    instantiate(_compose([f"{group}={name}"])[group])


def test_the_command_finds_the_users_option_from_its_folder(tmp_path: Path) -> None:
    _own_option(tmp_path, "reward", "harsh", OWN_REWARD)
    command = [sys.executable, "-m", "grpo_pipe", "reward=harsh", "reward.wrong=-0.8", "--cfg", "job"]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "wrong: -0.8" in proc.stdout  # the option's own key is known to the pre-check of misspelt keys
