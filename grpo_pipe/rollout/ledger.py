"""Where each group of rollouts went, by group id, kept with every checkpoint so that it balances across a resume.

A group is one task's completions in one batch; its id is `<batch>.<position>` (batch numbers are the scheduler's
1-based submission order, the same across a resume). Each group is in flight (`F`) from its submission until the
trainer takes its batch, then trained (`T`) or dropped (`D`). A group trained, or generated again, after it was
already trained is counted in `repeated`: a resume that lost nothing and trained nothing twice keeps it at 0, and
every group of every batch submitted is in exactly one of the three states. The repeats are counted in the
run's `Ledger` (`repeated`), beside its totals.

The record is per batch, one character per group (`{"12": "TTTT"}`): about ten bytes a step in `loop.json`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from grpo_pipe.types import Ledger

IN_FLIGHT, TRAINED, DROPPED = "F", "T", "D"


class GroupRecord:
    """The outcome of every group submitted so far, by batch. Both updates return how many groups they found
    already settled (a repeat: a group trained twice, or generated again after it was trained)."""

    def __init__(self) -> None:
        self.batches: dict[int, list[str]] = {}  # batch number -> one outcome per group, in submission order

    def submitted(self, batch: int, groups: int) -> int:
        """A batch went to the engine; submitting again what is still in flight (a restart, a resume) is no repeat."""
        repeats = sum(outcome != IN_FLIGHT for outcome in self.batches.get(batch, []))
        self.batches[batch] = [IN_FLIGHT] * groups
        return repeats

    def settled(self, batch: int, outcomes: Sequence[str]) -> int:
        """The trainer took the batch: each group trained or dropped, in order."""
        record = self.batches.setdefault(batch, [IN_FLIGHT] * len(outcomes))
        repeats = sum(before != IN_FLIGHT for before in record[: len(outcomes)])
        record[: len(outcomes)] = outcomes
        return repeats

    def count(self, outcome: str) -> int:
        return sum(record.count(outcome) for record in self.batches.values())

    def state_dict(self) -> dict[str, str]:
        return {str(b): "".join(r) for b, r in sorted(self.batches.items())}

    def load_state_dict(self, state: Mapping[str, str]) -> None:
        self.batches = {int(b): list(r) for b, r in state.items()}


def ledger_metrics(ledger: Ledger) -> dict[str, float]:
    """The run's accounting of groups as metrics (`ledger/*`), logged every step so a resumed run's chart continues
    where the checkpoint left it: submitted = trained + dropped + in flight, always (`ledger/balanced` = 1)."""
    metrics = {
        "ledger/submitted": float(ledger.submitted),
        "ledger/trained": float(ledger.trained),
        "ledger/dropped": float(sum(ledger.dropped.values())),
        "ledger/in_flight": float(ledger.in_flight),
        "ledger/repeated": float(ledger.repeated),
        "ledger/balanced": float(ledger.balanced()),
    }
    return metrics
