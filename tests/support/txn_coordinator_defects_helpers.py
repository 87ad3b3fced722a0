"""What tests besides tests/coordinator/test_txn_coordinator_defects.py use of it."""
from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode as E

from oncelog.coordinator.internal_log import WriteFailed
from oncelog.coordinator.transaction import txn_records as tr
from oncelog.coordinator.transaction.transaction_coordinator import (
    TransactionCoordinator,
    TxnConfig,
)

TOPICS = {("t", 0), ("t", 1), ("u", 0)}


NOW = 1_000_000


class HeldLog:
    """``__transaction_state`` in memory. ``hold``: appends wait until ``release``;
    ``fail``: appends are refused. A write whose fsync fails leaves nothing in the log."""

    def __init__(self) -> None:
        self.partitions: dict[int, list[tuple[bytes, bytes | None]]] = {}
        self.hold = False
        self.fail = False
        self.waiting: list[tuple[asyncio.Future, int, tuple]] = []

    def append(self, partition, records):
        if self.fail:
            raise WriteFailed(E.kafka_storage_error, "injected")
        self.partitions.setdefault(partition, []).extend(records)
        if not self.hold:
            return None
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((future, partition, tuple(records)))
        return future

    def release(self, fail: bool = False, count: int | None = None) -> int:
        """Make the held writes (the oldest ``count`` of them) durable, or fail them."""
        count = len(self.waiting) if count is None else count
        waiting, self.waiting = self.waiting[:count], self.waiting[count:]
        for future, partition, records in waiting:
            if fail:
                kept = self.partitions[partition]
                for record in records:
                    kept.remove(record)
            if future.done():  # its writer is gone (a restart)
                continue
            if fail:
                future.set_exception(OSError("injected fsync failure"))
            else:
                future.set_result(None)
        return len(waiting)

    def read(self, partition):
        return iter(list(self.partitions.get(partition, [])))

    def seed(self, coordinator: TransactionCoordinator, txn_id: str, value: tr.TxnValue) -> None:
        self.partitions.setdefault(coordinator.partition_of(txn_id), []).append(
            (tr.txn_key(txn_id), tr.txn_value(value)))


class Markers:
    """Records the markers; a TV2 marker at the epoch of the data it ends is refused, as a
    partition refuses it (rule M2), and so is one older than the data's epoch (M1)."""

    def __init__(self) -> None:
        self.written: list[tuple[int, int, bool, list, int]] = []
        self.data_epochs: dict[int, int] = {}  # producer id -> epoch of its data

    async def __call__(self, producer_id, epoch, commit, coordinator_epoch, partitions,
                       transaction_version=0, current=None):
        data = self.data_epochs.get(producer_id, -1)
        if epoch < data or (transaction_version >= 2 and epoch == data):
            return dict.fromkeys(partitions, E.invalid_producer_epoch)
        self.written.append((producer_id, epoch, commit, sorted(partitions),
                             transaction_version))
        return dict.fromkeys(partitions, E.none)


def coordinator(log: HeldLog, markers: Markers | None = None, first_id: int = 1000,
                **config) -> TransactionCoordinator:
    ids = iter(range(first_id, first_id + 1000))
    c = TransactionCoordinator(log, TxnConfig(**{"num_partitions": 3, **config}),
                               lambda: next(ids), lambda t, p: (t, p) in TOPICS,
                               markers or Markers(), now_ms=lambda: NOW)
    c.retry_s = 0.01
    c.pending_wait_s = 0.2  # a step held by the test is not waited out for 5 s
    return c
