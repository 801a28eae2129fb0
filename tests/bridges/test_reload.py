"""The reload bridge puts the trainer's exact weights into the live engine.

After two real GRPO steps and a sync, greedy outputs of the live engine must equal those of a
fresh engine loaded from the trainer's saved weights (fp32 on CPU), and differ from before the sync.
"""

import random
import shutil

from hydra.utils import instantiate
from transformers import AutoTokenizer

from grpo_pipe.pipeline import build
from grpo_pipe.prompts import render_prompt
from grpo_pipe.types import RolloutGroup, SamplingSettings

GREEDY = SamplingSettings(temperature=0.0, top_p=1.0, max_tokens=24)


def _greedy(engine, prompts):
    return [out[0].token_ids for out in engine.generate(prompts, [1] * len(prompts), GREEDY)]


def test_live_engine_equals_fresh_engine_after_sync(compose_cfg, tmp_path) -> None:
    cfg = compose_cfg(["trainer.lr=2e-3"])
    parts = build(cfg)
    engine, trainer, bridge, data = parts["rollout"], parts["trainer"], parts["weight_bridge"], parts["data"]
    model_path = parts["model"].materialize()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tasks = data.train_tasks()[:6]
    prompts = [render_prompt(tokenizer, data.system_prompt, t) for t in tasks]
    engine.connect(model_path)
    try:
        trainer.setup(model_path, parts["placement"].trainer_device(), pad_id=tokenizer.pad_token_id)
        bridge.connect(engine, trainer.policy)
        before = _greedy(engine, prompts)
        rng = random.Random(0)
        sampling = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=16)
        for _ in range(2):  # two real steps on real rollouts; random rewards give every group signal
            completions = engine.generate(prompts[:4], [4] * 4, sampling)
            groups = [RolloutGroup(t, p, tuple(c)) for t, p, c in zip(tasks, prompts, completions)]
            rewards = [rng.choice([0.0, 1.0]) for g in groups for _ in g.completions]
            metrics = trainer.step(groups, rewards, temperature=1.0)
            assert metrics["train/update_applied"] == 1.0 and metrics["train/active_samples"] > 0
        stats = bridge.push(trainer.policy, trainer.version)
        assert stats.policy_version == 2 == engine.served_version
        assert stats.bytes_moved > 0
        live = _greedy(engine, prompts)
        saved = tmp_path / "policy"
        trainer.policy.save_pretrained(saved)
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (model_path / name).exists():
                shutil.copy(model_path / name, saved / name)
    finally:
        engine.shutdown()
    fresh_engine = instantiate(cfg.rollout, _convert_="all")
    fresh_engine.connect(saved)
    try:
        fresh = _greedy(fresh_engine, prompts)
    finally:
        fresh_engine.shutdown()
    assert live == fresh
    assert live != before
