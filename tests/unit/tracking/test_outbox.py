"""The outbox's delivery rules with a clock the test moves: order kept, back-off doubling to its cap, one warning
when the store goes away and one when it is back, a refused record dropped, and what is left at the end handed
back. Plus the pending file's round trip through the upload command into a real (sqlite) MLflow store."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from grpo_pipe.tracking import mlflow_records as records
from grpo_pipe.tracking.outbox import Outbox, Record, read_pending, write_pending
from grpo_pipe.tracking.upload import main as upload_main


class Store:
    """A store that is up or away; remembers what it took, in order."""

    def __init__(self) -> None:
        self.up = True
        self.taken: list[int] = []
        self.tries = 0

    def send(self, record: Record) -> None:
        self.tries += 1
        if not self.up:
            raise ConnectionError("connection refused")
        self.taken.append(record["n"])


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Refused(Exception):
    def get_http_status_code(self) -> int:
        return 400


def test_records_wait_with_capped_back_off_and_arrive_once_in_order(caplog: pytest.LogCaptureFixture) -> None:
    store, clock = Store(), Clock()
    box = Outbox(send=store.send, target="http://server", first_backoff_s=1.0, max_backoff_s=8.0, clock=clock)
    caplog.set_level(logging.WARNING, logger="grpo_pipe.tracking.outbox")
    box.put({"n": 1})
    assert box.deliver_due() is None and store.taken == [1]

    store.up = False
    waits = []
    for n in (2, 3):
        box.put({"n": n})
    for _ in range(5):
        wait = box.deliver_due()
        assert wait is not None
        assert box.deliver_due() == wait  # before the back-off ends nothing is tried
        waits.append(wait)
        clock.now += wait
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert store.tries == 1 + 5 and box.away
    box.put({"n": 4})

    store.up = True
    assert box.deliver_due() is None
    assert store.taken == [1, 2, 3, 4] and not box.away and box.pending() == []
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert "does not answer" in warnings[0] and "3 record(s) delivered late, none lost" in warnings[1]

    store.up = False  # a second outage starts over at the first back-off
    box.put({"n": 5})
    assert box.deliver_due() == 1.0 and box.outages == 2


def test_a_record_the_store_refuses_is_dropped_not_retried() -> None:
    taken: list[int] = []

    def send(record: Record) -> None:
        if record["n"] == 2:
            raise Refused("INVALID_PARAMETER_VALUE")
        taken.append(record["n"])

    box = Outbox(send=send, target="http://server", clock=Clock())
    for n in (1, 2, 3):
        box.put({"n": n})
    assert box.deliver_due() is None and taken == [1, 3]


def test_close_hands_back_what_an_absent_store_did_not_take() -> None:
    store = Store()
    box = Outbox(send=store.send, target="http://server", first_backoff_s=0.01, max_backoff_s=0.05)
    store.up = False
    box.start()
    for n in (1, 2, 3):
        box.put({"n": n})
    left = box.close(timeout_s=0.5)
    assert [r["n"] for r in left] == [1, 2, 3] and store.taken == [] and store.tries >= 2


def test_the_pending_file_uploads_once(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("upload", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    pending = [*records.metric_records({"train/loss": 0.5, "train/reward/mean": 1.0}, step=3, now_ms=1_000),
               *records.metric_records({"train/loss": 0.25}, step=4, now_ms=2_000),
               records.tag_record({"grpo_pipe.last_step": "4"}), records.end_record("FINISHED", None)]
    path = write_pending(pending, tmp_path / "mlflow_pending.jsonl", {"kind": "header", "tracking_uri": uri,
                                                                      "run_id": run_id})
    assert read_pending(path)[1] == pending

    assert upload_main([str(path)]) == 0
    assert upload_main([str(path)]) == 2  # the file is gone (renamed .uploaded): nothing is sent twice
    history = sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, "train/loss"))
    assert history == [(3, 0.5, 1_000), (4, 0.25, 2_000)]  # at the original steps and times
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["grpo_pipe.last_step"] == "4"
    assert (tmp_path / "mlflow_pending.jsonl.uploaded").is_file()


def test_during_an_outage_every_pending_and_new_record_is_journaled_at_once_and_the_journal_goes_when_it_ends(
    tmp_path: Path,
) -> None:
    store, clock, journal = Store(), Clock(), tmp_path / "mlflow_pending.jsonl"
    header = {"kind": "header", "tracking_uri": "http://server", "run_id": "r1"}
    box = Outbox(send=store.send, target="http://server", first_backoff_s=1.0, clock=clock, journal=journal,
                 journal_header=header)
    box.put({"n": 1})
    assert box.deliver_due() is None and not journal.exists()  # no outage, no journal

    store.up = False
    box.put({"n": 2})
    assert box.deliver_due() is not None  # the outage begins: what is pending is journaled
    box.put({"n": 3})  # logged during the outage: journaled as it is put, before any delivery is tried
    read_header, pending = read_pending(journal)  # readable as it stands: what a killed process leaves behind
    assert read_header == header and [r["n"] for r in pending] == [2, 3]

    store.up, clock.now = True, clock.now + 1.0
    assert box.deliver_due() is None and store.taken == [1, 2, 3]
    assert not journal.exists()  # all delivered: nothing left to upload
