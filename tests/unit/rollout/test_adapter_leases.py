import pickle
from types import SimpleNamespace

from grpo_pipe.rollout.adapter_leases import AdapterLeases


def adapter(adapter_id: int) -> SimpleNamespace:
    return SimpleNamespace(lora_int_id=adapter_id)


def test_an_adapter_no_call_uses_is_removed_at_once() -> None:
    leases, removed = AdapterLeases(), []
    leases.serve(adapter(1))
    leases.serve(adapter(2))
    leases.retire(1, removed.append)
    assert removed == [1]


def test_an_adapter_a_running_call_uses_goes_when_the_last_such_call_ends() -> None:
    leases, removed = AdapterLeases(), []
    leases.serve(adapter(1))
    first, second = leases.take(), leases.take()  # two calls started on adapter 1
    leases.serve(adapter(2))
    third = leases.take()  # a call started after the push gets the new adapter
    leases.retire(1, removed.append)
    assert removed == [] and leases.leased() == {1, 2}
    assert leases.release(first) == []
    assert leases.release(second) == [1]  # the caller removes it now
    assert leases.release(third) == [] and leases.leased() == set()


def test_without_an_adapter_calls_hold_no_lease() -> None:
    leases = AdapterLeases()
    call = leases.take()
    assert call is None and leases.release(call) == [] and leases.leased() == set()


def test_an_engine_spec_sent_to_another_process_starts_with_no_adapter_and_no_lease() -> None:
    from grpo_pipe.rollout.vllm_engine import VllmEngine

    engine = VllmEngine()
    engine.adapters.serve(adapter(1))
    engine.adapters.take()
    copy = pickle.loads(pickle.dumps(engine))  # as Ray sends the engine's spec to an engine actor
    assert copy.adapters.current is None and copy.adapters.leased() == set()
