"""A real `mlflow server` (sqlite backend, artifacts served by the server) on 127.0.0.1, as a team runs one: started
and stopped by the tests of server mode and of a server that goes away mid-run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


class Server:
    """`mlflow server` on a fixed port and store, which the test can stop and start again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = self.folder / f"server-{self.starts}.log"
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.folder}/server.db",
                 "--serve-artifacts", "--artifacts-destination", str(self.folder / "artifacts"),
                 "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.folder, start_new_session=True,
                env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            )
        deadline = time.monotonic() + 300  # ~20-35 s on an idle 2-core machine, much more beside other work
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"mlflow server exited with {self.proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"mlflow server did not answer /health:\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        """The whole session (`mlflow server` starts uvicorn as a child); returns once nothing listens."""
        if self.proc is None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # a child that outlived its leader
        except ProcessLookupError:
            pass
        self.proc = None
