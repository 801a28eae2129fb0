"""Every environment variable grpo_pipe reads or sets, in one place."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def cache_dir() -> Path:
    """Where built models live: $GRPO_PIPE_CACHE, else ~/.cache/grpo_pipe."""
    return Path(os.environ.get("GRPO_PIPE_CACHE", Path.home() / ".cache" / "grpo_pipe")).expanduser()


def hub_offline() -> bool:
    """True when the user told Hugging Face libraries not to use the network."""
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def prepare_vllm_process_env(in_process: bool) -> None:
    """Settings vLLM reads at import/engine-build time; must run before `import vllm`.

    In-process mode (no engine subprocess) starts in ~3 s instead of ~20 s on CPU and lets the
    reload bridge hand tensors to the engine without serialising them.
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def quiet_libraries() -> None:
    """The command's console carries the pipeline's own lines: MLflow keeps to the logging levels of the job's
    config (it would otherwise install an INFO handler of its own at import), transformers' and the hub's
    progress bars (loading and writing weights, several per run) stay off, and torch's C++ warnings (a NUMA binding
    note at every engine start on a CPU) are not printed; errors still are. A value the user set wins."""
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


@contextmanager
def visible_devices(device_ids: str | None) -> Iterator[None]:
    """Make only `device_ids` visible to processes started inside this block (the engine process).

    The ids count among the GPUs this process sees, as `cuda:N` does: under `CUDA_VISIBLE_DEVICES=2,3`, id "1" is
    the card listed second (physical 3), not physical 1, which may be another job's card or the trainer's own.
    The current process is unaffected once it has initialised CUDA, so the trainer keeps its GPU.
    """
    if device_ids is None:
        yield
        return
    previous = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = among_visible(str(device_ids), previous)  # `=1` on the command line is an int
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = previous


def fast_scratch_dir() -> str | None:
    """A RAM-backed folder for short-lived hand-over files (LoRA adapters), when the machine has one."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


DEFAULT_TRACKING_URI = "sqlite:///outputs/mlflow.db"


def mlflow_tracking_uri(configured: str | None = None) -> str:
    """The MLflow store to use. Precedence: a `logger.tracking_uri` given in the config or on the command
    line, then $MLFLOW_TRACKING_URI, then a sqlite file under outputs/ (the config ships `null`)."""
    if configured:
        return configured
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def bound_mlflow_http_waits(timeout_s: int = 10, retries: int = 1) -> None:
    """MLflow's HTTP client retries a failed request for minutes by default (7 retries, back-off factor 2,
    120 s timeout); the tracker retries on its own terms instead, so one attempt must fail fast. A value the
    user exported is kept. Read by MLflow at every request, so this holds for the whole process."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(retries))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(timeout_s))


@dataclass(frozen=True)
class HaltRequest:
    """Where a test holds the job (`GRPO_PIPE_HALT_AT`), and the file that says it is held.

    Args:
        points: The (point, step) pairs at which the job holds.
        marker: The file written while the job is held; removing it lets the job go on.
    """

    points: tuple[tuple[str, int], ...]
    marker: Path


def halt_request() -> HaltRequest | None:
    """A fault-injection point for tests: `GRPO_PIPE_HALT_AT=<point>@<step>[,<point>@<step>...]` holds the job at
    those points (`grpo_pipe.runtime.halt`), each time writing the file `GRPO_PIPE_HALT_MARKER` and going on once it is
    removed. Unset in any real run."""
    spec, marker = os.environ.get("GRPO_PIPE_HALT_AT"), os.environ.get("GRPO_PIPE_HALT_MARKER")
    if not spec or not marker:
        return None
    points = tuple((point, int(step)) for point, _, step in (item.partition("@") for item in spec.split(",")))
    return HaltRequest(points, Path(marker))


def among_visible(device_ids: str, visible: str | None) -> str:
    """`device_ids` ("1" or "0,1", indices among the visible GPUs) as entries of `visible` (ids or UUIDs), for a child.

    Raises ValueError naming both when an index is past the visible list, rather than start an engine on a card the
    user did not give this job.
    """
    entries = [entry.strip() for entry in device_ids.split(",")]
    if not entries or not all(entry.isdigit() for entry in entries):
        raise ValueError(f"rollout.layout.device_ids={device_ids!r}: allowed: GPU indices such as \"1\" or \"0,1\"")
    if not visible:
        return device_ids
    listed = [entry.strip() for entry in visible.split(",") if entry.strip()]
    wanted = [int(entry) for entry in entries]
    if any(not 0 <= index < len(listed) for index in wanted):
        raise ValueError(f"rollout.layout.device_ids={device_ids!r}: this process sees {len(listed)} GPU(s) "
                         f"(CUDA_VISIBLE_DEVICES={visible}); allowed: indices 0..{len(listed) - 1} among them")
    return ",".join(listed[index] for index in wanted)

