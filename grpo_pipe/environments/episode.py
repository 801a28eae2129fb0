"""A tool episode's record while it runs (`environment=tools`, `environment=python`), and the completion the trainer
gets from it once it has ended.

`ToolEnvironment` (`environments/tool_environment.py`) runs the turns and appends each one here. The record keeps who
put each token there (`sampled`: the model, or the environment), the engine's log-probs and where the sampling policy's
version changed, so the completion is the engine's own tokens end to end, never text tokenized again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from grpo_pipe.environments.call_formats import ParsedTurn
from grpo_pipe.environments.toolbox import EpisodeTools
from grpo_pipe.types import Completion, EpisodeLog, RequestTelemetry, Turn

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Episode:
    """One episode while it runs: its tokens so far and what happened. `ToolEnvironment` starts it with its prompt and
    tools and appends each turn; `finish` turns it into what the trainer gets.

    Args:
        prompt: The prompt's tokens: the system prompt, the worked example and the task, in the chat template.
        tools: The episode's tools; None: the environment failed to start (counted; the episode ends after one turn).
        tokens: Every token after the prompt so far, the model's and the environment's, in order.
        logprobs: The engine's log-prob of each token (0.0 for the environment's).
        sampled: Whether the model sampled each token (False: the environment's, fed to the engine).
        first_version: The policy version that sampled the first turn; None before it.
        switches: (token index, policy version) wherever the version that samples changes.
        turns: The transcript: the model's turns and the tools' results, as text.
        model_turns: The model's turns so far.
        tool_calls: The calls run so far.
        tool_errors: Calls that answered with an error, and failures of the user's environment (its reset, reward or
            close).
        tool_timeouts: Calls abandoned after `tool_timeout_s`.
        tool_s: The seconds the calls took, together.
        fed_tokens: Prompt tokens of every turn's request (the prompt and the history so far).
        cached_tokens: Of those, the ones served from the prefix cache.
        last_finish: Why the engine ended the model's latest turn (`stop`, `length`).
        ended_by: Why the episode ended (`answer`, `length`, `done`, `max_turns`, `token_budget`,
            `environment_error`); None: it runs on.
        answer: The text of the model's last turn without a call: its final answer.
        pending: The call of the model's latest turn, if it made one.
    """

    prompt: tuple[int, ...]
    tools: EpisodeTools | None  # None: the environment failed to start (counted; the episode ends after one turn)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)
    first_version: int | None = None
    switches: list[tuple[int, int]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    model_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    tool_s: float = 0.0
    fed_tokens: int = 0  # prompt tokens of every turn's request (the prompt and the history so far)
    cached_tokens: int = 0  # of those, served from the prefix cache
    last_finish: str = "stop"
    ended_by: str | None = None
    answer: str = ""
    pending: ParsedTurn | None = None  # the call of the model's latest turn, if it made one

    @property
    def newest_version(self) -> int:
        return self.switches[-1][1] if self.switches else (self.first_version or 0)

    def finish(self) -> Completion:
        """The ended episode as the trainer takes it: its tokens with their log-probs, versions and owners, and its
        log. Asks the environment for its reward and closes it first, so it is called once, when the batch is done."""
        reward = None
        if self.tools is not None:
            try:
                reward = self.tools.reward()
                self.tools.close()
            except Exception as err:  # the user's environment: counted as a tool error, the reward left unset
                self.tool_errors += 1
                log.warning("environment reward() or close() failed: %s: %s", type(err).__name__, err)
        ended_by = self.ended_by or "answer"
        environment_tokens = len(self.sampled) - sum(self.sampled)
        log_ = EpisodeLog(
            turns=tuple(self.turns), model_turns=self.model_turns, tool_calls=self.tool_calls,
            tool_errors=self.tool_errors, tool_timeouts=self.tool_timeouts, tool_s=self.tool_s,
            environment_tokens=environment_tokens, ended_by=ended_by, environment_reward=reward, answer=self.answer,
        )
        # prompt_tokens: what the engine read for this episode, every turn's history included (a cost, and the base
        # of the prefix cache's share)
        telemetry = RequestTelemetry(prompt_tokens=self.fed_tokens, generated_tokens=sum(self.sampled),
                                     cached_prompt_tokens=self.cached_tokens)
        return Completion(
            token_ids=tuple(self.tokens), logprobs=tuple(self.logprobs), text=self.answer,
            finish_reason="length" if log_.hit_limit else self.last_finish,
            policy_version=self.first_version or 0, telemetry=telemetry, version_switches=tuple(self.switches),
            sampled_by_model=tuple(self.sampled), episode=log_,
        )
