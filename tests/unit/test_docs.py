"""The documentation: a README a newcomer reads to the end, and pages that build with no broken link."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
