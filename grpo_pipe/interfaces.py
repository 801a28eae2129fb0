"""The Protocols the recipe talks to. Nothing else lives here.

Each config group option builds one object that satisfies one of these. Construction is cheap and
safe on any machine; heavy work (loading models, starting engines) happens in `connect`/`setup`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from grpo_pipe.types import (
    Completion,
    GeneratedBatch,
    Ledger,
    LossStats,
    RewardOutput,
    RolloutGroup,
    SamplingSettings,
    SyncStats,
    TakenBatch,
    Task,
)


@runtime_checkable
class ModelSource(Protocol):
    """Where the policy's starting weights come from."""

    def materialize(self) -> Path:
        """Return a local Hugging Face model folder (config, tokenizer, safetensors), building it if needed."""
        ...


@runtime_checkable
class TaskSource(Protocol):
    """A dataset of tasks with a train/eval split that never overlap."""

    system_prompt: str
    max_bad_fraction: float  # the share of rows that may be skipped as unusable; more is an error

    @property
    def skipped(self) -> Collection[str]: ...  # "<file>:<line>: why" of each row that could not be used

    def train_tasks(self) -> Sequence[Task]: ...

    def eval_tasks(self) -> Sequence[Task]: ...


@runtime_checkable
class PendingRollout(Protocol):
    """A generation call that may still be running (on another process, device or machine)."""

    def result(self) -> GeneratedBatch:
        """Block until it is done."""
        ...


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates completions from token ids. It knows nothing about rewards or training.

    Calls take effect in the order they are made: a generation submitted after a weight sync uses
    the new weights, one submitted before it uses the old ones. The async loop relies on this.
    """

    @property
    def served_version(self) -> int:
        """Policy version of the weights the engine generates with (set by `bridges.contract.push_weights`)."""
        ...

    @served_version.setter
    def served_version(self, version: int) -> None: ...

    @property
    def model_path(self) -> Path | None: ...  # the folder it was started on

    @property
    def weight_dtype(self) -> torch.dtype: ...  # the dtype it holds weights in (bridges convert before sending)

    @property
    def in_process(self) -> bool: ...  # true when the engine's model lives in this process

    @property
    def max_model_len(self) -> int: ...  # prompt + completion tokens one request may hold

    @property
    def enable_sleep_mode(self) -> bool: ...  # whether `sleep` can free the engine's memory

    def connect(self, model_path: Path, options: dict[str, Any] | None = None) -> None: ...

    def generate(
        self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
    ) -> list[list[Completion]]:
        """For prompt i return `samples[i]` completions, tagged with `served_version`."""
        ...

    def submit(
        self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
    ) -> PendingRollout:
        """Like `generate`, without waiting where the engine runs elsewhere."""
        ...

    def sleep(self, level: int) -> None: ...

    def wake_up(self) -> None: ...

    def shutdown(self) -> None: ...


@runtime_checkable
class InProcessModelEngine(Protocol):
    """An engine whose model lives in this process, so a bridge can hand it tensors directly (a capability
    users' own bridges ask for: see the README's extension example)."""

    @property
    def in_process(self) -> bool: ...  # false when the same class was started in its own process

    @property
    def weight_dtype(self) -> torch.dtype: ...

    def reload_weights(self, weights: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors into the live model (vLLM fuses qkv / gate_up itself)."""
        ...


@runtime_checkable
class WorkerRpcEngine(Protocol):
    """An engine whose workers run bridge code (`worker_extension_cls`), wherever they live."""

    def call_workers(self, method: str, *args: Any, timeout_s: float | None = None) -> list[Any]:
        """Run a worker-extension method in every engine worker; one result per worker."""
        ...

    def after_external_weight_update(self) -> None: ...

    def is_running(self) -> bool: ...

    def worker_count(self) -> int:
        """How many workers `call_workers` reaches (all replicas together)."""
        ...


@runtime_checkable
class LocalEngine(InProcessModelEngine, WorkerRpcEngine, Protocol):
    """An engine on the trainer's machine: its model lives in this process, or in an engine process that maps
    memory the trainer shares with it. What `reload`, `ipc` and LoRA adapters handed over in memory ask for;
    an engine behind Ray, on other machines, is none."""

    @property
    def device_ids(self) -> str | None: ...  # GPUs of an engine process of its own: set = not the trainer's device

    @property
    def on_gpu(self) -> bool: ...

    @property
    def enable_sleep_mode(self) -> bool: ...

    def call_workers_in_process(self, fn: Callable[[Any], Any]) -> Any:
        """Call `fn(worker)` on the worker of an engine in this process; its result as is (tensors included)."""
        ...


@runtime_checkable
class AdapterEngine(Protocol):
    """An engine that serves LoRA adapters loaded while it runs."""

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype the engine computes adapters in (vLLM's LoRA dtype follows the model's)."""
        ...

    def use_adapter(self, name: str, adapter_id: int, folder: Path) -> None:
        """Load the adapter saved in `folder` and serve every following request with it."""
        ...

    def retire_adapter(self, adapter_id: int) -> None: ...


@runtime_checkable
class Policy(Protocol):
    """The trainable model as the bridges see it."""

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full-model weights under Hugging Face checkpoint names (LoRA merged where relevant)."""
        ...

    def save_pretrained(self, path: Path, dtype: torch.dtype | None = None) -> None:
        """A full Hugging Face checkpoint (LoRA merged), cast to `dtype` when given."""
        ...


@runtime_checkable
class ModulePolicy(Policy, Protocol):
    """A policy whose model is one module the trainer updates in place (with `AdapterPolicy`: an adapter on it)."""

    module: torch.nn.Module | None  # None until loaded


@runtime_checkable
class AdapterPolicy(Protocol):
    """A policy that trains a LoRA adapter on a frozen base, and can save the adapter alone."""

    rank: int

    def save_adapter(self, path: Path, dtype: torch.dtype | None = None) -> None: ...

    def adapter_tensors(self) -> dict[str, torch.Tensor]:
        """The adapter's tensors under peft's names, as `save_adapter` writes them."""
        ...

    def adapter_config(self) -> dict[str, Any]:
        """peft's adapter config as plain data, as `save_adapter` writes it."""
        ...


@runtime_checkable
class WeightBridge(Protocol):
    """Moves trained weights into the live engine.

    The contract the caller keeps (`grpo_pipe.bridges.contract.push_weights`), so no bridge repeats it:
    it pushes only every `sync_every` versions, times the whole sync and records the version the engine
    serves afterwards. A bridge only moves the weights and reports the phases only it can see.
    """

    sync_every: int

    def check(self, engine: RolloutEngine, policy: Any) -> list[str]:
        """Config problems (e.g. needs a GPU, needs an in-process engine); reported before anything loads."""
        ...

    def engine_options(self) -> dict[str, Any]:
        """Extra engine settings this bridge needs (e.g. enable_lora); applied when the engine starts."""
        ...

    def connect(self, engine: RolloutEngine, policy: Policy) -> None: ...

    def push(self, policy: Policy, version: int) -> SyncStats: ...

    def close(self) -> None: ...


@runtime_checkable
class PolicyLoss(Protocol):
    """The policy-gradient loss (`loss=`): advantages from rewards, and the per-micro-batch surrogate. The trainer
    knows nothing of the algorithm beyond this; `grpo_pipe.trainer.loss.GRPOLoss` is the GRPO family."""

    clip_low: float
    clip_high: float
    mask_truncated: bool  # completions that hit the budget get no loss and are in no normaliser

    @property
    def needs_reference(self) -> bool:
        """Whether `__call__` needs the frozen starting policy's log-probs (a KL term)."""
        ...

    def advantages(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """[N] rewards, [N] group ids -> [N] advantages."""
        ...

    def normaliser(self, lengths: Sequence[int]) -> float:
        """What the whole batch's summed loss is divided by, from the lengths of the completions that get one."""
        ...

    def __call__(
        self,
        new_logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        normaliser: float,
        ref_logprobs: torch.Tensor | None = None,
        proximal_logprobs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, LossStats]:
        """One micro-batch's loss, pre-divided by the batch's normaliser, and its detached statistics."""
        ...


@runtime_checkable
class Reward(Protocol):
    """Scores completions. Rewards compose: a composite reward holds others."""

    def setup(self, model_path: Path, kv_dtype: torch.dtype) -> None:
        """Called once the model is known (e.g. to read its dimensions); most rewards need nothing."""
        ...

    def __call__(self, groups: Sequence[RolloutGroup]) -> RewardOutput:
        """Return one value per completion, in group order then completion order."""
        ...


@runtime_checkable
class TriesOnTasks(Protocol):
    """A reward that runs user code: it is tried on a few rows of the data before the engine starts, so a
    broken function fails in seconds instead of after the engine's start-up."""

    def try_on(self, tasks: Sequence[Task]) -> list[str]:
        """One line per problem (naming the reward's key and what it raised); empty when fine."""
        ...


@runtime_checkable
class HasSourceFiles(Protocol):
    """A component built from the user's own code: its files are logged with the run, so the run records what
    scored it."""

    def source_files(self) -> list[Path]: ...


@runtime_checkable
class ReadsRequestTimestamps(Protocol):
    """A reward that reads the engine's per-request timestamps (`RequestTelemetry.queued_s` ...). Engines
    record them only when some component reads them: recording costs decode speed."""

    def reads_request_timestamps(self) -> bool: ...


def reads_request_timestamps(reward: object) -> bool:
    """Whether `reward` reads per-request timestamps (a reward without the method reads none)."""
    return isinstance(reward, ReadsRequestTimestamps) and reward.reads_request_timestamps()


@runtime_checkable
class RecordsRequestTimestamps(Protocol):
    """An engine that records per-request timestamps on request; None = not decided by the config."""

    request_timestamps: bool | None


@runtime_checkable
class Curriculum(Protocol):
    """Chooses which tasks to roll out next and how many samples each gets."""

    def attach(self, tasks: Sequence[Task]) -> None:
        """The train split to choose from; called once, before the first `next_batch`."""
        ...

    def next_batch(self) -> list[tuple[Task, int]]: ...

    def update(self, uids: Sequence[str], rewards: Sequence[float]) -> Mapping[str, float]:
        """Record one step's per-completion rewards; return metrics to log."""
        ...

    def take_reports(self, output_dir: Path) -> list[Path]:
        """Write any report produced since the last call under `output_dir`; return the files written."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class RolloutSource(Protocol):
    """Keeps the engine generating the batches the trainer takes next, within a staleness bound; every group
    it submits ends trained, dropped or in flight (`ledger`)."""

    max_staleness: int  # policy versions a trained sample may lag the trainer (0 = the synchronous loop)
    stale_policy: str  # pace (submit only within the bound) | drop (keep the engine busy, drop what is too old)
    ledger: Ledger
    generation_intervals: list[tuple[float, float]]  # wall-clock spans the engine was generating
    guard: Callable[[], Any]  # wraps every wait on the engine (a stop signal may abandon it)

    def fill(self, trainer_version: int, pushed_version: int, steps_done: int) -> int:
        """Submit batches while the bound allows; returns how many are in flight."""
        ...

    def take(self, trainer_version: int) -> TakenBatch:
        """The oldest batch in flight, waited for."""
        ...

    def requeue_lost(self) -> int:
        """After an engine restart: submit again what it lost; returns the batches re-issued."""
        ...

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, snapshot: Mapping[str, Any], tasks_by_uid: Mapping[str, Task]) -> None: ...


@runtime_checkable
class RolloutSourceFactory(Protocol):
    """The `rollout_scheduler` config group: a `_partial_` whose settings (`keywords`, e.g. max_staleness) are
    known, and checked, before the engine and the data exist; the recipe completes it with them."""

    keywords: Mapping[str, Any]

    def __call__(
        self, engine: RolloutEngine, next_batch: Callable[[], list[tuple[Task, int]]],
        render: Callable[[Task], tuple[int, ...]], sampling: SamplingSettings, *, total_steps: int,
        prompt_limit: int | None, overlong_prompts: str,
    ) -> RolloutSource: ...


@runtime_checkable
class Placement(Protocol):
    """Where the engine and the trainer live and how they hand the device to each other."""

    sleep_level: int  # vLLM sleep level while the trainer runs; 0 = the engine keeps its memory

    def place(self, engine: RolloutEngine) -> RolloutEngine:
        """The engine the runner should use: `engine` itself, or a handle to copies of it placed elsewhere."""
        ...

    def trainer_device(self) -> torch.device:
        """Valid once the engine is connected (where engines went decides what is left)."""
        ...

    def before_rollout(self, engine: RolloutEngine) -> None: ...

    def before_train(self, engine: RolloutEngine) -> None: ...

    def before_sync(self, engine: RolloutEngine) -> None: ...

    def restart_engines(self, engine: RolloutEngine, attempt: int) -> None:
        """Replace engines that died (after a back-off), or raise when that is not possible or too often."""
        ...

    def check(self, trainer: Any, bridge: Any) -> list[str]:
        """What this machine or cluster cannot give the configured trainer and engines (GPUs, a reachable
        Ray cluster, a trainer kind this placement cannot host); checked before anything loads."""
        ...

    def close(self) -> None:
        """Release what `place` started (processes, actors)."""
        ...


@runtime_checkable
class Trainer(Protocol):
    """Owns the policy and its optimizer; one `step` = one optimizer update (advantages included)."""

    steps: int  # optimizer steps the run is configured for
    version: int  # bumped by every applied update: the policy version the engine should serve

    @property
    def policy(self) -> Policy: ...

    def setup(self, model_path: Path, device: torch.device, pad_id: int) -> None:
        """Load the policy on `device` and build the optimizer."""
        ...

    def step(self, groups: Sequence[RolloutGroup], rewards: Sequence[float], temperature: float) -> dict[str, float]:
        """Group advantages from `rewards` ([N], group order), one update; returns metrics to log."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None:
        """Release what `setup` started beyond this process (a sharded trainer's rank actors)."""
        ...


@runtime_checkable
class CheckpointStore(Protocol):
    """Where whole training states and the best model so far are written."""

    best_metric: str | None  # the evaluation metric that picks the best model (higher is better)
    best_value: float | None

    def attach(self, output_dir: Path) -> None:
        """A new run: write under this run's output folder (or the configured directory)."""
        ...

    def resume_in(self, root: Path) -> None:
        """A resumed run: keep writing into the checkpoint folder it was resumed from."""
        ...

    def set_best(self, value: float | None) -> None:
        """The best value so far without an export (the untrained baseline, or a resumed run's)."""
        ...

    def due(self, step: int, last_step: int) -> bool: ...

    def save(self, step: int, trainer_state: Mapping[str, Any], loop_state: Mapping[str, Any], config_yaml: str) -> Any:
        """Write one checkpoint atomically; returns it (with its `path`), or None when a failed write was
        only warned about (a failure that stops the run raises)."""
        ...

    def consider_best(self, metrics: Mapping[str, float], export: Callable[[Path], None]) -> bool:
        """Export a new `best/` through `export(folder)` if `metrics` beat the best so far."""
        ...

    def latest(self) -> Any:
        """The newest checkpoint written (with its `path`), or None."""
        ...


@runtime_checkable
class Tracker(Protocol):
    """Experiment tracking: params, metrics, artifacts."""

    run_id: str | None

    def start(
        self,
        run_name: str,
        tags: Mapping[str, str],
        sweep_dir: str | None = None,
        resume_run_id: str | None = None,
        output_dir: Path | None = None,
    ) -> None:
        """Open the run (or continue `resume_run_id`); `output_dir` is the job's folder, where a tracker may leave
        what it could not deliver."""
        ...

    def logged_steps(self, key: str) -> set[int]:
        """Steps already logged for `key` (empty for a new run)."""
        ...

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Must not wait on the network for long: a tracking server that is away cannot hold training up."""
        ...

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Run-level facts that change as the run goes (the last step logged, the last checkpoint)."""
        ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...

    def log_table(self, rows: Sequence[Mapping[str, Any]], artifact_file: str) -> None: ...

    def describe(self) -> str:
        """A line telling a person where the run is and how to look at it."""
        ...

    def close(self, status: str = "FINISHED") -> None: ...


@runtime_checkable
class ChecksItsConfig(Protocol):
    """A component that can tell, cheaply and before any model loads, whether its settings can work
    (a path that does not exist, a column a file lacks, a function that cannot be imported)."""

    def config_problems(self) -> list[str]:
        """One line per problem, naming the key (relative to the component: `path=...`), the value and
        what is allowed; empty when fine. The caller puts the component's own key in front."""
        ...
