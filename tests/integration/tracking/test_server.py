"""Server mode, as a team would run it: a real `mlflow server` (sqlite backend, artifacts served by the
server), a two-job sweep logging to it over HTTP, the parent's comparison read back through it, and the
MLflow UI looked at in headless Chromium (screenshots and the rendered DOM of the experiment page and of
the comparison page)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from grpo_pipe.tracking.sweep_runs import find_parent
from tests.conftest import REPO, TINY
from tests.mlflow_server import Server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BRIDGES = ("reload", "lora")
WINDOW = (1920, 1080)
SCREENSHOTS = Path(os.environ.get("GRPO_PIPE_SCREENSHOTS", "")) if os.environ.get("GRPO_PIPE_SCREENSHOTS") else None


@dataclass(frozen=True)
class Sweep:
    uri: str
    sweep_dir: Path
    workdir: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    found = Server(tmp_path_factory.mktemp("mlflow-server"))
    found.start()
    try:
        yield found.uri
    finally:
        found.stop()


@pytest.fixture(scope="module")
def sweep(server: str, tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    """Two jobs (one per bridge) logging to the server; nothing is written to a local store."""
    workdir = tmp_path_factory.mktemp("sweep")
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_pipe", "-m", f"weight_bridge={','.join(BRIDGES)}", *TINY,
         "trainer.steps=1", "run.eval_size=2", f"logger.tracking_uri={server}", "logger.system_metrics_interval_s=1",
         f"hydra.sweep.dir={workdir}/sweep"],
        cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "?workflowType=machine_learning" in proc.stdout + proc.stderr  # the link the run prints
    return Sweep(server, workdir / "sweep", workdir)


def test_the_sweep_and_its_comparison_are_read_back_through_the_server(sweep: Sweep) -> None:
    client = MlflowClient(tracking_uri=sweep.uri)
    parent_id = find_parent(client, str(sweep.sweep_dir))
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.info.artifact_uri.startswith("mlflow-artifacts:")
    experiment = client.get_experiment(parent.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert parent.data.params == {"weight_bridge": ",".join(BRIDGES)}
    children = client.search_runs([experiment.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")
    assert sorted(c.data.tags["grpo_pipe.choice.weight_bridge"] for c in children) == sorted(BRIDGES)
    for child in children:
        assert "grpo_pipe.git_commit" in child.data.tags and "grpo_pipe" in child.data.tags["grpo_pipe.command"]
        assert "system/cpu_utilization_percentage" in child.data.metrics  # MLflow's system metrics, on by default

    download = sweep.workdir / "download"
    download.mkdir()
    table = json.loads(Path(client.download_artifacts(parent_id, "comparison/comparison.json", str(download))).read_text())
    rows = {row[0]: dict(zip(table["columns"], row)) for row in table["data"]}
    assert set(rows) == {f"weight_bridge={b}" for b in BRIDGES}
    assert all(row["sync_total_s"] > 0 and row["status"] == "FINISHED" for row in rows.values())
    page = Path(client.download_artifacts(parent_id, "comparison/comparison.html", str(download))).read_text()
    assert all(f"weight_bridge={b}" in page for b in BRIDGES) and page.count("data:image/png;base64,") >= 3
    best = parent.data.tags["grpo_pipe.best_run_id"]
    assert parent.data.metrics["best/eval/accuracy"] == client.get_run(best).data.metrics["eval/accuracy"]


def _look(url: str, name: str, folder: Path) -> str:
    """One headless Chromium visit: a screenshot into folder/name.png (checked to be a real, full-size PNG)
    and the DOM after the page's scripts ran (returned)."""
    assert CHROMIUM is not None
    png = folder / f"{name}.png"
    visit = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={folder / ('profile-' + name)}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
         "--virtual-time-budget=20000", "--hide-scrollbars", f"--screenshot={png}", "--dump-dom", url],
        capture_output=True, text=True, timeout=180,
    )
    assert visit.returncode == 0 and png.is_file(), visit.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == WINDOW and len(data) > 20_000  # a rendered page, not a blank one
    if SCREENSHOTS is not None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(png, SCREENSHOTS / png.name)
    return visit.stdout


def _text(dom: str) -> str:
    """The DOM's text with the tags taken out (the UI splits "3 matching runs" over two elements)."""
    return re.sub(r"<[^>]+>", "", dom)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH; bash .ci/setup.sh installs Debian's package")
def test_the_mlflow_ui_shows_the_runs_and_the_comparison_page(sweep: Sweep) -> None:
    client = MlflowClient(tracking_uri=sweep.uri)
    parent_id = find_parent(client, str(sweep.sweep_dir))
    experiment_id = client.get_run(parent_id).info.experiment_id
    folder = sweep.workdir / "browser"
    folder.mkdir()
    view = "?workflowType=machine_learning"  # the training view (the 3.17 UI does not follow the experiment's tag)

    runs_dom = _look(f"{sweep.uri}/#/experiments/{experiment_id}/runs{view}", "experiment_runs", folder)
    # The parent, named by what the sweep varied (its two children folded under it).
    assert f"sweep weight_bridge={','.join(BRIDGES)} ({sweep.sweep_dir.name})" in _text(runs_dom)
    assert "3 matching runs" in _text(runs_dom)
    # Sorted by name, the table lists the children flat (MLflow nests them only in its default, by-date order):
    # each child's row is named by the bridge it ran.
    flat = f"{view}&orderByKey=attributes.run_name&orderByAsc=true"
    flat_text = _text(_look(f"{sweep.uri}/#/experiments/{experiment_id}/runs{flat}", "experiment_runs_by_name", folder))
    assert all(f"weight_bridge={b}" in flat_text for b in BRIDGES), flat_text[-2000:]

    # The parent's page: its description holds the sweep's answer and its margin.
    parent_text = _text(_look(f"{sweep.uri}/#/experiments/{experiment_id}/runs/{parent_id}{view}", "parent", folder))
    assert "margin unknown" in parent_text or "Tie on eval/accuracy" in parent_text, parent_text[-2000:]

    artifact = "comparison/comparison.html"
    ui_dom = _look(f"{sweep.uri}/#/experiments/{experiment_id}/runs/{parent_id}/artifacts/{artifact}{view}",
                   "comparison", folder)
    assert "comparison.html" in ui_dom and "mlflow-html-iframe" in ui_dom  # the UI's HTML viewer holds the page
    # The viewer's iframe is a blob the DOM dump leaves out: the same page, fetched through the server, rendered.
    page = Path(client.download_artifacts(parent_id, artifact, str(folder)))
    page_dom = _look(page.as_uri(), "comparison_page", folder)
    assert "Sweep comparison: 2 runs" in page_dom and all(f"weight_bridge={b}" in page_dom for b in BRIDGES)
    assert page_dom.count("<tr") == 3  # the header and a row per child
