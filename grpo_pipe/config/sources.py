"""Where the configs come from, for every composition (the command, the override check, benchmarks, tests):

- `conf/`: the shipped configs, Hydra's main config folder (`config.yaml` and one folder per group);
- `sweeps/`: the shipped sweeps, the config group `sweeps` (`python -m grpo_pipe +sweeps=compare_bridges`);
- `./conf/` in the working directory, when there is one: the user's own options, found after the shipped ones
  (`./conf/reward/mine.yaml` -> `reward=mine`); a name the project ships stays the project's.

Both shipped folders sit at the repository root, the one copy of the configs. A wheel holds them inside the package
(`grpo_pipe/conf/`, `grpo_pipe/sweeps/`: pyproject.toml maps the root folders there); a checkout or an editable
install reads them at the root. Importing this module registers the last two sources with Hydra.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

_PACKAGE = Path(__file__).resolve().parents[1]
# A file, not the folder: a checkout may keep an emptied grpo_pipe/conf/ (a __pycache__) from the old layout.
_ROOT = _PACKAGE if (_PACKAGE / "conf" / "config.yaml").is_file() else _PACKAGE.parent
CONF_DIR = _ROOT / "conf"
SWEEPS_DIR = _ROOT / "sweeps"


class WorkingDirConf(SearchPathPlugin):
    """`./conf/` of the working directory, appended after the shipped configs: it adds options, it cannot replace
    the primary config or a shipped option. Only compositions of CONF_DIR get it; a missing folder is skipped."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        main = [e.path for e in search_path.get_path() if e.provider == "main"]
        if not main or Path(main[0].removeprefix("file://")).resolve() != CONF_DIR.resolve():
            return
        own = Path.cwd() / "conf"
        if own.is_dir() and own.resolve() != CONF_DIR.resolve():  # the repository root is not a user's folder
            search_path.append("grpo_pipe-working-dir", f"file://{own.resolve()}")


def _register() -> None:
    Plugins.instance().register(WorkingDirConf)
    # The sweeps become options of the group `sweeps` through Hydra's config store: a search path entry could only
    # name the folder above sweeps/ (the repository root, or the whole package), and every folder there would then
    # read as a config group. Every sweep sets keys across the config (`# @package _global_`).
    store = ConfigStore.instance()
    for path in sorted(SWEEPS_DIR.glob("*.yaml")):
        store.store(group="sweeps", name=path.stem, node=OmegaConf.load(path), package="_global_",
                    provider="grpo_pipe-sweeps")


_register()
