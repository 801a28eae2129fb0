"""What vLLM returns for each request (tokens, sampled log-probs, its own per-request numbers), read into the
pipeline's own types, for any vLLM version we run."""

from __future__ import annotations

from typing import Any

from grpo_pipe.rollout.in_flight import InFlightLog
from grpo_pipe.types import Completion, RequestTelemetry


def request_telemetry(output: Any, generated: int) -> RequestTelemetry:
    """The request's own numbers. With n > 1 samples vLLM runs one child request per sample but reports
    the timestamps and prefix-cache hits of the last child to finish, so a group's samples share them.
    Engine-core timestamps are monotonic and left at 0.0 when not recorded: 0.0 means unknown."""
    metrics = getattr(output, "metrics", None)
    return RequestTelemetry(
        prompt_tokens=len(output.prompt_token_ids or ()),
        generated_tokens=generated,
        cached_prompt_tokens=int(getattr(output, "num_cached_tokens", 0) or 0),
        queued_s=getattr(metrics, "queued_ts", None) or None,
        first_token_s=getattr(metrics, "first_token_ts", None) or None,
        last_token_s=getattr(metrics, "last_token_ts", None) or None,
    )


def spec_acceptance(completion: Any) -> float | None:
    """Accepted / proposed draft tokens of one sample; None when the engine reported no spec-decode metrics.

    vLLM >= 0.28 (with `per_request_spec_decode_metrics`) attaches a `RequestSpecDecodeMetrics` to each
    sample's final output: an acceptance histogram and `num_draft_tokens`, with the rate only in its
    `to_dict()` (0.0 when nothing was proposed). A plain dict with the same keys is read as is.
    """
    spec = getattr(completion, "spec_decode_metrics", None)
    if spec is None:
        return None
    if hasattr(spec, "to_dict"):
        spec = spec.to_dict()
    rate = spec.get("draft_acceptance_rate") if isinstance(spec, dict) else getattr(spec, "draft_acceptance_rate", None)
    return None if rate is None else float(rate)


def completions_of(output: Any, flight: InFlightLog, tokenizer: Any) -> list[Completion]:
    """One request's samples as completions: token ids, sampled log-probs, the policy versions that wrote them."""
    completions = []
    for sample in output.outputs:
        ids = tuple(sample.token_ids)
        first_version, switches = flight.versions_of(str(output.request_id), int(sample.index), len(ids))
        logprobs = sampled_logprobs(sample.logprobs, len(ids))
        base = request_telemetry(output, len(ids))
        telemetry = RequestTelemetry(**{**base.__dict__, "spec_acceptance_rate": spec_acceptance(sample)})
        completions.append(
            Completion(
                token_ids=ids,
                logprobs=logprobs,
                text=tokenizer.decode(ids, skip_special_tokens=True),  # as vLLM's own detokenizer renders it
                finish_reason=str(sample.finish_reason),
                policy_version=first_version,
                telemetry=telemetry,
                version_switches=switches,
            )
        )
    return completions


def sampled_logprobs(logprobs: Any, count: int) -> tuple[float, ...]:
    """The sampled token's log-prob at each of `count` positions, from vLLM's flat log-probs (requested
    with logprobs=0, each position holds the sampled token alone, first: read straight from the flat list)."""
    if logprobs is None:
        return ()
    return tuple(float(logprobs.logprobs[start]) for start in logprobs.start_indices[:count])
