"""Shared fixtures: the real config composed from conf/ (and sweeps/), shrunk to the tiny model and a temp MLflow store.

Two tiers. The unit tier (`UNIT_MODULES`: logic, in-memory fakes of our own Protocols, seconds each) is the
quick loop, `pytest -m "not slow"`; every other module is the integration tier (real vLLM, MLflow, Ray),
marked `slow` here, and `pytest` runs both. A new module joins the unit tier by being listed below; a
listed module marks its own integration tests `@pytest.mark.slow`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from grpo_pipe.config.sources import CONF_DIR, SWEEPS_DIR

REPO = Path(__file__).resolve().parents[1]
# The shipped configs, where the package finds them (the repository root in a checkout); importing them also puts
# sweeps/ (`+sweeps=NAME`) and a ./conf/ of the working directory on Hydra's search path.
CONF, SWEEPS = CONF_DIR, SWEEPS_DIR
# GSM8K (MIT): the full train+test beside the repo when present, else the test split kept in tests/fixtures.
_SHARED_GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
GSM8K_DIR = _SHARED_GSM8K if (_SHARED_GSM8K / "train.jsonl").exists() else REPO / "tests" / "fixtures" / "gsm8k"

# Fast and deterministic: the tiny model everywhere, fp32 so engine and trainer agree exactly.
TINY = [
    "model=tiny_random",
    "rollout.dtype=float32",
    "rollout.kv_cache_gib=0.25",
    "rollout.max_model_len=512",
    "trainer.steps=2",
    "trainer.lr=1e-3",
    "curriculum.prompts_per_step=4",
    "curriculum.samples_per_prompt=4",
    "run.max_new_tokens=16",
    "run.eval_size=8",
    "run.eval_max_new_tokens=16",
    "data.train_size=64",
    "data.eval_size=16",
]


UNIT_MODULES = {
    "tests/test_recipe.py",
    "tests/test_docs.py",
    "tests/config/test_output_dirs.py",
    "tests/curriculum/test_kde_buckets.py",  # its one real job is marked slow in the module
    "tests/test_checkpointing.py",
    "tests/test_configs.py",
    "tests/rollout/test_scheduler_accounting.py",
    "tests/trainer/test_loss.py",
    "tests/rewards/test_answers.py",
    "tests/rewards/test_correctness.py",
    "tests/data/test_gsm8k.py",
    "tests/data/test_reasoning_gym.py",
    "tests/test_lint.py",
    "tests/tracking/test_run_tags.py",
    "tests/tracking/test_outbox.py",
    "tests/config/test_overrides.py",
    "tests/config/test_sources.py",
    "tests/test_packaging.py",
}


# Modules that start Ray clusters of their own: with `pytest -n 2 --dist loadgroup` they share one worker,
# so two local clusters never run side by side (a second `ray.init()` may join the first one's cluster).
RAY_MODULES = {"tests/placement/test_split.py", "tests/placement/test_multinode.py", "tests/trainer/test_sharded.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.relative_to(REPO).as_posix()
        if module not in UNIT_MODULES:
            item.add_marker(pytest.mark.slow)
        if module in RAY_MODULES:
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Models built by tests go to a per-session cache unless the caller set GRPO_PIPE_CACHE."""
    if "GRPO_PIPE_CACHE" not in os.environ:
        os.environ["GRPO_PIPE_CACHE"] = str(tmp_path_factory.mktemp("model-cache"))
    return Path(os.environ["GRPO_PIPE_CACHE"])


@pytest.fixture
def compose_cfg(tmp_path: Path) -> Callable[..., DictConfig]:
    """Compose the real config with the tiny-model overrides plus `overrides`; MLflow under tmp_path."""

    def _compose(overrides: Sequence[str] = (), tiny: bool = True) -> DictConfig:
        store = [f"logger.tracking_uri=sqlite:///{tmp_path}/mlflow.db", f"logger.artifact_location={tmp_path}/artifacts"]
        base = (list(TINY) if tiny else []) + store
        # Picking another option of a group drops the tiny settings tuned for the default option.
        chosen = {o.split("=", 1)[0] for o in overrides if "=" in o and "." not in o.split("=", 1)[0]}
        base = [o for o in base if o.split(".", 1)[0] not in chosen or o.startswith("model=")]
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("config", overrides=[*base, *overrides])

    return _compose
