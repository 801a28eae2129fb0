"""`environment=verifiers`: train on a verifiers environment's rollouts, scored by its rubric.

A verifiers environment (verifiers 0.4, `verifiers.v1`) is run the way Atropos environments are (`episodes.atropos`,
which this class drives): the run serves its engine on 127.0.0.1 behind a token of its own, starts Atropos's API
server and `processes` copies of `verifiers_worker.py` under the verifiers environment's own Python (`python`: verifiers
and vLLM pin `openai` and `mcp` apart, so they cannot share one). Each worker loads the environment (`name`, `args`),
runs `group_size` rollouts per task through the endpoint with verifiers' train client (token ids in and out:
`/inference/v1/generate`), and posts each group with its rubric's rewards. The trainer side is Atropos's, unchanged:
every trained span is checked against what the engine served, a malformed or foreign group is refused and counted,
a worker that dies is restarted (`max_restarts` in all). Train on the rubric's rewards with `reward=environment`.
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


class VerifiersEnvironment:
    """A verifiers environment as the run's source of scored groups (see the module docstring)."""

    def __init__(self, *, name: str, args: Mapping[str, Any] | None = None, python: str | None = None,
                 processes: int = 1, groups_per_step: int = 32, group_size: int = 8, batch_timeout_s: float = 600.0,
                 max_restarts: int = 3, model_name: str = "grpo_pipe", report_every_s: float = 30.0) -> None:
        self.name = name  # a taskset id: a module exporting one verifiers Taskset (verifiers' own, or importable)
        self.args = json.loads(json.dumps(dict(args or {})))  # the rest of verifiers' env config (harness, ...)
        self.python = python or str(VENV_PYTHON)  # resolved here; checked in config_problems
        self.processes = processes
        self._base = [[str(WORKER), f"--vf.name={name}", f"--vf.args={json.dumps(self.args)}", f"--vf.seed={index}"]
                      for index in range(processes)]
        self._atropos = AtroposEnvironment(environments=self._base, groups_per_step=groups_per_step,
                                           group_size=group_size, batch_timeout_s=batch_timeout_s,
                                           max_restarts=max_restarts, model_name=model_name,
                                           report_every_s=report_every_s, python=self.python)

    def config_problems(self) -> list[str]:
        problems = [] if self.processes >= 1 else [f"processes={self.processes}: need >= 1 worker"]
        problems += self._atropos.config_problems()
        return problems + self._interpreter_problems()

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
