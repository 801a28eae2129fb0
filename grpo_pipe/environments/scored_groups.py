"""A scored group from an environment service (Atropos's `ScoredData`) read as the trainer's own group, or refused.

Atropos hands a trainer, per group, every sequence's full tokens (prompt and completion), a mask (-100 where a token
is not trained, the token id where it is) and one score per sequence. Read here:
- The group's prompt is the tokens every sequence shares before its first trained token; the rest of each sequence is
  its completion, `sampled_by_model` marking the trained tokens (a multi-turn episode's environment turns are masked).
- Each sequence's score is its episode's `environment_reward`, what `reward=environment` trains on.
- Every trained span must be a completion the engine itself served after exactly the tokens before it (`ServedLog`):
  its log-probs and policy version come from the engine's record, never from the environment's copy. A span the
  engine never served (re-tokenised text, another server's output, a record since forgotten), or served at another
  temperature than the run trains at, refuses the group.
- Anything malformed refuses the group with the reason, counted by the caller: lengths that disagree, a score that is
  NaN or inf, an empty group, a token outside the vocabulary, a sequence longer than the model, a mask that names
  another token than the sequence holds, a sequence with nothing to train.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpo_pipe.serving.served_log import ServedLog
from grpo_pipe.types import Completion, EpisodeLog, RequestTelemetry, RolloutGroup, Task

NOT_TRAINED = -100  # Atropos's mask value for a token that gets no loss


class RefusedGroup(ValueError):
    """A scored group the trainer will not train on; the message says why."""


@dataclass(frozen=True)
class ScoredGroup:
    """A group as the trainer takes it, with the environment's scores.

    Args:
        group: The prompt and its completions, with the engine's log-probs and policy versions.
        scores: The environment's score of each completion, in order.
    """

    group: RolloutGroup
    scores: tuple[float, ...]


@dataclass(frozen=True)
class Limits:
    """What every scored group is checked against.

    Args:
        vocab_size: Token ids must lie in [0, vocab_size).
        max_model_len: The longest sequence the engine takes, in tokens.
        temperature: The run's sampling temperature; None: not checked.
    """

    vocab_size: int
    max_model_len: int
    temperature: float | None = None  # a span sampled at another has log-probs of another distribution


def read_scored_group(data: Mapping[str, Any], limits: Limits, served: ServedLog, uid: str) -> ScoredGroup:
    """`data` is one ScoredData dict; RefusedGroup says why it cannot be trained on."""
    tokens, masks, scores = data.get("tokens") or [], data.get("masks") or [], data.get("scores") or []
    _check_shapes(tokens, masks, scores)
    for index, (sequence, mask) in enumerate(zip(tokens, masks)):
        _check_sequence(index, sequence, mask, limits)
    prompt = _shared_prompt(tokens, masks)
    completions = tuple(_completion(i, seq, mask, len(prompt), served, float(score), limits.temperature)
                        for i, (seq, mask, score) in enumerate(zip(tokens, masks, scores)))
    task = Task(uid=uid, question="", answer="", metadata={"env_id": data.get("env_id")})
    return ScoredGroup(RolloutGroup(task, tuple(prompt), completions), tuple(float(s) for s in scores))


def _check_shapes(tokens: Sequence[Any], masks: Sequence[Any], scores: Sequence[Any]) -> None:
    if not tokens:
        raise RefusedGroup("empty group: no sequences")
    if not len(tokens) == len(masks) == len(scores):
        raise RefusedGroup(f"{len(tokens)} sequences, {len(masks)} masks and {len(scores)} scores: they must agree")
    bad = [i for i, s in enumerate(scores) if not isinstance(s, int | float) or not math.isfinite(s)]
    if bad:
        raise RefusedGroup(f"scores of sequences {bad[:5]} are not finite numbers: {[scores[i] for i in bad[:5]]}")


def _check_sequence(index: int, sequence: Sequence[int], mask: Sequence[int], limits: Limits) -> None:
    if len(sequence) != len(mask):
        raise RefusedGroup(f"sequence {index}: {len(sequence)} tokens but {len(mask)} mask entries")
    if len(sequence) > limits.max_model_len:
        raise RefusedGroup(f"sequence {index}: {len(sequence)} tokens, more than the model's {limits.max_model_len}")
    outside = [t for t in sequence if not isinstance(t, int) or not 0 <= t < limits.vocab_size]
    if outside:
        raise RefusedGroup(f"sequence {index}: token ids outside the vocabulary (0..{limits.vocab_size - 1}): "
                           f"{outside[:5]}")
    wrong = [p for p, (t, m) in enumerate(zip(sequence, mask)) if m not in (NOT_TRAINED, t)]
    if wrong:
        raise RefusedGroup(f"sequence {index}: the mask at positions {wrong[:5]} is neither {NOT_TRAINED} nor the token")
    if all(m == NOT_TRAINED for m in mask):
        raise RefusedGroup(f"sequence {index}: every token is masked, nothing to train")


def _shared_prompt(tokens: Sequence[Sequence[int]], masks: Sequence[Sequence[int]]) -> list[int]:
    """The longest start that every sequence shares and none trains on."""
    first_trained = min(next(p for p, m in enumerate(mask) if m != NOT_TRAINED) for mask in masks)
    prompt: list[int] = []
    for position in range(first_trained):
        column = {sequence[position] for sequence in tokens}
        if len(column) != 1:
            break
        prompt.append(tokens[0][position])
    return prompt


def _completion(index: int, sequence: Sequence[int], mask: Sequence[int], start: int, served: ServedLog,
                score: float, temperature: float | None) -> Completion:
    trained = [m != NOT_TRAINED for m in mask]
    logprobs = [0.0] * (len(sequence) - start)
    versions: list[tuple[int, int]] = []  # (offset in the completion, version) wherever a span starts or switches
    for begin, end in _spans(trained, start):
        record = served.find(sequence[:begin], sequence[begin:end])
        if record is None:
            raise RefusedGroup(f"sequence {index}: tokens {begin}..{end - 1} are not a completion the engine served "
                               "after exactly the tokens before them (re-tokenised text, or another server's output)")
        if temperature is not None and record.temperature is not None and record.temperature != temperature:
            raise RefusedGroup(f"sequence {index}: tokens {begin}..{end - 1} were sampled at temperature "
                               f"{record.temperature}, the run trains at {temperature} (run.temperature): their "
                               "log-probs are of another distribution; sample training groups at the run's temperature")
        logprobs[begin - start : end - start] = record.logprobs
        versions.append((begin - start, record.policy_version))
        versions += [(begin - start + at, version) for at, version in record.version_switches]
    first = versions[0][1]
    switches = tuple((at, v) for (at, v), (_, before) in zip(versions[1:], versions) if v != before)
    generated = sum(trained[start:])
    return Completion(
        token_ids=tuple(sequence[start:]), logprobs=tuple(logprobs), text="", finish_reason="stop",
        policy_version=first, version_switches=switches,
        telemetry=RequestTelemetry(prompt_tokens=start, generated_tokens=generated, cached_prompt_tokens=0),
        sampled_by_model=tuple(trained[start:]),
        episode=EpisodeLog(turns=(), model_turns=len(versions), environment_tokens=len(trained) - start - generated,
                           ended_by="done", environment_reward=score),
    )


def _spans(trained: Sequence[bool], start: int) -> list[tuple[int, int]]:
    """[begin, end) of each run of trained tokens at or after `start`."""
    spans, begin = [], None
    for position in range(start, len(trained) + 1):
        inside = position < len(trained) and trained[position]
        if inside and begin is None:
            begin = position
        elif not inside and begin is not None:
            spans.append((begin, position))
            begin = None
    return spans
