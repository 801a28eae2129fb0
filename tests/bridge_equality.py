"""The check every weight bridge must pass.

Train two real GRPO steps on real rollouts, sync through the bridge, then greedy outputs of the
live engine must equal those of a fresh engine loaded from the trainer's saved weights (fp32 on
CPU), and differ from the outputs before the sync.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig
from transformers import AutoTokenizer

from grpo_pipe.bridges.contract import push_weights
from grpo_pipe.data.prompts import render_prompt
from grpo_pipe.models.files import copy_tokenizer_files
from grpo_pipe.runner.components import Components
from grpo_pipe.runner.pipeline import build
from grpo_pipe.types import RolloutGroup, SamplingSettings, SyncStats

GREEDY = SamplingSettings(temperature=0.0, top_p=1.0, max_tokens=24)


def greedy(engine, prompts) -> list[tuple[int, ...]]:
    return [out[0].token_ids for out in engine.generate(prompts, [1] * len(prompts), GREEDY)]


def train_sync_and_compare(
    cfg: DictConfig, saved: Path, fresh_from: str = "merged", before_close: Callable[[Components], None] | None = None,
    push_every_step: bool = False,
) -> SyncStats:
    """`fresh_from="adapter"`: the fresh engine loads the base model plus the trainer's saved LoRA adapter
    (in bf16 an unmerged adapter is not bitwise equal to merged weights); "merged": one full checkpoint.
    `push_every_step`: push after each of the two steps, so the second push runs on what the first one set up."""
    parts = build(cfg)
    engine, trainer, bridge, data = parts.rollout, parts.trainer, parts.weight_bridge, parts.data
    model_path = parts.model.materialize()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tasks = data.train_tasks()[:6]
    prompts = [render_prompt(tokenizer, data.system_prompt, t) for t in tasks]
    engine.connect(model_path, bridge.engine_options())
    try:
        trainer.setup(model_path, parts.placement.trainer_device(), pad_id=tokenizer.pad_token_id)
        bridge.connect(engine, trainer.policy)
        before = greedy(engine, prompts)
        rng = random.Random(0)
        sampling = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=16)
        for _ in range(2):  # random rewards give every group signal, so the weights really move
            completions = engine.generate(prompts[:4], [4] * 4, sampling)
            groups = [RolloutGroup(t, p, tuple(c)) for t, p, c in zip(tasks, prompts, completions)]
            rewards = [rng.choice([0.0, 1.0]) for g in groups for _ in g.completions]
            metrics = trainer.step(groups, rewards, temperature=1.0)
            assert metrics["train/update_applied"] == 1.0 and metrics["train/active_samples"] > 0
            if push_every_step and trainer.version < 2:
                push_weights(bridge, engine, trainer.policy, trainer.version)
        stats = push_weights(bridge, engine, trainer.policy, trainer.version)
        assert stats.policy_version == trainer.version == engine.served_version == 2
        live = greedy(engine, prompts)
        if fresh_from == "adapter":
            trainer.policy.save_adapter(saved)
        else:
            trainer.policy.save_pretrained(saved)
            copy_tokenizer_files(model_path, saved)
        if before_close is not None:
            before_close(parts)
    finally:
        bridge.close()
        engine.shutdown()
        getattr(parts.trainer, "close", lambda: None)()
        parts.placement.close()
    fresh = fresh_greedy(cfg, saved, prompts, fresh_from, model_path, bridge.engine_options())
    assert live == fresh, f"live engine after sync differs from a fresh engine on the same weights: {divergence(live, fresh)}"
    assert live != before, "the sync did not change the engine's outputs"
    return stats


def fresh_greedy(cfg: DictConfig, saved: Path, prompts: list, fresh_from: str = "merged", model_path: Path | None = None,
                 engine_options: dict | None = None) -> list[tuple[int, ...]]:
    """Greedy outputs of a fresh engine (as configured) on the weights saved in `saved`: a full checkpoint
    ("merged"), or the base model at `model_path` plus the adapter saved there ("adapter")."""
    # The reference engine always runs in this process: same weights, same kernels, no process start-up.
    fresh_engine = instantiate(cfg.rollout, _convert_="all", layout={"in_process": True, "device_ids": None})
    if fresh_from == "adapter":
        assert model_path is not None
        fresh_engine.connect(model_path, engine_options or {})
        fresh_engine.use_adapter("fresh", 1, saved)
    else:
        fresh_engine.connect(saved)
    try:
        return greedy(fresh_engine, prompts)
    finally:
        fresh_engine.shutdown()


def divergence(live: list[tuple[int, ...]], fresh: list[tuple[int, ...]]) -> str:
    """Where each differing pair of outputs parts: a first token that differs points at the weights, a late one
    at the numerics of the forward pass."""
    parts = []
    for index, (ours, theirs) in enumerate(zip(live, fresh)):
        if ours != theirs:
            at = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            parts.append(f"prompt {index} from token {at} of {len(ours)}/{len(theirs)} "
                         f"(live {list(ours[at:at + 3])}, fresh {list(theirs[at:at + 3])})")
    return "; ".join(parts) or f"{len(live)} live outputs vs {len(fresh)} fresh ones"
