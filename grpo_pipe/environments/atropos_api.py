"""The trainer's side of Atropos's API server (`run-api` from `atroposlib`): register, then pull batches of scored
groups that environment processes posted. The server itself, when the run starts it, and the environment processes
are child processes of the run: `atropos_processes`.

Waiting is never silent and never endless: while no batch is ready the client says so every `report_every_s`, with
the server's queue; past `timeout_s` it raises `NoBatch`. A server that goes away is waited for (said so), and a server
that came back without its memory (it keeps everything in memory) is registered with again; the run's `stop` event
ends any wait at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger(__name__)


class NoBatch(TimeoutError):
    """No batch came within the timeout; the message says what the server and its environments were doing."""


@dataclass(frozen=True, kw_only=True)
class Registration:
    """What a trainer tells the API server (Atropos's `/register` body, in our words).

    Args:
        batch_size: Sequences per batch (groups x group size).
        max_token_len: The longest sequence the trainer takes, in tokens (the engine's context length).
        num_steps: The trainer steps of the run.
        starting_step: The step the trainer starts at.
        checkpoint_dir: Atropos's `checkpoint_dir`, as the server passes it on; empty: none named.
        save_checkpoint_interval: Atropos's `save_checkpoint_interval`, as the server passes it on; 0: none.
        group: The `wandb_group` named to the server.
        project: The `wandb_project` named to the server.
    """

    batch_size: int
    max_token_len: int
    num_steps: int
    starting_step: int = 0
    checkpoint_dir: str = ""
    save_checkpoint_interval: int = 0
    group: str = "grpo_pipe"
    project: str = "grpo_pipe"

    def body(self) -> dict[str, Any]:
        return {"wandb_group": self.group, "wandb_project": self.project, "batch_size": self.batch_size,
                "max_token_len": self.max_token_len, "checkpoint_dir": self.checkpoint_dir,
                "save_checkpoint_interval": self.save_checkpoint_interval, "starting_step": self.starting_step,
                "num_steps": self.num_steps}


class AtroposApi:
    """A trainer registered with one Atropos API server.

    Args:
        url: The API server's base URL.
        registration: What `register` tells the server (again when a server that lost its memory is found).
        poll_s: Seconds between asks for a batch.
        report_every_s: While waiting for a batch, a warning says so this often.
        stop: Set when the run is stopping: a wait for a batch ends at once; None: a fresh event nothing sets.
    """

    def __init__(self, *, url: str, registration: Registration, poll_s: float = 0.5, report_every_s: float = 30.0,
                 stop: threading.Event | None = None) -> None:
        self.url = url.rstrip("/")
        self.registration = registration
        self.poll_s, self.report_every_s = poll_s, report_every_s
        self.stop = stop or threading.Event()
        self.registrations = 0  # 1 + the times a server that lost its memory was registered with again
        self._http = httpx.Client(base_url=self.url, timeout=30.0)

    def register(self) -> None:
        self._http.post("/register", json=self.registration.body()).raise_for_status()
        self.registrations += 1
        log.info("registered as the trainer with the Atropos API at %s", self.url)

    def next_batch(self, timeout_s: float) -> list[dict[str, Any]]:
        """The next batch of scored groups (each one ScoredData dict); waits, saying so, up to `timeout_s`."""
        started = last_report = time.monotonic()
        while True:
            batch, why = self._try_batch()
            if batch is not None:
                return batch
            waited = time.monotonic() - started
            if waited >= timeout_s:
                raise NoBatch(f"no batch from the Atropos API at {self.url} in {timeout_s:.0f} s: {why}")
            if time.monotonic() - last_report >= self.report_every_s:
                log.warning("waiting for scored groups from the Atropos API at %s for %.0f s: %s", self.url, waited, why)
                last_report = time.monotonic()
            if self.stop.wait(self.poll_s):
                raise InterruptedError("the run is stopping")

    def poll_once(self) -> None:
        """Ask for a batch once, expecting none: Atropos accepts environments only after the trainer asked."""
        self._try_batch()

    def close(self) -> None:
        self._http.close()

    def _try_batch(self) -> tuple[list[dict[str, Any]] | None, str]:
        try:
            answer = self._http.get("/batch").json()
        except (httpx.TransportError, ValueError) as err:
            return None, f"the server does not answer ({type(err).__name__}); waiting for it to come back"
        if answer.get("status") == "error":  # a restarted server: it lost the registration
            log.warning("the Atropos API at %s no longer knows this trainer (restarted?): registering again", self.url)
            self._register_quietly()
            return None, "registered again after the server restarted"
        if answer.get("batch") is None:
            return None, self._queue_status()
        return list(answer["batch"]), ""

    def _register_quietly(self) -> None:
        try:
            self.register()
        except httpx.HTTPError as err:
            log.warning("registering with the Atropos API at %s failed: %s", self.url, err)

    def _queue_status(self) -> str:
        try:
            status: Mapping[str, Any] = self._http.get("/status").json()
        except (httpx.TransportError, ValueError):
            return "the server stopped answering"
        return (f"{status.get('queue_size', '?')} groups queued, fewer sequences than a batch of "
                f"{self.registration.batch_size}; are the environment processes running and posting?")
