"""sweeps/reward_weights.yaml really runs: one parent, a child per setting, every reward term side by side;
sweeps/optuna_reward_weights.yaml really searches: three trials, the best one named on the parent."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tests.conftest import CONF, TINY
from tests.sweep_runs import run_sweep

TERMS = ("task", "latency_ms", "generated_tokens", "kv_memory_mb", "spec_accept_rate", "cache_reuse")


def test_the_sweep_crosses_delta_and_beta(monkeypatch) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["+sweeps=reward_weights"], return_hydra_config=True)
    params = dict(cfg.hydra.sweeper.params)
    assert params == {"reward.spec_accept_weight": "0.0,1.0", "reward.token_weight": "0.001,0.01"}
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN" and cfg.reward._target_.endswith("InferenceAwareReward")
    assert cfg.rollout.features.speculative_config.method == "ngram"


def test_reward_weights_gives_a_child_per_setting_with_each_term(tmp_path: Path) -> None:
    overrides = [*TINY, "trainer.steps=1", "run.eval_size=2"]
    # No `-m`: the sweep sets hydra.mode. β pinned (a CLI value replaces a swept one): two engine starts, not four.
    runs = run_sweep(tmp_path, ["+sweeps=reward_weights", "reward.token_weight=0.01", *overrides])
    client, parents, children = runs.client, runs.parents, runs.children
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    settings = sorted((c.data.params["reward.spec_accept_weight"], c.data.params["reward.token_weight"])
                      for c in children)
    assert settings == [("0.0", "0.01"), ("1.0", "0.01")]
    for child in children:
        metrics = child.data.metrics
        assert {f"train/reward/{t}" for t in TERMS} | {f"train/reward/weighted/{t}" for t in TERMS[1:]} <= set(metrics)
        assert metrics["train/reward/latency_ms"] > 0 and metrics["train/reward/kv_memory_mb"] > 0
        assert 0.0 <= metrics["train/reward/spec_accept_rate"] <= 1.0
        delta = float(child.data.params["reward.spec_accept_weight"])
        weighted = {t: metrics[f"train/reward/weighted/{t}"] for t in ("spec_accept_rate", "generated_tokens")}
        assert weighted["spec_accept_rate"] == pytest.approx(delta * metrics["train/reward/spec_accept_rate"])
        assert weighted["generated_tokens"] == pytest.approx(-0.01 * metrics["train/reward/generated_tokens"])
    parent_id = parents[0].info.run_id
    assert client.get_run(parent_id).data.params == {"reward.spec_accept_weight": "0.0,1.0"}  # β was pinned
    files = {f.path.rsplit("/", 1)[-1] for f in client.list_artifacts(parent_id, "comparison")}
    assert "reward_terms.png" in files  # each term per setting


def test_optuna_sweep_runs_three_trials_and_names_the_best_on_the_parent(tmp_path: Path) -> None:
    """Optuna's own best trial and the parent's best child are the same run and value."""
    # Without speculation the engine may live in this process (the grid sweep's reason for a process of its own).
    cheap = ["trainer.steps=1", "run.eval_size=2", "rollout.features.speculative_config=null", "rollout.layout.in_process=true",
             "weight_bridge=reload", "hydra.sweeper.n_trials=3", "run.objective=eval/reward/mean"]
    runs = run_sweep(tmp_path, ["+sweeps=optuna_reward_weights", *TINY, *cheap])
    client, parent, children = runs.client, runs.parents[0], runs.children
    assert len(children) == 3 and all(c.info.status == "FINISHED" for c in children)
    finals = {c.info.run_id: c.data.metrics["eval/reward/mean"] for c in children}
    parent = client.get_run(parent.info.run_id)
    assert parent.data.metrics["best/eval/reward/mean"] == max(finals.values())
    assert finals[parent.data.tags["grpo_pipe.best_run_id"]] == max(finals.values())
    assert len(parent.data.params["reward.spec_accept_weight"].split(",")) == 3  # three sampled values
    (tmp_path / "dl").mkdir()
    optuna_best = (tmp_path / "sweep" / "optimization_results.yaml").read_text()
    assert f"best_value: {max(finals.values())}" in optuna_best  # what main returned is what was logged
    local = client.download_artifacts(parent.info.run_id, "sweep/optimization_results.yaml", str(tmp_path / "dl"))
    assert Path(local).read_text() == optuna_best
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "comparison/comparison.json",
                                                      str(tmp_path / "dl"))).read_text())
    assert len(table["data"]) == 3
