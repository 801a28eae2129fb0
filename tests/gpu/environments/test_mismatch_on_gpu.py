"""The trainer/engine log-prob mismatch on episodes, against single turns at the same bridge, on a GPU in bf16.

An episode's model turns are scored by the trainer in one pass over the whole token sequence (prompt, turns, tool
results), while the engine sampled them turn by turn from cached prefixes: if the two disagreed anywhere (a shifted
mask, a token fed that the engine never saw, a turn scored against the wrong version), the mismatch per model token
would grow. It must not: the same tasks, the same steps, with and without the calculator."""

from __future__ import annotations

import statistics

import pytest
from mlflow.tracking import MlflowClient

from grpo_pipe.runner.pipeline import JobContext, run

# Short and small: 6 steps of 8 tasks x 8 episodes, a small final evaluation; the engine's share of the card kept low.
COMMON = ["experiment=calculator", "trainer.steps=6", "run.max_minutes=null", "run.eval_every=0", "run.eval_size=8",
          "data.eval_size=8", "checkpoint.every=0", "curriculum.prompts_per_step=8", "curriculum.samples_per_prompt=8",
          "rollout.memory.gpu_memory_utilization=0.3", "trainer.batching.skip_zero_advantage=false"]
BRIDGES = {"reload": [], "ipc": [], "lora": ["trainer.optimisation.lr=2e-4"]}


def _history(tmp_path, run_id: str, key: str) -> list[float]:
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    return [m.value for m in client.get_metric_history(run_id, key)]


@pytest.mark.parametrize("bridge", sorted(BRIDGES))
def test_mismatch_on_episodes_is_no_larger_than_on_single_turns(bridge, compose_cfg, tmp_path) -> None:
    settings = [f"weight_bridge={bridge}", *BRIDGES[bridge], *COMMON]
    medians, turns = {}, []
    for kind, extra in (("episodes", []), ("single", ["environment=single_turn"])):
        cfg = compose_cfg([*settings, *extra], tiny=False)
        result = run(cfg, JobContext(output_dir=tmp_path / kind, run_name=f"{bridge}-{kind}"))
        mismatch = _history(tmp_path, result.run_id, "mismatch/logprob_abs_mean")
        assert len(mismatch) == 6, mismatch
        medians[kind] = statistics.median(mismatch)
        if kind == "episodes":
            turns = _history(tmp_path, result.run_id, "episodes/turns_mean")
    assert max(turns) > 1.0, "no episode went past its first turn: nothing was compared"
    # bf16 numerics: a quarter more, or 1e-3 absolute, is noise; a token misaligned anywhere is far more.
    assert medians["episodes"] <= 1.25 * medians["single"] + 1e-3, medians
