"""`environment=verifiers`: train on a verifiers environment's rollouts, scored by its rubric.

A verifiers environment (verifiers 0.4, `verifiers.v1`) is run the way Atropos environments are: `verifiers_environment`
builds environment=atropos's source (`episodes.atropos`) with `VerifiersWorkers` as its processes. The run serves its
engine on 127.0.0.1 behind a token of its own, starts Atropos's API server and `processes` copies of
`verifiers_worker.py` under the verifiers environment's own Python (`python`: verifiers and vLLM pin `openai` and `mcp`
apart, so they cannot share one). Each worker loads the environment (`name`, `args`), runs `group_size` rollouts per
task through the endpoint with verifiers' train client (token ids in and out: `/inference/v1/generate`; it renders each
chat with `renderer`, a `renderers` config), and posts each group with its rubric's rewards. The trainer side is
Atropos's, unchanged: every trained span is checked against what the engine served, a malformed or foreign group is
refused and counted, a worker that dies is restarted (`max_restarts` in all).
Train on the rubric's rewards with `reward=environment`.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_pipe.environments.atropos import AtroposEnvironment
from grpo_pipe.types import SamplingSettings

WORKER = Path(__file__).with_name("verifiers_worker.py")
VENV_PYTHON = Path(__file__).resolve().parents[2] / ".venv-verifiers" / "bin" / "python"  # `.ci/setup.sh` makes it
VERSION = "0.4."  # the `verifiers.v1` API the worker is written against
RENDERER_PROBE = """
import json, sys
from pydantic import TypeAdapter, ValidationError
from renderers import RendererConfig
try:
    TypeAdapter(RendererConfig).validate_python(json.loads(sys.argv[1]))
except ValidationError as err:
    sys.exit("; ".join(".".join(map(str, e["loc"][1:])) + ": " + e["msg"] if e["loc"][1:] else e["msg"]
                       for e in err.errors()))
except Exception as err:
    sys.exit(f"{type(err).__name__}: {err}")
"""  # validates `renderer` as verifiers' TrainClientConfig will, in the environment's Python; says why not on stderr


def _renderer_config(renderer: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A `renderers` config as plain JSON data (a bare name is `{name: ...}`); None: verifiers' default, the model's
    own chat template."""
    if renderer is None:
        return None
    return json.loads(json.dumps({"name": renderer} if isinstance(renderer, str) else dict(renderer)))


def verifiers_environment(*, name: str, args: Mapping[str, Any] | None = None,
                          renderer: str | Mapping[str, Any] | None = None, python: str | None = None,
                          processes: int = 1, groups_per_step: int = 32, group_size: int = 8,
                          batch_timeout_s: float = 600.0, max_restarts: int = 3, model_name: str = "grpo_pipe",
                          report_every_s: float = 30.0) -> AtroposEnvironment:
    """`environment=verifiers`: environment=atropos's source of scored groups, its processes `VerifiersWorkers`
    (see the module docstring); everything else, held-out evaluation included, is environment=atropos's.

    Args:
        name: A taskset id: verifiers' own, or a module exporting one Taskset.
        args: The rest of verifiers' env config, e.g. `{agent: {harness: {id: ...}}}`; None: none.
        renderer: How verifiers' train client renders chats to tokens (a `renderers` config: `{name: qwen3}`, or a
            name); None: the default renderer (the model's chat template), which re-renders each turn.
        python: The verifiers environment's interpreter; None: `.venv-verifiers/bin/python`.
        processes: Workers, each with its own copy of the environment.
        groups_per_step: One step's batch: this many groups ...
        group_size: ... of this many rollouts of one task.
        batch_timeout_s: No batch this long: the run stops saying why.
        max_restarts: Workers that exit are restarted, this many times in all.
        model_name: The name the endpoint serves the engine under.
        report_every_s: While waiting for a batch, say so this often.
    """
    workers = VerifiersWorkers(name=name, args=args, renderer=renderer, python=python, processes=processes)
    return AtroposEnvironment(groups_per_step=groups_per_step, group_size=group_size, batch_timeout_s=batch_timeout_s,
                              max_restarts=max_restarts, model_name=model_name, report_every_s=report_every_s,
                              python=workers.python, commands=workers)


class VerifiersWorkers:
    """The worker processes of a verifiers environment: their commands and the rules of their settings.

    Args:
        name: A taskset id: verifiers' own, or a module exporting one Taskset.
        args: The rest of verifiers' env config, e.g. `{agent: {harness: {id: ...}}}`; None: none.
        renderer: How verifiers' train client renders chats to tokens (a `renderers` config: `{name: qwen3}`, or a
            name); None: the default renderer (the model's chat template).
        python: The verifiers environment's interpreter; None: `.venv-verifiers/bin/python`.
        processes: Workers, each with its own copy of the environment.
    """

    def __init__(self, *, name: str, args: Mapping[str, Any] | None = None,
                 renderer: str | Mapping[str, Any] | None = None, python: str | None = None, processes: int = 1) -> None:
        self.name = name
        self.args = json.loads(json.dumps(dict(args or {})))
        self.renderer = _renderer_config(renderer)  # verifiers' `TrainClientConfig.renderer`; checked in config_problems
        self.python = python or str(VENV_PYTHON)  # resolved here; checked in config_problems
        self.processes = processes
        chosen = [f"--vf.renderer={json.dumps(self.renderer)}"] if self.renderer is not None else []
        self._base = [[str(WORKER), f"--vf.name={name}", f"--vf.args={json.dumps(self.args)}", *chosen,
                       f"--vf.seed={index}"] for index in range(processes)]

    def config_problems(self) -> list[str]:
        problems = [] if self.processes >= 1 else [f"processes={self.processes}: need >= 1 worker"]
        interpreter = self._interpreter_problems()
        return problems + (interpreter or self._renderer_problems())

    def commands(self, sampling: SamplingSettings, max_model_len: int) -> list[list[str]]:
        """The workers sample at the run's temperature (or their groups are refused) and per-turn budget."""
        flags = [f"--vf.temperature={sampling.temperature}", f"--vf.max_tokens={sampling.max_tokens}",
                 f"--env.max_token_length={max_model_len}"]
        return [[*command, *flags] for command in self._base]

    def _interpreter_problems(self) -> list[str]:
        if not Path(self.python).is_file():
            return [f"python={self.python!r}: no such interpreter; the verifiers environment needs a Python of its own "
                    "with verifiers 0.4 installed (the pin: grpo_pipe's `verifiers` extra; .ci/setup.sh makes .venv-verifiers)"]
        probe = "import importlib.metadata as m; print(m.version('verifiers'))"
        try:
            done = subprocess.run([self.python, "-c", probe], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            return [f"python={self.python!r}: cannot be run ({type(err).__name__}: {err})"]
        version = done.stdout.strip()
        if done.returncode != 0:
            return [f"python={self.python!r}: has no verifiers installed (pip install verifiers==0.4.0 there)"]
        if not version.startswith(VERSION):
            return [f"python={self.python!r}: has verifiers {version}; needs {VERSION}x (the verifiers.v1 API)"]
        return []

    def _renderer_problems(self) -> list[str]:
        """The renderer config as verifiers will build it, in the environment's Python (only it has `renderers`): an
        unknown name is refused with the names there are, a custom renderer's import path must resolve."""
        if self.renderer is None:
            return []
        try:
            done = subprocess.run([self.python, "-c", RENDERER_PROBE, json.dumps(self.renderer)], capture_output=True,
                                  text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as err:
            return [f"renderer={self.renderer!r}: could not be checked ({type(err).__name__}: {err})"]
        if done.returncode != 0:
            said = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            return [f"renderer={self.renderer!r}: not a renderer verifiers can build: {said[0]} (a `renderers` config: "
                    "a name it ships, e.g. {name: qwen3}, or {name: custom, import_path: module.Class})"]
        return []
