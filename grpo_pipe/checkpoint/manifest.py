"""The files of one checkpoint folder, written with a manifest of their sizes and sha256 digests and checked
against it.

Each file is hashed as it is written (no second read) and fsync'ed; the manifest goes in last, so a folder that
holds one was written whole. Verifying reads every byte once, in chunks, and is done when resuming only. A
failed write keeps its OSError (torch.save would report it as a RuntimeError without the errno) so the caller
can say what failed: disk full, a file-size limit, an I/O error.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"  # {"format": 1, "files": {name: {"size": bytes, "sha256": hex}}}
_CHUNK = 8 << 20  # bytes read at a time when verifying: memory stays flat whatever a file's size


def manifest_problems(folder: Path, required: Sequence[str]) -> list[str]:
    """What in `folder` does not match its manifest, each naming its file; empty when every file matches."""
    manifest = folder / MANIFEST
    try:
        listed = json.loads(manifest.read_text())["files"]
    except FileNotFoundError:
        return [f"{manifest} is missing (a torn folder, or one written before checkpoints had manifests)"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [f"{manifest} is unreadable ({err!r})"]
    found = [f"{folder / name} is not in the manifest" for name in required if name not in listed]
    for name, expected in sorted(listed.items()):
        found.extend(_file_problems(folder / name, expected))
    return found


class HashingFile:
    """A file opened for writing that hashes and counts the bytes written to it, and keeps the first OSError:
    torch.save reports a failed write as a RuntimeError without the errno.

    Args:
        path: The file to create (or truncate) and write, unbuffered.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0
        self.digest = hashlib.sha256()
        self.error: OSError | None = None
        self._file = path.open("wb", buffering=0)

    def write(self, data: bytes) -> int:
        view = memoryview(data).cast("B")
        length = view.nbytes
        try:
            while view:  # a full disk or a size limit may take part of a write and refuse the rest
                taken = self._file.write(view) or 0
                self.digest.update(view[:taken])
                self.size += taken
                view = view[taken:]
        except OSError as err:
            self.error = self.error or err
            raise
        return length

    def flush(self) -> None:
        """Nothing is buffered (torch.save calls it)."""

    def sync(self) -> None:
        try:
            os.fsync(self._file.fileno())
        except OSError as err:  # delayed allocation: a full disk may only show here
            self.error = self.error or err
            raise

    def close(self) -> None:
        self._file.close()


class ManifestedFolder:
    """Writes a checkpoint's files into its temporary folder, each fsync'ed, and the manifest of them last.

    Args:
        folder: The checkpoint's temporary folder, which the files and the manifest are written into.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.listed: dict[str, dict[str, Any]] = {}
        self._open: HashingFile | None = None

    @property
    def current(self) -> str | None:
        """The file being written (when a write fails: the one that failed)."""
        return self._open.path.name if self._open is not None else None

    @property
    def written(self) -> int:
        return sum(f["size"] for f in self.listed.values()) + (self._open.size if self._open is not None else 0)

    @property
    def error(self) -> OSError | None:
        return self._open.error if self._open is not None else None

    def write(self, name: str, fill: Callable[[HashingFile], object]) -> None:
        out = self._open = HashingFile(self.folder / name)
        try:
            fill(out)
            out.sync()
        finally:
            out.close()
        self.listed[name] = {"size": out.size, "sha256": out.digest.hexdigest()}
        self._open = None

    def adopt(self, subfolder: str) -> None:
        """List the files other processes wrote under `subfolder` (a sharded trainer's ranks, each writing its own
        shards): each is read once to hash it, and fsync'ed, as `write` does for its own."""
        root = self.folder / subfolder
        found = sorted(root.rglob("*"))
        for path in (p for p in found if p.is_file()):
            size, digest = _digest(path)
            self.listed[path.relative_to(self.folder).as_posix()] = {"size": size, "sha256": digest}
            fsync(path)
        for folder in [root, *(p for p in found if p.is_dir())]:
            fsync(folder)  # the shards' names

    def write_manifest(self) -> None:
        manifest = json.dumps({"format": 1, "files": self.listed}, indent=1).encode()
        self.write(MANIFEST, lambda f: f.write(manifest))
        fsync(self.folder)  # the files' names, before the folder is renamed into place


def _file_problems(path: Path, expected: Mapping[str, Any]) -> list[str]:
    if not path.is_file():
        return [f"{path} is missing"]
    size = path.stat().st_size
    if size != expected["size"]:
        return [f"{path} has {size:,} bytes, its manifest says {expected['size']:,} (truncated or overwritten)"]
    if _digest(path)[1] != expected["sha256"]:
        return [f"{path} does not match its sha256 in the manifest (its bytes changed on disk)"]
    return []


def _digest(path: Path) -> tuple[int, str]:
    """A file's size and sha256, read in chunks: memory stays flat whatever its size."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def describe(err: OSError) -> str:
    code = errno.errorcode.get(err.errno, str(err.errno)) if err.errno is not None else type(err).__name__
    return f"{code}: {err.strerror or err}"


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
