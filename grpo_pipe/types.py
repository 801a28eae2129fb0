"""Small value types passed between components. Shapes are noted where a field holds a sequence."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    Scalar = float | torch.Tensor  # a statistic: a float, or a 0-dim tensor not yet read from its device


@dataclass(frozen=True, kw_only=True)
class Task:
    """One prompt source item: a question and the reference answer used to score it.

    Args:
        uid: Stable id across epochs and resumes, e.g. "gsm8k/train/17".
        question: The question as the model reads it.
        answer: Reference final answer, already extracted (e.g. "72").
        metadata: Extra dataset columns (difficulty, source, test cases, ...): rewards receive them per completion.
        messages: A chat-style prompt ({"role", "content"} messages) that replaces system prompt + question when
            set.
    """

    uid: str
    question: str
    answer: str
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)
    messages: tuple[Mapping[str, str], ...] | None = field(default=None, hash=False)


@dataclass(frozen=True, kw_only=True)
class RequestTelemetry:
    """Per-request numbers reported by the engine itself (never estimated by us).

    Args:
        prompt_tokens: Tokens of the request's prompt.
        generated_tokens: Tokens the engine generated for it.
        cached_prompt_tokens: Prefix-cache hits for this request's prompt.
        queued_s: When the engine queued the request; None when the engine does not report timestamps.
        first_token_s: When the engine produced the first token; None when not reported.
        last_token_s: When it produced the last one; None when not reported.
        spec_acceptance_rate: The share of draft tokens the engine accepted; None without speculative decoding.
    """

    prompt_tokens: int
    generated_tokens: int
    cached_prompt_tokens: int
    queued_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    spec_acceptance_rate: float | None = None

    @property
    def latency_s(self) -> float | None:
        """Queued -> last token, from the request's own timestamps."""
        if self.queued_s is None or self.last_token_s is None:
            return None
        return self.last_token_s - self.queued_s


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One sampled answer to a prompt.

    Args:
        token_ids: [T] generated tokens, EOS included when it was sampled.
        logprobs: [T] log-probability of each token under the sampling policy.
        text: The completion decoded (for a checker and for people).
        finish_reason: "stop" | "length" | "abort".
        policy_version: Version of the weights that generated its first token.
        telemetry: What the engine reported for the request.
        version_switches: ((token index, version), ...): where newer weights took over mid-sample (in-flight weight
            updates, or a sync that landed between two turns of an episode)
        sampled_by_model: [T] True where the engine sampled the token, False where the environment put it (tool
            results and the chat template's glue between turns): those get no loss, no advantage, no place in any
            normaliser. None: one turn, every token sampled.
        episode: What happened in a multi-turn episode (None: one turn).
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: str
    policy_version: int
    telemetry: RequestTelemetry
    version_switches: tuple[tuple[int, int], ...] = ()
    sampled_by_model: tuple[bool, ...] | None = None
    episode: EpisodeLog | None = None

    @property
    def loss_mask(self) -> tuple[bool, ...]:
        """[T] which tokens the trainer may train on."""
        return self.sampled_by_model if self.sampled_by_model is not None else (True,) * len(self.token_ids)

    @property
    def newest_version(self) -> int:
        return self.version_switches[-1][1] if self.version_switches else self.policy_version


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One turn of an episode as a person reads it: what the model wrote, or what a tool answered.

    Args:
        role: Who wrote the turn: "assistant" or "tool".
        text: What was written in the turn.
        tool: The tool called (assistant) or answering (tool).
        outcome: A tool turn: ok | error | timeout | truncated.
    """

    role: str
    text: str
    tool: str | None = None
    outcome: str = "ok"


@dataclass(frozen=True, kw_only=True)
class EpisodeLog:
    """What one multi-turn episode did: its turns, the tools' work and how it ended.

    Args:
        turns: Every turn, in order.
        model_turns: Turns the model wrote.
        tool_calls: Calls the model made.
        tool_errors: Calls that failed: a malformed call, an unknown tool, a tool that raised or returned a non-string.
        tool_timeouts: Calls that ran past the tool's time limit.
        tool_s: Wall time the episode's tool calls took (the batch waits for the slowest of a turn).
        environment_tokens: Tokens of the completion the environment put there (masked from the loss).
        ended_by: How it ended: answer | done (the environment said so) | max_turns | token_budget | length.
        environment_reward: What an environment that owns the reward gave the episode.
        answer: The final model turn's text when it called no tool: what a checker grades.
    """

    turns: tuple[Turn, ...]
    model_turns: int
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    tool_s: float = 0.0
    environment_tokens: int = 0
    ended_by: str = "answer"
    environment_reward: float | None = None
    answer: str = ""

    @property
    def hit_limit(self) -> bool:
        return self.ended_by in ("max_turns", "token_budget", "length")


@dataclass(frozen=True)
class GeneratedBatch:
    """What one generation call returned, with when the engine worked on it (wall clock, `time.time()`).

    Args:
        completions: [prompts][samples] the completions of each prompt.
        started_s: When the engine started on it (wall clock).
        finished_s: When it finished (wall clock).
    """

    completions: list[list[Completion]]
    started_s: float
    finished_s: float

    def result(self) -> GeneratedBatch:
        """A finished batch is its own pending handle (engines that generate in place return it)."""
        return self


@dataclass(frozen=True)
class RolloutGroup:
    """All completions sampled for one task: the unit GRPO normalises advantages over.

    Args:
        task: The task every completion answers.
        prompt_token_ids: [P] the prompt's token ids, as the engine saw them.
        completions: [G] the group's completions.
    """

    task: Task
    prompt_token_ids: tuple[int, ...]
    completions: tuple[Completion, ...]


@dataclass(frozen=True, kw_only=True)
class RewardOutput:
    """Per-completion rewards and the named terms they were built from (logged separately).

    Args:
        values: [N] total reward per completion.
        terms: Each named term of the reward, [N] per name.
        correct: [N] whether each completion is correct, when the reward knows.
        task_values: [N] the task score alone, when `values` adds serving costs.
    """

    values: list[float]
    terms: dict[str, list[float]] = field(default_factory=dict)
    correct: list[bool] | None = None
    task_values: list[float] | None = None

    @property
    def difficulty_signal(self) -> list[float]:
        """What a curriculum should judge a task's difficulty by: how well it was solved, not what it cost."""
        return self.values if self.task_values is None else self.task_values


@dataclass(frozen=True, kw_only=True)
class SyncStats:
    """What one weight synchronisation cost, broken down by phase.

    Args:
        gather_s: Seconds to collect and convert the trainer's weights.
        transport_s: Seconds to move the bytes to the engine (0 in process).
        load_s: Seconds the engine took to load them.
        pause_s: Seconds generation was unavailable.
        bytes_moved: Bytes sent to the engine.
        policy_version: Version the engine serves afterwards.
        total_s: Wall time of the whole push, measured by the caller (bridges/contract.py).
    """

    gather_s: float
    transport_s: float
    load_s: float
    pause_s: float
    bytes_moved: int
    policy_version: int
    total_s: float | None = None

    def as_metrics(self) -> dict[str, float]:
        phases = self.gather_s + self.transport_s + self.load_s
        return {
            "sync/gather_s": self.gather_s,
            "sync/transport_s": self.transport_s,
            "sync/load_s": self.load_s,
            "sync/pause_s": self.pause_s,
            "sync/total_s": phases if self.total_s is None else self.total_s,
            "sync/bytes": float(self.bytes_moved),
            "sync/policy_version": float(self.policy_version),
        }


@dataclass(frozen=True, kw_only=True)
class SamplingSettings:
    """How completions are sampled for training.

    Args:
        temperature: Sampling temperature (the trainer's log-probs use the same).
        top_p: Nucleus sampling's mass; only 1.0 is accepted for training (run.top_p).
        max_tokens: Tokens one completion may generate.
        seed: When set, prompt i of a call is sampled with its own seed derived from it; None: unseeded.
        extra: Other vLLM sampling parameters (`run.sampling_extra`), only ones that leave the distribution as it
            is.
        max_tokens_each: [prompts] a budget per prompt (an episode's next turn gets what its token budget has left);
            None: max_tokens.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 128
    seed: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    max_tokens_each: tuple[int, ...] | None = None

    def max_tokens_of(self, index: int) -> int:
        return self.max_tokens if self.max_tokens_each is None else self.max_tokens_each[index]

    def prompt_seed(self, index: int) -> int | None:
        """A seed per prompt (vLLM gives the n samples of a prompt seed, seed + 1, ...)."""
        if self.seed is None:
            return None
        return derive_seed(self.seed, index) * 4096 % 2**62


def derive_seed(seed: int, index: int) -> int:
    """The seed of stream `index` (a batch, a prompt) of a run seeded with `seed`: distinct for distinct
    indices, and a function of the two alone, so a resumed run draws exactly what the uninterrupted one did."""
    return seed * 1_000_003 + index


@dataclass(frozen=True, kw_only=True)
class LossStats:
    """Detached statistics of one loss call: sums over its tokens (the trainer adds them over micro-batches
    and divides by the token counts) and maxima. A loss without clipping or importance weights leaves those
    at their defaults. A loss may give 0-dim tensors (nothing is read from the device until the trainer reads a
    whole pass's statistics at once, trainer/device_values.py) or floats.

    Args:
        tokens: Tokens that got a loss.
        clipped_tokens: Tokens whose surrogate the clip replaced (no gradient).
        positive_tokens: Tokens of completions with advantage > 0.
        clipped_positive: Of those, the clipped ones (the ratio rose past 1 + clip_high).
        negative_tokens: Tokens of completions with advantage < 0.
        clipped_negative: Of those, the clipped ones (the ratio fell below 1 - clip_low).
        kl_sum: The k3 KL to the frozen reference, summed (kl_coef > 0).
        ratio_max: The largest ratio the clip saw.
        is_weight_sum: The sampling correction's weights, summed; None: no weights (1 per token).
        is_truncated: Tokens whose importance weight the cap cut.
    """

    tokens: Scalar
    clipped_tokens: Scalar = 0.0
    positive_tokens: Scalar = 0.0
    clipped_positive: Scalar = 0.0
    negative_tokens: Scalar = 0.0
    clipped_negative: Scalar = 0.0
    kl_sum: Scalar = 0.0
    ratio_max: Scalar = 1.0
    is_weight_sum: Scalar | None = None
    is_truncated: Scalar = 0.0


@dataclass(frozen=True, kw_only=True)
class TakenBatch:
    """The next batch to train on, and what it took to get it.

    Args:
        groups: The groups to train on (stale ones removed under `drop`).
        staleness: [len(groups)] policy versions each group's weights lag the trainer's.
        dropped: (task uid, staleness) of groups discarded as too stale.
        generated: The generation call the groups came from.
        wait_s: How long the trainer waited for it.
        engine_gap_s: How long the engine sat idle between the previous batch and this one.
        queue_depth: Batches in flight when it was taken (itself included).
    """

    groups: list[RolloutGroup]
    staleness: list[int]
    dropped: list[tuple[str, int]]
    generated: GeneratedBatch
    wait_s: float
    engine_gap_s: float
    queue_depth: int


@dataclass(kw_only=True)
class Ledger:
    """Where every submitted group went. `trained + dropped + in_flight == submitted`, always.

    Args:
        submitted: Groups sent to the engine.
        trained: Groups trained on.
        dropped: Groups dropped, by reason.
        in_flight: Groups generated or generating, not yet trained or dropped.
        repeated: Groups trained, or generated again, after they were trained: 0 in a run that repeats nothing.
    """

    submitted: int = 0
    trained: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    repeated: int = 0

    def balanced(self) -> bool:
        return self.trained + sum(self.dropped.values()) + self.in_flight == self.submitted and self.repeated == 0


@dataclass(frozen=True, kw_only=True)
class TrackedRun:
    """The run a tracker opens for one job (`Tracker.start`): what it is called and tagged, where it belongs.

    Args:
        name: The run's display name.
        tags: Facts known at the start (config choices, the machine), set on the run.
        sweep_dir: The sweep's folder when the run is one job of a sweep (its runs are nested under one parent).
        resume_run_id: The id of the run a resumed job continues, or None for a new run.
        output_dir: The job's folder, where a tracker may leave what it could not deliver.
    """

    name: str
    tags: Mapping[str, str]
    sweep_dir: str | None = None
    resume_run_id: str | None = None
    output_dir: Path | None = None
