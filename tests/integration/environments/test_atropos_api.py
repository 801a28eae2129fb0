"""The trainer against Atropos's real API server (`run-api` from atroposlib, on 127.0.0.1): it registers, an
environment registers and posts scored groups as atroposlib's BaseEnv does, and the batch it pulls reads as our
groups, checked against what the engine served; waiting says so and ends at its timeout; a restarted server (which
forgets everything) is registered with again and the run goes on."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from grpo_pipe.environments.atropos_api import AtroposApi, NoBatch, Registration
from grpo_pipe.environments.atropos_processes import AtroposServer, EnvironmentProcesses
from grpo_pipe.environments.scored_groups import Limits, read_scored_group
from grpo_pipe.serving.served_log import ServedLog
from grpo_pipe.types import Completion, RequestTelemetry

M = -100


def _register_env(url: str, group_size: int = 2, deadline_s: float = 60.0) -> int:
    """As BaseEnv does: the server takes environments only once a trainer asked for a batch."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        answer = httpx.post(f"{url}/register-env", json={"max_token_length": 64, "desired_name": "tiny", "weight": 1.0,
                                                          "group_size": group_size}).json()
        if answer.get("status") == "success":
            return int(answer["env_id"])
        time.sleep(0.1)
    raise AssertionError("the environment could not register")


def _group(env_id: int, first: int) -> dict[str, Any]:
    return {"tokens": [[1, 2, 3, first, first + 1], [1, 2, 3, first + 2]], "masks": [[M, M, M, first, first + 1],
            [M, M, M, first + 2]], "scores": [1.0, 0.0], "env_id": env_id}


def _served(firsts: list[int]) -> ServedLog:
    log = ServedLog()
    for first in firsts:
        for ids in ((first, first + 1), (first + 2,)):
            log.record((1, 2, 3), Completion(token_ids=ids, logprobs=(-0.25,) * len(ids), text="", finish_reason="stop",
                                             policy_version=1,
                                             telemetry=RequestTelemetry(prompt_tokens=3, generated_tokens=len(ids),
                                                                        cached_prompt_tokens=0)))
    return log


@pytest.fixture
def server(tmp_path: Path):
    server = AtroposServer(tmp_path / "atropos-api.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_trainer_pulls_the_groups_an_environment_posted(server: AtroposServer) -> None:
    api = AtroposApi(url=server.url, registration=Registration(batch_size=4, max_token_len=64, num_steps=10), poll_s=0.05)
    api.register()
    with pytest.raises(NoBatch, match="0 groups queued"):  # asking once lets environments in; nothing posted yet
        api.next_batch(timeout_s=0.2)
    env_id = _register_env(server.url)
    for first in (10, 20):
        assert httpx.post(f"{server.url}/scored_data", json=_group(env_id, first)).status_code == 200
    batch = api.next_batch(timeout_s=30)
    groups = [read_scored_group(data, Limits(100, 64), _served([10, 20]), f"atropos/{i}") for i, data in enumerate(batch)]
    assert sorted(g.group.completions[0].token_ids for g in groups) == [(10, 11), (20, 21)]
    assert all(g.scores == (1.0, 0.0) and g.group.completions[0].logprobs == (-0.25, -0.25) for g in groups)


def test_waiting_is_said_and_ends_at_the_timeout(server: AtroposServer, caplog: pytest.LogCaptureFixture) -> None:
    api = AtroposApi(url=server.url, registration=Registration(batch_size=4, max_token_len=64, num_steps=10), poll_s=0.05,
                     report_every_s=0.2)
    api.register()
    with caplog.at_level(logging.WARNING), pytest.raises(NoBatch, match="are the environment processes running"):
        api.next_batch(timeout_s=1.0)
    assert any("waiting for scored groups" in r.getMessage() for r in caplog.records)
    stop = threading.Event()
    stop.set()
    api.stop = stop
    with pytest.raises(InterruptedError):  # a stopping run does not wait
        api.next_batch(timeout_s=60)


def test_a_restarted_server_is_registered_with_again_and_the_run_goes_on(server: AtroposServer) -> None:
    api = AtroposApi(url=server.url, registration=Registration(batch_size=2, max_token_len=64, num_steps=10), poll_s=0.05)
    api.register()
    server.stop()
    pulled: list[Any] = []
    waiter = threading.Thread(target=lambda: pulled.append(api.next_batch(timeout_s=120)))
    waiter.start()
    server.start()  # the same port, an empty memory
    env_id = _register_env(server.url)  # succeeds only once the trainer registered again and asked for a batch
    httpx.post(f"{server.url}/scored_data", json=_group(env_id, 30)).raise_for_status()
    waiter.join(120)
    assert api.registrations == 2 and pulled and pulled[0][0]["tokens"][0][3] == 30


def test_an_environment_process_that_exits_is_restarted_then_the_run_stops_with_its_log(tmp_path: Path) -> None:
    script = tmp_path / "dies.py"
    script.write_text("import sys\nprint('environment failing: no tokenizer', flush=True)\nsys.exit(3)\n")
    processes = EnvironmentProcesses(commands=[[str(script), "serve"]], connection=["--env.x", "1"],
                                     log_dir=tmp_path / "logs", max_restarts=2)
    processes.start()
    try:
        for restarts in (1, 2):
            processes.processes[0].wait(60)  # type: ignore[union-attr]
            processes.check()
            assert processes.restarts == restarts
        processes.processes[0].wait(60)  # type: ignore[union-attr]
        with pytest.raises(RuntimeError, match="exited with 3 after 2 restarts; its log ends:\n.*no tokenizer"):
            processes.check()
    finally:
        processes.stop()
    assert (tmp_path / "logs" / "environment-0.log").read_text().count("environment failing") == 3
