"""`environment=verifiers`: train on a verifiers environment's rollouts, scored by its rubric.

A verifiers environment (verifiers 0.4, `verifiers.v1`) is run the way Atropos environments are (`episodes.atropos`,
which this class drives): the run serves its engine on 127.0.0.1 behind a token of its own, starts Atropos's API
server and `processes` copies of `verifiers_worker.py` under the verifiers environment's own Python (`python`: verifiers
and vLLM pin `openai` and `mcp` apart, so they cannot share one). Each worker loads the environment (`name`, `args`),
runs `group_size` rollouts per task through the endpoint with verifiers' train client (token ids in and out:
`/inference/v1/generate`; it renders each chat with `renderer`, a `renderers` config), and posts each group with its
rubric's rewards. The trainer side is Atropos's, unchanged: every trained span is checked against what the engine
served, a malformed or foreign group is refused and counted, a worker that dies is restarted (`max_restarts` in all).
Train on the rubric's rewards with `reward=environment`.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_pipe.episodes.atropos import AtroposEnvironment, AtroposSource
from grpo_pipe.interfaces import PendingRollout, RolloutEngine
from grpo_pipe.types import Completion, SamplingSettings, Task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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


class VerifiersEnvironment:
    """A verifiers environment as the run's source of scored groups (see the module docstring)."""

    def __init__(self, *, name: str, args: Mapping[str, Any] | None = None,
                 renderer: str | Mapping[str, Any] | None = None, python: str | None = None, processes: int = 1,
                 groups_per_step: int = 32, group_size: int = 8, batch_timeout_s: float = 600.0, max_restarts: int = 3,
                 model_name: str = "grpo_pipe", report_every_s: float = 30.0) -> None:
        self.name = name  # a taskset id: a module exporting one verifiers Taskset (verifiers' own, or importable)
        self.args = json.loads(json.dumps(dict(args or {})))  # the rest of verifiers' env config (harness, ...)
        self.renderer = _renderer_config(renderer)  # verifiers' `TrainClientConfig.renderer`; checked in config_problems
        self.python = python or str(VENV_PYTHON)  # resolved here; checked in config_problems
        self.processes = processes
        chosen = [f"--vf.renderer={json.dumps(self.renderer)}"] if self.renderer is not None else []
        self._base = [[str(WORKER), f"--vf.name={name}", f"--vf.args={json.dumps(self.args)}", *chosen,
                       f"--vf.seed={index}"] for index in range(processes)]
        self._atropos = AtroposEnvironment(environments=self._base, groups_per_step=groups_per_step,
                                           group_size=group_size, batch_timeout_s=batch_timeout_s,
                                           max_restarts=max_restarts, model_name=model_name,
                                           report_every_s=report_every_s, python=self.python)

    def config_problems(self) -> list[str]:
        problems = [] if self.processes >= 1 else [f"processes={self.processes}: need >= 1 worker"]
        problems += self._atropos.config_problems()
        interpreter = self._interpreter_problems()
        return problems + (interpreter or self._renderer_problems())

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

    # -- the episode runner's part: held-out evaluation as single turns, as environment=atropos ---------------

    def setup(self, tokenizer: PreTrainedTokenizerBase, system_prompt: str, max_model_len: int) -> None:
        self._atropos.setup(tokenizer, system_prompt, max_model_len)

    def completion_budget(self, max_new_tokens: int) -> int:
        return self._atropos.completion_budget(max_new_tokens)

    def render_prompt(self, task: Task) -> tuple[int, ...]:
        return self._atropos.render_prompt(task)

    def submit(self, engine: RolloutEngine, tasks: Sequence[Task], prompts: Sequence[Sequence[int]],
               samples: Sequence[int], sampling: SamplingSettings) -> PendingRollout:
        return self._atropos.submit(engine, tasks, prompts, samples, sampling)

    def generate(self, engine: RolloutEngine, tasks: Sequence[Task], prompts: Sequence[Sequence[int]],
                 samples: Sequence[int], sampling: SamplingSettings) -> list[list[Completion]]:
        return self._atropos.generate(engine, tasks, prompts, samples, sampling)

    # -- the source of training groups ------------------------------------------------------------------------

    def rollout_source(self, engine: RolloutEngine, sampling: SamplingSettings, *, max_staleness: int,
                       total_steps: int, log_dir: Path) -> AtroposSource:
        """The workers sample at the run's temperature (or their groups are refused) and per-turn budget."""
        flags = [f"--vf.temperature={sampling.temperature}", f"--vf.max_tokens={sampling.max_tokens}",
                 f"--env.max_token_length={engine.max_model_len}"]
        self._atropos.environments = [[*command, *flags] for command in self._base]
        return self._atropos.rollout_source(engine, sampling, max_staleness=max_staleness, total_steps=total_steps,
                                            log_dir=log_dir)

    def close(self) -> None:
        self._atropos.close()
