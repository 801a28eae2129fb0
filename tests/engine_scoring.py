"""The engine's own log-probs of a completion, scored again from its prompt: what a test compares sampled log-probs
with to show the engine sampled exactly these tokens after exactly this prompt."""

from __future__ import annotations

from grpo_pipe.rollout.vllm_engine import VllmEngine


def engine_logprobs(engine: VllmEngine, prompt: tuple[int, ...], completion: tuple[int, ...]) -> list[float]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    tokens = list(prompt + completion)
    out = engine.llm.generate([TokensPrompt(prompt_token_ids=tokens)],
                              SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0), use_tqdm=False)[0]
    entries = out.prompt_logprobs[len(prompt):]
    return [float(entry[token].logprob) for entry, token in zip(entries, completion)]
