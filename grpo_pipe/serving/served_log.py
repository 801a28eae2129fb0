"""What the endpoint served, remembered so a scored group that comes back from an environment can be checked against
it: a trainer trains only on tokens the engine sampled, after exactly the tokens it was fed, and takes their log-probs
and policy version from the engine's record, never from the environment's copy.

Entries are keyed by a digest of (prompt, completion) token ids and kept for the newest `capacity` completions; an
environment that scores a completion later than that finds it forgotten, and the group is refused (counted).
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from grpo_pipe.types import Completion


@dataclass(frozen=True, kw_only=True)
class ServedCompletion:
    """The engine's record of one completion: its log-probs and the versions that sampled it.

    Args:
        logprobs: The log-prob of each completion token, as the engine sampled it.
        policy_version: The policy version that sampled it.
        version_switches: ((token index, version), ...): where newer weights took over mid-completion.
        temperature: What it was sampled at (its log-probs are of that distribution); None: not recorded.
    """

    logprobs: tuple[float, ...]
    policy_version: int
    version_switches: tuple[tuple[int, int], ...]
    temperature: float | None = None


class ServedLog:
    """A bounded record of (prompt, completion) -> what the engine said about it; safe across threads.

    Args:
        capacity: The most completions kept; the oldest go first.
    """

    def __init__(self, capacity: int = 65536) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[bytes, ServedCompletion] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, prompt: Sequence[int], completion: Completion, temperature: float | None = None) -> None:
        entry = ServedCompletion(logprobs=tuple(completion.logprobs), policy_version=completion.policy_version,
                                 version_switches=completion.version_switches,
                                 temperature=temperature)
        key = _digest(prompt, completion.token_ids)
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def find(self, prompt: Sequence[int], completion: Sequence[int]) -> ServedCompletion | None:
        """The record of `completion` sampled after exactly `prompt`, if the engine served it lately."""
        with self._lock:
            return self._entries.get(_digest(prompt, completion))

    def __len__(self) -> int:
        return len(self._entries)


def _digest(prompt: Sequence[int], completion: Sequence[int]) -> bytes:
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(array("q", prompt).tobytes())
    hasher.update(b"|")  # where the prompt ends is part of the key
    hasher.update(array("q", completion).tobytes())
    return hasher.digest()
