"""Which LoRA adapter each running generation call uses, so that an adapter is removed only once none does.

A request keeps the adapter it started with (a new adapter never reaches running requests). With async rollouts a
sync may serve a new adapter, and retire the old one, while a generation call still runs on the old one; vLLM then
looks for the removed adapter at its next step and, for an adapter built from memory, finds no folder to read it
from: the engine dies. So a call holds a lease on its adapter, and retiring a leased adapter only marks it; the
call's end removes it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

# The LoRARequest path of an adapter a bridge built inside the worker from memory (`weight_bridge=lora`): no folder exists.
IN_MEMORY_PREFIX = "in-memory:"


class AdapterLeases:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users: Counter[int] = Counter()  # adapter id -> running generation calls on it
        self._retiring: set[int] = set()  # retired while leased: removed when the last lease ends
        self.current: Any = None  # the LoRARequest new calls start with (None: no adapter)

    def __getstate__(self) -> dict[str, Any]:
        return {}  # an engine spec sent to another process (an engine actor) starts with no adapter and no lease

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def serve(self, request: Any) -> None:
        """New calls start with `request` from now on."""
        with self._lock:
            self.current = request

    def take(self) -> Any:
        """The adapter a call starting now uses, leased until `release` (read and leased at once, so a retire
        given meanwhile sees the lease)."""
        with self._lock:
            if self.current is not None:
                self._users[self.current.lora_int_id] += 1
            return self.current

    def release(self, request: Any) -> list[int]:
        """End a call's lease; returns the adapters retired meanwhile that no call uses any more."""
        if request is None:
            return []
        with self._lock:
            self._users[request.lora_int_id] -= 1
            free = [a for a in self._retiring if self._users[a] <= 0]
            self._retiring.difference_update(free)
            return free

    def retire(self, adapter_id: int, remove: Callable[[int], None]) -> None:
        """Remove the adapter now if no call uses it, else once the last one ends."""
        with self._lock:
            leased = self._users[adapter_id] > 0
            if leased:
                self._retiring.add(adapter_id)
        if not leased:
            remove(adapter_id)

    def leased(self) -> set[int]:
        with self._lock:
            return {a for a, n in self._users.items() if n > 0}
