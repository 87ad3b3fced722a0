"""What tests besides tests/coordinator/test_group_coordinator.py use of it."""
from __future__ import annotations

from kio.schema.errors import ErrorCode as E

from oncelog.coordinator.internal_log import WriteFailed


class MemoryOffsetsLog:
    def __init__(self) -> None:
        self.partitions: dict[int, list[tuple[bytes, bytes | None]]] = {}
        self.fail_with: E | None = None

    def append(self, partition, records):
        if self.fail_with is not None:
            raise WriteFailed(self.fail_with, "injected")
        self.partitions.setdefault(partition, []).extend(records)
        return None

    def append_at(self, partition, records, producer=None):
        assert producer is None
        base = len(self.partitions.get(partition, []))
        return base, self.append(partition, records)

    def read(self, partition):
        return iter(list(self.partitions.get(partition, [])))
