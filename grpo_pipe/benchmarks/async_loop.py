"""Benchmark: the same training, synchronous (`rollout_scheduler.max_staleness=0`) and async (1, 2), in one run.

Every variant trains the same number of steps on the same number of samples; the figure is the
wall clock of the training loop per step (evaluation excluded) and its ratio to the synchronous one.

    python -m grpo_pipe.benchmarks.async_loop --staleness 0,1,2 --steps 8 [--compare-in-flight] \\
        placement=split weight_bridge=nccl model=tiny_random          # any config overrides follow

`--compare-in-flight` adds each async variant again with `rollout.features.in_flight_updates=false` (a sync
that arrives mid-generation then waits for the running generate call to end).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from grpo_pipe.config.sources import CONF_DIR
from grpo_pipe.runner.pipeline import JobContext, run


def run_variant(overrides: list[str], staleness: int, steps: int, out: Path, in_flight: bool = True) -> dict[str, Any]:
    variant = [f"rollout_scheduler.max_staleness={staleness}", f"trainer.steps={steps}", "logger=none",
               f"rollout.features.in_flight_updates={str(in_flight).lower()}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, *variant])
    name = f"staleness{staleness}" + ("" if in_flight else "-no-in-flight")
    result = run(cfg, JobContext(output_dir=out / name, run_name=f"async-{name}"))
    loop_s = result.summary["summary/loop_s"]
    row = {
        "max_staleness": staleness,
        "in_flight_updates": in_flight,
        "steps": steps,
        "loop_s": loop_s,
        "step_s": loop_s / steps,
        "first_step_s": result.summary["summary/first_step_s"],
        "overlap_fraction": result.summary["summary/overlap_fraction"],
        "engine_idle_fraction": result.summary["summary/engine_idle_fraction"],
        "trainer_idle_fraction": result.summary["summary/trainer_idle_fraction"],
        "in_flight_updated_fraction": result.summary["summary/in_flight_updated_fraction"],
        "groups_trained": result.ledger.trained,
        "groups_dropped": sum(result.ledger.dropped.values()),
        # What the speed costs in learning per step: a stale sample teaches less than a fresh one.
        "reward_per_10_steps": [round(sum(chunk) / len(chunk), 3) for chunk in
                                (result.rewards[i:i + 10] for i in range(0, len(result.rewards), 10))],
        "phases_s": {key.removeprefix("summary/phase/"): value for key, value in result.summary.items()
                     if key.startswith("summary/phase/")},
    }
    return with_unaccounted(row)


def with_unaccounted(row: dict[str, Any]) -> dict[str, Any]:
    """The median step (warm-up step left out) and what its phases' medians leave unexplained (recording the
    step's metrics; medians of parts need not add up exactly). `step_s` (the loop's wall clock per step) also
    carries the first step's warm-up and the loop's own work between steps."""
    phases = dict(row["phases_s"])
    step = phases.pop("step_s", row["step_s"])
    row["median_step_s"] = step
    row["phases_s"]["unaccounted_s"] = step - sum(phases.values())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--staleness", default="0,1,2", help="max_staleness values; the first is the baseline")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--compare-in-flight", action="store_true",
                        help="also run every async variant with rollout.features.in_flight_updates=false")
    parser.add_argument("overrides", nargs="*", help="config overrides, as on the grpo_pipe command line")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # Every in-place reload makes vLLM list the layers it restores itself (rotary cache, tied head).
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="grpo_pipe-async-bench-") as out:
        for staleness in (int(s) for s in args.staleness.split(",")):
            for in_flight in (True, False) if args.compare_in_flight and staleness > 0 else (True,):
                row = run_variant(args.overrides, staleness, args.steps, Path(out), in_flight)
                row["ratio_vs_first"] = rows[0]["step_s"] / row["step_s"] if rows else 1.0
                row["median_ratio_vs_first"] = rows[0]["median_step_s"] / row["median_step_s"] if rows else 1.0
                rows.append(row)
                print(format_row(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"overrides": args.overrides, "rows": rows}, indent=2))


def format_row(row: dict[str, Any]) -> str:
    return (
        f"max_staleness={row['max_staleness']}{'' if row['in_flight_updates'] else ' (in-flight off)'}  "
        f"{row['step_s']:7.2f} s/step  speed-up vs first {row['ratio_vs_first']:.2f}x  "
        f"median step {row['median_step_s']:.2f} s ({row['median_ratio_vs_first']:.2f}x)  "
        f"first step {row['first_step_s']:.1f} s  "
        f"overlap {row['overlap_fraction']:.2f}  engine idle {row['engine_idle_fraction']:.2f}  "
        f"trainer idle {row['trainer_idle_fraction']:.2f}  updated in flight {row['in_flight_updated_fraction']:.2f}  "
        f"trained {row['groups_trained']} dropped {row['groups_dropped']}\n"
        "    median s/step by phase (step = their sum + unaccounted): "
        + ", ".join(f"{name} {value:.2f}" for name, value in row["phases_s"].items())
        + "\n    reward per 10 steps: " + ", ".join(f"{value:.2f}" for value in row["reward_per_10_steps"])
    )


if __name__ == "__main__":
    main()
