"""House rules a reader relies on, kept by a test rather than by memory."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "grpo_pipe"
MOST_POSITIONAL_FIELDS = 3


def _is_dataclass_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return (isinstance(target, ast.Name) and target.id == "dataclass") or (
        isinstance(target, ast.Attribute) and target.attr == "dataclass")


def _keyword_only(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and any(
        k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value is True for k in node.keywords)


def _init_fields(cls: ast.ClassDef) -> list[str]:
    """The fields `__init__` takes: annotated names, less class variables and `field(init=False)`."""
    return [statement.target.id for statement in cls.body
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
            and "ClassVar" not in ast.unparse(statement.annotation)
            and not (statement.value is not None and "init=False" in ast.unparse(statement.value))]


def positional_dataclasses(package: Path) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            for decorator in cls.decorator_list:
                fields = _init_fields(cls)
                if _is_dataclass_decorator(decorator) and not _keyword_only(decorator) \
                        and len(fields) > MOST_POSITIONAL_FIELDS:
                    found.append(f"{path.relative_to(package.parent)}:{cls.lineno} {cls.name} ({len(fields)} fields)")
    return found


def test_dataclasses_of_more_than_three_fields_are_keyword_only() -> None:
    """`Completion(ids, lps, "", "stop", 0, t)` says nothing to a reader and breaks silently when a field is added;
    `Completion(token_ids=ids, ...)` does neither."""
    assert positional_dataclasses(PACKAGE) == []


def test_the_check_finds_a_positional_dataclass(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(
        "from dataclasses import dataclass\n\n@dataclass(frozen=True)\nclass Wide:\n    a: int\n    b: int\n    c: int\n"
        "    d: int\n\n@dataclass(kw_only=True)\nclass Named:\n    a: int\n    b: int\n    c: int\n    d: int\n")
    assert positional_dataclasses(tmp_path / "pkg") == ["pkg/a.py:4 Wide (4 fields)"]
