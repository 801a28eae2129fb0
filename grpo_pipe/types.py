"""Small value types passed between components. Shapes are noted where a field holds a sequence."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    Scalar = float | torch.Tensor  # a statistic: a float, or a 0-dim tensor not yet read from its device


@dataclass(frozen=True, kw_only=True)
class Task:
    """One prompt source item: a question and the reference answer used to score it."""

    uid: str  # stable id across epochs and resumes, e.g. "gsm8k/train/17"
    question: str
    answer: str  # reference final answer, already extracted (e.g. "72")
    # Extra dataset columns (difficulty, source, test cases, ...): rewards receive them per completion.
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # A chat-style prompt ({"role", "content"} messages) that replaces system prompt + question when set.
    messages: tuple[Mapping[str, str], ...] | None = field(default=None, hash=False)


@dataclass(frozen=True, kw_only=True)
class RequestTelemetry:
    """Per-request numbers reported by the engine itself (never estimated by us)."""

    prompt_tokens: int
    generated_tokens: int
    cached_prompt_tokens: int  # prefix-cache hits for this request's prompt
    queued_s: float | None = None  # engine timestamps; None when the engine does not report them
    first_token_s: float | None = None
    last_token_s: float | None = None
    spec_acceptance_rate: float | None = None  # None without speculative decoding

    @property
    def latency_s(self) -> float | None:
        """Queued -> last token, from the request's own timestamps."""
        if self.queued_s is None or self.last_token_s is None:
            return None
        return self.last_token_s - self.queued_s


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One sampled answer to a prompt."""

    token_ids: tuple[int, ...]  # [T] generated tokens, EOS included when it was sampled
    logprobs: tuple[float, ...]  # [T] log-probability of each token under the sampling policy
    text: str
    finish_reason: str  # "stop" | "length" | "abort"
    policy_version: int  # version of the weights that generated its first token
    telemetry: RequestTelemetry
    # ((token index, version), ...): where newer weights took over mid-sample (in-flight weight updates, or a
    # sync that landed between two turns of an episode)
    version_switches: tuple[tuple[int, int], ...] = ()
    # [T] True where the engine sampled the token, False where the environment put it (tool results and the chat
    # template's glue between turns): those get no loss, no advantage, no place in any normaliser. None: one turn,
    # every token sampled.
    sampled_by_model: tuple[bool, ...] | None = None
    episode: EpisodeLog | None = None  # what happened in a multi-turn episode (None: one turn)

    @property
    def loss_mask(self) -> tuple[bool, ...]:
        """[T] which tokens the trainer may train on."""
        return self.sampled_by_model if self.sampled_by_model is not None else (True,) * len(self.token_ids)

    @property
    def newest_version(self) -> int:
        return self.version_switches[-1][1] if self.version_switches else self.policy_version


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One turn of an episode as a person reads it: what the model wrote, or what a tool answered."""

    role: str  # "assistant" | "tool"
    text: str
    tool: str | None = None  # the tool called (assistant) or answering (tool)
    outcome: str = "ok"  # a tool turn: ok | error | timeout | truncated


@dataclass(frozen=True, kw_only=True)
class EpisodeLog:
    """What one multi-turn episode did: its turns, the tools' work and how it ended."""

    turns: tuple[Turn, ...]
    model_turns: int
    tool_calls: int = 0
    tool_errors: int = 0  # a malformed call, an unknown tool, a tool that raised or returned a non-string
    tool_timeouts: int = 0
    tool_s: float = 0.0  # wall time the episode's tool calls took (the batch waits for the slowest of a turn)
    environment_tokens: int = 0  # tokens of the completion the environment put there (masked from the loss)
    ended_by: str = "answer"  # answer | done (the environment said so) | max_turns | token_budget | length
    environment_reward: float | None = None  # what an environment that owns the reward gave the episode
    answer: str = ""  # the final model turn's text when it called no tool: what a checker grades

    @property
    def hit_limit(self) -> bool:
        return self.ended_by in ("max_turns", "token_budget", "length")


@dataclass(frozen=True)
class GeneratedBatch:
    """What one generation call returned, with when the engine worked on it (wall clock, `time.time()`)."""

    completions: list[list[Completion]]  # [prompts][samples]
    started_s: float
    finished_s: float

    def result(self) -> GeneratedBatch:
        """A finished batch is its own pending handle (engines that generate in place return it)."""
        return self


@dataclass(frozen=True)
class RolloutGroup:
    """All completions sampled for one task: the unit GRPO normalises advantages over."""

    task: Task
    prompt_token_ids: tuple[int, ...]  # [P]
    completions: tuple[Completion, ...]  # [G]


@dataclass(frozen=True, kw_only=True)
class RewardOutput:
    """Per-completion rewards and the named terms they were built from (logged separately)."""

    values: list[float]  # [N] total reward per completion
    terms: dict[str, list[float]] = field(default_factory=dict)  # name -> [N]
    correct: list[bool] | None = None  # [N] when the reward knows about correctness
    task_values: list[float] | None = None  # [N] the task score alone, when `values` adds serving costs

    @property
    def difficulty_signal(self) -> list[float]:
        """What a curriculum should judge a task's difficulty by: how well it was solved, not what it cost."""
        return self.values if self.task_values is None else self.task_values


@dataclass(frozen=True, kw_only=True)
class SyncStats:
    """What one weight synchronisation cost, broken down by phase."""

    gather_s: float  # collect / convert trainer weights
    transport_s: float  # move bytes to the engine (0 for in-process)
    load_s: float  # engine-side load
    pause_s: float  # time generation was unavailable
    bytes_moved: int
    policy_version: int  # version the engine serves afterwards
    total_s: float | None = None  # wall time of the whole push, measured by the caller (bridges.contract)

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
    """How completions are sampled for training."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 128
    seed: int | None = None  # set: prompt i of this call is sampled with its own seed derived from it
    # Other vLLM sampling parameters (`run.sampling_extra`), only ones that leave the distribution as it is.
    extra: Mapping[str, Any] = field(default_factory=dict)
    # [prompts] a budget per prompt (an episode's next turn gets what its token budget has left); None: max_tokens
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
    whole pass's statistics at once, trainer/device_values.py) or floats."""

    tokens: Scalar  # tokens that got a loss
    clipped_tokens: Scalar = 0.0  # tokens whose surrogate the clip replaced (no gradient)
    positive_tokens: Scalar = 0.0  # tokens of completions with advantage > 0
    clipped_positive: Scalar = 0.0  # ... of which clipped (the ratio rose past 1 + clip_high)
    negative_tokens: Scalar = 0.0  # tokens of completions with advantage < 0
    clipped_negative: Scalar = 0.0  # ... of which clipped (the ratio fell below 1 - clip_low)
    kl_sum: Scalar = 0.0  # k3 KL to the frozen reference (kl_coef > 0)
    ratio_max: Scalar = 1.0  # the largest ratio the clip saw
    is_weight_sum: Scalar | None = None  # truncated importance weights; None = no weights (1 per token)
    is_truncated: Scalar = 0.0  # tokens whose importance weight the cap cut


@dataclass(frozen=True, kw_only=True)
class TakenBatch:
    """The next batch to train on, and what it took to get it."""

    groups: list[RolloutGroup]  # the groups to train on (stale ones removed under `drop`)
    staleness: list[int]  # [len(groups)] policy versions each group's weights lag the trainer's
    dropped: list[tuple[str, int]]  # (task uid, staleness) of groups discarded as too stale
    generated: GeneratedBatch
    wait_s: float  # how long the trainer waited for it
    engine_gap_s: float  # how long the engine sat idle between the previous batch and this one
    queue_depth: int  # batches in flight when it was taken (itself included)


@dataclass(kw_only=True)
class Ledger:
    """Where every submitted group went. `trained + dropped + in_flight == submitted`, always."""

    submitted: int = 0
    trained: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> groups
    in_flight: int = 0
    repeated: int = 0  # groups trained, or generated again, after they were trained: 0 in a run that repeats nothing

    def balanced(self) -> bool:
        return self.trained + sum(self.dropped.values()) + self.in_flight == self.submitted and self.repeated == 0
