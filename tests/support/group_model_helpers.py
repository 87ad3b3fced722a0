"""What tests besides tests/coordinator/test_group_model.py use of it."""
from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode as E

from oncelog.coordinator.group.group_coordinator import (
    WriteFailed,
)


class ModelLog:
    """__consumer_offsets in memory: one partition, records with their offsets."""

    def __init__(self) -> None:
        self.records: list[tuple] = []
        self.fail = False
        self.hold = False
        self.held: list[asyncio.Future] = []

    def append_at(self, partition, records, producer=None):
        if self.fail:
            raise WriteFailed(E.not_coordinator, "injected")
        base = len(self.records)
        pid = producer[0] if producer is not None else -1
        for key, value in records:
            self.records.append((key, value, pid, None, len(self.records)))
        durable = None
        if self.hold:
            durable = asyncio.get_running_loop().create_future()
            self.held.append(durable)
        return base, durable

    def append(self, partition, records, producer=None):
        return self.append_at(partition, records, producer)[1]

    def marker(self, pid: int, commit: bool) -> None:
        self.records.append((None, None, pid, "commit" if commit else "abort",
                             len(self.records)))

    def read(self, partition):
        return list(self.records)
