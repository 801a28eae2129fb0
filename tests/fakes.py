"""Small in-memory implementations of our own Protocols, for the unit tier (no engine, no model, no MLflow).

Each one is the least that satisfies its Protocol and records what the recipe asked of it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from grpo_pipe.environments.single_turn import SingleTurn
from grpo_pipe.rollout.scheduler import RolloutSchedulerSettings, StalePolicy
from grpo_pipe.runner.components import Components
from grpo_pipe.runner.settings import RunSettings
from grpo_pipe.types import (
    Completion,
    GeneratedBatch,
    RequestTelemetry,
    RewardOutput,
    RolloutGroup,
    SamplingSettings,
    SyncStats,
    Task,
    TrackedRun,
)

TASKS = [Task(uid=f"t/{i}", question=f"{i} + 1", answer=str(i + 1)) for i in range(8)]
TELEMETRY = RequestTelemetry(prompt_tokens=4, generated_tokens=3, cached_prompt_tokens=0)


def scored_groups(seed: int = 0, truncated: Collection[tuple[int, int]] = ()) -> tuple[list[RolloutGroup], list[float]]:
    """Three groups of four seeded random completions (token ids within the tiny model's vocabulary) with their
    rewards: what one optimisation step of the trainer takes, without an engine. `truncated`: (group, sample)
    pairs that hit the token budget instead of stopping."""
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for g in range(3):
        prompt = tuple(torch.randint(10, 400, (4 + g,), generator=gen).tolist())
        completions = tuple(
            Completion(
                token_ids=tuple(torch.randint(10, 400, (2 + (i % 3),), generator=gen).tolist()),
                logprobs=tuple([-3.0] * (2 + (i % 3))),
                text="", finish_reason="length" if (g, i) in truncated else "stop", policy_version=0, telemetry=TELEMETRY,
            )
            for i in range(4)
        )
        groups.append(RolloutGroup(Task(uid=str(g), question="q", answer="1"), prompt, completions))
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1.0, 0.0, 0.0, 0.0]  # group 2 carries no signal
    return groups, rewards


class FakeTokenizer:
    """Characters as token ids: enough for `render_prompt`."""

    pad_token_id = 0

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], **_: Any) -> str:
        return "|".join(m["content"] for m in messages)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


class FakeEngine:
    """Answers task i with "i+1" (right) on even calls and "0" (wrong) on odd ones; tags the served version."""

    in_process = True
    max_model_len = 256
    enable_sleep_mode = False
    weight_dtype = torch.float32

    def __init__(self) -> None:
        self.served_version = 0
        self.model_path: Path | None = None
        self.calls: list[str] = []

    def connect(self, model_path: Path, options: dict[str, Any] | None = None) -> None:
        self.model_path = model_path

    def generate(
        self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
    ) -> list[list[Completion]]:
        self.calls.append("generate")
        out = []
        for prompt, n in zip(prompts, samples):
            answer = str(int("".join(chr(t) for t in prompt).split(" + ")[0]) + 1)
            out.append([self._completion(answer if k % 2 == 0 else "0") for k in range(n)])
        return out

    def _completion(self, text: str) -> Completion:
        return Completion(token_ids=(1, 2), logprobs=(-0.5, -0.5), text=text, finish_reason="stop",
                          policy_version=self.served_version, telemetry=RequestTelemetry(prompt_tokens=4, generated_tokens=2,
                                                                                         cached_prompt_tokens=0))

    def submit(self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings) -> GeneratedBatch:
        started = time.time()
        return GeneratedBatch(self.generate(prompts, samples, sampling), started, time.time())

    def sleep(self, level: int) -> None: ...

    def wake_up(self) -> None: ...

    def shutdown(self) -> None:
        self.calls.append("shutdown")


class FakeCurriculum:
    def __init__(self, prompts_per_step: int = 2, samples: int = 2) -> None:
        self.prompts_per_step, self.samples = prompts_per_step, samples
        self.tasks: list[Task] = []
        self.position = 0
        self.updates: list[list[str]] = []

    def attach(self, tasks: Sequence[Task]) -> None:
        self.tasks = list(tasks)

    def next_batch(self) -> list[tuple[Task, int]]:
        batch = [(self.tasks[(self.position + i) % len(self.tasks)], self.samples) for i in range(self.prompts_per_step)]
        self.position += self.prompts_per_step
        return batch

    def update(self, uids: Sequence[str], rewards: Sequence[float]) -> Mapping[str, float]:
        self.updates.append(list(uids))
        return {"curriculum/updates": float(len(self.updates))}

    def take_reports(self, output_dir: Path) -> list[Path]:
        return []

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.position = int(state["position"])


class ExactReward:
    def setup(self, model_path: Path, kv_dtype: torch.dtype) -> None: ...

    def __call__(self, groups: Sequence[RolloutGroup]) -> RewardOutput:
        correct = [c.text == g.task.answer for g in groups for c in g.completions]
        return RewardOutput(values=[float(ok) for ok in correct], terms={"correctness": [float(ok) for ok in correct]},
                            correct=correct)


class FakePolicy:
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield "w", torch.zeros(2)

    def save_pretrained(self, path: Path, dtype: torch.dtype | None = None) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / "weights").write_text("w")


class CountingTrainer:
    """Every step is an applied update: the version counts steps."""

    def __init__(self, steps: int) -> None:
        self.steps, self.version = steps, 0
        self.policy = FakePolicy()
        self.seen: list[tuple[int, list[float]]] = []  # (version before the update, rewards)

    def setup(self, model_path: Path, device: torch.device, pad_id: int) -> None: ...

    def step(self, groups: Sequence[RolloutGroup], rewards: Sequence[float], temperature: float) -> dict[str, float]:
        self.seen.append((self.version, list(rewards)))
        self.version += 1
        return {"train/loss": 0.0}

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = int(state["version"])


class RecordingBridge:
    def __init__(self, sync_every: int = 1) -> None:
        self.sync_every = sync_every
        self.pushed: list[int] = []

    def check(self, engine: Any, policy: Any) -> list[str]:
        return []

    def engine_options(self) -> dict[str, Any]:
        return {}

    def connect(self, engine: Any, policy: Any) -> None: ...

    def push(self, policy: Any, version: int) -> SyncStats:
        self.pushed.append(version)
        return SyncStats(gather_s=0.0, transport_s=0.0, load_s=0.0, pause_s=0.0, bytes_moved=8, policy_version=version)

    def close(self) -> None: ...


class SamePlacement:
    sleep_level = 0

    def place(self, engine: Any) -> Any:
        return engine

    def trainer_device(self) -> torch.device:
        return torch.device("cpu")

    def before_rollout(self, engine: Any) -> None: ...

    def before_train(self, engine: Any) -> None: ...

    def before_sync(self, engine: Any) -> None: ...

    def restart_engines(self, engine: Any, attempt: int) -> None:
        raise RuntimeError("no restarts in the unit tier")

    def close(self) -> None: ...


class ListTracker:
    run_id: str | None = "fake-run"

    def __init__(self) -> None:
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.artifacts: list[tuple[Path, str | None]] = []

    def start(self, run: TrackedRun) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def logged_steps(self, key: str) -> set[int]:
        return set()

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.metrics.append((step, dict(metrics)))

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.artifacts.append((path, artifact_path))

    def log_table(self, rows: Sequence[Mapping[str, Any]], artifact_file: str) -> None: ...

    def describe(self) -> str:
        return "in memory"

    def close(self, status: str = "FINISHED", within_s: float | None = None) -> None: ...


class StaticTasks:
    system_prompt = ""
    skipped = ()
    max_bad_fraction = 0.0

    def train_tasks(self) -> list[Task]:
        return TASKS

    def eval_tasks(self) -> list[Task]:
        return TASKS[:4]


class LocalModel:
    """A model folder that is never read: its tokenizer is `FakeTokenizer`, its tokenizer files one marker file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def materialize(self) -> Path:
        return self.path

    def tokenizer(self) -> FakeTokenizer:
        return FakeTokenizer()

    def copy_tokenizer(self, folder: Path) -> None:
        (folder / "tokenizer.json").write_text("{}")


def fake_components(
    tmp_path: Path, steps: int = 3, max_staleness: int = 0, stale_policy: StalePolicy = "pace", sync_every: int = 1,
    checkpoints: Callable[[], Any] | None = None,
) -> Components:
    from grpo_pipe.checkpoint.store import CheckpointManager

    store = (checkpoints or CheckpointManager)()
    store.attach(tmp_path)
    return Components(
        run=RunSettings(max_new_tokens=8, eval_size=4, eval_max_new_tokens=8),
        model=LocalModel(tmp_path),
        data=StaticTasks(),
        reward=ExactReward(),
        curriculum=FakeCurriculum(),
        trainer=CountingTrainer(steps),
        rollout=FakeEngine(),
        rollout_scheduler=RolloutSchedulerSettings(max_staleness=max_staleness, stale_policy=stale_policy),
        environment=SingleTurn(),
        weight_bridge=RecordingBridge(sync_every),
        placement=SamePlacement(),
        logger=ListTracker(),
        checkpoint=store,
    )


class GatedEngine:
    """Answers each prompt with its tokens reversed, cut at its budget; the first call waits for `gate`."""

    def __init__(self) -> None:
        self.served_version = 3
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls: list[tuple[list[tuple[int, ...]], SamplingSettings]] = []
        self.fail = False

    def generate(self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
                 ) -> list[list[Completion]]:
        self.calls.append(([tuple(p) for p in prompts], sampling))
        self.entered.set()
        self.gate.wait()
        if self.fail:
            raise RuntimeError("engine died")
        return [[self._answer(p, sampling.max_tokens_of(i)) for _ in range(n)]
                for i, (p, n) in enumerate(zip(prompts, samples))]

    def _answer(self, prompt: Sequence[int], budget: int) -> Completion:
        ids = tuple(reversed(prompt))[:budget]
        return Completion(token_ids=ids, logprobs=(-0.5,) * len(ids), text="", finish_reason="stop",
                          policy_version=self.served_version,
                          telemetry=RequestTelemetry(prompt_tokens=len(prompt), generated_tokens=len(ids),
                                                     cached_prompt_tokens=0))
