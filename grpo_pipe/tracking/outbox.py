"""What the tracker has to send, kept in order until the tracking store took it.

A tracking server that goes away (restarted, network down) must neither stop training nor lose a metric. The
tracker hands every record (a batch of metrics with their own step and time, params, tags, an artifact, a table,
the run's end) to an `Outbox`; a worker thread delivers them in order. When a delivery fails because the store does
not answer, the outbox warns once, keeps the record and tries again after a back-off that doubles up to a cap; when
the store answers again it says so once, with the count delivered late. A record the store refuses (HTTP 4xx: a bad
value) is logged and dropped: retrying would never succeed.

What is still pending at the end of a run is written as JSON lines (`write_pending`) for
`python -m grpo_pipe.tracking.upload FILE` to deliver later. During an outage the same file is a journal: when the
store stops answering, what is pending is written to it, and every record logged until the store answers again is
appended as it is logged; so a process killed outright (SIGKILL, the kernel's OOM killer) mid-outage loses nothing
the upload command cannot deliver. The journal is removed once the store has taken everything. Records carry their
original step and timestamp, and a SQL-backed MLflow store ignores a metric logged twice with the same key, step,
timestamp and value, so a record delivered twice (sent, then the reply lost; or delivered late, then uploaded
again from the journal of a killed run) is stored once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

Record = dict[str, Any]  # JSON-able: {"kind": "batch" | "artifact" | "table" | "end", ...}
PENDING_FILE = "mlflow_pending.jsonl"
UPLOAD_COMMAND = "python -m grpo_pipe.tracking.upload"


def store_refused(err: BaseException) -> bool:
    """True when the store answered and said no (HTTP 4xx); False when it did not answer (or failed, 5xx)."""
    status = getattr(err, "get_http_status_code", None)
    if status is None:
        return False
    try:
        return 400 <= int(status()) < 500
    except (TypeError, ValueError):
        return False


class Outbox:
    """Records delivered in order by `send`, retried with capped exponential back-off while the store is away.

    `deliver_due()` is one delivery attempt (used by the worker thread, and directly by tests with a fake clock);
    `start()` runs it in a daemon thread so that a log call only appends to a queue and never waits on the network.

    Args:
        send: Delivers one record to the store; raises when the store does not answer or refuses it.
        target: The store, named in the warnings while it is away.
        first_backoff_s: The wait before the first retry; it doubles with each failed attempt ...
        max_backoff_s: ... up to this cap.
        clock: Monotonic seconds (a fake one in tests).
        journal: The pending file, kept up to date while the store is away; None: no journal.
        journal_header: The journal's first line: where the records go (tracking URI, run id).
    """

    def __init__(
        self,
        *,
        send: Callable[[Record], None],
        target: str,
        first_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        journal: Path | None = None,
        journal_header: Record | None = None,
    ) -> None:
        self._send = send
        self.journal = journal
        self.journal_header = journal_header or {"kind": "header"}
        self._journal_file: Any = None  # open for appending while the store is away
        self.target = target
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self._clock = clock
        self._queue: deque[Record] = deque()
        self._lock = threading.Condition()
        self._backoff_s = first_backoff_s
        self._next_try = 0.0
        self.away = False  # the store did not answer the last attempt
        self.delivered_late = 0  # records delivered after an outage began (reset when it is over)
        self.outages = 0
        self._closing = False
        self._thread: threading.Thread | None = None

    def put(self, record: Record) -> None:
        with self._lock:
            self._queue.append(record)
            if self._journal_file is not None:
                self._journal_file.write(json.dumps(record, default=str) + "\n")
                self._journal_file.flush()  # in the kernel's hands: a SIGKILL of this process cannot lose it
            self._lock.notify_all()

    def pending(self) -> list[Record]:
        with self._lock:
            return list(self._queue)

    def deliver_due(self) -> float | None:
        """Deliver pending records in order until one fails or none is left. Returns the seconds until the next
        attempt is due (after a failure), or None when the queue is empty. Does nothing before a back-off ends."""
        now = self._clock()
        if now < self._next_try:
            return self._next_try - now
        while True:
            with self._lock:
                if not self._queue:
                    return None
                record = self._queue[0]
            try:
                self._send(record)
            except Exception as err:  # noqa: BLE001 - any failure of the store or the network
                if store_refused(err):
                    log.error("The tracking store refused a %s record; dropped: %s", record.get("kind"), err)
                    self._pop(record)
                    continue
                return self._failed(err)
            self._pop(record)
            self._delivered()

    def _pop(self, record: Record) -> None:
        with self._lock:
            if self._queue and self._queue[0] is record:
                self._queue.popleft()
            self._lock.notify_all()  # a closer waiting for the queue to empty

    def _failed(self, err: BaseException) -> float:
        if not self.away:
            self.away, self.outages = True, self.outages + 1
            self._open_journal()
            log.warning(
                "The tracking server %s does not answer (%s). Training goes on; metrics and artifacts are kept and "
                "sent again with back-off (%.0f s up to %.0f s)%s.", self.target, _short(err), self.first_backoff_s,
                self.max_backoff_s, "" if self.journal is None else
                f", and journaled in {self.journal} (if this process is killed: {UPLOAD_COMMAND} {self.journal})",
            )
        wait = self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self.max_backoff_s)
        self._next_try = self._clock() + wait
        return wait

    def _delivered(self) -> None:
        self._backoff_s, self._next_try = self.first_backoff_s, 0.0
        if self.away:
            self.delivered_late += 1
            with self._lock:
                caught_up = not self._queue
            if caught_up:
                log.warning("The tracking server %s answers again: %d record(s) delivered late, none lost.",
                            self.target, self.delivered_late)
                self.away, self.delivered_late = False, 0
                self._drop_journal()

    def _open_journal(self) -> None:
        """The outage began: what is pending goes to the journal now, and every record logged from now on with it."""
        if self.journal is None:
            return
        with self._lock:
            write_pending(self._queue, self.journal, self.journal_header)
            self._journal_file = self.journal.open("a")

    def _drop_journal(self) -> None:
        with self._lock:
            if self._journal_file is not None:
                self._journal_file.close()
                self._journal_file = None
                if self.journal is not None:
                    self.journal.unlink(missing_ok=True)

    # -- the worker thread ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="tracking-outbox", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            wait = self.deliver_due()
            with self._lock:
                if self._closing and (not self._queue or wait is not None):
                    return  # the closer decides what happens to what is left
                if wait is None and not self._queue:
                    self._lock.wait()
                elif wait is not None:
                    self._lock.wait(timeout=wait)

    def close(self, timeout_s: float) -> list[Record]:
        """Deliver what is pending, trying for at most `timeout_s` (back-off capped at a few seconds meanwhile);
        stop the worker and return what could not be delivered."""
        if self._thread is None:
            self.deliver_due()
            return self.pending()
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self.max_backoff_s = min(self.max_backoff_s, 5.0)
            self._backoff_s = min(self._backoff_s, self.max_backoff_s)
            self._next_try = min(self._next_try, self._clock() + self._backoff_s)
            self._lock.notify_all()
            while self._queue and time.monotonic() < deadline:
                self._lock.wait(timeout=min(1.0, max(deadline - time.monotonic(), 0.0)))
            self._closing = True
            self._lock.notify_all()
        self._thread.join(timeout=max(deadline - time.monotonic(), 0.0) + 30.0)
        self._thread = None
        undelivered = self.pending()
        if not undelivered:
            self._drop_journal()
        elif self._journal_file is not None:  # the caller rewrites the file with exactly what is left
            with self._lock:
                self._journal_file.close()
                self._journal_file = None
        return undelivered


def write_pending(records: Iterable[Record], path: Path, header: Record) -> Path:
    """`header` (where the records go: tracking URI, run id) then one record per line; atomically."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as out:
        for item in (header, *records):
            out.write(json.dumps(item, default=str) + "\n")
    tmp.replace(path)
    return path


def read_pending(path: Path) -> tuple[Record, list[Record]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not lines or lines[0].get("kind") != "header":
        raise ValueError(f"{path}: not a file of pending tracking records (no header line)")
    return lines[0], lines[1:]


def _short(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return text if len(text) <= 200 else text[:200] + "..."
