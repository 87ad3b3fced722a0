"""read_committed: the walk that leaves out the records of aborted transactions.

The broker answers a Fetch with isolation_level=1 up to the partition's last stable offset,
with the aborted transactions of the range: (producer id, first offset) each. As Kafka's
consumer does, the walk keeps the aborted transactions not yet reached in offset order;
once a data batch reaches a transaction's first offset, that producer's transactional
batches are withheld until its next control batch (the ABORT marker that ends it: a producer
has one transaction open at a time, so the next marker of that producer is this one's).

protocol/batches.py's RecordSetWalk learns the same with the storage side of transactions
(its ``aborted`` argument); once both are in, the consumer can give it the aborted
transactions and this subclass goes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from ..protocol.batches import RecordSetWalk
from ..protocol.record_batch import BatchHeader


class CommittedWalk(RecordSetWalk):
    """A RecordSetWalk that also withholds the batches of ``aborted`` transactions."""

    __slots__ = ("aborted_records", "open_aborted", "pending")

    def __init__(self, data: bytes | bytearray | memoryview, position: int,
                 aborted: Iterable[tuple[int, int]], *, check_crcs: bool = True) -> None:
        super().__init__(data, position, check_crcs=check_crcs)
        self.pending = [(first_offset, producer_id) for producer_id, first_offset in aborted]
        heapq.heapify(self.pending)
        self.open_aborted: set[int] = set()  # producers inside an aborted transaction here
        self.aborted_records = 0

    def _withheld(self, header: BatchHeader, *where: int) -> bool:
        # ``where``: what else the base walk's _withheld takes (the batch's position, where
        # it reads markers), passed through.
        pending = self.pending
        last = header.base_offset + header.last_offset_delta
        while pending and pending[0][0] <= last:
            self.open_aborted.add(heapq.heappop(pending)[1])
        if header.is_control:
            self.open_aborted.discard(header.producer_id)
            return True
        if header.is_transactional and header.producer_id in self.open_aborted:
            self.aborted_records += header.records_count
            return True
        return super()._withheld(header, *where)
