"""What a job hands back to its caller (a sweeper, a test, a benchmark): `RunResult`, made by the recipe at the end of
training, or by the pipeline alone for a run whose checkpoint shows it finished already.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpo_pipe.types import Ledger


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """What a finished (or stopped) run hands back to its caller.

    Args:
        run_id: The tracked run's id; None where the tracker keeps no runs.
        rewards: The mean reward of each step.
        final_eval: The metrics of the held-out evaluation at the end.
        ledger: Where every generated group went: trained, dropped, or in flight at the end.
        summary: The end-of-run metrics (eval, reward quarters, overlap, loop time).
        stopped_by: The signal that stopped the run early (a checkpoint was written); None: it ran to the end.
        objective: `run.objective` at the end (NaN when the run did not log it): for a sweeper.
        resume_dir: What `resume=` takes to continue this run: the folder holding its checkpoints.
    """

    run_id: str | None
    rewards: list[float]
    final_eval: dict[str, float]
    ledger: Ledger
    summary: dict[str, float]
    stopped_by: str | None = None
    objective: float = float("nan")
    resume_dir: Path | None = None
