"""Every rule of committed and transactional offsets lives in this file.

A group's committed offsets and the offsets of transactions not yet decided (TxnOffsetCommit)
change only by replaying records of ``__consumer_offsets`` in log order: the coordinator
replays each record it has just appended, and ``load`` replays the partition after a
restart, through the same functions, so memory and a reload cannot disagree. Each offset
remembers the log offset of its record (``OffsetValue.record_offset``). OffsetFetch answers
the committed offsets only: a plain commit whose record is appended but not yet durable
(fsynced, or replicated in a cluster) waits aside (O7) and is committed once it is (O8); a
write that fails drops it (O9), so no client ever reads an offset a failover can take back
(Kafka's GroupMetadata keeps pendingOffsetCommits the same way).

    | # | record replayed                          | effect                                  |
    |---|------------------------------------------|-----------------------------------------|
    |O1 | plain offset commit of (g, tp) at r      | committed[g][tp] = value@r              |
    |O2 | plain tombstone of (g, tp) (DeleteTopics,| committed[g][tp] gone, and the pending  |
    |   | DeleteGroups, OffsetDelete, expiry)      | offsets of (g, tp) of every open        |
    |   |                                          | transaction gone too                    |
    |O3 | transactional offset of P for (g, tp)    | pending[P][g][tp] = value@r             |
    |   | at r                                     |                                         |
    |O4 | COMMIT marker of P in partition n        | for each pending[P][g], g in n: value@r |
    |   |                                          | taken only if nothing is committed or   |
    |   |                                          | committed.r < r; pending[P][g] gone     |
    |O5 | ABORT marker of P in partition n         | pending[P][g] gone, for g in n          |
    |O6 | a marker while n is still loading        | left to the loader, which reads it in   |
    |   | (GroupCoordinator.complete_txn)          | its place in the log                    |
    |O7 | plain offset commit of (g, tp) appended  | in_flight[g][tp] += value@r; committed  |
    |   | at r, its write not durable yet          | unchanged (OffsetFetch answers it)      |
    |O8 | that write durable                       | if value@r still in flight: out of it,  |
    |   |                                          | and as O1 if nothing is committed or    |
    |   |                                          | committed.r < r (an older write made    |
    |   |                                          | durable later loses)                    |
    |O9 | that write failed (fsync, replication)   | value@r out of in_flight (plain) or out |
    |   |                                          | of pending[P][g] (transactional, O3),   |
    |   |                                          | if still there, and then (g, tp) unsure:|
    |   |                                          | its record may be in the log all the    |
    |   |                                          | same; committed unchanged               |
    |   | (O2 also empties in_flight[g][tp] and    |                                         |
    |   | unsure (g, tp); a resignation empties    |                                         |
    |   | in_flight and unsure of n)               |                                         |

Kafka's OffsetMetadataManager decides the same (replayEndTransactionMarker compares record
offsets; a tombstone replayed removes the open transactions' offsets of that partition).
O4 compares positions in the log, not the order markers arrive, so a plain commit written
after a TxnOffsetCommit but before its marker stays, and a clean of ``__consumer_offsets``
(which keeps each key's newest record at its offset) cannot flip the answer after a restart.
O2 covers the pending offsets a deletion must also remove: a deletion writes a tombstone for
every partition with a committed, a pending, an in-flight or an unsure offset. Unsure: a write
that failed to become durable while its log went on (no descriptor for the fsync; in a
cluster, not replicated in time) was appended all the same (an append is all or nothing,
log/segment.py), so a restart, or the next leader once it is replicated, reads it back; a
deletion that left it untombstoned would give a deleted group that offset back. The write of a
transaction's offsets is awaited by its TxnOffsetCommit, which a producer answered an error
sends again before it ends the transaction; O9 keeps a marker from making visible what was
never written. A write's outcome is the log's answer, not a decision: O7-O9 decide nothing
a request saw, and a request arriving meanwhile decides on the state the write left
(in_flight counts as held: a deletion tombstones it, expiry leaves its group alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .group_records import OffsetValue

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, OffsetValue]


class PendingTxnOffsets:
    """Offsets of undecided transactions: producer id -> group -> partition -> value, with
    the open producers of each group indexed so a tombstone costs what its group holds."""

    def __init__(self) -> None:
        self.by_producer: dict[int, dict[str, Offsets]] = {}
        self.by_group: dict[str, set[int]] = {}

    def add(self, producer_id: int, group_id: str, tp: TopicPartition,
            value: OffsetValue) -> None:  # O3
        self.by_producer.setdefault(producer_id, {}).setdefault(group_id, {})[tp] = value
        self.by_group.setdefault(group_id, set()).add(producer_id)

    def drop(self, group_id: str, tp: TopicPartition) -> None:  # O2's pending part
        for producer_id in list(self.by_group.get(group_id, ())):
            offsets = self.by_producer[producer_id][group_id]
            offsets.pop(tp, None)
            if not offsets:
                self._forget(producer_id, group_id)

    def merge(self, other: PendingTxnOffsets) -> None:
        """Take a loaded partition's pending offsets (its groups have none here yet)."""
        for producer_id, groups in other.by_producer.items():
            for group_id, offsets in groups.items():
                for tp, value in offsets.items():
                    self.add(producer_id, group_id, tp, value)

    def partitions(self, group_id: str) -> set[TopicPartition]:
        """Partitions of ``group_id`` some undecided transaction holds an offset for."""
        return {tp for producer_id in self.by_group.get(group_id, ())
                for tp in self.by_producer[producer_id][group_id]}

    def groups(self) -> Iterator[str]:
        return iter(list(self.by_group))

    def take(self, producer_id: int, in_partition: Callable[[str], bool]
             ) -> list[tuple[str, Offsets]]:
        """Remove and return the producer's pending offsets of the groups ``in_partition``
        (O4/O5: a marker decides only its own partition's groups)."""
        groups = self.by_producer.get(producer_id)
        if not groups:
            return []
        taken = [(g, groups[g]) for g in list(groups) if in_partition(g)]
        for group_id, _ in taken:
            self._forget(producer_id, group_id)
        return taken

    def _forget(self, producer_id: int, group_id: str) -> None:
        groups = self.by_producer[producer_id]
        del groups[group_id]
        if not groups:
            del self.by_producer[producer_id]
        open_producers = self.by_group[group_id]
        open_producers.discard(producer_id)
        if not open_producers:
            del self.by_group[group_id]


    def discard(self, producer_id: int, group_id: str, tp: TopicPartition,
                value: OffsetValue) -> bool:  # O9, transactional
        """Remove ``value`` (this very object); False: it was not pending."""
        offsets = self.by_producer.get(producer_id, {}).get(group_id)
        if offsets is None or offsets.get(tp) is not value:
            return False
        del offsets[tp]
        if not offsets:
            self._forget(producer_id, group_id)
        return True


class InFlightCommits:
    """Plain commits appended whose writes are not durable yet: group -> partition -> values
    in log order (usually one). Kept by the coordinator, not its groups: a group with no
    write in flight costs nothing here."""

    def __init__(self) -> None:
        self.by_group: dict[str, dict[TopicPartition, list[OffsetValue]]] = {}
        # group -> partitions whose failed write may be in the log all the same (O9)
        self.unsure: dict[str, set[TopicPartition]] = {}

    def add(self, group_id: str, tp: TopicPartition, value: OffsetValue) -> None:  # O7
        self.by_group.setdefault(group_id, {}).setdefault(tp, []).append(value)

    def partitions(self, group_id: str) -> set[TopicPartition]:
        return set(self.by_group.get(group_id, ()))

    def unsure_of(self, group_id: str) -> set[TopicPartition]:
        return set(self.unsure.get(group_id, ()))

    def failed(self, group_id: str, tp: TopicPartition) -> None:  # O9: maybe in the log
        self.unsure.setdefault(group_id, set()).add(tp)

    def groups(self) -> Iterator[str]:
        """Groups with a write in flight or an unsure partition."""
        return iter(list(self.by_group.keys() | self.unsure.keys()))

    def drop(self, group_id: str, tp: TopicPartition) -> None:  # O2's in-flight part
        offsets = self.by_group.get(group_id)
        if offsets is not None and offsets.pop(tp, None) is not None and not offsets:
            del self.by_group[group_id]
        unsure = self.unsure.get(group_id)
        if unsure is not None:
            unsure.discard(tp)
            if not unsure:
                del self.unsure[group_id]

    def forget(self, group_id: str) -> None:  # a resignation
        self.by_group.pop(group_id, None)
        self.unsure.pop(group_id, None)

    def take(self, group_id: str, tp: TopicPartition, value: OffsetValue) -> bool:
        """Remove ``value`` (this very object) from the flight; False: it was not in it."""
        offsets = self.by_group.get(group_id)
        values = offsets.get(tp) if offsets is not None else None
        if values is None or not any(v is value for v in values):
            return False
        values[:] = [v for v in values if v is not value]
        if not values:
            del offsets[tp]
            if not offsets:
                del self.by_group[group_id]
        return True


def replay_durable(in_flight: InFlightCommits, group_id: str, tp: TopicPartition,
                   value: OffsetValue, durable: bool,
                   offsets_of: Callable[[str], Offsets]) -> bool:  # O8, O9
    """The write of a plain commit ended; returns whether ``value`` took effect."""
    if not in_flight.take(group_id, tp, value):
        return False  # a tombstone written since decided it (O2)
    if not durable:
        in_flight.failed(group_id, tp)
        return False
    offsets = offsets_of(group_id)
    current = offsets.get(tp)
    if current is not None and current.record_offset >= value.record_offset:
        return False
    replay_commit(offsets, tp, value)
    return True


def replay_txn_failed(pending: PendingTxnOffsets, in_flight: InFlightCommits,
                      producer_id: int, group_id: str,
                      written: list[tuple[TopicPartition, OffsetValue]]) -> None:  # O9
    """The write of a transaction's offsets failed: each value still pending leaves it,
    its partition unsure. One no longer pending was decided since (a tombstone, a marker,
    a resignation, a newer offset of the producer): nothing of it is held any more."""
    for tp, value in written:
        if pending.discard(producer_id, group_id, tp, value):
            in_flight.failed(group_id, tp)


def replay_commit(offsets: Offsets, tp: TopicPartition, value: OffsetValue) -> None:  # O1
    offsets[tp] = value


def replay_tombstone(offsets: Offsets | None, pending: PendingTxnOffsets, group_id: str,
                     tp: TopicPartition, in_flight: InFlightCommits | None = None
                     ) -> None:  # O2 (a load has nothing in flight)
    if offsets is not None:
        offsets.pop(tp, None)
    pending.drop(group_id, tp)
    if in_flight is not None:
        in_flight.drop(group_id, tp)


def replay_marker(pending: PendingTxnOffsets, producer_id: int, commit: bool,
                  in_partition: Callable[[str], bool],
                  offsets_of: Callable[[str], Offsets]) -> int:  # O4, O5
    """Returns how many offsets took effect."""
    applied = 0
    for group_id, values in pending.take(producer_id, in_partition):
        if not commit:
            continue
        offsets = offsets_of(group_id)
        for tp, value in values.items():
            current = offsets.get(tp)
            if current is None or current.record_offset < value.record_offset:
                offsets[tp] = value
                applied += 1
    return applied
