"""Checkpoints are atomic, verified and pruned; resume refuses a changed config, passes over a torn checkpoint
(resume=latest) or names it (resume=<dir>); a disk that fills up mid-write leaves the previous checkpoint whole.
The pieces by hand; the command meeting them is in tests/integration/checkpoint/test_store.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_pipe.checkpoint.manifest import MANIFEST
from grpo_pipe.checkpoint.resume import config_differences, find_resume_checkpoint
from grpo_pipe.checkpoint.store import FILES, CheckpointManager, CorruptCheckpointError
from tests.checkpoint_files import flip_bytes, train_two_states, truncate, two_checkpoints
from tests.fakes import scored_groups


def _save(manager: CheckpointManager, step: int) -> None:
    manager.save(step, {"w": torch.full((3,), float(step))}, {"step": step}, f"step: {step}\n")


def test_keeps_the_newest_and_loads_what_was_saved(tmp_path) -> None:
    manager = CheckpointManager(every=1, keep_last=2)
    manager.attach(tmp_path)
    for step in (1, 2, 3):
        _save(manager, step)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-000002", "step-000003"]
    latest = manager.latest()
    assert latest.step == 3 and latest.loop_state() == {"step": 3}
    assert torch.equal(latest.trainer_state()["w"], torch.full((3,), 3.0))


def test_a_writer_killed_before_the_rename_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch) -> None:
    manager = CheckpointManager(every=1, keep_last=2)
    manager.attach(tmp_path)
    _save(manager, 1)

    def killed(src, dst):  # the process dies between writing the files and renaming the folder
        raise SystemExit("killed")

    monkeypatch.setattr(os, "rename", killed)
    with pytest.raises(SystemExit):
        _save(manager, 2)
    monkeypatch.undo()
    assert manager.latest().step == 1 and manager.latest().loop_state() == {"step": 1}
    assert find_resume_checkpoint(str(tmp_path), tmp_path.parent).step == 1


def test_a_temporary_left_by_a_hard_kill_is_ignored_and_cleaned(tmp_path) -> None:
    manager = CheckpointManager(every=1, keep_last=2)
    manager.attach(tmp_path)
    _save(manager, 1)
    half = tmp_path / "checkpoints" / ".step-000002.abc"  # what kill -9 mid-write leaves behind
    half.mkdir()
    (half / "trainer.pt").write_bytes(b"truncated")
    assert manager.latest().step == 1
    _save(manager, 2)
    assert not half.exists()


def test_best_is_exported_only_on_improvement(tmp_path) -> None:
    manager = CheckpointManager(best_metric="eval/accuracy")
    manager.attach(tmp_path)
    written = []

    def export(folder: Path) -> None:
        (folder / "weights").write_text(str(len(written)))
        written.append(folder)

    assert manager.consider_best({"eval/accuracy": 0.2}, export)
    assert not manager.consider_best({"eval/accuracy": 0.2}, export)
    assert manager.consider_best({"eval/accuracy": 0.5}, export)
    best = tmp_path / "checkpoints" / "best"
    assert json.loads((best / "best.json").read_text()) == {"eval/accuracy": 0.5}
    assert (best / "weights").read_text() == "1"


def test_config_differences_names_dotted_keys() -> None:
    saved = {"trainer": {"lr": 1e-3, "steps": 3}, "model": {"arch": "a"}}
    current = {"trainer": {"lr": 1e-3, "steps": 5}, "model": {"arch": "b"}, "extra": 1}
    assert config_differences(saved, current) == ["extra", "model.arch", "trainer.steps"]


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        find_resume_checkpoint(str(tmp_path), tmp_path)
    with pytest.raises(FileNotFoundError, match="resume=latest"):
        find_resume_checkpoint("latest", tmp_path)


def test_a_real_trainer_state_loads_with_weights_only_and_restores_every_rng(tmp_path) -> None:
    import random

    import numpy as np

    from grpo_pipe.models.tiny_random import TinyRandomModel
    from grpo_pipe.trainer.grpo import GRPOTrainer
    from grpo_pipe.trainer.policy import FullFinetunePolicy
    from grpo_pipe.trainer.settings import OptimisationSettings

    trainer = GRPOTrainer(policy=FullFinetunePolicy(), steps=3, optimisation=OptimisationSettings(lr=1e-3))
    trainer.setup(TinyRandomModel().materialize(), torch.device("cpu"), pad_id=0)
    trainer.step(*scored_groups(), temperature=1.0)  # optimizer and schedule state that is not all zeros
    manager = CheckpointManager(every=1, keep_last=1)
    manager.attach(tmp_path)
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    saved = manager.save(1, trainer.state_dict(), {"step": 1}, "")
    expected = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    trainer.load_state_dict(saved.trainer_state())  # torch.load(..., weights_only=True) inside
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert [random.random() for _ in range(3)] == expected[2]
    assert set(saved.trainer_state()["rng"]) == {"torch", "cuda", "numpy", "python"}


# -- torn or corrupted checkpoints ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_states() -> list[dict]:
    return train_two_states()


CORRUPTIONS = {  # what is done to the newest checkpoint -> what the message says about it
    "truncated": (truncate, "trainer.pt has"),
    "bytes flipped": (flip_bytes, "trainer.pt does not match its sha256"),
    "file missing": (lambda folder: (folder / "loop.json").unlink(), "loop.json is missing"),
    "manifest missing": (lambda folder: (folder / MANIFEST).unlink(), f"{MANIFEST} is missing"),
}


def test_a_saved_checkpoint_lists_every_file_with_its_size_and_verifies(tmp_path, trained_states) -> None:
    _, second = two_checkpoints(tmp_path, trained_states)
    listed = json.loads((second / MANIFEST).read_text())["files"]
    assert set(listed) == set(FILES)
    assert all(entry["size"] == (second / name).stat().st_size for name, entry in listed.items())
    assert find_resume_checkpoint(str(second), tmp_path).problems() == []


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_resume_latest_passes_over_a_torn_newest_checkpoint_to_the_one_before(
    tmp_path, trained_states, caplog, corruption: str
) -> None:
    corrupt, said = CORRUPTIONS[corruption]
    first, second = two_checkpoints(tmp_path, trained_states)
    corrupt(second)
    with caplog.at_level("WARNING", logger="grpo_pipe.checkpoint.store"):
        found = find_resume_checkpoint("latest", tmp_path)
    assert found.path == first
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"skipping {second}" in warning and said in warning
    params = found.trainer_state()["params"]  # the older state, whole: it loads and is what was saved
    assert params.keys() == trained_states[0]["params"].keys()
    assert all(torch.equal(params[name], tensor) for name, tensor in trained_states[0]["params"].items())


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_resume_of_a_named_folder_that_fails_verification_is_an_error_naming_the_file(
    tmp_path, trained_states, corruption: str
) -> None:
    corrupt, said = CORRUPTIONS[corruption]
    first, second = two_checkpoints(tmp_path, trained_states)
    corrupt(second)
    for named in (second, tmp_path / "run", tmp_path / "run" / "checkpoints"):  # the checkpoint, its run, its folder
        with pytest.raises(CorruptCheckpointError) as raised:
            find_resume_checkpoint(str(named), tmp_path)
        message = str(raised.value)
        assert f"resume={named}: {second} fails verification" in message and said in message
    assert f"the checkpoint before it verifies: resume={first}" in message  # named the run: the way on is offered


def test_resume_latest_with_no_checkpoint_that_verifies_is_an_error(tmp_path, trained_states, caplog) -> None:
    first, second = two_checkpoints(tmp_path, trained_states)
    truncate(first), flip_bytes(second)
    with pytest.raises(CorruptCheckpointError, match="none of the 2 checkpoints"):
        find_resume_checkpoint("latest", tmp_path)
    assert sum("skipping" in r.getMessage() for r in caplog.records) == 2


# -- a disk that fills up during a save -------------------------------------------------------------------------

# Saves step 1, then lowers this process's file-size limit (RLIMIT_FSIZE, enforced by the kernel) below the size
# of step 2's trainer.pt: its write fails part-way with EFBIG, as on a full disk (SIGXFSZ ignored, so the write
# returns an error instead of the signal killing the process).
FILL_UP = """
import resource, signal, sys
from pathlib import Path
import torch
from grpo_pipe.checkpoint.store import CheckpointManager, CheckpointWriteError

manager = CheckpointManager(every=1, keep_last=2, on_save_error=sys.argv[2])
manager.attach(Path(sys.argv[1]))
manager.save(1, {"w": torch.full((1 << 20,), 1.0)}, {"step": 1}, "a: 1\\n")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    saved = manager.save(2, {"w": torch.full((1 << 20,), 2.0)}, {"step": 2}, "a: 1\\n")  # 4 MiB of weights
except CheckpointWriteError as err:
    print(err)
    sys.exit(3)
print("save returned", saved)
"""


@pytest.mark.parametrize("on_save_error", ["stop", "warn"])
def test_a_disk_that_fills_up_mid_write_leaves_the_previous_checkpoint_whole(tmp_path, on_save_error: str) -> None:
    limit = 256 * 1024
    done = subprocess.run([sys.executable, "-c", FILL_UP, str(tmp_path), on_save_error, str(limit)],
                          capture_output=True, text=True, timeout=300)
    checkpoints = tmp_path / "checkpoints"
    failed = checkpoints / "step-000002"
    if on_save_error == "stop":
        assert done.returncode == 3, done.stdout + done.stderr
        message = done.stdout
    else:  # logged, and the caller goes on
        assert done.returncode == 0 and "save returned None" in done.stdout, done.stdout + done.stderr
        message = done.stderr
        assert "checkpoint.on_save_error=warn: training goes on" in message
    assert f"writing trainer.pt for {failed} failed after {limit:,} bytes (EFBIG" in message
    assert "bytes are free on" in message and f"python -m grpo_pipe resume={tmp_path}" in message
    assert [p.name for p in checkpoints.iterdir()] == ["step-000001"]  # no half checkpoint, no temporary
    found = find_resume_checkpoint(str(tmp_path), tmp_path.parent)
    assert found.step == 1 and found.problems() == []
    assert torch.equal(found.trainer_state()["w"], torch.full((1 << 20,), 1.0))


class _RanksWriteTheirShards:
    """A sharded trainer's checkpoint side: each "rank" writes its own file into the folder it is given."""

    def __init__(self, shared: bool = True) -> None:
        self.loaded_from: Path | None = None
        self.shared = shared

    def shares_folder(self, folder: Path) -> bool:
        assert folder.is_dir()  # the checkpoint's temporary folder, made before the ranks are asked
        return self.shared

    def save_sharded(self, folder: Path) -> None:
        (folder / "shards").mkdir(parents=True)
        for rank in (0, 1):
            (folder / "shards" / f"__{rank}_0.distcp").write_bytes(bytes([rank]) * 4096)
        (folder / "counters.pt").write_bytes(b"counters")

    def load_sharded(self, folder: Path) -> None:
        self.loaded_from = folder

    def state_dict(self) -> dict:
        assert not self.shared, "a sharded trainer's state is gathered only where its ranks cannot see the folder"
        return {"version": torch.tensor(7)}


def test_a_sharded_trainers_ranks_write_its_state_into_the_checkpoint_which_lists_and_verifies_every_shard(tmp_path) -> None:
    """At 7B the gathered state (fp32 weights and AdamW, 91 GB) had not been written 3.5 minutes after the last step;
    the ranks now write their own shards into the checkpoint, which the manifest covers like any other file."""
    manager = CheckpointManager(every=1, keep_last=2)
    manager.attach(tmp_path)
    trainer = _RanksWriteTheirShards()
    saved = manager.save(1, trainer, {"step": 1}, "a: 1\n")
    assert saved is not None and saved.sharded and not (saved.path / "trainer.pt").exists()
    listed = json.loads((saved.path / MANIFEST).read_text())["files"]
    assert {"trainer/shards/__0_0.distcp", "trainer/shards/__1_0.distcp", "trainer/counters.pt"} <= set(listed)
    assert saved.problems() == []
    resumed = _RanksWriteTheirShards()
    saved.restore_trainer(resumed)
    assert resumed.loaded_from == saved.path / "trainer"
    shard = saved.path / "trainer" / "shards" / "__1_0.distcp"
    shard.write_bytes(b"\x00" + shard.read_bytes()[1:])  # same size, one byte changed
    assert [p for p in saved.problems() if "__1_0.distcp" in p and "sha256" in p]


def test_a_sharded_checkpoint_resumed_by_a_trainer_that_cannot_read_shards_says_which_can(tmp_path) -> None:
    manager = CheckpointManager(every=1, keep_last=2)
    manager.attach(tmp_path)
    saved = manager.save(1, _RanksWriteTheirShards(), {"step": 1}, "a: 1\n")
    class OneProcessTrainer:
        def load_state_dict(self, state: dict) -> None:
            raise AssertionError("there is no trainer.pt to read")

    with pytest.raises(ValueError, match="trainer=fsdp, at any trainer.world_size"):
        saved.restore_trainer(OneProcessTrainer())


def test_ranks_that_do_not_all_see_the_checkpoint_folder_gather_the_state_into_one_file_instead(tmp_path) -> None:
    """On a cluster without a shared filesystem a rank's shards would land on its own host: the state is gathered."""
    manager = CheckpointManager(every=1, keep_last=2)
    manager.attach(tmp_path)
    saved = manager.save(1, _RanksWriteTheirShards(shared=False), {"step": 1}, "a: 1\n")
    assert saved is not None and not saved.sharded and saved.problems() == []
    assert int(saved.trainer_state()["version"]) == 7
