"""Upload what a run could not deliver to its tracking server: `python -m grpo_pipe.tracking.upload FILE`.

FILE is the `mlflow_pending.jsonl` a run leaves in its folder when the server was away at its end. The records go
in order to the run they belong to, metrics at their original step and time. After each delivered record the file
is rewritten with what is left, and once all are delivered it is renamed to `FILE.uploaded`: running the command
again does not send anything twice. `--tracking-uri` sends them to another address of the same store (the server
moved).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from grpo_pipe.runtime.env import bound_mlflow_http_waits
from grpo_pipe.tracking import mlflow_records as records
from grpo_pipe.tracking.outbox import read_pending, write_pending

log = logging.getLogger(__name__)


def upload(path: Path, tracking_uri: str | None = None) -> int:
    """Deliver the file's records; returns how many were sent. Raises what the client raises when the store does
    not answer (the file then holds exactly what is still to send)."""
    from mlflow.tracking import MlflowClient

    header, pending = read_pending(path)
    bound_mlflow_http_waits()
    client = MlflowClient(tracking_uri=tracking_uri or header["tracking_uri"])
    sent = 0
    while pending:
        records.send(client, header["run_id"], pending[0])
        pending, sent = pending[1:], sent + 1
        write_pending(pending, path, header)
    path.replace(path.with_name(path.name + ".uploaded"))
    return sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grpo_pipe.tracking.upload", description="Upload what a run could not deliver to its tracking server."
    )
    parser.add_argument("file", type=Path, help="the mlflow_pending.jsonl a run left in its folder")
    parser.add_argument("--tracking-uri", help="where the store answers now (default: the address the run used)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if not args.file.is_file():
        done = args.file.with_name(args.file.name + ".uploaded")
        log.error("%s: no such file%s", args.file, f" ({done.name} says it was uploaded)" if done.exists() else "")
        return 2
    try:
        sent = upload(args.file, args.tracking_uri)
    except Exception as err:  # noqa: BLE001 - the store's or the network's failure, reported in one line
        log.error("Upload stopped (%s); %s keeps what is still to send: run the same command again", err, args.file)
        return 1
    log.info("%d record(s) uploaded; %s renamed to %s.uploaded", sent, args.file, args.file.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
