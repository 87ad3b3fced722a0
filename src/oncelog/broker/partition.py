"""A partition on this broker: its Log, and the waiters of long-polling fetches.

Later the producer state manager and replication hang off this object too.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from ..log.log import Log, LogConfig
from ..protocol.record_batch import assign_offsets, split_batches


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_start_offset: int


class Partition:
    def __init__(self, topic: str, index: int, directory: str, config: LogConfig,
                 max_message_bytes: int) -> None:
        self.topic = topic
        self.index = index
        self.dir = directory
        self.config = config
        self.max_message_bytes = max_message_bytes
        self._log: Log | None = None
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.index}"

    @property
    def log(self) -> Log:
        # Opened on first use: a broker with 10,000 idle partitions holds no files for them.
        if self._log is None:
            self._log = Log(self.dir, self.config)
        return self._log

    @property
    def is_open(self) -> bool:
        return self._log is not None

    def append_records(self, records: bytes) -> AppendResult:
        """Validate and append a produce request's records; raises InvalidBatch."""
        headers = split_batches(records, self.max_message_bytes)
        log = self.log
        buf = bytearray(records)
        base = log.log_end_offset
        headers = assign_offsets(buf, headers, base, 0)
        log.append(buf, headers)
        self._wake_waiters()
        return AppendResult(base, headers[-1].last_offset, log.log_start_offset)

    @property
    def high_watermark(self) -> int:
        # Single node: everything appended is committed.
        return self.log.log_end_offset

    def waiter(self) -> asyncio.Future[None]:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def delete(self) -> None:
        if self._log is not None:
            self._log.delete()
            self._log = None
        if os.path.isdir(self.dir):
            for name in os.listdir(self.dir):
                os.unlink(os.path.join(self.dir, name))
            os.rmdir(self.dir)
