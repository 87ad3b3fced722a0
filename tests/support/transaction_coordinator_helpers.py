"""What tests besides tests/coordinator/test_transaction_coordinator.py use of it."""
from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode as E

from oncelog.coordinator.transaction.transaction_coordinator import (
    TransactionCoordinator,
    TxnConfig,
)
from support.group_coordinator_helpers import MemoryOffsetsLog

TOPICS = {("t", 0), ("t", 1), ("u", 0)}


class Markers:
    def __init__(self) -> None:
        self.written: list[tuple[int, int, bool, list]] = []

    async def __call__(self, producer_id, epoch, commit, coordinator_epoch, partitions,
                       transaction_version=0, current=None):
        self.written.append((producer_id, epoch, commit, sorted(partitions)))
        return dict.fromkeys(partitions, E.none)


def coordinator(store=None, markers=None, clock=None, **config):
    ids = iter(range(1000, 2000))
    return TransactionCoordinator(store or MemoryOffsetsLog(),
                                  TxnConfig(**{"num_partitions": 3, **config}),
                                  lambda: next(ids), lambda t, p: (t, p) in TOPICS,
                                  markers or Markers(),
                                  now_ms=(lambda: clock[0]) if clock else _clock)


_now = [1_000_000]


def _clock() -> int:
    return _now[0]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))
