"""An optional dependency that a setting needs is checked before anything loads, stand-ins included."""

from __future__ import annotations

import sys
import types

from grpo_pipe.config.dependencies import ray_problems


def test_the_installed_ray_passes() -> None:
    assert ray_problems("_target_: placement=split") == []


def test_a_ray_stand_in_without_ray_util_is_named_before_anything_loads(tmp_path, monkeypatch) -> None:
    stand_in = types.ModuleType("ray")
    stand_in.__path__ = [str(tmp_path)]  # a package with nothing in it, as an image's import stand-in
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", stand_in)
    problems = ray_problems("_target_: trainer=fsdp")
    assert len(problems) == 1 and problems[0].startswith("_target_: trainer=fsdp needs Ray")
    assert "pip install 'grpo_pipe[ray]'" in problems[0]


def test_no_ray_at_all_is_named(monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # None in sys.modules: `import ray` raises ImportError
    assert ray_problems("_target_: placement=split")[0].startswith("_target_: placement=split needs Ray")
