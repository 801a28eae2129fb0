"""Benchmark: the trainer alone, on seeded batches of realistic RL sequences, in tokens per second and MFU.

    python -m grpo_pipe.benchmarks.trainer --archs qwen2.5-0.5b,qwen2.5-1.5b --layouts padded,packed
    python -m grpo_pipe.benchmarks.trainer --archs qwen2.5-7b --layouts packed \\
        trainer.precision.dtype=bfloat16 policy.gradient_checkpointing=true     # what fits one card at 7B
    python -m grpo_pipe.benchmarks.trainer --archs qwen3-0.6b --prime-rl           # prime-rl's published shape

Each step is one GRPO batch: `--prompts` groups of `--samples` completions, prompt lengths drawn uniformly from
`--prompt-tokens` (one per group, as the engine sees them) and completion lengths from `--completion-tokens`, random
tokens of the model's vocabulary, half of each group rewarded (every completion has an advantage, so every one is
trained). `--prime-rl` instead gives every step four micro-batches of 16 k tokens (sequences of the same length
distribution), the shape of prime-rl's Qwen3-0.6B full fine-tune benchmark (11% MFU on one H100, published).

The trainer is the configured one (`conf/trainer`, the shipped defaults unless overridden on the command line), on a
random-init model of the named architecture (`model=random_architecture`). The layouts are the shipped packed
micro-batches (`packed`) and the padded ones before them (`padded`: `trainer.batching.packed=false`), measured in the
same run on the same batches. Printed per architecture and layout: the median step (the first `--warm-up` steps
left out), tokens per second (prompt + completion tokens through forward and backward), MFU by the count in
trainer/throughput.py over the card's dense bf16 peak (named), peak memory, and the packed layout's speed-up over
the padded one. `--profile` adds a torch profiler table of one step per architecture and layout.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from grpo_pipe.config.sources import CONF_DIR
from grpo_pipe.trainer.throughput import peak_flops
from grpo_pipe.types import Completion, RequestTelemetry, RolloutGroup, Task

PRIME_RL_TOKENS = 16384  # tokens per micro-batch in prime-rl's published trainer benchmark
PRIME_RL_MICRO_BATCHES = 4


def span(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def rl_batch(*, prompts: int, samples: int, prompt_tokens: tuple[int, int], completion_tokens: tuple[int, int],
             vocab: int, gen: torch.Generator) -> tuple[list[RolloutGroup], list[float]]:
    """One seeded GRPO batch: `prompts` groups of `samples` completions, half of each group rewarded."""
    def length(bounds: tuple[int, int]) -> int:
        return int(torch.randint(bounds[0], bounds[1] + 1, (1,), generator=gen))

    def tokens(count: int) -> tuple[int, ...]:
        return tuple(torch.randint(10, vocab, (count,), generator=gen).tolist())

    sampled = -math.log(vocab)  # a random-init model's log-prob of any token: importance weights near 1
    groups, rewards = [], []
    for p in range(prompts):
        prompt = tokens(length(prompt_tokens))
        completions = []
        for _ in range(samples):
            ids = tokens(length(completion_tokens))
            telemetry = RequestTelemetry(prompt_tokens=len(prompt), generated_tokens=len(ids), cached_prompt_tokens=0)
            completions.append(Completion(token_ids=ids, logprobs=(sampled,) * len(ids), text="", finish_reason="stop",
                                          policy_version=0, telemetry=telemetry))
        groups.append(RolloutGroup(Task(uid=str(p), question="q", answer="1"), prompt, tuple(completions)))
        rewards += [float(i % 2) for i in range(samples)]
    return groups, rewards


def prime_rl_batch(vocab: int, gen: torch.Generator, prompt_tokens: tuple[int, int],
                   completion_tokens: tuple[int, int]) -> tuple[list[RolloutGroup], list[float]]:
    """Groups of 8 until four 16 k-token micro-batches are full (the last group may run over by a few sequences)."""
    groups, rewards, total = [], [], 0
    while total < PRIME_RL_TOKENS * PRIME_RL_MICRO_BATCHES:
        more, more_rewards = rl_batch(prompts=1, samples=8, prompt_tokens=prompt_tokens,
                                      completion_tokens=completion_tokens, vocab=vocab, gen=gen)
        groups += more
        rewards += more_rewards
        total += sum(len(more[0].prompt_token_ids) + len(c.token_ids) for c in more[0].completions)
    return groups, rewards


def build_trainer(arch: str, layout: str, overrides: list[str]) -> tuple[Any, int]:
    """The configured trainer on a random-init `arch` (`tiny`: the test model), set up on the first GPU (or the CPU),
    and the vocabulary size."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        model_choice = ["model=tiny_random"] if arch == "tiny" else ["model=random_architecture", f"model.arch={arch}"]
        cfg = compose("config", overrides=[*model_choice, "logger=none", f"trainer.batching.packed={layout == 'packed'}",
                                           *overrides])
    model = instantiate(cfg.model, _convert_="all")
    path = model.materialize()
    trainer = instantiate(cfg.trainer, _convert_="all")
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    tokenizer = model.tokenizer()
    trainer.setup(path, device, pad_id=tokenizer.pad_token_id or 0)
    vocab = int(trainer.policy.module.config.vocab_size)
    return trainer, vocab


def profile_step(trainer: Any, batch: tuple[list[RolloutGroup], list[float]], rows: int) -> str:
    """Torch profiler tables of one step: where its time goes, by the device's own time and by the host's."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        trainer.step(*batch, 1.0)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    table = prof.key_averages()
    host = table.table(sort_by="self_cpu_time_total", row_limit=rows)
    if not torch.cuda.is_available():
        return host
    return table.table(sort_by="self_device_time_total", row_limit=rows) + "\n" + host


def measure(arch: str, layout: str, work: list[tuple[list[RolloutGroup], list[float]]] | None,
            args: argparse.Namespace) -> tuple[dict[str, Any], list[tuple[list[RolloutGroup], list[float]]]]:
    trainer, vocab = build_trainer(arch, layout, args.overrides)
    if work is None:
        gen = torch.Generator().manual_seed(args.seed)
        prompt_tokens, completion_tokens = span(args.prompt_tokens), span(args.completion_tokens)
        work = [prime_rl_batch(vocab, gen, prompt_tokens, completion_tokens) if args.prime_rl else
                rl_batch(prompts=args.prompts, samples=args.samples, prompt_tokens=prompt_tokens,
                         completion_tokens=completion_tokens, vocab=vocab, gen=gen)
                for _ in range(args.steps)]
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    steps = []
    for batch in work:
        started = time.perf_counter()
        metrics = trainer.step(*batch, 1.0)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        steps.append({**metrics, "wall_s": time.perf_counter() - started})
    timed = steps[args.warm_up :] or steps
    row: dict[str, Any] = {
        "arch": arch, "layout": layout, "step_s": statistics.median(s["wall_s"] for s in timed),
        "tokens_per_s": statistics.median(s["train/tokens_per_s"] for s in timed),
        "mfu": statistics.median(s["train/mfu"] for s in timed) if "train/mfu" in timed[0] else None,
        "micro_batches": None, "tokens_per_step": timed[0]["train/tokens_per_s"] * timed[0]["train/step_s"],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "losses": [s["train/loss"] for s in steps[:3]], "applied": sum(s["train/update_applied"] for s in steps),
        "steps": len(steps),
    }
    row["micro_batches"] = len(trainer.plan(*work[0]).cuts)
    if args.profile:
        row["profile"] = profile_step(trainer, work[-1], args.profile)
    trainer.close()
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row, work


def format_row(row: dict[str, Any], baseline: dict[str, Any] | None) -> str:
    mfu = "MFU n/a (peak unknown)" if row["mfu"] is None else f"MFU {row['mfu']:.1%}"
    memory = f"  peak {row['peak_gib']:.1f} GiB" if row["peak_gib"] is not None else ""
    ratio = f"  x{baseline['step_s'] / row['step_s']:.2f} vs {baseline['layout']}" if baseline else ""
    return (f"{row['arch']:14s} {row['layout']:7s} step {row['step_s']:6.2f} s  {row['tokens_per_s']:9.0f} tok/s  "
            f"{mfu}  {row['micro_batches']} micro-batches of {row['tokens_per_step'] / row['micro_batches']:.0f} "
            f"tokens{memory}{ratio}  updates applied {row['applied']:.0f}/{row['steps']}  "
            f"first losses {', '.join(f'{x:+.4f}' for x in row['losses'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", default="qwen2.5-0.5b,qwen2.5-1.5b")
    parser.add_argument("--layouts", default="padded,packed", help="the first is the baseline of the ratio")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warm-up", type=int, default=2, help="steps left out of the medians")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-tokens", default="60-250", help="uniform range, one length per group")
    parser.add_argument("--completion-tokens", default="20-512", help="uniform range, one length per completion")
    parser.add_argument("--prime-rl", action="store_true", help="four 16 k-token micro-batches a step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", type=int, default=0, help="rows of a profiler table of one step (0: none)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("overrides", nargs="*", help="config overrides (trainer, policy, loss)")
    args = parser.parse_args()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    peak = peak_flops(device)
    print(f"device: {device}; dense bf16 peak: {f'{peak / 1e12:.0f} TFLOP/s' if peak else 'not known (no MFU)'}; "
          f"MFU counts 6 x decoder matmul weights per token + causal attention + the lm head on scored tokens "
          f"(trainer/throughput.py); prime-rl's published Qwen3-0.6B figure: 11% on one H100", flush=True)
    rows = []
    for arch in args.archs.split(","):
        work = None
        first: dict[str, Any] | None = None
        for layout in args.layouts.split(","):
            row, work = measure(arch, layout, work, args)
            print(format_row(row, first), flush=True)
            if "profile" in row:
                print(row["profile"], flush=True)
            first = first or row
            rows.append({k: v for k, v in row.items() if k != "profile"})
    if args.json:
        args.json.write_text(json.dumps({"device": device, "peak_flops": peak, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
