"""The package's layout keeps its order: each package imports only packages of lower layers (so no circle), and the
top level holds packages plus at most five files. docs/architecture.md draws these layers."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "grpo_pipe"

# Lowest first. A package may import any package of a lower layer, none of its own layer or above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("types", "dtypes"),                                  # value types shared by every layer
    ("runtime", "config"),                                # the process (signals, env variables); config checking
    ("interfaces",),                                      # the Protocols
    ("data", "models", "curriculum", "tracking", "serving", "checkpoint", "transport"),
    ("rewards", "trainer", "environments"),
    ("rollout", "evaluation"),
    ("bridges", "placement"),
    ("runner",),                                          # the job: pipeline, recipe, components, bookkeeping
    ("benchmarks", "report", "__main__"),                 # commands
)
LAYER = {name: depth for depth, names in enumerate(LAYERS) for name in names}


def _unit(module: str) -> str:
    """`grpo_pipe.rollout.vllm_engine` -> `rollout`: the top-level package or module a module belongs to."""
    return module.split(".")[1]


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "grpo_pipe":
                found |= {f"grpo_pipe.{alias.name}" for alias in node.names}
            elif node.module.startswith("grpo_pipe."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("grpo_pipe.")}
    return {_unit(name) for name in found}


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.name == "__init__.py" and len(relative.parts) == 1:
            continue
        unit = relative.parts[0].removesuffix(".py")
        edges.setdefault(unit, set()).update(_imports(path) - {unit})
    return edges


def test_every_package_and_top_level_module_has_a_layer() -> None:
    assert set(_edges()) - set(LAYER) == set(), "add the new package to LAYERS (and to docs/architecture.md)"


def test_no_import_climbs_to_its_own_layer_or_above() -> None:
    climbing = [f"{a} (layer {LAYER[a]}) imports {b} (layer {LAYER[b]})"
                for a, targets in sorted(_edges().items()) for b in sorted(targets) if LAYER[b] >= LAYER[a]]
    assert climbing == []


def test_the_top_level_holds_packages_and_at_most_five_files() -> None:
    files = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(files) <= 5, files
