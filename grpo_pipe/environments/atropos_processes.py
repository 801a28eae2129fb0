"""The processes the run starts for Atropos, and what they leave behind: Atropos's API server (`run-api`) on
127.0.0.1, the environment processes (each `python SCRIPT serve ...` on atroposlib's BaseEnv) with the command line the
run gives them, and the evaluations those environments write, read back. The trainer's side of the API server, which
talks to it over HTTP, is `atropos_api`.

The API server and the environment processes die with the run however it ends: each is started under an undertaker
(`runtime.undertaker`), which kills it and its descendants once the run's process is gone, a SIGKILL included (they
are ordinary child processes: a run killed so left them running, the server for good), and which a normal stop
dismisses once it has stopped them itself.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from grpo_pipe.runtime.undertaker import Undertaker, watch

log = logging.getLogger(__name__)


class AtroposServer:
    """Atropos's API server (`run-api`) as a child process of the run, on 127.0.0.1.

    Args:
        log_path: The file its output goes to.
        port: The port it listens on; None: a free one.
        host: The address it listens on.
    """

    def __init__(self, log_path: Path, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port(host)
        self.log_path = log_path  # uvicorn logs every request: a file, never a pipe nobody reads
        self.process: subprocess.Popen[bytes] | None = None
        self._undertaker: Undertaker | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, ready_timeout_s: float = 60.0) -> None:
        command = [sys.executable, "-m", "atroposlib.cli.run_api", "--host", self.host, "--port", str(self.port)]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        self._undertaker = dies_with_the_run(self.process)
        deadline = time.monotonic() + ready_timeout_s
        while not _answers(self.url):
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the Atropos API server exited with {self.process.returncode}: {tail}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Atropos API server did not answer on {self.url} in {ready_timeout_s:.0f} s")
            time.sleep(0.1)

    def stop(self, grace_s: float = 5.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._undertaker is not None:  # only once the server is stopped: until then it is the undertaker's to stop
            self._undertaker.dismiss()
            self._undertaker = None


def dies_with_the_run(process: subprocess.Popen[bytes]) -> Undertaker | None:
    """An undertaker for `process` and its descendants (`runtime.undertaker`): killed once this process is gone, however
    it went. None when `process` has exited already (its exit is reported where it is waited for)."""
    try:
        return watch([psutil.Process(process.pid)])
    except psutil.NoSuchProcess:
        return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/", timeout=2.0).status_code == 200
    except httpx.TransportError:
        return False


def without_config(command: Sequence[str]) -> list[str]:
    """`command` without its `--config FILE` / `--config=FILE` (the run passes a file of its own instead)."""
    kept: list[str] = []
    skip = False
    for part in command:
        if skip:
            skip = False
        elif part == "--config":
            skip = True
        elif not part.startswith("--config="):
            kept.append(part)
    return kept


def own_config(command: Sequence[str]) -> dict[str, Any]:
    """The settings of the config file `command` names with `--config` (atroposlib's YAML), or {}."""
    for i, part in enumerate(command):
        path = part.removeprefix("--config=") if part.startswith("--config=") else None
        if part == "--config" and i + 1 < len(command):
            path = command[i + 1]
        if path is not None:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
            if not isinstance(loaded, dict):
                raise ValueError(f"{path}: an environment's --config file must hold a mapping")
            return dict(loaded)
    return {}


def sets(command: Sequence[str], flag: str) -> bool:
    """Whether `command` sets `flag` (`env.max_batches_offpolicy`): as `--flag value`, `--flag=value`, or in the
    config file it names."""
    if any(part == f"--{flag}" or part.startswith(f"--{flag}=") for part in command):
        return True
    section: Any = own_config(command)
    for key in flag.split("."):
        if not isinstance(section, dict) or key not in section:
            return False
        section = section[key]
    return True


class EnvironmentProcesses:
    """The environment processes the run starts (each `python SCRIPT serve ...` on atroposlib's BaseEnv), told where
    the endpoint, its token, the tokenizer and the API server are; one that dies is restarted up to `max_restarts`
    times in all (counted), then the run stops with its log's last lines. `python` runs them: the run's own
    interpreter, or another environment's (a verifiers environment cannot share the run's).

    Args:
        commands: Each process's own command (`[script.py, serve, --env.some_flag=value, ...]`).
        connection: Flags every process gets after its own: the endpoint, the tokenizer, the group size and the API.
        log_dir: The folder of each process's log, its config file and its evaluations, readable by the run's user
            alone.
        max_restarts: Processes that exit are restarted, this many times in all.
        env: Environment variables set for every process, on top of this process's own.
        python: The interpreter that runs them; None: the run's own.
        secrets: Settings kept off the command line, where `ps` shows them to every user, in atroposlib's `--config`
            file instead, e.g. {"openai.api_key": token}.
        defaults: Settings the run suggests, e.g. {"env.max_batches_offpolicy": "2"}: a process gets each one unless
            its command or its own config file sets it.
    """

    def __init__(self, *, commands: Sequence[Sequence[str]], connection: Sequence[str], log_dir: Path,
                 max_restarts: int = 3, env: Mapping[str, str] | None = None, python: str | None = None,
                 secrets: Mapping[str, str] | None = None, defaults: Mapping[str, str] | None = None) -> None:
        self.commands = [list(c) for c in commands]
        self.defaults = dict(defaults or {})
        self.python = python or sys.executable
        self.connection = list(connection)
        self.secrets = dict(secrets or {})  # `--config` is written for the owner alone
        self.log_dir = log_dir
        self.max_restarts = max_restarts
        self.env = dict(env or {})
        self.restarts = 0
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * len(self.commands)
        self._undertakers: list[Undertaker | None] = [None] * len(self.commands)  # one per process, started with it

    def start(self) -> None:
        # atroposlib prints its server settings at start, the endpoint's token among them, into the process's log:
        # the folder of the logs and config files is the run's user's alone.
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.chmod(0o700)
        for index in range(len(self.commands)):
            self._start(index)

    def check(self) -> None:
        """Restart those that died (counted); RuntimeError once the restarts are spent."""
        for index, process in enumerate(self.processes):
            if process is None or process.poll() is None:
                continue
            if self.restarts >= self.max_restarts:
                tail = self._log(index).read_text(errors="replace")[-1500:]
                raise RuntimeError(f"environment process {index} ({' '.join(self.commands[index][:2])}) exited with "
                                   f"{process.returncode} after {self.restarts} restarts; its log ends:\n{tail}")
            self.restarts += 1
            log.warning("environment process %d exited with %s; restarting it (%d of %d)", index, process.returncode,
                        self.restarts, self.max_restarts)
            self._start(index)

    def stop(self, grace_s: float = 5.0) -> None:
        for process in self.processes:
            if process is not None and process.poll() is None:
                process.terminate()
        for process in self.processes:
            if process is None:
                continue
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for index in range(len(self._undertakers)):
            self._dismiss(index)

    def command(self, index: int) -> list[str]:
        """Process `index`'s command line: its own, the run's connection flags, and where atroposlib's
        `evaluate_log` writes its evaluations (read back by `EnvironmentEvaluations`)."""
        own = self.commands[index]
        config = [f"--config={self._secrets_file(index, own)}"] if self.secrets else []
        suggested = [f"--{flag}={value}" for flag, value in self.defaults.items() if not sets(own, flag)]
        return [self.python, *without_config(own), *suggested, *self.connection, *config,
                f"--env.data_dir_to_save_evals={self.evaluations_dir(index)}"]

    def _secrets_file(self, index: int, own: Sequence[str]) -> Path:
        """The process's `--config` file: its own config file's settings (when its command names one) with the
        secrets added, readable by the run's user alone."""
        settings = own_config(own)
        for dotted, value in self.secrets.items():
            namespace, key = dotted.split(".", 1)
            section = settings.setdefault(namespace, {})
            if not isinstance(section, dict):
                raise ValueError(f"environment process {index}: its --config file's {namespace!r} is not a mapping")
            section[key] = value
        path = self.log_dir / f"environment-{index}.config.json"  # JSON is YAML: atroposlib reads it as its own
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump(settings, out)
        return path

    def evaluations_dir(self, index: int) -> Path:
        return self.log_dir / "evaluations" / str(index)

    def _start(self, index: int) -> None:
        command = self.command(index)
        self._dismiss(index)  # a restart: the process it watched has exited
        descriptor = os.open(self._log(index), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(descriptor, "ab") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env})
        self.processes[index] = process
        self._undertakers[index] = dies_with_the_run(process)

    def _dismiss(self, index: int) -> None:
        undertaker, self._undertakers[index] = self._undertakers[index], None
        if undertaker is not None:
            undertaker.dismiss()

    def _log(self, index: int) -> Path:
        return self.log_dir / f"environment-{index}.log"


class EnvironmentEvaluations:
    """What the environments' own evaluations wrote (atroposlib's `evaluate_log`: `metrics.json`, and `samples.jsonl`
    when given samples), read back once each time a file changes: numbers as `env_eval/<process>/<metric>`, the files
    to keep with the run. A file that does not parse is named in one warning and skipped: an environment's mistake
    never stops the run.

    Args:
        folders: Each environment process's evaluations folder (`EnvironmentProcesses.evaluations_dir`).
    """

    def __init__(self, folders: Sequence[Path]) -> None:
        self.folders = list(folders)
        self._seen: dict[Path, int] = {}  # file -> the modification time read last

    def take(self) -> tuple[dict[str, float], list[Path]]:
        metrics: dict[str, float] = {}
        files: list[Path] = []
        for index, folder in enumerate(self.folders):
            report = folder / "metrics.json"
            if not self._changed(report):
                continue
            try:
                results = json.loads(report.read_text())["results"]["all"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.warning("environment %d's evaluation %s does not parse (%s: %s); skipped", index, report,
                            type(err).__name__, err)
                continue
            metrics.update({f"env_eval/{index}/{name}": float(value) for name, value in results.items()
                            if isinstance(value, (int, float)) and not isinstance(value, bool)})
            files.append(report)
            samples = folder / "samples.jsonl"
            if samples.is_file():
                files.append(samples)
        return metrics, files

    def _changed(self, path: Path) -> bool:
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            return False
        if self._seen.get(path) == stamp:
            return False
        self._seen[path] = stamp
        return True
