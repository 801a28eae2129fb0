"""Every rule about the config, one bad value each: the job's one error list names the setting, before anything loads.

A new rule gets a row here. The list is what `build` (the runner's check of a composed config) reports; each rule is
stated once, beside the setting it constrains (a type hint, its component's `config_problems`, or a rule across
groups); no constructor raises."""

from __future__ import annotations

import pytest

from grpo_pipe.config.errors import ConfigError
from grpo_pipe.runner.components import build

TOOLS = ["environment=tools", "environment.tools=[calculator]"]
RULES: list[tuple[list[str], str]] = [
    # types and allowed values, from the constructors' signatures
    (["trainer.optimisation.lr=fast"], "trainer.optimisation.lr='fast': expected a number"),
    (["loss.aggregation=mean_of_everything"], "loss.aggregation"),
    (["+trainer.nonsense=1"], "trainer.nonsense"),
    # the trainer and its loss
    (["trainer.steps=0"], "trainer.steps=0: must be >= 1"),
    (["trainer.optimisation.lr=0"], "trainer.optimisation.lr=0"),
    (["trainer.optimisation.grad_clip=0"], "trainer.optimisation.grad_clip=0"),
    (["trainer.batching.micro_batch_size=0"], "trainer.batching.micro_batch_size=0"),
    (["trainer.optimisation.updates_per_batch=0"], "trainer.optimisation.updates_per_batch=0"),
    (["trainer.optimisation.max_bad_steps=0"], "trainer.optimisation.max_bad_steps=0"),
    (["loss.correction.cap=0"], "loss.correction.cap=0: must be > 0"),
    (["loss/correction=token_mask", "loss.correction.cap=-1"], "loss.correction.cap=-1: must be > 0"),
    (["loss/correction=sequence_truncate", "loss.correction.cap=0"], "loss.correction.cap=0: must be > 0"),
    (["loss/correction=sequence_mask", "loss.correction.cap=0"], "loss.correction.cap=0: must be > 0"),
    (["loss/correction=icepop", "loss.correction.low=0"], "loss.correction.low=0: must be > 0"),
    (["loss/correction=icepop", "loss.correction.high=0.5"], "loss.correction.high=0.5: must be > loss.correction.low=0.5"),
    (["loss.objective.clip_low=-0.1"], "loss.objective.clip_low=-0.1"),
    (["loss=gspo", "loss.objective.clip_high=-1"], "loss.objective.clip_high=-1"),
    (["loss=cispo", "loss.objective.max_weight=0"], "loss.objective.max_weight=0"),
    (["loss.entropy_coef=-0.1"], "loss.entropy_coef=-0.1"),
    (["loss.entropy_floor=0"], "loss.entropy_floor=0"),
    (["loss.ratio_reference=sampler"], "with loss.ratio_reference=sampler"),
    (["trainer.optimisation.lr_schedule.warmup_steps=-1"], "trainer.optimisation.lr_schedule.warmup_steps=-1: must be >= 0"),
    (["placement=split", "trainer=fsdp", "trainer.world_size=0"], "trainer.world_size=0: must be >= 1"),
    (["placement=split", "trainer=fsdp", "trainer.precision.compile=true"],
     "trainer.precision.compile=true: not with trainer=fsdp"),
    # the engine
    (["rollout.max_model_len=64", "run.max_new_tokens=64"], "run.max_new_tokens=64 leaves no room for a prompt"),
    (["run.max_new_tokens=0"], "run.max_new_tokens=0: must be >= 1"),
    (["rollout.layout.device_ids='0'", "rollout.layout.in_process=true"],
     "rollout.layout.device_ids='0' needs rollout.layout.in_process=false"),
    (["rollout.layout.tensor_parallel_size=0"], "rollout.layout.tensor_parallel_size=0"),
    # a settings group's rule beside a problem of another kind: named in the same list, not on the next try
    (["run.max_new_tokens=0", "rollout.layout.tensor_parallel_size=0"], "rollout.layout.tensor_parallel_size=0"),
    (["run.max_new_tokens=0", "trainer.batching.micro_batch_size=0"], "trainer.batching.micro_batch_size=0"),
    (["run.max_new_tokens=0", "trainer.optimisation.lr_schedule.warmup_steps=-1"],
     "trainer.optimisation.lr_schedule.warmup_steps=-1"),
    # the run
    (["run.shutdown_grace_s=0"], "run.shutdown_grace_s=0"),
    (["run.top_p=0.9"], "run.top_p=0.9"),
    (["run.mismatch_warn=0"], "run.mismatch_warn=0"),
    # curricula and data
    (["curriculum.samples_per_prompt=1"], "curriculum.samples_per_prompt=1"),
    (["curriculum=kde_buckets", "curriculum.ema_decay=1.0"], "curriculum.ema_decay=1.0"),
    (["curriculum=kde_buckets", "curriculum.n_buckets=0"], "curriculum.n_buckets=0"),
    (["model.num_heads=8"], "model.hidden_size / model.num_heads = 16: vLLM's CPU attention needs head_dim >= 32"),
    (["data=arithmetic", "data.terms=1"], "data.terms=1: must be >= 2"),
    (["data=jsonl", "data.train_path=/nonexistent/tasks.jsonl"], "no such file"),
    # async rollouts
    (["rollout_scheduler.max_staleness=-1"], "max_staleness=-1: must be >= 0"),
    (["rollout_scheduler.stale_policy=wait"], "stale_policy"),
    (["weight_bridge.sync_every=3", "rollout_scheduler.max_staleness=0"], "< weight_bridge.sync_every - 1"),
    (["rollout.layout.background=true", "rollout_scheduler.max_staleness=0"], "rollout.layout.background=true with"),
    # bridges and placement
    (["weight_bridge.sync_every=0"], "weight_bridge.sync_every=0: must be >= 1"),
    (["weight_bridge.bucket_mb=0"], "weight_bridge.bucket_mb=0"),
    (["weight_bridge=lora", "policy=full"], "weight_bridge=lora needs policy=lora"),
    (["weight_bridge=lora", "policy=lora", "weight_bridge.max_loras=1"], "weight_bridge.max_loras=1"),
    (["weight_bridge=checkpoint", "weight_bridge.keep_last=0"], "weight_bridge.keep_last=0"),
    (["weight_bridge=nccl", "weight_bridge.backend=nccl"], "weight_bridge.backend=nccl needs CUDA GPUs"),
    (["weight_bridge=ipc"], "weight_bridge=ipc needs a CUDA GPU"),
    (["placement.sleep_level=3"], "placement.sleep_level=3"),
    (["placement.sleep_level=1"], "placement.sleep_level=1 needs rollout.memory.enable_sleep_mode=true"),
    (["trainer=fsdp"], "with placement=colocated"),
    (["placement=split", "placement.num_engines=0"], "placement.num_engines=0"),
    (["placement=split", "placement.engine_cpus=0"], "placement.engine_cpus=0"),
    (["placement=split", "rollout.layout.tensor_parallel_size=2"], "rollout.layout.tensor_parallel_size=2"),
    # checkpoints
    (["checkpoint.keep_last=0"], "checkpoint.keep_last=0"),
    (["checkpoint.every=-1"], "checkpoint.every=-1: must be >= 0"),
    # episodes
    ([*TOOLS, "environment.max_turns=0"], "environment.max_turns=0: must be >= 1"),
    ([*TOOLS, "environment.tool_timeout_s=0"], "environment.tool_timeout_s=0"),
    ([*TOOLS, "environment.max_episode_tokens=4096"], "environment.max_episode_tokens=4096 leaves no room"),
    (["environment=tools", "environment.tools=[nowhere.py:lookup]"], "nowhere.py"),
    (["environment=atropos", "reward=correctness"], "with reward=environment"),  # beside the next problem
    (["environment=atropos", "reward=correctness"], "environment.environments: none to start"),
    # rewards
    (["reward=python", "reward.fn=nowhere.py:score"], "nowhere.py"),
    (["reward=python", "reward.fn=nowhere.py:score", "reward.completions=html"], "reward.completions='html'"),
]


@pytest.mark.parametrize(("overrides", "named"), RULES, ids=[" ".join(o) for o, _ in RULES])
def test_each_rule_is_named_in_the_one_error_list_before_anything_loads(compose_cfg, overrides, named) -> None:
    with pytest.raises(ConfigError) as refused:
        build(compose_cfg(overrides))
    problems = refused.value.problems
    assert any(named in problem for problem in problems), problems


# Where `raise ConfigError` may stand: the two collectors of the job's rules, and the benchmarks' entry points, each
# the one collector of its own flags' rules. What loading reveals is an `InputError`, raised where the input is read.
COLLECTORS = {"config/validate.py", "runner/components.py", "benchmarks/trl_tools.py", "benchmarks/trl_peer.py"}


def test_config_errors_are_raised_only_where_rules_are_collected() -> None:
    import re
    from pathlib import Path

    package = Path(__file__).parents[3] / "grpo_pipe"
    raising = {str(path.relative_to(package)) for path in package.rglob("*.py")
               if re.search(r"raise ConfigError\b", path.read_text())}
    assert raising <= COLLECTORS, f"raise ConfigError outside the collectors: {sorted(raising - COLLECTORS)}"


def test_an_input_error_is_a_config_error_in_the_same_format_saying_it_is_the_input() -> None:
    from grpo_pipe.config.errors import InputError

    err = InputError(["data: the train split is empty", "reward.fn: failed on row 1"])
    assert isinstance(err, ConfigError) and err.problems == ["data: the train split is empty", "reward.fn: failed on row 1"]
    assert str(err) == "Invalid input:\n  - data: the train split is empty\n  - reward.fn: failed on row 1"
