"""The history of a Jepsen-style transactional workload and its checker, sans-IO
(tests/cluster/test_txn_workload.py; held by tests/cluster/test_txn_history.py).

Each transaction is what one producer attempted, in its order (``seq``), as values unique in
the whole run, per partition in the order it produced them, and what its client said:

- ``committed``: commit_transaction returned;
- ``aborted``: abort_transaction returned, or the producer never asked to commit it (it failed
  before): no coordinator may commit it;
- ``unknown``: the commit (or an abort after a commit was asked) raised: either outcome.

``check`` takes the history and every value a read_committed reader read, per partition, in
offset order, and names every anomaly (an empty list: none):

| anomaly | what is read |
|---|---|
| ``unexpected`` | a value no transaction of the history wrote (or written to another partition) |
| ``duplicate`` | a value more than once |
| ``aborted-read`` | any value of an aborted transaction |
| ``lost`` | not every value of a committed transaction |
| ``torn`` | some values of a committed or unknown transaction, not all (atomic: all or none) |
| ``order`` | a producer's values in a partition out of its order (by ``seq``, then as produced) |
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

COMMITTED, ABORTED, UNKNOWN = "committed", "aborted", "unknown"
OUTCOMES = (COMMITTED, ABORTED, UNKNOWN)
Partition = tuple[str, int]


@dataclass
class Txn:
    producer: str
    seq: int
    writes: dict[Partition, list[bytes]] = field(default_factory=dict)
    outcome: str | None = None  # None while it runs; one of OUTCOMES once the client said

    def values(self) -> Iterable[tuple[Partition, int, bytes]]:
        for partition, values in self.writes.items():
            for i, value in enumerate(values):
                yield partition, i, value


@dataclass(frozen=True)
class Anomaly:
    kind: str
    txn: str  # "producer#seq", or "-" for a value of no transaction
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.txn}: {self.detail}"


def check(history: list[Txn], reads: dict[Partition, list[bytes]]) -> list[Anomaly]:
    """Every anomaly of ``reads`` against ``history``; see the module's table."""
    anomalies: list[Anomaly] = []
    written: dict[bytes, tuple[Txn, Partition, int]] = {}
    for txn in history:
        if txn.outcome not in OUTCOMES:
            raise ValueError(f"{txn.producer}#{txn.seq} has no outcome: {txn.outcome!r}")
        for partition, i, value in txn.values():
            if value in written:
                raise ValueError(f"value {value!r} written twice in the history")
            written[value] = (txn, partition, i)

    def name(txn: Txn) -> str:
        return f"{txn.producer}#{txn.seq}"

    count: dict[bytes, int] = {}
    for partition, values in sorted(reads.items()):
        last: dict[str, tuple[int, int, bytes]] = {}  # producer -> (seq, index, value)
        for value in values:
            count[value] = count.get(value, 0) + 1
            found = written.get(value)
            if found is None or found[1] != partition:
                anomalies.append(Anomaly("unexpected", "-", f"{value!r} read in {partition}"))
                continue
            txn, _, i = found
            if count[value] == 2:
                anomalies.append(Anomaly("duplicate", name(txn), f"{value!r} in {partition}"))
            before = last.get(txn.producer)
            if before is not None and (txn.seq, i) <= before[:2]:
                anomalies.append(Anomaly("order", name(txn),
                                         f"{value!r} after {before[2]!r} in {partition}"))
            last[txn.producer] = (txn.seq, i, value)
    for txn in history:
        values = [value for _, _, value in txn.values()]
        seen = [value for value in values if value in count]
        if txn.outcome == ABORTED and seen:
            anomalies.append(Anomaly("aborted-read", name(txn), f"read {seen[:3]!r}"))
            continue
        if txn.outcome == COMMITTED and len(seen) < len(values):
            missing = [value for value in values if value not in count]
            anomalies.append(Anomaly("lost", name(txn), f"never read {missing[:3]!r}"))
        if 0 < len(seen) < len(values):
            anomalies.append(Anomaly("torn", name(txn),
                                     f"read {len(seen)} of its {len(values)} values"))
    return anomalies
