import pytest

from grpo_pipe.rewards.correctness import CorrectnessReward
from grpo_pipe.types import Completion, RequestTelemetry, RolloutGroup, Task


def _group(answer: str, texts: list[str]) -> RolloutGroup:
    telemetry = RequestTelemetry(prompt_tokens=3, generated_tokens=2, cached_prompt_tokens=0)
    completions = tuple(Completion(token_ids=(1, 2), logprobs=(-0.1, -0.2), text=t, finish_reason="stop", policy_version=0,
                                   telemetry=telemetry) for t in texts)
    return RolloutGroup(Task(uid="t", question="q", answer=answer), (5, 6, 7), completions)


def test_values_come_from_config_and_order_follows_groups() -> None:
    reward = CorrectnessReward(correct=1.0, wrong=-0.2, unparsable=-0.5)
    out = reward([_group("4", ["#### 4", "#### 5"]), _group("10", ["no idea", "it is 10"])])
    assert out.values == [1.0, -0.2, -0.5, 1.0]
    assert out.correct == [True, False, False, True]
    assert out.terms["parsable"] == [1.0, 1.0, 0.0, 1.0]


def test_the_verifier_is_chosen_by_config(compose_cfg) -> None:
    from hydra.utils import instantiate

    pytest.importorskip("math_verify", reason="math-verify is the optional extra grpo_pipe[math]")
    cfg = compose_cfg(["reward.verifier._target_=grpo_pipe.rewards.answers.MathVerifyVerifier"])
    reward = instantiate(cfg.reward)
    assert type(reward.verifier).__name__ == "MathVerifyVerifier"
    assert reward([_group("0.5", ["\\boxed{\\frac{1}{2}}", "\\boxed{\\frac{1}{3}}"])]).values == [1.0, 0.0]
