"""What vLLM reports about each request, read into the pipeline's own types (any vLLM version we run)."""

from __future__ import annotations

from typing import Any

from grpo_pipe.types import RequestTelemetry


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
