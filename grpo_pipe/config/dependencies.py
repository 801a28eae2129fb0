"""Optional dependencies that a setting needs, checked before anything loads."""

from __future__ import annotations

import importlib.util


def ray_problems(who: str) -> list[str]:
    """`who` (a `key=value`) needs Ray whole. A module named `ray` without `ray.util` (an import stand-in that some
    inference images carry for vLLM's sake) would otherwise fail only at the first actor, after the models loaded."""
    try:
        usable = importlib.util.find_spec("ray.util.placement_group") is not None
    except ImportError:  # no `ray` at all, or a `ray` that is not a package
        usable = False
    if usable:
        return []
    return [f"{who} needs Ray, and the installed `ray` cannot start actors (missing, or a stand-in without "
            "ray.util): pip install 'grpo_pipe[ray]'"]
