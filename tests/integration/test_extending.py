"""The examples of docs/extending.md, copied verbatim into a fresh folder outside the repository (a package
and ./conf/), found from that folder as the user's own options, and trained with for a short job; the tool's built, its
rules in the one error list."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from grpo_pipe.config.errors import ConfigError
from grpo_pipe.interfaces import PolicyLoss
from grpo_pipe.runner.pipeline import JobContext, build, run
from tests.conftest import REPO

FILE_BLOCK = re.compile(r"```(?:python|yaml)\n# (\S+)\n(.*?)```", re.S)


def _write_examples(root: Path) -> dict[str, Path]:
    """Every block of docs/extending.md that opens with `# <path>`, written under `root`."""
    section = (REPO / "docs" / "extending.md").read_text()
    written = {}
    for relative, body in FILE_BLOCK.findall(section):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        written[relative] = path
    (root / "my_ext" / "__init__.py").touch()
    return written


def test_readme_reward_bridge_and_loss_train_a_job(compose_cfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = _write_examples(tmp_path / "ext")
    assert set(written) == {
        "my_ext/short_and_right.py", "conf/reward/short_and_right.yaml",
        "my_ext/half_reload.py", "conf/weight_bridge/half_reload.yaml",
        "my_ext/plain_pg.py", "conf/loss/plain_pg.yaml", "my_ext/dice.py", "conf/environment/dice.yaml",
    }
    monkeypatch.syspath_prepend(str(tmp_path / "ext"))
    monkeypatch.chdir(tmp_path / "ext")  # as the page runs it: ./conf beside the user, no flag
    cfg = compose_cfg(["reward=short_and_right", "weight_bridge=half_reload", "loss=plain_pg", "trainer.steps=2"])
    parts = build(cfg)
    assert type(parts.reward).__name__ == "ShortAndRight" and type(parts.weight_bridge).__name__ == "HalfReloadBridge"
    assert type(parts.trainer.loss).__name__ == "PlainPolicyGradient" and isinstance(parts.trainer.loss, PolicyLoss)
    result = run(cfg, JobContext(output_dir=tmp_path / "run", run_name="extending"))
    assert len(result.rewards) == 2
    logged = _logged(tmp_path, result.run_id)
    assert {"train/reward/length", "train/reward/correctness", "sync/total_s", "train/loss"} <= logged


def _logged(tmp_path: Path, run_id: str | None) -> set[str]:
    from mlflow.tracking import MlflowClient

    assert run_id is not None
    return set(MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db").get_run(run_id).data.metrics)


def test_the_tool_example_builds_and_its_rules_are_in_the_one_error_list(compose_cfg, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    _write_examples(tmp_path / "ext")
    for name in [n for n in sys.modules if n == "my_ext" or n.startswith("my_ext.")]:
        monkeypatch.delitem(sys.modules, name)  # this folder's package, not one an earlier test imported
    monkeypatch.syspath_prepend(str(tmp_path / "ext"))
    monkeypatch.chdir(tmp_path / "ext")
    parts = build(compose_cfg(["environment=dice"]))
    tools = parts.environment.tools  # type: ignore[attr-defined]
    assert [tool.name for tool in tools] == ["Dice"] and tools[0].parameters == ["count"]
    with pytest.raises(ConfigError) as err:
        build(compose_cfg(["environment=dice", "environment.tool_options.Dice.sides=1"]))
    assert err.value.problems == ["environment.tool_options.Dice.sides=1: must be >= 2"]
