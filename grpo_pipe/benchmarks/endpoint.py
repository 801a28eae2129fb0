"""Benchmark: rollout tokens/s through the run's HTTP endpoint against the engine's own rate, on the same prompts.

What an environment service (Atropos's `vllm` server type) does: one request per prompt, all of them at once, each
asking for `--samples` completions of it over HTTP (vLLM's `/generate`, the run's bearer token). The endpoint gathers
the requests that wait into batched engine calls (`serving.batcher`). The baseline, measured in the same run on the
same started engine: the same prompts and samples in one `generate` call. Rounds alternate which goes first; the
figure is the median over rounds of endpoint tokens/s over engine tokens/s (target: at least 0.8).

    python -m grpo_pipe.benchmarks.endpoint --prompts 64 --samples 8 --max-tokens 128 --rounds 3 \\
        data=gsm8k logger=none          # any config overrides follow (the model, the rollout engine, the data)
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from hydra.utils import instantiate
from transformers import AutoTokenizer

from grpo_pipe.benchmarks.rollout import compose_cfg, prompts_and_sampling
from grpo_pipe.interfaces import RolloutEngine
from grpo_pipe.serving.endpoint import EngineEndpoint
from grpo_pipe.serving.openai_api import ServedModel
from grpo_pipe.types import SamplingSettings

log = logging.getLogger("grpo_pipe.benchmarks")


def engine_rate(engine: RolloutEngine, prompts: Sequence[Sequence[int]], samples: int,
                sampling: SamplingSettings) -> dict[str, float]:
    """The engine's own rate: every prompt's samples in one `generate` call."""
    started = time.perf_counter()
    outputs = engine.generate(prompts, [samples] * len(prompts), sampling)
    seconds = time.perf_counter() - started
    tokens = sum(len(c.token_ids) for output in outputs for c in output)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def endpoint_rate(endpoint: EngineEndpoint, prompts: Sequence[Sequence[int]], samples: int,
                  sampling: SamplingSettings) -> dict[str, float]:
    """Through HTTP: one `/generate` request per prompt, all sent at once, as an environment service sends them."""
    root = endpoint.base_url.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {endpoint.token}"}
    body = {"n": samples, "max_tokens": sampling.max_tokens, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "logprobs": 0}

    with httpx.Client(headers=headers, timeout=600.0, limits=httpx.Limits(max_connections=len(prompts))) as client:

        def ask(prompt: Sequence[int]) -> int:
            answer = client.post(f"{root}/generate", json={**body, "prompt": {"prompt_token_ids": list(prompt)}})
            answer.raise_for_status()
            return sum(len(ids) for ids in answer.json()["token_ids"])

        calls_before = endpoint.batcher.engine_calls if endpoint.batcher else 0
        started = time.perf_counter()
        with ThreadPoolExecutor(len(prompts)) as pool:
            tokens = sum(pool.map(ask, prompts))
        seconds = time.perf_counter() - started
    calls = (endpoint.batcher.engine_calls if endpoint.batcher else 0) - calls_before
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "engine_calls": float(calls)}


def measure(engine: RolloutEngine, endpoint: EngineEndpoint, prompts: Sequence[Sequence[int]], samples: int,
            sampling: SamplingSettings, rounds: int) -> dict[str, Any]:
    """`rounds` rounds after one warm-up of each path; odd rounds start with the engine, even ones with the endpoint
    (a path measured second finds the prefix cache warm)."""
    engine_rate(engine, prompts[:2], samples, sampling)
    endpoint_rate(endpoint, prompts[:2], samples, sampling)
    paths = {"engine": lambda: engine_rate(engine, prompts, samples, sampling),
             "endpoint": lambda: endpoint_rate(endpoint, prompts, samples, sampling)}
    rows = []
    for number in range(1, rounds + 1):
        order = ("engine", "endpoint") if number % 2 else ("endpoint", "engine")
        measured = {name: paths[name]() for name in order}
        own, served = measured["engine"], measured["endpoint"]
        rows.append({"round": number, "engine": own, "endpoint": served,
                     "ratio": served["tokens_per_s"] / own["tokens_per_s"]})
        print(f"round {number}: engine {own['tokens_per_s']:.0f} tok/s, endpoint {served['tokens_per_s']:.0f} tok/s "
              f"({int(served['engine_calls'])} engine calls for {len(prompts)} requests), "
              f"ratio {rows[-1]['ratio']:.2f}", flush=True)
    ratios = [r["ratio"] for r in rows]
    return {"prompts": len(prompts), "samples": samples, "max_tokens": sampling.max_tokens, "rounds": rows,
            "ratio": {"median": statistics.median(ratios), "rounds": ratios}}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64, help="requests sent at once (one per prompt)")
    parser.add_argument("--samples", type=int, default=8, help="completions per request (its n)")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per completion")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds, alternating which path goes first")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("overrides", nargs="*", help="config overrides, as on the grpo_pipe command line")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    cfg = compose_cfg(args.overrides)
    path, prompts, sampling = prompts_and_sampling(cfg, args.prompts, args.max_tokens)
    engine = instantiate(cfg.rollout, _convert_="all")
    engine.connect(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    endpoint = EngineEndpoint(engine=engine, model=ServedModel(name="bench", tokenizer=tokenizer,
                                                               max_model_len=engine.max_model_len, vocab_size=len(tokenizer),
                                                  default_max_tokens=args.max_tokens))
    try:
        endpoint.start()
        result = measure(engine, endpoint, prompts, args.samples, sampling, args.rounds)
    finally:
        endpoint.stop()
        engine.shutdown()
    print(f"endpoint against the engine over {args.rounds} rounds: median {result['ratio']['median']:.2f} "
          f"(target >= 0.80)", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
