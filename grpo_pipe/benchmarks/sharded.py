"""Benchmark: the sharded trainer (`trainer=fsdp`) at several world sizes on the same batches, in one run.

    python -m grpo_pipe.benchmarks.sharded --world-sizes 1,2 --steps 6 --prompts 16 --samples 8 \\
        --prompt-tokens 128 --completion-tokens 384 model=random_architecture model.arch=qwen2.5-1.5b

Every world size trains the same seeded batches (random tokens in the model's vocabulary, rewards 0/1, the
engine's log-probs set near a random-init model's own so importance weights stay near 1) at the same
global batch, from the same starting weights. Printed per world size: the median trainer step (what the
runner records as `time/train_s`, the first step left out as warm-up) and its speed-up over the first
world size, and the loss of the first steps beside the first world size's. Then the last world size
writes the checkpoint the runner writes (`trainer.save_sharded`: each rank its own shards; the write is timed),
trains one more step, and the first world size (or `--resume-at`) resumes from that folder and trains the same
step: the two losses are printed. With one world size, `--resume-at` names the other.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from grpo_pipe.config.sources import CONF_DIR
from grpo_pipe.interfaces import Trainer
from grpo_pipe.runtime.undertaker import fate_shared
from grpo_pipe.types import Completion, RequestTelemetry, RolloutGroup, Task

LOSS_STEPS = 5  # losses compared across world sizes


def batches(count: int, prompts: int, samples: int, prompt_tokens: int, completion_tokens: int,
            vocab: int, seed: int = 0) -> list[tuple[list[RolloutGroup], list[float]]]:
    """`count` seeded training batches of `prompts` groups x `samples` completions, every group with signal."""
    gen = torch.Generator().manual_seed(seed)
    sampled = -math.log(vocab)  # a random-init model's log-prob of any token
    telemetry = RequestTelemetry(prompt_tokens=prompt_tokens, generated_tokens=completion_tokens, cached_prompt_tokens=0)
    out = []
    for _ in range(count):
        groups, rewards = [], []
        for p in range(prompts):
            prompt = tuple(torch.randint(10, vocab, (prompt_tokens,), generator=gen).tolist())
            completions = tuple(
                Completion(token_ids=tuple(torch.randint(10, vocab, (completion_tokens,), generator=gen).tolist()),
                           logprobs=(sampled,) * completion_tokens, text="", finish_reason="stop", policy_version=0,
                           telemetry=telemetry)
                for _ in range(samples)
            )
            groups.append(RolloutGroup(Task(uid=str(p), question="q", answer="1"), prompt, completions))
            rewards += [float(i % 2) for i in range(samples)]  # half right in every group: all carry signal
        out.append((groups, rewards))
    return out


def trainer_for(overrides: list[str], world_size: int) -> tuple[Any, int]:
    """The configured sharded trainer at `world_size`, set up on the configured model, and the model's vocabulary size."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, "trainer=fsdp", f"trainer.world_size={world_size}", "logger=none"])
    model = instantiate(cfg.model, _convert_="all")
    path = model.materialize()
    trainer = instantiate(cfg.trainer, _convert_="all")  # its policy, loss and optimizer with it, as configured
    tokenizer = model.tokenizer()
    trainer.setup(path, torch.device("cpu"), pad_id=tokenizer.pad_token_id or 0)
    return trainer, len(tokenizer)


def train(trainer: Trainer, work: list[tuple[list[RolloutGroup], list[float]]]) -> tuple[list[float], list[float], list[float]]:
    """Step times (wall clock of `trainer.step`), losses and global grad norms. The GRPO loss of a batch whose groups
    are half right is a near-cancelling sum, so its relative difference across world sizes says little; the grad norm
    does not cancel."""
    times, losses, norms = [], [], []
    for groups, rewards in work:
        started = time.perf_counter()
        metrics = trainer.step(groups, rewards, 1.0)
        times.append(time.perf_counter() - started)
        losses.append(float(metrics["train/loss"]))
        norms.append(float(metrics["train/grad_norm"]))
    return times, losses, norms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", default="1,2", help="the first is the baseline")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--completion-tokens", type=int, default=384)
    parser.add_argument("--resume-at", type=int, default=None,
                        help="the world size that resumes the last one's checkpoint; default: the first")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("overrides", nargs="*", help="config overrides (model, policy, loss, trainer settings)")
    args = parser.parse_args()
    import ray

    sizes = [int(s) for s in args.world_sizes.split(",")]
    # The undertaker stops Ray's processes if this one is killed (its agents would outlive it a minute).
    fate_shared(lambda: ray.init(address="local", num_cpus=2 * max(sizes) + 2, include_dashboard=False,
                                 _node_ip_address="127.0.0.1"))
    rows: list[dict[str, Any]] = []
    work: list[tuple[list[RolloutGroup], list[float]]] = []
    with tempfile.TemporaryDirectory(prefix="grpo_pipe-sharded-bench-") as scratch:
        checkpoint = Path(scratch) / "trainer"
        resume_at = args.resume_at or (sizes[0] if len(sizes) > 1 else None)
        for index, size in enumerate(sizes):
            trainer, vocab = trainer_for(args.overrides, size)
            if not work:
                work = batches(args.steps + 1, args.prompts, args.samples, args.prompt_tokens, args.completion_tokens, vocab)
            try:
                times, losses, norms = train(trainer, work[: args.steps])
                row = {"world_size": size, "step_s": statistics.median(times[1:] or times), "steps_s": times,
                       "losses": losses, "grad_norms": norms}
                if index == len(sizes) - 1 and resume_at is not None:  # the runner's checkpoint, one step past it
                    started = time.perf_counter()
                    trainer.save_sharded(checkpoint)
                    row["checkpoint_write_s"] = time.perf_counter() - started
                    row["next_loss"] = train(trainer, work[args.steps :])[1][0]
            finally:
                trainer.close()
            row["speed_up"] = rows[0]["step_s"] / row["step_s"] if rows else 1.0
            first = rows[0] if rows else row
            row["loss_abs_diff"] = max(abs(a - b) for a, b in zip(losses[:LOSS_STEPS], first["losses"][:LOSS_STEPS]))
            row["grad_norm_rel_diff"] = max(abs(a - b) / max(abs(b), 1e-12) for a, b in
                                            zip(norms[:LOSS_STEPS], first["grad_norms"][:LOSS_STEPS]))
            rows.append(row)
            print(format_row(row), flush=True)
        if resume_at is not None:
            resumed, _ = trainer_for(args.overrides, resume_at)
            try:
                started = time.perf_counter()
                resumed.load_sharded(checkpoint)
                read_s = time.perf_counter() - started
                again = train(resumed, work[args.steps :])[1][0]
            finally:
                resumed.close()
            want = rows[-1]["next_loss"]
            print(f"checkpoint written at world size {sizes[-1]} after step {args.steps} in "
                  f"{rows[-1]['checkpoint_write_s']:.1f} s ({folder_gb(checkpoint):.1f} GB), read at world size "
                  f"{resume_at} in {read_s:.1f} s: next step's loss {again:.6g} vs {want:.6g} at world size {sizes[-1]} "
                  f"(relative difference {abs(again - want) / max(abs(want), 1e-12):.2e})", flush=True)
            rows[-1] |= {"resumed_loss": again, "resumed_at": resume_at, "checkpoint_read_s": read_s}
    ray.shutdown()
    if args.json:
        args.json.write_text(json.dumps({"overrides": args.overrides, "args": vars(args) | {"json": str(args.json)},
                                         "rows": rows}, indent=2, default=str))


def folder_gb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e9


def format_row(row: dict[str, Any]) -> str:
    return (f"world_size={row['world_size']}  trainer step {row['step_s']:.3f} s (median)  speed-up vs first "
            f"{row['speed_up']:.2f}x\n    losses " + ", ".join(f"{x:.6g}" for x in row["losses"][:LOSS_STEPS])
            + f"  (largest absolute difference from the first world size {row['loss_abs_diff']:.2e})\n    grad norms "
            + ", ".join(f"{x:.6g}" for x in row["grad_norms"][:LOSS_STEPS])
            + f"  (largest relative difference from the first world size {row['grad_norm_rel_diff']:.2e})")


if __name__ == "__main__":
    main()
