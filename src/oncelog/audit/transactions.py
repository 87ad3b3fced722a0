"""The transaction audit: what each transactional batch's markers decided, checked against what a
read_committed reader gets, and transactions torn across partitions. Pure: batch headers and
markers in, a ``TransactionReport`` out; the one-process audit and the Spark audit both feed
it, so each rule below lives here only.

Per partition (read uncommitted, control batches included, in log order):

=============================================  ===============================================
a transactional data batch of producer id P    belongs to P's transaction on this partition
                                               that the next marker of P on the partition ends
                                               (whatever the marker's epoch: a fenced
                                               producer's batches end with the new epoch's
                                               ABORT)
P's next marker is COMMIT                      committed
P's next marker is ABORT                       aborted
no marker of P after it (up to the high        open (undecided)
watermark read)
a control batch without a marker (emptied by   ignored
the cleaner)
a non-transactional batch                      not a transaction's: the sequence audit's only
=============================================  ===============================================

The read_committed check reads the same partition with isolation_level 1 from its log start
up to the last stable offset taken *before* the high watermark (so that a transaction still
open below the high watermark read cannot have become stable in the reader's range), dropping
the aborted transactions the Fetch answers list as Kafka's consumers do
(``protocol.batches``). Then, per transactional batch in that range:

==================  ==================  ===================================================
decision            read_committed      finding
==================  ==================  ===================================================
committed           sees it             -
committed           does not            committed record missing
aborted             sees it             aborted record visible
open                sees it             open-transaction record visible
aborted or open     does not            -
==================  ==================  ===================================================

Offsets deleted between the two reads are left out of "missing". Open transactions above the
last stable offset are counted, not findings: a producer may be in the middle of one.

Across partitions, a transaction is named by its producer id and its markers' epoch, then cut
by time: with transaction version 2 (KIP-890, oncelog, the Java client from 4.0) the epoch is
bumped at the end of every transaction and the markers carry the bumped epoch, so (producer id,
marker epoch) is one transaction. With transaction version 1 (kafka-python, aiokafka,
librdkafka against brokers without it) every transaction of an incarnation shares the epoch;
but the coordinator writes all markers of transaction k together, before it lets transaction
k+1 add a partition, so the producer's markers in time order are those of k, then those of
k+1. The rule:

* the markers of one (producer id, marker epoch) with at most one per partition are one
  transaction (version 2; or the only transaction of an epoch under version 1);
* otherwise (version 1), ordered by timestamp (then by their rank among that producer's
  markers on their partition, then partition), they are cut into transactions wherever a
  partition would get a second marker, or more than ``MARKER_GAP_MS`` passed since the
  previous marker (the markers of one transaction are written in one go).

A transaction whose markers disagree, COMMIT on some partitions and ABORT on others, is torn.
Under version 1 the cut leans on the marker timestamps (the brokers' clocks, in milliseconds):
a transaction whose markers were written more than ``MARKER_GAP_MS`` apart (a retried marker)
is seen as two, so a tear between its parts goes unseen; two transactions of one producer on
different partitions less than ``MARKER_GAP_MS`` apart, or brokers whose clocks disagree by
more than that, can be taken for one. Version 2 needs no clock.

Memory: 9 bytes per transactional batch of the partition being checked (its base offset and
record count; one byte of decision), freed once its partition is done; markers are kept for the
torn check (about 100 bytes each, one per transaction and partition).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..protocol.control import Marker
from ..protocol.record_batch import BatchHeader
from .wording import counted

COMMITTED, ABORTED, OPEN = 0, 1, 2
MARKER_GAP_MS = 200


@dataclass
class MarkerSeen:
    partition: int
    offset: int
    producer_id: int
    epoch: int
    commit: bool
    coordinator_epoch: int
    timestamp: int
    records: int  # the data records of the producer on this partition it decided


@dataclass
class TxnPartitionReport:
    partition: int
    read_committed_end: int  # read_committed was checked on [log start, this offset)
    markers: int = 0
    committed: int = 0  # records, by their markers' decision
    aborted: int = 0
    open: int = 0
    aborted_visible: int = 0
    open_visible: int = 0
    committed_missing: int = 0

    @property
    def problems(self) -> int:
        return self.aborted_visible + self.open_visible + self.committed_missing


@dataclass
class TornTransaction:
    producer_id: int
    epoch: int
    timestamp: int  # of its first marker
    committed: list[int]  # partitions with a COMMIT marker
    aborted: list[int]  # partitions with an ABORT marker
    records_committed: int
    records_aborted: int


@dataclass
class TransactionReport:
    partitions: list[TxnPartitionReport]
    torn: list[TornTransaction] = field(default_factory=list)
    transactions: int = 0  # across partitions, by the rule above

    @classmethod
    def build(cls, partitions: Iterable[TxnPartitionReport],
              markers: Iterable[MarkerSeen]) -> TransactionReport:
        found = transactions_of(markers)
        torn = [t for t in map(_torn, found) if t is not None]
        return cls(sorted(partitions, key=lambda p: p.partition), torn, len(found))

    @property
    def totals(self) -> dict[str, int]:
        parts = self.partitions
        return {
            "transactions": self.transactions,
            "committed_records": sum(p.committed for p in parts),
            "aborted_records": sum(p.aborted for p in parts),
            "open_records": sum(p.open for p in parts),
            "aborted_visible": sum(p.aborted_visible for p in parts),
            "open_visible": sum(p.open_visible for p in parts),
            "committed_missing": sum(p.committed_missing for p in parts),
            "torn_transactions": len(self.torn),
        }

    @property
    def problems(self) -> list[str]:
        t = self.totals
        found = []
        if t["aborted_visible"]:
            found.append(counted(t["aborted_visible"], "aborted record")
                         + " visible to read_committed")
        if t["open_visible"]:
            found.append(counted(t["open_visible"], "open-transaction record")
                         + " visible to read_committed")
        if t["committed_missing"]:
            found.append(counted(t["committed_missing"], "committed record")
                         + " missing from read_committed")
        if t["torn_transactions"]:
            found.append(counted(t["torn_transactions"], "torn transaction"))
        return found


class _Partition:
    __slots__ = ("bases", "counts", "decisions", "lost", "markers", "pending", "visible")

    def __init__(self) -> None:
        self.bases = array("q")  # transactional data batches, in log order
        self.counts = array("l")
        self.decisions = bytearray()
        self.pending: dict[int, list[int]] = {}  # producer id -> its undecided batches
        self.markers = 0
        self.visible = array("q")  # base offsets read_committed got
        self.lost: list[tuple[int, int]] = []  # offsets deleted before read_committed got them


class TransactionAudit:
    """Feed each partition's batches in log order (``add_batch``), what read_committed got of
    it (``add_visible``, in offset order, before or after), then ``finish_partition``; at the
    end ``finish()``."""

    def __init__(self) -> None:
        self._parts: dict[int, _Partition] = {}
        self.reports: list[TxnPartitionReport] = []
        self.markers: list[MarkerSeen] = []

    def has(self, partition: int) -> bool:
        """Whether the partition holds a transactional batch or a marker so far."""
        return partition in self._parts

    def _part(self, partition: int) -> _Partition:
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = _Partition()
        return part

    def add_batch(self, partition: int, header: BatchHeader,
                  marker: Marker | None = None) -> None:
        """A batch read uncommitted; a control batch comes with its marker (None: none)."""
        if header.is_control:
            part = self._part(partition)
            if marker is None:
                return
            pid = header.producer_id
            decided = part.pending.pop(pid, [])
            code = COMMITTED if marker.commit else ABORTED
            records = 0
            for i in decided:
                part.decisions[i] = code
                records += part.counts[i]
            part.markers += 1
            self.markers.append(MarkerSeen(
                partition, header.base_offset, pid, header.producer_epoch, marker.commit,
                marker.coordinator_epoch, header.max_timestamp, records))
            return
        if not header.is_transactional:
            return
        part = self._part(partition)
        part.pending.setdefault(header.producer_id, []).append(len(part.bases))
        part.bases.append(header.base_offset)
        part.counts.append(header.records_count)
        part.decisions.append(OPEN)

    def add_visible(self, partition: int, header: BatchHeader) -> None:
        """A data batch a read_committed reader got."""
        if header.is_transactional:
            self._part(partition).visible.append(header.base_offset)

    def add_lost(self, partition: int, first: int, end: int) -> None:
        """Offsets [first, end) deleted before the read_committed read got to them."""
        self._part(partition).lost.append((first, end))

    def finish_partition(self, partition: int, read_committed_end: int) -> None:
        """Check the partition: read_committed was read up to ``read_committed_end``."""
        part = self._parts.pop(partition, None)
        if part is None:
            return
        report = TxnPartitionReport(partition, read_committed_end, part.markers)
        visible = sorted(part.visible)
        j, nv = 0, len(visible)
        for base, n, decision in zip(part.bases, part.counts, part.decisions, strict=True):
            while j < nv and visible[j] < base:
                j += 1
            seen = j < nv and visible[j] == base
            if decision == COMMITTED:
                report.committed += n
                if not seen and base < read_committed_end \
                        and not any(f <= base < e for f, e in part.lost):
                    report.committed_missing += n
            elif decision == ABORTED:
                report.aborted += n
                report.aborted_visible += n if seen else 0
            else:
                report.open += n
                report.open_visible += n if seen else 0
        self.reports.append(report)

    def finish(self) -> TransactionReport | None:
        """The report; None when no partition held a transaction."""
        for partition in list(self._parts):
            self.finish_partition(partition, -1)
        if not self.reports:
            return None
        return TransactionReport.build(self.reports, self.markers)


def transactions_of(markers: Iterable[MarkerSeen]) -> list[list[MarkerSeen]]:
    """The markers grouped into transactions (the module's rule), in a stable order."""
    groups: dict[tuple[int, int], list[MarkerSeen]] = {}
    for m in markers:
        groups.setdefault((m.producer_id, m.epoch), []).append(m)
    found = []
    for _, group in sorted(groups.items()):
        if len({m.partition for m in group}) == len(group):
            found.append(sorted(group, key=lambda m: (m.timestamp, m.partition, m.offset)))
            continue
        rank: dict[int, int] = {}
        ranked = []
        for m in sorted(group, key=lambda m: (m.partition, m.offset)):
            ranked.append((m.timestamp, rank.get(m.partition, 0), m.partition, m.offset, m))
            rank[m.partition] = rank.get(m.partition, 0) + 1
        ranked.sort(key=lambda r: r[:4])
        current: list[MarkerSeen] = []
        partitions: set[int] = set()
        for *_, m in ranked:
            if m.partition in partitions or (
                    current and m.timestamp - current[-1].timestamp > MARKER_GAP_MS):
                found.append(current)
                current, partitions = [], set()
            current.append(m)
            partitions.add(m.partition)
        found.append(current)
    return found


def _torn(transaction: list[MarkerSeen]) -> TornTransaction | None:
    committed = [m for m in transaction if m.commit]
    aborted = [m for m in transaction if not m.commit]
    if not committed or not aborted:
        return None
    first = transaction[0]
    return TornTransaction(first.producer_id, first.epoch, first.timestamp,
                           sorted(m.partition for m in committed),
                           sorted(m.partition for m in aborted),
                           sum(m.records for m in committed), sum(m.records for m in aborted))
