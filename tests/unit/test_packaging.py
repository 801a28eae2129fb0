"""pyproject.toml names every package (mapped config folders rule out automatic discovery): a package left out
would be missing from the wheel while every test of the checkout still passed."""

import tomllib

from tests.conftest import REPO


def test_every_package_of_the_source_tree_is_listed_for_the_wheel() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "grpo_pipe").rglob("__init__.py")}
    mapped = setuptools["package-dir"]
    assert mapped == {"grpo_pipe.conf": "conf", "grpo_pipe.sweeps": "sweeps"}
    assert sorted(setuptools["packages"]) == sorted(found | set(mapped))
