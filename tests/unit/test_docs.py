"""The documentation: a README a newcomer reads to the end, and pages that build with no broken link."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import REPO

README_MAX_LINES = 250


def test_the_readme_stays_short_and_points_at_every_page() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name != "index.md")
    missing = [page for page in pages if f"](docs/{page})" not in readme]
    assert not missing, f"README links no page for {missing}"


def test_the_pages_build_with_mkdocs_strict(tmp_path: Path) -> None:
    """--strict: a link to a page or image that does not exist fails the build; every page is in the nav."""
    nav = (REPO / "mkdocs.yml").read_text()
    assert all(f": {page.name}" in nav for page in (REPO / "docs").glob("*.md"))
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "loss" / "index.html").is_file()
    # The API reference is rendered from the docstrings: a Protocol's method arguments appear with their Args: lines.
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "WeightBridge" in api and "sync_every" in api
    assert "engine_options" in api and "The live engine the bridge pushes into" in api


def _undocumented(obj: object, label: str, params: list[str]) -> list[str]:
    """`label`'s parameters that its docstring's Args: section does not name (all of them without the section)."""
    if not params:
        return []
    doc = inspect.getdoc(obj) or ""
    if "Args:" not in doc:
        return [f"{label}: no Args: section ({', '.join(params)})"]
    section = doc.split("Args:", 1)[1]
    missing = [p for p in params if not re.search(rf"^\s+{re.escape(p)}(?![\w])[^\n]*:", section, re.MULTILINE)]
    return [f"{label}: Args: lacks {missing}"] if missing else []


def _parameters(function: Any) -> list[str]:
    """The parameters as written in the source, which is what mkdocstrings renders (not a `__signature__` set later)."""
    code = function.__code__
    count = code.co_argcount + code.co_kwonlyargcount
    names = list(code.co_varnames[:count])
    if code.co_flags & inspect.CO_VARARGS:
        names.append("*" + code.co_varnames[count])
        count += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        names.append("**" + code.co_varnames[count])
    return [name for name in names if name not in ("self", "cls")]


def test_every_component_on_the_api_page_documents_each_argument() -> None:
    """The reference page is where a user looks first: each class's constructor and each Protocol method there says
    what every argument is, in an Args: section mkdocstrings renders."""
    names = re.findall(r"^::: (\S+)", (REPO / "docs" / "api.md").read_text(), re.MULTILINE)
    problems: list[str] = []
    for name in names:
        module, _, attribute = name.rpartition(".")
        obj = getattr(importlib.import_module(module), attribute)
        if inspect.isfunction(obj):
            problems += _undocumented(obj, name, _parameters(obj))
        elif getattr(obj, "_is_protocol", False):
            problems += [problem for method_name, method in vars(obj).items()
                         if not method_name.startswith("_") and inspect.isfunction(method)
                         for problem in _undocumented(method, f"{name}.{method_name}", _parameters(method))]
        elif inspect.isclass(obj) and obj.__init__ is not object.__init__:
            problems += _undocumented(obj, name, _parameters(obj.__init__))
    assert len(names) > 60 and not problems, "\n".join(problems)


def test_every_protocol_method_in_the_package_documents_each_argument() -> None:
    """A Protocol is where a user writing their own component reads what each argument is."""
    import grpo_pipe

    problems: list[str] = []
    for info in pkgutil.walk_packages(grpo_pipe.__path__, "grpo_pipe."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == module.__name__ and getattr(obj, "_is_protocol", False):
                problems += [problem for method_name, method in vars(obj).items()
                             if not method_name.startswith("_") and inspect.isfunction(method)
                             for problem in _undocumented(method, f"{info.name}.{name}.{method_name}",
                                                          _parameters(method))]
    assert not problems, "\n".join(problems)


def _args_names(doc: str) -> list[str]:
    """The names the Args: section lists: its entries at the section's first indent (continuations deeper)."""
    names: list[str] = []
    indent = 0
    for line in doc.split("Args:", 1)[1].splitlines()[1:]:
        depth = len(line) - len(line.lstrip())
        if not line.strip():
            continue
        if depth == 0:  # the next section, or prose after the entries
            break
        indent = indent or depth
        if depth == indent:
            names.append(re.split(r"[\s(:]", line.strip(), maxsplit=1)[0])
    return names


def _constructor_arguments(cls: type) -> list[str]:
    """What constructing `cls` takes: a pydantic model's fields, else its (or its dataclass's) `__init__` parameters;
    none for an `__init__` written in C (an exception that keeps its base's)."""
    fields = getattr(cls, "model_fields", None)
    if isinstance(fields, dict):
        return list(fields)
    return _parameters(cls.__init__) if inspect.isfunction(cls.__init__) else []


def _documented_by_bases(cls: type) -> set[str]:
    """The names the Args: sections of `cls`'s bases in the package list (mkdocstrings shows a class's bases, so a
    subclass that adds fields documents only its own and says where the rest are)."""
    docs = [inspect.cleandoc(vars(base).get("__doc__") or "") for base in cls.__mro__[1:]
            if base.__module__.startswith("grpo_pipe.")]
    return {name for doc in docs if "Args:" in doc for name in _args_names(doc)}


def test_every_public_class_in_the_package_documents_each_constructor_argument() -> None:
    """A class's own docstring names what its constructor takes, each once, in an Args: section; an argument its base
    in the package documents (a field it inherits) may be left to the base's. Every argument is named somewhere, and
    nothing the constructor does not take: a renamed, added or removed argument fails here, not in a reader's head."""
    import grpo_pipe

    problems: list[str] = []
    checked = 0
    for info in pkgutil.walk_packages(grpo_pipe.__path__, "grpo_pipe."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (name.startswith("_") or not inspect.isclass(obj) or obj.__module__ != module.__name__
                    or getattr(obj, "_is_protocol", False)):
                continue
            arguments = _constructor_arguments(obj)
            if not arguments:
                continue
            checked += 1
            doc = inspect.cleandoc(vars(obj).get("__doc__") or "")
            if "Args:" not in doc:
                problems.append(f"{info.name}.{name}: no Args: section ({', '.join(arguments)})")
                continue
            named = _args_names(doc)
            undocumented = set(arguments) - set(named) - _documented_by_bases(obj)
            if len(set(named)) != len(named) or not set(named) <= set(arguments) or undocumented:
                problems.append(f"{info.name}.{name}: Args: names {named}, the constructor takes {arguments}"
                                + (f", {sorted(undocumented)} documented nowhere" if undocumented else ""))
    assert checked > 100 and not problems, "\n".join(problems)
