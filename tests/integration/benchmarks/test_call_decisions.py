"""The call-decision benchmark plays correct episodes through the experiment's real environment and calculator (tiny
model, CPU): every turn it scripts is run, the calculator returns the task's own steps, and a choice is read at the
start of every turn."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_pipe.benchmarks.call_decisions import correct_turns, main
from grpo_pipe.data.arithmetic import steps
from tests.conftest import TINY


def test_correct_episodes_are_played_through_the_environment_and_read_at_every_turn(tmp_path: Path) -> None:
    out = tmp_path / "decisions.json"
    assert main(["--tasks", "2", "--lead-in", "Now {left}. ", "--restate-answer", "--json", str(out), *TINY,
                 "experiment=calculator_restated"]) == 0
    found = json.loads(out.read_text())
    assert found["cut"] == []
    assert sorted(found["figures"]) == ["terms_3", "terms_4", "terms_5"]  # held out: 3, 4 and 5 terms
    for length, row in found["figures"].items():
        operations = int(length.removeprefix("terms_")) - 1
        assert sorted(row) == sorted(["mass", *(f"left_{k}" for k in range(operations + 1))])
        assert all(0.0 <= value <= 1.0 for value in row.values())
    for length, episode in found["episodes"].items():
        scripted = correct_turns(episode["question"], "calculator", "Now {left}. ", restate_answer=True)
        said = [t["text"] for t in episode["turns"] if t["role"] == "assistant"]
        results = [t["text"] for t in episode["turns"] if t["role"] == "tool"]
        assert said == [t.text for t in scripted], length
        # The real calculator returned the task's own steps, which the script carried into its next calls.
        pieces = episode["question"].removeprefix("Calculate ").rstrip(".").split()
        assert results == [str(v) for v in steps([int(n) for n in pieces[0::2]], pieces[1::2])], length
