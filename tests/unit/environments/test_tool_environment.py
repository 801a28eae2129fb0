"""The episode loop's logic against a scripted in-memory engine (characters as tokens): the user's environment class,
every limit, malformed calls and failing environments. The real engine runs episodes in
tests/integration/environments/test_tool_environment.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo_pipe.environments.tool_environment import ToolEnvironment
from grpo_pipe.rewards.environment import EnvironmentReward
from grpo_pipe.types import Completion, RequestTelemetry, RolloutGroup, SamplingSettings, Task

EOS = "\x03"


class CharTokenizer:
    """One character, one token; a ChatML-like template; EOS ends a turn."""

    eos_token, eos_token_id, pad_token_id = EOS, ord(EOS), 0

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False,
                            tokenize: bool = False, **_: Any) -> str:
        text = "".join(f"[{m['role']}]{m['content']}{EOS}\n" for m in messages)
        return text + ("[assistant]" if add_generation_prompt else "")

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == self.eos_token_id))


class ScriptedEngine:
    """Writes `script(conversation so far)` as the next turn, cut at a stop string as vLLM cuts it."""

    def __init__(self, script: Callable[[str], str]) -> None:
        self.script = script
        self.served_version = 0
        self.calls = 0

    def generate(self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
                 ) -> list[list[Completion]]:
        self.calls += 1
        return [[self._turn("".join(map(chr, p)), sampling, i) for _ in range(n)]
                for i, (p, n) in enumerate(zip(prompts, samples))]

    def _turn(self, conversation: str, sampling: SamplingSettings, index: int) -> Completion:
        text = self.script(conversation)
        finish = "stop"
        for stop in sampling.extra.get("stop", []):
            if stop in text:
                text = text[: text.index(stop) + len(stop)]
                break
        else:
            text += EOS  # no call: the model ends its turn
        budget = sampling.max_tokens_of(index)
        if len(text) > budget:
            text, finish = text[:budget], "length"
        ids = tuple(map(ord, text))
        return Completion(token_ids=ids, logprobs=(-0.1,) * len(ids), text=text, finish_reason=finish,
                          policy_version=self.served_version,
                          telemetry=RequestTelemetry(prompt_tokens=len(conversation), generated_tokens=len(ids),
                                                     cached_prompt_tokens=0))


def _episodes(**settings: Any) -> ToolEnvironment:
    episodes = ToolEnvironment(**{"environment_class": "tests/fixtures/environments/counter.py:Counter", **settings})
    assert episodes.config_problems() == []
    episodes.setup(CharTokenizer(), "Count.", max_model_len=4096)
    return episodes


def _run(episodes: ToolEnvironment, script: Callable[[str], str], answer: str = "4") -> Completion:
    task = Task(uid="t", question="Reach the target.", answer=answer)
    engine = ScriptedEngine(script)
    return episodes.generate(engine, [task], [episodes.render_prompt(task)], [1], SamplingSettings(max_tokens=40))[0][0]


def test_the_users_environment_runs_the_episode_says_when_it_is_done_and_scores_it() -> None:
    completion = _run(_episodes(), lambda conversation: "<add>2</add> and more")
    episode = completion.episode
    assert episode is not None and episode.ended_by == "done" and episode.environment_reward == 1.0
    assert [t.text for t in episode.turns if t.role == "tool"] == ["2", "4"]
    assert episode.model_turns == 2 and episode.tool_calls == 2 and episode.tool_errors == 0
    # Token-exact: every token is the scripted engine's or the template's glue, and the mask says which.
    text = "".join(map(chr, completion.token_ids))
    glue = f"{EOS}\n[tool]<tool_response>2</tool_response>{EOS}\n[assistant]"
    assert text == f"<add>2</add>{glue}<add>2</add>{glue.replace('>2<', '>4<')}"
    assert completion.loss_mask == tuple([True] * 12 + [False] * len(glue) + [True] * 12 + [False] * len(glue))
    group = RolloutGroup(Task(uid="t", question="q", answer="4"), (), (completion,))
    assert EnvironmentReward()([group]).values == [1.0]
    # What the engine read: the prompt for turn one, the prompt and turn one's tokens for turn two.
    prompt = len(_episodes().render_prompt(Task(uid="t", question="Reach the target.", answer="4")))
    assert completion.telemetry.prompt_tokens == prompt + prompt + 12 + len(glue)


def test_limits_end_episodes_and_are_counted() -> None:
    at_turns = _run(_episodes(max_turns=3), lambda conversation: "<add>1</add>", answer="100").episode
    assert at_turns is not None and at_turns.ended_by == "max_turns" and at_turns.model_turns == 3
    assert at_turns.tool_calls == 2 and at_turns.hit_limit  # the last turn's call is not run
    budget = _run(_episodes(max_episode_tokens=60), lambda conversation: "<add>1</add>", answer="100")
    assert budget.episode is not None and budget.episode.ended_by == "token_budget" and len(budget.token_ids) < 60
    assert budget.finish_reason == "length"  # what loss.mask_truncated reads


def test_a_malformed_call_is_an_error_observation_and_the_episode_goes_on() -> None:
    turns = iter(["<add>two</add>", "<add>4", "#### 4"])
    completion = _run(_episodes(), lambda conversation: next(turns))
    episode = completion.episode
    assert episode is not None and episode.tool_errors == 2 and episode.ended_by == "answer"
    results = [t.text for t in episode.turns if t.role == "tool"]
    assert results == ["error: add: amount must be of type integer, got 'two'",
                       "error: the call <add> was not closed with </add>"]
    assert completion.text == "#### 4"  # what the checker grades: the final answer


def test_an_environment_that_fails_to_start_ends_only_its_episode() -> None:
    completion = _run(_episodes(), lambda conversation: "<add>1</add>", answer="not a number")
    episode = completion.episode
    assert episode is not None and episode.ended_by == "environment_error" and episode.tool_errors == 1
    assert episode.model_turns == 1 and episode.environment_reward is None


def test_text_that_reset_returns_is_not_shown_and_the_run_warns_once(caplog) -> None:
    episodes = _episodes(environment_class="tests/fixtures/environments/greeting.py:Greeting")
    for _ in range(2):
        completion = _run(episodes, lambda conversation: "<add>1</add>")
        assert "Welcome" not in "".join(map(chr, completion.token_ids))
    warnings = [r.getMessage() for r in caplog.records if "reset() returned" in r.getMessage()]
    assert len(warnings) == 1 and "Welcome" in warnings[0] and "put what it should read in the task" in warnings[0]


def test_episodes_in_the_background_give_what_they_give_in_place() -> None:
    script = lambda conversation: "<add>2</add>"  # noqa: E731
    task = Task(uid="t", question="Reach the target.", answer="4")
    here, behind = _episodes(), _episodes(background=True)
    sampling = SamplingSettings(max_tokens=40)
    expected = here.generate(ScriptedEngine(script), [task], [here.render_prompt(task)], [2], sampling)
    pending = [behind.submit(ScriptedEngine(script), [task], [behind.render_prompt(task)], [2], sampling) for _ in range(3)]
    for handle in pending:
        assert [c.token_ids for c in handle.result().completions[0]] == [c.token_ids for c in expected[0]]
