"""Chaos: one job SIGKILLed (what the out-of-memory killer sends) at N moments drawn at random among its phases,
resumed each time with the command it printed, then checked as a whole.

    python -m grpo_pipe.benchmarks.chaos --kills 10 --seed 0 --steps 30 --out chaos/ -- \\
        debug=tiny environment=tools rollout_scheduler.max_staleness=1 trainer.steps=30 checkpoint.every=1 \\
        environment.max_turns=2 environment.max_episode_tokens=96 environment.tool_timeout_s=600 \\
        'environment.tools=[grpo_pipe.benchmarks.chaos:calculator]' \\
        environment.call_format._target_=tests.fixtures.call_formats.EveryTurnCalls

Each kill picks a phase (generation, a tool call, the reward, the update, a weight sync, a checkpoint write; in rounds
that each hold every phase once, in random order) and a step two or three after the last checkpoint, holds the job
there (`runtime.halt`: no timing window, the job is inside that phase when it dies) and SIGKILLs its main process only,
as the kernel would. The next attempt runs the
command the last checkpoint's log line printed (`continue with: python -m grpo_pipe resume=...`), its own output in
`--out`. After the last attempt has run to the end, the checks:

- every step trained exactly once: `policy/version` is logged once for each step 1..N and equals the step;
- the reward curve and the MLflow run continue: one run for all attempts, FINISHED, `train/reward/mean` once per step,
  the last checkpoint's reward curve N long;
- the ledger balances: `ledger/balanced` = 1 and `ledger/repeated` = 0 at every step, and the last checkpoint's record
  holds every group of every batch trained or dropped, none in flight, as many trained as the ledger counts;
- no process of the run alive after its end: every process below a killed job gone within a minute of the kill;
- no file outside the run's folder changed: sizes and times of every file under `--watch` (the current folder's
  `outputs/` and the model cache by default) the same before and after.

The tool phase needs a tool that holds: `grpo_pipe.benchmarks.chaos:calculator` is the shipped calculator, held at its
n-th call of an attempt when asked (`tool@n`); the tiny random model writes no call of its own, hence the test call
format that reads every turn as one. Prints one JSON line per attempt and the checks at the end; exit status 1 when a
check fails.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_pipe.benchmarks.job_processes import kill_left, start_job, still_alive, wait_held_or_ended
from grpo_pipe.environments.tools.calculator import Calculator
from grpo_pipe.rollout.ledger import IN_FLIGHT, TRAINED
from grpo_pipe.runtime.env import cache_dir
from grpo_pipe.runtime.halt import halt_point

PHASES = ("generation", "tool", "reward", "update", "sync", "checkpoint")
CONTINUE = re.compile(r"continue with: python -m grpo_pipe (resume=\S+)")
ATTEMPT_TIMEOUT_S = 1800.0  # an attempt that neither holds nor ends in this long is a hang, reported as such

_calculator = Calculator()
_calls = itertools.count(1)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers, + - * / // % ** and parentheses.
    """
    halt_point("tool", next(_calls))  # the chaos driver's kill point: the n-th call of this process
    return _calculator(expression)


@dataclass(kw_only=True)
class Attempt:
    """One start of the job, and how it ended.

    Args:
        number: The attempt's number, from 1.
        command: The command line it ran.
        point: Where it was held and killed; None: left to run to its end.
        killed: Whether it was SIGKILLed at `point`.
        returncode: The main process's exit status, once it ended.
        resumed_from: The checkpoint folder it continued from; None: a fresh start.
        left_alive: Processes below it still running after its end.
    """

    number: int
    command: list[str]
    point: str | None
    killed: bool = False
    returncode: int | None = None
    resumed_from: str | None = None
    left_alive: list[str] = field(default_factory=list)


class ChaosRun:
    """One job under `folder`: its run folder, MLflow store and artifacts, and one folder per attempt.

    Args:
        folder: Where the job's run folder, MLflow store, artifacts and attempts go.
        overrides: The job's Hydra overrides (the run folder and MLflow locations are added to them).
        cwd: The working directory the job runs in; None: this process's.
    """

    def __init__(self, folder: Path, overrides: Sequence[str], cwd: Path | None = None) -> None:
        self.folder = folder.resolve()
        self.run_dir = self.folder / "run"
        self.store = self.folder / "mlflow.db"
        self.cwd = cwd
        self.overrides = [*overrides, f"hydra.run.dir={self.run_dir}", f"logger.tracking_uri=sqlite:///{self.store}",
                          f"logger.artifact_location={self.folder / 'artifacts'}"]
        self.attempts: list[Attempt] = []

    def attempt(self, point: str | None) -> Attempt:
        """Start the job (resumed with the command the last attempt printed), held and SIGKILLed at `point`, or run
        to its end when `point` is None."""
        number = len(self.attempts) + 1
        folder = self.folder / f"attempt-{number}"
        resume = self.printed_resume()
        arguments = self.overrides if resume is None else [resume, f"hydra.run.dir={folder / 'run'}"]
        job = start_job(arguments, folder, halt_at=point, cwd=self.cwd)
        attempt = Attempt(number=number, command=["python", "-m", "grpo_pipe", *arguments], point=point, resumed_from=resume)
        self.attempts.append(attempt)
        processes = []
        try:
            held = point is not None and wait_held_or_ended(job, ATTEMPT_TIMEOUT_S)
            processes = job.processes()
            if held:
                job.proc.kill()  # SIGKILL to the main process alone, as the kernel's out-of-memory killer sends it
                attempt.killed = True
            attempt.returncode = job.proc.wait(timeout=None if held else ATTEMPT_TIMEOUT_S)
        finally:
            if job.proc.poll() is None:
                job.proc.kill()
                job.proc.wait()
        attempt.left_alive = still_alive(processes)
        kill_left(processes)
        return attempt

    def printed_resume(self) -> str | None:
        """`resume=...` from the newest `continue with:` line any attempt printed."""
        for attempt in reversed(self.attempts):
            found = CONTINUE.findall((self.folder / f"attempt-{attempt.number}" / "job.log").read_text(errors="replace"))
            if found:
                return found[-1]
        return None

    def last_checkpoint_step(self) -> int:
        found = sorted((self.run_dir / "checkpoints").glob("step-*"))
        return int(found[-1].name.removeprefix("step-")) if found else 0

    def last_checkpoint(self) -> dict[str, Any]:
        found = sorted((self.run_dir / "checkpoints").glob("step-*"))
        return json.loads((found[-1] / "loop.json").read_text()) if found else {}


def pick_point(rng: random.Random, phase: str, last_checkpoint: int, steps: int) -> str:
    """The moment to kill `phase`: two or three steps past the last checkpoint (every kill leaves the run a step
    further), or for a tool call its n-th call in the attempt."""
    if phase == "tool":
        return f"tool@{rng.randint(1, 60)}"
    return f"{phase}@{min(last_checkpoint + rng.choice((2, 3)), steps)}"  # a sync is numbered by the version it pushes


def phase_order(rng: random.Random, kills: int) -> list[str]:
    """`kills` phases in rounds, each round every phase once in a random order, so ten kills meet all six phases.
    The first is never a tool call: the first calls are the untrained model's evaluation, and a run killed before
    its first checkpoint has nothing to resume."""
    order: list[str] = []
    while len(order) < kills:
        round_ = list(PHASES)
        rng.shuffle(round_)
        order += round_
    if order[0] == "tool":
        order[0], order[1] = order[1], order[0]
    return order[:kills]


def files_under(roots: Sequence[Path], skip: Path) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime ns) of every file under `roots`, those under `skip` left out."""
    found = {}
    for root in roots:
        for path in root.rglob("*") if root.is_dir() else []:
            if path.is_file() and skip not in path.parents:
                stat = path.stat()
                found[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return found


def checks(run: ChaosRun, steps: int) -> dict[str, list[str]]:
    """Each check of the module's description -> what failed (empty: passed)."""
    from mlflow.tracking import MlflowClient

    failures: dict[str, list[str]] = {name: [] for name in (
        "every step trained exactly once", "reward curve and MLflow run continue", "ledger balances",
        "no process left alive", "last attempt finished")}
    last = run.attempts[-1]
    if last.killed or last.returncode != 0:
        failures["last attempt finished"].append(f"attempt {last.number}: killed={last.killed} rc={last.returncode}")
    for attempt in run.attempts:
        failures["no process left alive"] += [f"attempt {attempt.number}: {p}" for p in attempt.left_alive]
    client = MlflowClient(tracking_uri=f"sqlite:///{run.store}")
    experiment = client.get_experiment_by_name("grpo_pipe")
    runs = [] if experiment is None else client.search_runs([experiment.experiment_id])
    continued = failures["reward curve and MLflow run continue"]
    if len(runs) != 1:
        continued.append(f"{len(runs)} MLflow runs, expected one for all attempts")
        return failures
    record = runs[0]
    if record.info.status != "FINISHED":
        continued.append(f"the MLflow run is {record.info.status}")
    history = {key: client.get_metric_history(record.info.run_id, key)
               for key in ("policy/version", "train/reward/mean", "ledger/balanced", "ledger/repeated", "ledger/trained")}
    wanted = list(range(1, steps + 1))
    versions = sorted((m.step, m.value) for m in history["policy/version"])
    if versions != [(s, float(s)) for s in wanted]:
        failures["every step trained exactly once"].append(f"policy/version by step: {versions}")
    rewards = sorted(m.step for m in history["train/reward/mean"])
    if rewards != wanted:
        continued.append(f"train/reward/mean logged at steps {rewards}")
    loop = run.last_checkpoint()
    if len(loop.get("step_rewards", [])) != steps:
        continued.append(f"the last checkpoint's reward curve has {len(loop.get('step_rewards', []))} steps")
    ledger = failures["ledger balances"]
    ledger += [f"ledger/balanced=0 at step {m.step}" for m in history["ledger/balanced"] if m.value != 1.0]
    ledger += [f"ledger/repeated={m.value:g} at step {m.step}" for m in history["ledger/repeated"] if m.value != 0.0]
    groups = loop.get("scheduler", {}).get("groups", {})
    outcomes = "".join(groups.values())
    if IN_FLIGHT in outcomes:
        ledger.append(f"groups still in flight at the end: {[b for b, r in groups.items() if IN_FLIGHT in r]}")
    if sorted(map(int, groups)) != list(range(1, len(groups) + 1)):
        ledger.append(f"batches recorded: {sorted(map(int, groups))}")
    trained = loop.get("scheduler", {}).get("ledger", {}).get("trained")
    if outcomes.count(TRAINED) != trained:
        ledger.append(f"{outcomes.count(TRAINED)} groups recorded trained, the ledger counts {trained}")
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, required=True, help="the job's trainer.steps (also given as an override)")
    parser.add_argument("--out", type=Path, required=True, help="the run's folder: run, MLflow store, attempts")
    parser.add_argument("--watch", type=Path, nargs="*", default=None,
                        help="folders whose files must not change (default: ./outputs and the model cache)")
    parser.add_argument("overrides", nargs="*", help="the job's config overrides")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    run = ChaosRun(args.out, args.overrides)
    watch = args.watch if args.watch is not None else [Path("outputs").resolve(), cache_dir()]
    before = files_under(watch, skip=run.folder)
    for phase in phase_order(rng, args.kills):
        if run.last_checkpoint_step() >= args.steps:
            break
        point = pick_point(rng, phase, run.last_checkpoint_step(), args.steps)
        attempt = run.attempt(point)
        print(json.dumps(asdict(attempt)), flush=True)
        if not attempt.killed:  # the point was never reached: the run ended (finished or failed) on its own
            break
    if not run.attempts or run.attempts[-1].killed:
        print(json.dumps(asdict(run.attempt(None))), flush=True)
    failures = checks(run, args.steps)
    after = files_under(watch, skip=run.folder)
    failures["no file outside the run's folder changed"] = sorted(
        path for path in set(before) | set(after) if before.get(path) != after.get(path))
    kills = sum(a.killed for a in run.attempts)
    print(json.dumps({"kills": kills, "points": [a.point for a in run.attempts if a.killed],
                      "attempts": len(run.attempts), "checks": {k: (v or "pass") for k, v in failures.items()}}, indent=1))
    return 1 if any(failures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
