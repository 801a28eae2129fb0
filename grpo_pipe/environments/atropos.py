"""`environment=atropos`: train on scored groups from Atropos environment services, unchanged.

The run serves its engine on 127.0.0.1 (`serving.endpoint`, a token of its own), starts Atropos's API server
(`run-api`) or attaches to one by URL, starts the environment processes of `environments` (each told the endpoint,
the token, the tokenizer and the API), registers as the trainer, and each step pulls one batch of scored groups:
- every trained token is checked against what the engine served (`scored_groups`): its log-probs and policy version
  are the engine's, a foreign or malformed group is refused and counted (`ledger.dropped["refused"]`);
- a group sampled by a policy more than `rollout_scheduler.max_staleness` versions behind is dropped and counted;
- the scores are the environments' own: train on them with `reward=environment`.
With `rollout_scheduler.max_staleness=0` the environments sample only while the trainer waits for its batch; while it
trains, syncs and evaluates, their requests queue at the endpoint. With `max_staleness >= 1` and an engine that
generates on a thread of its own (`rollout.layout.background`, the default then), the endpoint stays open: the environments
sample while the trainer trains, every engine call and weight sync goes through that one thread (a sync lands between
engine steps, each token keeping the version that sampled it), and what comes back too old is dropped and counted.
The environments' own evaluations are the run's held-out evaluation (`env_eval/*`, read by `EnvironmentEvaluations`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from grpo_pipe.environments.atropos_api import AtroposApi, Registration
from grpo_pipe.environments.atropos_processes import AtroposServer, EnvironmentEvaluations, EnvironmentProcesses
from grpo_pipe.environments.scored_groups import Limits, RefusedGroup, ScoredGroup, read_scored_group
from grpo_pipe.environments.single_turn import SingleTurn
from grpo_pipe.interfaces import GeneratesInBackground, PendingRollout, RolloutEngine
from grpo_pipe.serving.endpoint import EngineEndpoint
from grpo_pipe.serving.openai_api import ServedModel
from grpo_pipe.types import Completion, GeneratedBatch, Ledger, SamplingSettings, TakenBatch, Task

log = logging.getLogger(__name__)


def as_written(item: str | int | float | bool) -> str:
    """A command-line item as the config wrote it: YAML reads `64` as a number and `true` as a boolean, a process
    takes text."""
    if isinstance(item, bool):
        return "true" if item else "false"
    return str(item)


class EnvironmentCommands(Protocol):
    """Environment processes whose commands depend on the run (environment=verifiers: its workers sample at the run's
    temperature and budgets): checked with the config, their commands made when the source starts."""

    def config_problems(self) -> list[str]: ...

    def commands(self, sampling: SamplingSettings, max_model_len: int) -> list[list[str]]:
        """The environment processes' command lines for this run.

        Args:
            sampling: The run's sampling settings (temperature, token budget) the workers sample with.
            max_model_len: The engine's limit on prompt plus completion tokens.
        """
        ...


class AtroposEnvironment:
    """Atropos environments as the run's source of scored groups (see the module docstring). Their commands are
    `environments`, or made by `commands` when the source starts (then `environments` is left empty).

    Args:
        environments: Each a command: `[script.py, serve, --env.some_flag, value, ...]`; the run adds the endpoint,
            its token, the tokenizer and the API.
        api_url: A running run-api to attach to; None: the run starts one.
        groups_per_step: One step's batch: this many groups (`curriculum.prompts_per_step` by default) ...
        group_size: ... of this many samples, passed to the environments (`curriculum.samples_per_prompt`).
        batch_timeout_s: No batch this long: the run stops saying why.
        max_restarts: Environment processes that exit are restarted, this many times in all.
        model_name: The name the endpoint serves the engine under.
        poll_s: Seconds between asks of the API for a batch.
        report_every_s: While waiting for a batch, say so this often.
        eval_every: The environments' own `evaluate()`, every N trainer steps (their `steps_per_eval`); None: as each
            environment sets it. Logged as `env_eval/<process>/<metric>`.
        python: The interpreter that runs the environments; None: the run's own.
        commands: Processes whose commands are made when the source starts (`environment=verifiers`'s workers), in
            place of `environments`.
    """

    def __init__(self, *, environments: Sequence[Sequence[str | int | float | bool]] = (), api_url: str | None = None,
                 groups_per_step: int = 32, group_size: int = 8, batch_timeout_s: float = 600.0,
                 max_restarts: int = 3, model_name: str = "grpo_pipe", poll_s: float = 0.5,
                 report_every_s: float = 30.0, eval_every: int | None = None, python: str | None = None,
                 commands: EnvironmentCommands | None = None) -> None:
        # e.g. [[my_env.py, serve, --env.max_token_length, 512]]: a number (or true/false) is passed on as written
        self.environments = [[as_written(item) for item in command] for command in environments]
        self.groups_per_step, self.group_size = groups_per_step, group_size  # a batch: groups x samples per group
        self.api_url = api_url  # a running run-api to attach to; None: the run starts one on 127.0.0.1
        self.batch_timeout_s = batch_timeout_s
        self.max_restarts = max_restarts
        self.model_name = model_name  # the name the endpoint serves the engine under (--openai.model_name)
        self.poll_s, self.report_every_s = poll_s, report_every_s
        self.eval_every = eval_every  # the environments' own evaluations, every this many trainer steps; None: theirs
        self.python = python  # the interpreter that runs the environments; None: the run's own
        self.commands = commands
        self._single = SingleTurn()  # held-out evaluation: the data's tasks, one turn
        self._tokenizer: Any = None
        self._closers: list[Callable[[], None]] = []

    def config_problems(self) -> list[str]:
        problems = [] if self.commands is None else self.commands.config_problems()
        if not self.environments and self.commands is None and self.api_url is None:
            problems.append("environments: none to start and no api_url to attach to: nothing would post groups")
        for command in self.environments:
            if not command or not Path(command[0]).is_file():
                problems.append(f"environments: {command!r}: the first item must be an environment's script file")
        if self.groups_per_step < 1 or self.group_size < 2:
            problems.append(f"groups_per_step={self.groups_per_step}, group_size={self.group_size}: need >= 1 group "
                            "of >= 2 samples (GRPO compares a group's samples)")
        if self.batch_timeout_s <= 0:
            problems.append(f"batch_timeout_s={self.batch_timeout_s}: must be > 0")
        if self.eval_every is not None and (self.eval_every < 0 or self.eval_every == 1):
            # atroposlib evaluates when the step count passes a multiple of steps_per_eval (step % N wraps): at 1 it
            # never wraps, and the environments would silently never evaluate.
            problems.append(f"eval_every={self.eval_every}: allowed 0 (the environments never evaluate), 2 or more "
                            "(atroposlib never evaluates at steps_per_eval=1), or null (each environment's own)")
        return problems

    # -- the environment's part: held-out evaluation as single turns --------------------------------------

    def setup(self, tokenizer: PreTrainedTokenizerBase, system_prompt: str, max_model_len: int) -> None:
        self._tokenizer = tokenizer
        self._single.setup(tokenizer, system_prompt, max_model_len)

    def completion_budget(self, max_new_tokens: int) -> int:
        return max_new_tokens

    def render_prompt(self, task: Task) -> tuple[int, ...]:
        return self._single.render_prompt(task)

    def submit(self, engine: RolloutEngine, tasks: Sequence[Task], prompts: Sequence[Sequence[int]],
               samples: Sequence[int], sampling: SamplingSettings) -> PendingRollout:
        return self._single.submit(engine, tasks, prompts, samples, sampling)

    def generate(self, engine: RolloutEngine, tasks: Sequence[Task], prompts: Sequence[Sequence[int]],
                 samples: Sequence[int], sampling: SamplingSettings) -> list[list[Completion]]:
        return self._single.generate(engine, tasks, prompts, samples, sampling)

    # -- the source of training groups ------------------------------------------------------------------------

    def rollout_source(self, engine: RolloutEngine, sampling: SamplingSettings, *, max_staleness: int,
                       total_steps: int, log_dir: Path) -> AtroposSource:
        """Start the endpoint, the API server (unless attached) and the environments; register as the trainer."""
        if self._tokenizer is None:
            raise RuntimeError("environment used before setup()")
        served = ServedModel(name=self.model_name, tokenizer=self._tokenizer, max_model_len=engine.max_model_len,
                             vocab_size=len(self._tokenizer),
                             default_max_tokens=sampling.max_tokens)
        endpoint = EngineEndpoint(engine=engine, model=served)
        endpoint.start()
        endpoint.pause()  # the engine is the run's until the first `take` waits for a batch
        self._closers.append(endpoint.stop)
        url = self.api_url or self._start_server(log_dir)
        api = AtroposApi(url=url, registration=Registration(batch_size=self.groups_per_step * self.group_size,
                                           max_token_len=engine.max_model_len,
                                           num_steps=total_steps), poll_s=self.poll_s,
                         report_every_s=self.report_every_s)
        self._closers.append(api.close)
        api.register()
        commands = self.environments if self.commands is None else self.commands.commands(sampling, engine.max_model_len)
        processes = EnvironmentProcesses(commands=commands, connection=self._connection(endpoint, url),
                                         log_dir=log_dir, max_restarts=self.max_restarts,
                                         env={"HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}, python=self.python,
                                         secrets={"openai.api_key": endpoint.token},
                                         defaults=suggested_settings(max_staleness))
        self._closers.append(processes.stop)
        # The engine may serve the environments while the trainer trains only where its calls are serialised on its
        # own thread (the batcher's, held-out evaluation's, weight syncs') and a group may be a version behind.
        overlap = max_staleness >= 1 and isinstance(engine, GeneratesInBackground) and bool(engine.background)
        evaluations = EnvironmentEvaluations([processes.evaluations_dir(i) for i in range(len(commands))])
        limits = Limits(len(self._tokenizer), engine.max_model_len, sampling.temperature)
        source = AtroposSource(api=api, endpoint=endpoint, processes=processes, limits=limits,
                               max_staleness=max_staleness, timeout_s=self.batch_timeout_s, overlap=overlap,
                               evaluations=evaluations)
        source.open_intake()
        processes.start()
        return source

    def close(self) -> None:
        """Environments first (they call the endpoint and the API), then the API server, then the endpoint."""
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except Exception as err:  # noqa: BLE001 - the others must still be closed
                log.warning("closing part of environment=atropos failed: %s: %s", type(err).__name__, err)

    def _start_server(self, log_dir: Path) -> str:
        server = AtroposServer(log_dir / "atropos-api.log")
        server.start()
        self._closers.append(server.stop)
        return server.url

    def _connection(self, endpoint: EngineEndpoint, api_url: str) -> list[str]:
        model = str(getattr(self._tokenizer, "name_or_path", ""))
        flags = {"env.rollout_server_url": api_url, "env.tokenizer_name": model, "env.use_wandb": "false",
                 "env.group_size": str(self.group_size), "openai.base_url": endpoint.base_url,
                 "openai.model_name": self.model_name, "openai.server_type": "vllm",
                 "openai.tokenizer_name": model}
        if self.eval_every is not None:
            flags["env.steps_per_eval"] = str(self.eval_every)
        return [f"--{flag}={value}" for flag, value in flags.items()]  # `=`: a value is never read as a flag


def suggested_settings(max_staleness: int) -> dict[str, str]:
    """What each environment process is told unless its command or config file says otherwise.

    atroposlib samples up to `max_batches_offpolicy` batches ahead (3 by default). The run takes one batch a step, so a
    batch queued deeper than max_staleness + 1 was sampled by a policy too old to train on and is dropped: on a GPU, 3
    deep at max_staleness=1 dropped more groups than the run trained on."""
    return {"env.max_batches_offpolicy": str(max_staleness + 1)}


class AtroposSource:
    """The recipe's `RolloutSource` for Atropos: each `take` is one batch pulled from the API server.

    Args:
        api: The API server the trainer is registered with, which batches are pulled from.
        endpoint: The engine's HTTP endpoint the environments sample from; its log of what was served checks each
            group.
        processes: The environment processes, checked (and restarted) while the run waits for a batch.
        limits: The vocabulary, context length and temperature every scored group is checked against.
        max_staleness: Groups sampled more than this many policy versions behind are dropped and counted.
        timeout_s: No batch this long: the run stops saying why.
        overlap: The endpoint stays open while the trainer trains (see the module docstring).
        evaluations: What the environments' own evaluations write, read back as `env_eval/*`; None: none.
    """

    def __init__(self, *, api: AtroposApi, endpoint: EngineEndpoint, processes: EnvironmentProcesses, limits: Limits,
                 max_staleness: int, timeout_s: float, overlap: bool = False,
                 evaluations: EnvironmentEvaluations | None = None) -> None:
        self.api, self.endpoint, self.processes, self.limits = api, endpoint, processes, limits
        self.max_staleness = max_staleness
        self.stale_policy = "drop"  # the environments sample on their own: what is too old can only be dropped
        self.timeout_s = timeout_s
        self.overlap = overlap
        self.evaluations = evaluations or EnvironmentEvaluations([])
        self.ledger = Ledger()
        self.generation_intervals: list[tuple[float, float]] = []
        self.guard: Callable[[], Any] = nullcontext
        self._pulled = 0

    def open_intake(self) -> None:
        """Atropos takes environments only once the trainer has asked for a batch: ask once, expecting none."""
        self.api.poll_once()

    def fill(self, trainer_version: int, pushed_version: int, steps_done: int) -> int:
        return 0  # the environments generate on their own

    def take(self, trainer_version: int) -> TakenBatch:
        started = time.time()
        self.endpoint.resume()  # the environments may sample now ...
        try:
            with self.guard():
                batch = self._next_batch()
        finally:
            if not self.overlap:
                self.endpoint.pause()  # ... and, without overlap, not while the trainer trains, syncs or evaluates
        ended = time.time()
        self.generation_intervals.append((started, ended))
        lagging = [(s, trainer_version - _oldest(s)) for s in self._read(batch)]  # versions behind the trainer
        kept = [(s, lag) for s, lag in lagging if lag <= self.max_staleness]
        dropped = [(s.group.task.uid, lag) for s, lag in lagging if lag > self.max_staleness]
        self.ledger.submitted += len(lagging)
        self.ledger.trained += len(kept)
        if dropped:
            self.ledger.dropped["stale"] = self.ledger.dropped.get("stale", 0) + len(dropped)
        generated = GeneratedBatch([list(s.group.completions) for s, _ in kept], started, ended)
        return TakenBatch(groups=[s.group for s, _ in kept], staleness=[lag for _, lag in kept], dropped=dropped,
                          generated=generated, wait_s=ended - started, engine_gap_s=0.0, queue_depth=1)

    def requeue_lost(self) -> int:
        return 0  # the environments resend what they did not get answered

    def take_evaluations(self) -> tuple[dict[str, float], list[Path]]:
        """The environments' own evaluations reported since the last call (`env_eval/<process>/<metric>`)."""
        return self.evaluations.take()

    def snapshot(self) -> dict[str, Any]:
        return {"pulled": self._pulled}

    def restore(self, snapshot: Mapping[str, Any], tasks_by_uid: Mapping[str, Task]) -> None:
        self._pulled = int(snapshot.get("pulled", 0))

    def _next_batch(self) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            self.processes.check()  # a process that died is restarted (counted), or the run stops saying why
            try:
                return self.api.next_batch(timeout_s=min(self.api.report_every_s, max(deadline - time.monotonic(), 0.0)))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise

    def _read(self, batch: Sequence[Mapping[str, Any]]) -> list[ScoredGroup]:
        scored = []
        for data in batch:
            self._pulled += 1
            try:
                scored.append(read_scored_group(data, self.limits, self.endpoint.served, f"atropos/{self._pulled}"))
            except RefusedGroup as err:
                self.ledger.submitted += 1
                self.ledger.dropped["refused"] = self.ledger.dropped.get("refused", 0) + 1
                log.warning("refused a scored group from the Atropos API: %s", err)
        return scored


def _oldest(scored: ScoredGroup) -> int:
    return min(c.policy_version for c in scored.group.completions)
