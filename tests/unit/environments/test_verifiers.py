"""environment=verifiers's own rules, checked before anything loads: the verifiers environment's Python must exist and
have verifiers 0.4 (the run's own cannot: their pins clash); `renderer` is checked there too (tests/integration). The
rest is environment=atropos's, tested there."""

from __future__ import annotations

import json
import sys

from grpo_pipe.environments.verifiers import VerifiersWorkers


def test_a_missing_interpreter_is_named_with_how_to_make_one(tmp_path) -> None:
    missing = str(tmp_path / "nothing" / "python")
    assert VerifiersWorkers(name="t", python=missing).config_problems() == [
        f"python={missing!r}: no such interpreter; the verifiers environment needs a Python of its own with "
        "verifiers 0.4 installed (the pin: grpo_pipe's `verifiers` extra; .ci/setup.sh makes .venv-verifiers)"]


def test_an_interpreter_without_verifiers_is_refused() -> None:
    problems = VerifiersWorkers(name="t", python=sys.executable).config_problems()
    assert problems == [f"python={sys.executable!r}: has no verifiers installed "
                        "(pip install verifiers==0.4.0 there)"]


def test_each_worker_gets_the_environment_and_a_seed_of_its_own() -> None:
    environment = VerifiersWorkers(name="t", args={"agent": {"harness": {"id": "h"}}}, processes=2)
    assert [c[1:] for c in environment._base] == [
        ["--vf.name=t", '--vf.args={"agent": {"harness": {"id": "h"}}}', f"--vf.seed={i}"] for i in range(2)]


def test_a_renderer_reaches_every_worker_as_verifiers_config_a_bare_name_as_its_name() -> None:
    environment = VerifiersWorkers(name="t", renderer="qwen3", processes=2)
    assert [c[1:] for c in environment._base] == [
        ["--vf.name=t", "--vf.args={}", '--vf.renderer={"name": "qwen3"}', f"--vf.seed={i}"] for i in range(2)]
    custom = {"name": "custom", "import_path": "my_renderers.Mine"}
    assert VerifiersWorkers(name="t", renderer=custom)._base[0][3] == f"--vf.renderer={json.dumps(custom)}"
