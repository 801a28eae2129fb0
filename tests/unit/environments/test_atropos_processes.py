"""What the run tells each Atropos environment process, and the evaluations they write read back once per change
(the real processes and API server: tests/integration/environments/test_atropos_api.py)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from grpo_pipe.environments.atropos_processes import EnvironmentEvaluations, EnvironmentProcesses


def _write(folder: Path, metrics: dict, stamp_ns: int, samples: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / "metrics.json"
    report.write_text(json.dumps({"config_general": {}, "results": {"atropos|sums|0": metrics, "all": metrics}}))
    os.utime(report, ns=(stamp_ns, stamp_ns))  # each write its own modification time, whatever the clock's grain
    if samples:
        (folder / "samples.jsonl").write_text('{"question": "1+1"}\n')


def test_each_process_is_told_where_to_write_its_evaluations(tmp_path: Path) -> None:
    processes = EnvironmentProcesses(commands=[["env_a.py", "serve"], ["env_b.py", "serve"]], connection=["--env.x=1"],
                                     log_dir=tmp_path)
    assert processes.command(1)[1:] == ["env_b.py", "serve", "--env.x=1",
                                        f"--env.data_dir_to_save_evals={tmp_path / 'evaluations' / '1'}"]


def test_a_suggested_setting_is_added_unless_the_command_or_its_config_file_sets_it(tmp_path: Path) -> None:
    own = tmp_path / "mine.yaml"
    own.write_text("env:\n  max_batches_offpolicy: 4\n")
    commands = [["a.py", "serve"], ["b.py", "serve", "--env.max_batches_offpolicy", "5"],
                ["c.py", "serve", "--env.max_batches_offpolicy=6"], ["d.py", "serve", "--config", str(own)]]
    processes = EnvironmentProcesses(commands=commands, connection=["--env.x=1"], log_dir=tmp_path,
                                     defaults={"env.max_batches_offpolicy": "2"})
    assert "--env.max_batches_offpolicy=2" in processes.command(0)
    for index in (1, 2, 3):
        assert "--env.max_batches_offpolicy=2" not in processes.command(index), commands[index]


def test_evaluations_are_read_once_per_change_and_a_broken_one_is_skipped(tmp_path: Path, caplog) -> None:
    first, second = tmp_path / "0", tmp_path / "1"
    evaluations = EnvironmentEvaluations([first, second])
    assert evaluations.take() == ({}, [])  # nothing written yet
    _write(first, {"accuracy": 0.25, "n": 8, "note": "text is not a metric", "flag": True}, 1_000, samples=True)
    assert evaluations.take() == ({"env_eval/0/accuracy": 0.25, "env_eval/0/n": 8.0},
                                  [first / "metrics.json", first / "samples.jsonl"])
    assert evaluations.take() == ({}, [])  # unchanged: not logged twice
    _write(first, {"accuracy": 0.5}, 2_000)
    second.mkdir()
    (second / "metrics.json").write_text("{not json")
    with caplog.at_level(logging.WARNING):
        metrics, files = evaluations.take()
    assert metrics == {"env_eval/0/accuracy": 0.5} and files[0] == first / "metrics.json"
    assert "environment 1's evaluation" in caplog.text and "does not parse" in caplog.text


def test_the_token_reaches_a_process_in_a_file_for_its_owner_not_on_its_command_line(tmp_path: Path) -> None:
    processes = EnvironmentProcesses(commands=[["env_a.py", "serve"]], connection=["--env.x=1"], log_dir=tmp_path,
                                     secrets={"openai.api_key": "s3cret"})
    command = processes.command(0)
    assert not any("s3cret" in part for part in command)
    config = Path(next(part.removeprefix("--config=") for part in command if part.startswith("--config=")))
    assert json.loads(config.read_text()) == {"openai": {"api_key": "s3cret"}}
    assert config.stat().st_mode & 0o777 == 0o600


def test_the_processes_logs_which_print_the_token_are_for_the_runs_user_alone(tmp_path: Path) -> None:
    # atroposlib prints its server settings, api_key included, when an environment starts.
    script = tmp_path / "env.py"
    script.write_text("print('api_key=s3cret')\n")
    folder = tmp_path / "environments"
    processes = EnvironmentProcesses(commands=[[str(script), "serve"]], connection=[], log_dir=folder,
                                     secrets={"openai.api_key": "s3cret"})
    processes.start()
    running = processes.processes[0]
    assert running is not None and running.wait(timeout=120) == 0  # it prints and exits
    log = folder / "environment-0.log"
    assert "s3cret" in log.read_text()
    assert folder.stat().st_mode & 0o777 == 0o700 and log.stat().st_mode & 0o777 == 0o600


def test_a_process_config_file_of_its_own_keeps_its_settings_beside_the_token(tmp_path: Path) -> None:
    own = tmp_path / "mine.yaml"
    own.write_text("env:\n  max_token_length: 512\nopenai:\n  timeout: 30\n")
    processes = EnvironmentProcesses(commands=[["env_a.py", "serve", "--config", str(own), "--env.y=2"]],
                                     connection=[], log_dir=tmp_path, secrets={"openai.api_key": "s3cret"})
    command = processes.command(0)
    assert str(own) not in command and "--env.y=2" in command
    config = Path(next(part.removeprefix("--config=") for part in command if part.startswith("--config=")))
    assert json.loads(config.read_text()) == {"env": {"max_token_length": 512},
                                              "openai": {"timeout": 30, "api_key": "s3cret"}}
