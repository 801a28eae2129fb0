"""Inference-aware reward: the task's score, minus what the answer cost to serve, plus what made it cheap.

    reward = task − α·latency_ms − β·generated_tokens − γ·kv_memory_mb
                  + δ·spec_accept_rate + ε·cache_reuse

`task` is another reward (correctness by default) held, not copied: rewards compose. Every other term
comes from the engine's own per-request telemetry (`RequestTelemetry`), never from our estimates:
- latency_ms: queued -> last token of the request. With n > 1 samples per prompt vLLM reports one set
  of timestamps per prompt (the last sample to finish), so the samples of a group share it.
- generated_tokens: tokens of this completion.
- kv_memory_mb: KV cache the sequence holds at its end, from the model's dimensions:
  2 (K and V) × layers × kv_heads × head_dim × bytes per element × (prompt + generated tokens), in MiB.
- spec_accept_rate: accepted / proposed draft tokens of this sample (vLLM's per-request spec-decode metrics).
- cache_reuse: prefix-cache hits / prompt tokens (vLLM caches whole blocks: 128 tokens on CPU).

Missing telemetry contributes 0 and is logged as 0: acceptance is missing when no speculative decoding
is configured, timestamps when the engine keeps no stats. Speculation that is configured but reports
nothing is warned about once, since the δ term then silently does nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo_pipe.interfaces import Reward  # imported at run time: config validation reads this hint
from grpo_pipe.types import Completion, RewardOutput, RolloutGroup

log = logging.getLogger(__name__)

MIB = 2**20
TERMS = ("latency_ms", "generated_tokens", "kv_memory_mb", "spec_accept_rate", "cache_reuse")


@dataclass(frozen=True, kw_only=True)
class KvShape:
    """What one token costs in the KV cache.

    Args:
        layers: The model's layers, each caching a key and a value per token.
        kv_heads: Key/value heads per layer.
        head_dim: Elements per head.
        bytes_per_element: Bytes of one cached element (2 for bfloat16).
    """

    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_element: int

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_element  # K and V


def read_kv_shape(model_path: Path, kv_dtype: torch.dtype) -> KvShape:
    """KV dimensions from a Hugging Face `config.json` (the text model's, for multimodal configs)."""
    config: dict[str, Any] = json.loads((Path(model_path) / "config.json").read_text())
    config = config.get("text_config", config)
    heads = int(config["num_attention_heads"])
    head_dim = config.get("head_dim") or int(config["hidden_size"]) // heads
    return KvShape(
        layers=int(config["num_hidden_layers"]),
        kv_heads=int(config.get("num_key_value_heads") or heads),  # absent = plain multi-head attention
        head_dim=int(head_dim),
        bytes_per_element=kv_dtype.itemsize,
    )


class InferenceAwareReward:
    """`task_score` plus weighted serving-cost terms, each logged separately (`train/reward/<term>`).

    Terms logged per completion: `task`, the task reward's own terms under `task/<name>`, the raw
    measurements (TERMS) and their signed contributions to the reward under `weighted/<name>`, so a
    sweep shows both what the policy does (raw) and how much each weight moves the reward (weighted).

    reward = task - α·latency_ms - β·generated_tokens - γ·kv_memory_mb + δ·spec_accept_rate + ε·cache_reuse

    Args:
        task_score: Any other reward: the task's score; its own terms are logged as `train/reward/task/<term>`.
        latency_weight: α, per ms from queued to last token.
        token_weight: β, per generated token.
        kv_memory_weight: γ, per MiB of KV cache held at the end of the sequence.
        spec_accept_weight: δ, per unit of draft acceptance rate (0..1); the term is 0 without speculative decoding.
        cache_reuse_weight: ε, per unit of prompt prefix-cache hit ratio (0..1).
        speculative_config: The engine's speculation settings (`rollout.features.speculative_config`), only to warn
            when configured speculation reports nothing.
    """

    def __init__(
        self,
        *,
        task_score: Reward,
        latency_weight: float = 0.001,
        token_weight: float = 0.001,
        kv_memory_weight: float = 0.01,
        spec_accept_weight: float = 1.0,
        cache_reuse_weight: float = 0.5,
        speculative_config: dict[str, Any] | None = None,
    ) -> None:
        self.task_score = task_score
        # Signed: costs pull the reward down, speculation and cache hits push it up.
        self.weights = {
            "latency_ms": -latency_weight,
            "generated_tokens": -token_weight,
            "kv_memory_mb": -kv_memory_weight,
            "spec_accept_rate": spec_accept_weight,
            "cache_reuse": cache_reuse_weight,
        }
        # Only used to tell "no speculation" (acceptance absent, fine) from "speculation reporting nothing".
        self.speculation_configured = bool(speculative_config)
        self.kv_shape: KvShape | None = None
        self._warned_no_spec = False

    def reads_request_timestamps(self) -> bool:
        return True  # the latency term is logged (raw) whatever its weight

    def setup(self, model_path: Path, kv_dtype: torch.dtype) -> None:
        self.task_score.setup(model_path, kv_dtype)
        self.kv_shape = read_kv_shape(model_path, kv_dtype)
        log.info("inference_aware reward: %d KV bytes per token (%s)", self.kv_shape.bytes_per_token, self.kv_shape)

    def __call__(self, groups: Sequence[RolloutGroup]) -> RewardOutput:
        task = self.task_score(groups)
        raw: dict[str, list[float]] = {name: [] for name in TERMS}
        spec_reported = False
        for group in groups:
            for completion in group.completions:
                spec_reported |= completion.telemetry.spec_acceptance_rate is not None
                for name, value in self.measure(group, completion).items():
                    raw[name].append(value)
        self._warn_if_spec_silent(spec_reported)
        weighted = {name: [self.weights[name] * v for v in raw[name]] for name in TERMS}
        values = [t + sum(weighted[name][i] for name in TERMS) for i, t in enumerate(task.values)]  # [N]
        terms = {
            "task": list(task.values),
            **{f"task/{name}": term for name, term in task.terms.items()},
            **raw,
            **{f"weighted/{name}": term for name, term in weighted.items()},
        }
        return RewardOutput(values=values, terms=terms, correct=task.correct, task_values=task.difficulty_signal)

    def measure(self, group: RolloutGroup, completion: Completion) -> dict[str, float]:
        """The raw, unweighted terms of one completion; a missing measurement is 0."""
        if self.kv_shape is None:
            raise RuntimeError("InferenceAwareReward used before setup(model_path, kv_dtype)")
        telemetry = completion.telemetry
        prompt_tokens = telemetry.prompt_tokens or len(group.prompt_token_ids)
        sequence_tokens = prompt_tokens + telemetry.generated_tokens
        latency_s = telemetry.latency_s
        return {
            "latency_ms": 0.0 if latency_s is None else 1000.0 * latency_s,
            "generated_tokens": float(telemetry.generated_tokens),
            "kv_memory_mb": self.kv_shape.bytes_per_token * sequence_tokens / MIB,
            "spec_accept_rate": telemetry.spec_acceptance_rate or 0.0,
            "cache_reuse": telemetry.cached_prompt_tokens / prompt_tokens if prompt_tokens else 0.0,
        }

    def _warn_if_spec_silent(self, spec_reported: bool) -> None:
        if self.speculation_configured and not spec_reported and not self._warned_no_spec:
            self._warned_no_spec = True
            log.warning(
                "rollout.features.speculative_config is set but no completion carried spec-decode metrics: "
                "the spec_accept_rate term is 0 (this vLLM may not report per-request acceptance)"
            )
