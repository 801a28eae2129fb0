"""Checkpoints of the whole training state, written so that a kill at any moment loses nothing.

A checkpoint is a folder `step-000012/` holding `trainer.pt` (trainable weights, optimizer, LR
schedule, counters, RNG) or, from a sharded trainer, `trainer/` (each rank's shards, written by the ranks
themselves: a 7B state with AdamW is 91 GB, too much to gather into one process), `loop.json` (step,
curriculum, policy versions, the MLflow run id, eval history) and `config.yaml` (the resolved config it ran
with). It is written under a temporary name, every file fsync'ed, then renamed into place and the parent
folder fsync'ed: a reader sees the old set of checkpoints or the new one, never half of one. The newest
`keep_last` are kept, plus the best by `best_metric`, exported as a Hugging Face folder `best/` that vLLM or
transformers load.

Last into the folder goes `manifest.json`: each file's size and sha256, hashed as it is written (no second
read; the ranks' shards are read back once to hash them). Resuming checks a checkpoint against it, reading
every byte once: `resume=latest` passes over one that fails (a file truncated, altered or missing after the
rename) to the one before; a checkpoint named by `resume=<dir>` that fails is an error. A write that fails
(disk full, file-size limit, I/O error) removes its temporary folder and is reported with the space a
checkpoint needs and the space free.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, cast

import torch
from omegaconf import OmegaConf

from grpo_pipe.checkpoint.manifest import ManifestedFolder, describe, fsync, manifest_problems
from grpo_pipe.config.errors import failed
from grpo_pipe.interfaces.training import ShardedState, Trainer
from grpo_pipe.runtime.halt import halt_point

STEP_PREFIX = "step-"
FILES = ("trainer.pt", "loop.json", "config.yaml")  # what every checkpoint holds, besides its manifest
SHARDS = "trainer"  # a sharded trainer's state: a folder its ranks write, in place of trainer.pt

log = logging.getLogger(__name__)


class CorruptCheckpointError(Exception):
    """A checkpoint whose files do not match its manifest (torn, truncated or changed on disk)."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, file-size limit, I/O error); nothing of it was left behind."""


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint on disk.

    Args:
        path: Its folder (`step-<N>`), holding the files its manifest lists.
    """

    path: Path

    @property
    def step(self) -> int:
        return int(self.path.name.removeprefix(STEP_PREFIX))

    def loop_state(self) -> dict[str, Any]:
        return json.loads((self.path / "loop.json").read_text())

    @property
    def sharded(self) -> bool:
        """Written by a sharded trainer's ranks (`trainer/`) rather than as one `trainer.pt`."""
        return (self.path / SHARDS).is_dir()

    def trainer_state(self) -> dict[str, Any]:
        # Tensors and plain Python types only (see trainer.rng): no pickled objects, so no code runs on load.
        return torch.load(self.path / "trainer.pt", map_location="cpu", weights_only=True)

    def restore_trainer(self, trainer: Trainer) -> None:
        """Put the training state back into `trainer`: shards through its own ranks (at any world size), a
        `trainer.pt` through `load_state_dict` (a sharded trainer spreads it over its ranks)."""
        if not self.sharded:
            trainer.load_state_dict(self.trainer_state())
        elif isinstance(trainer, ShardedState):
            trainer.load_sharded(self.path / SHARDS)
        else:
            raise ValueError(f"{self.path} was written by the sharded trainer's ranks ({SHARDS}/); resume it with "
                             "trainer=fsdp, at any trainer.world_size")

    def config_yaml(self) -> str:
        return (self.path / "config.yaml").read_text()

    def problems(self) -> list[str]:
        """What does not match the manifest, each naming its file; empty when the checkpoint is whole.
        Reads every byte once: done when resuming, never when saving."""
        if not self.sharded:
            return manifest_problems(self.path, FILES)
        found = manifest_problems(self.path, [f for f in FILES if f != "trainer.pt"])
        if not found and not any(p.is_file() for p in (self.path / SHARDS).rglob("*")):
            found.append(f"{self.path / SHARDS} holds no file")
        return found

    def overrides(self) -> list[str]:
        """The command-line overrides of the job that wrote it (older checkpoints: its run's Hydra record)."""
        saved = self.loop_state().get("overrides")
        if saved is not None:
            return list(saved)
        hydra_record = self.path.parent.parent / ".hydra" / "overrides.yaml"
        if hydra_record.exists():
            return [str(o) for o in OmegaConf.to_container(OmegaConf.load(hydra_record)) or []]  # type: ignore[union-attr]
        return []


class CheckpointManager:
    """The `checkpoint` group: when a run's state is written, where, how many are kept, and which one is the best.

    Args:
        every: Steps between checkpoints; 0 = only at the end (and on a clean stop).
        keep_last: Checkpoints kept on disk (the newest); the best export is kept besides them.
        best_metric: The held-out metric whose highest value is exported as `best/` (a Hugging Face folder); None:
            keep no best.
        directory: Where checkpoints go; None: `<run output dir>/checkpoints`.
        on_save_error: A failed write (disk full, ...): `stop` ends the run with its message; `warn` logs it and
            training goes on, so a later checkpoint may succeed once space is freed.
    """

    def __init__(
        self,
        *,
        every: int = 0,
        keep_last: int = 2,
        best_metric: str | None = "eval/accuracy",
        directory: str | None = None,
        on_save_error: Literal["stop", "warn"] = "stop",
    ) -> None:
        self.every = every
        self.keep_last = keep_last
        self.best_metric = best_metric  # higher is better
        self.directory = directory
        self.on_save_error = on_save_error  # "stop" raises CheckpointWriteError
        self.root: Path | None = None
        self.best_value: float | None = None

    def config_problems(self) -> list[str]:
        return failed(
            (self.every >= 0, f"checkpoint.every={self.every}: must be >= 0 (0: only at the end)"),
            (self.keep_last >= 1, f"checkpoint.keep_last={self.keep_last}: must be >= 1"),
            (self.on_save_error in ("stop", "warn"), f"checkpoint.on_save_error={self.on_save_error!r}: allowed: stop, warn"),
        )

    def attach(self, output_dir: Path) -> None:
        """Checkpoints go to `directory`, else `<run output dir>/checkpoints`."""
        self.root = Path(self.directory) if self.directory else output_dir / "checkpoints"
        self.root.mkdir(parents=True, exist_ok=True)

    def resume_in(self, root: Path) -> None:
        """A resumed run keeps writing into the folder it was resumed from: one run, one checkpoint folder."""
        self.root = root

    def set_best(self, value: float | None) -> None:
        """The best value so far, without an export (the untrained baseline, or a resumed run's)."""
        self.best_value = value

    def due(self, step: int, last_step: int) -> bool:
        return step == last_step or (self.every > 0 and step % self.every == 0)

    def save(
        self, step: int, trainer_state: Mapping[str, Any] | ShardedState, loop_state: Mapping[str, Any], config_yaml: str
    ) -> Checkpoint | None:
        """Write one checkpoint atomically and prune old ones. `trainer_state`: the trainer's state, or a trainer
        whose ranks write their own shards into the checkpoint. A write that fails leaves the earlier checkpoints
        as they were and no folder of its own; it raises CheckpointWriteError (on_save_error=stop) or logs it and
        returns None (warn)."""
        root = self._root()
        final = root / f"{STEP_PREFIX}{step:06d}"
        files: ManifestedFolder | None = None
        try:
            files = ManifestedFolder(Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root)))
            if isinstance(trainer_state, ShardedState) and trainer_state.shares_folder(files.folder):
                trainer_state.save_sharded(files.folder / SHARDS)
                files.adopt(SHARDS)
            else:  # a rank on a host that does not see this folder: the state is gathered here instead
                state = trainer_state.state_dict() if isinstance(trainer_state, ShardedState) else dict(trainer_state)
                files.write("trainer.pt", lambda f: torch.save(state, cast(IO[bytes], f)))  # writes, flushes
            halt_point("checkpoint", step)  # (a test's kill point: a torn checkpoint; no-op otherwise)
            files.write("loop.json", lambda f: f.write(json.dumps(loop_state, indent=1, default=_jsonable).encode()))
            files.write("config.yaml", lambda f: f.write(config_yaml.encode()))
            files.write_manifest()  # last: a checkpoint folder holding a manifest is whole
            if final.exists():  # a re-run of the same step after a resume: replace it whole
                shutil.rmtree(final)
            os.rename(files.folder, final)
            fsync(root)
        except BaseException as err:
            if files is not None:
                shutil.rmtree(files.folder, ignore_errors=True)
            # torch.save reports a failed write as a RuntimeError without the errno: the file kept the OSError
            cause = (files.error if files is not None else None) or (err if isinstance(err, OSError) else None)
            if cause is None:
                raise
            self._failed(self._write_failure(final, files, cause), cause)
            return None
        self._prune()
        return Checkpoint(final)

    def consider_best(self, metrics: Mapping[str, float], export: Callable[[Path], None]) -> bool:
        """If `metrics` beat the best so far, call `export(folder)` to write the new `best/` (atomically)."""
        if self.best_metric is None or self.best_metric not in metrics:
            return False
        value = float(metrics[self.best_metric])
        if self.best_value is not None and value <= self.best_value:
            return False
        root = self._root()
        tmp = Path(tempfile.mkdtemp(prefix=".best.", dir=root))
        try:
            export(tmp)
            (tmp / "best.json").write_text(json.dumps({self.best_metric: value}))
            old = root / "best"
            if old.exists():
                shutil.rmtree(old)
            os.rename(tmp, old)
            fsync(root)
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)
            if not isinstance(err, OSError):
                raise
            self._failed(f"best model not exported to {root / 'best'}: {describe(err)}; "
                         f"{shutil.disk_usage(root).free:,} bytes are free on {root}", err)
            return False
        self.best_value = value
        return True

    def latest(self) -> Checkpoint | None:
        found = sorted(p for p in self._root().glob(f"{STEP_PREFIX}*") if p.is_dir())
        return Checkpoint(found[-1]) if found else None

    def _prune(self) -> None:
        found = sorted(p for p in self._root().glob(f"{STEP_PREFIX}*") if p.is_dir())
        for old in found[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        for pattern in (f".{STEP_PREFIX}*", ".best.*"):  # temporaries of a killed writer
            for leftover in self._root().glob(pattern):
                shutil.rmtree(leftover, ignore_errors=True)

    def _failed(self, message: str, cause: OSError) -> None:
        if self.on_save_error == "warn":
            log.warning("%s (checkpoint.on_save_error=warn: training goes on)", message)
            return
        raise CheckpointWriteError(message) from cause

    def _write_failure(self, final: Path, files: ManifestedFolder | None, err: OSError) -> str:
        """What failed, where, after how many bytes; what a checkpoint needs and what is free; how to go on."""
        root = final.parent
        written = files.written if files is not None else 0
        where = f"{files.current} for {final}" if files is not None and files.current else str(final)
        previous = self.latest()
        if previous is not None:
            size = sum(p.stat().st_size for p in previous.path.rglob("*") if p.is_file())
            need = f"a checkpoint takes about {size:,} bytes (the previous one)"
            run_dir = root.parent if root.name == "checkpoints" else root  # what resume= takes (either works)
            keep = (f"the previous checkpoint {previous.path} is intact; free space, then continue with: "
                    f"python -m grpo_pipe resume={run_dir}")
        else:
            need, keep = f"a checkpoint takes more than the {written:,} bytes written", "no earlier checkpoint exists"
        return (f"checkpoint not written: writing {where} failed after {written:,} bytes ({describe(err)}); {need}, "
                f"{shutil.disk_usage(root).free:,} bytes are free on {root}. Its temporary folder was removed; {keep}")

    def _root(self) -> Path:
        if self.root is None:
            raise RuntimeError("checkpoint manager used before attach()")
        return self.root


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dict__"):
        return vars(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")
