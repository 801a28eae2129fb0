"""`run.sampling_extra`: vLLM sampling parameters passed through to the engine, and the ones refused.

A parameter passes when the engine then still samples each token from the plain softmax at `run.temperature`,
the distribution the trainer's log-probs and every importance ratio assume: where generation stops
(`stop`, `stop_token_ids`, `ignore_eos`) or what the returned text holds. Any parameter that reshapes the
distribution (penalties, biases, banned or allowed tokens, a minimum length that masks the end token) is
refused with that reason, as are the ones the pipeline sets itself.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

PASSED_THROUGH = ("stop", "stop_token_ids", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                  "spaces_between_special_tokens")

SET_BY_THE_PIPELINE = {
    "n": "curriculum.samples_per_prompt",
    "temperature": "run.temperature",
    "top_p": "run.top_p",
    "top_k": "run.top_k",
    "min_p": "run.min_p",
    "repetition_penalty": "run.repetition_penalty",
    "max_tokens": "run.max_new_tokens",
    "seed": "run.seed and run.seeded_sampling",
    "logprobs": "the pipeline (the sampled token's log-prob)",
    "prompt_logprobs": "the pipeline",
    "detokenize": "the pipeline (texts are decoded once, at the end)",
    "flat_logprobs": "the pipeline",
}

RESHAPES_THE_DISTRIBUTION = ("presence_penalty", "frequency_penalty", "min_tokens", "logit_bias",
                             "allowed_token_ids", "bad_words", "logits_processors", "structured_outputs",
                             "guided_decoding", "extra_args", "best_of", "truncate_prompt_tokens")


def sampling_extra_problems(extra: Mapping[str, Any]) -> list[str]:
    """One problem per key of `run.sampling_extra` the engine may not be given, each with the reason."""
    problems = []
    for key in extra:
        if key in PASSED_THROUGH:
            continue
        if key in SET_BY_THE_PIPELINE:
            reason = f"set by {SET_BY_THE_PIPELINE[key]}"
        elif key in RESHAPES_THE_DISTRIBUTION:
            reason = ("changes the distribution the engine samples from, which the trainer's log-probs would not "
                      "follow (every importance ratio would be off)")
        else:
            near = difflib.get_close_matches(key, PASSED_THROUGH, n=2)
            reason = "not a vLLM sampling parameter passed through" + (f" (did you mean {', '.join(near)}?)" if near else "")
        problems.append(f"run.sampling_extra.{key}: {reason}; allowed: {', '.join(PASSED_THROUGH)}")
    return problems


def needs_text(extra: Mapping[str, Any]) -> bool:
    """Stop strings are matched on text, so the engine must detokenize as it goes (a third of the decode rate
    on a GPU, BENCHMARKS.md); stop token ids need no text."""
    return bool(extra.get("stop"))
