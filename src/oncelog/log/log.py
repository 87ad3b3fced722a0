"""One partition's log: an ordered list of segments, append at the end, read anywhere.

The log knows nothing of producers. It takes validated batches whose offsets are already
patched, writes them to the active segment, rolls segments by size and age, applies
retention, and on start validates what an unclean shutdown may have torn.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..protocol.record_batch import HEADER_SIZE, BatchHeader, read_header, scan_batches
from .segment import LogSegment

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".clean_shutdown"


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    flush_messages: int = (1 << 63) - 1
    flush_ms: int = (1 << 63) - 1
    index_interval_bytes: int = 4096


@dataclass(frozen=True, slots=True)
class ReadResult:
    records: bytes
    first_offset: int  # base offset of the first batch returned, -1 when empty


def _now_ms() -> int:
    return int(time.time() * 1000)


class Log:
    def __init__(self, directory: str, config: LogConfig,
                 on_roll: Callable[[int], None] | None = None) -> None:
        self.dir = directory
        self.config = config
        self._on_roll = on_roll
        self.segments: list[LogSegment] = []
        self._base_offsets: list[int] = []
        self.last_flush_ms = _now_ms()
        os.makedirs(directory, exist_ok=True)
        self._open()

    # --- opening -------------------------------------------------------------------------

    def _open(self) -> None:
        marker = os.path.join(self.dir, CLEAN_SHUTDOWN_FILE)
        clean = os.path.exists(marker)
        if clean:
            os.unlink(marker)
        bases = sorted(
            int(name[:-4]) for name in os.listdir(self.dir)
            if name.endswith(".log") and name[:-4].isdigit()
        )
        for name in os.listdir(self.dir):
            if name.endswith(".tmp"):
                os.unlink(os.path.join(self.dir, name))
        for i, base in enumerate(bases):
            segment = LogSegment(self.dir, base, self.config.index_interval_bytes)
            is_active = i == len(bases) - 1
            if clean or not is_active:
                segment.load()
            else:
                segment.recover()
            self.segments.append(segment)
        if not self.segments:
            self.segments.append(LogSegment(self.dir, 0, self.config.index_interval_bytes))
        self._base_offsets = [s.base_offset for s in self.segments]

    # --- state ---------------------------------------------------------------------------

    @property
    def active(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_start_offset(self) -> int:
        return self.segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self.active.next_offset

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)

    # --- writing -------------------------------------------------------------------------

    def append(self, parts: list, headers: list[BatchHeader]) -> None:
        """Append batches whose offsets start at log_end_offset (see assign_offsets).

        ``parts`` are the buffers holding the batches, in order, written with one writev.
        """
        self._maybe_roll(sum(h.size for h in headers), headers[0].max_timestamp)
        self.active.append(parts, headers)
        if self.active.unflushed_messages >= self.config.flush_messages:
            self.flush()

    def _maybe_roll(self, incoming: int, timestamp: int) -> None:
        active = self.active
        if active.size == 0:
            return
        too_big = active.size + incoming > self.config.segment_bytes
        started = active.first_batch_timestamp
        if started < 0:
            started = active.created_at_ms
        too_old = _now_ms() - started > self.config.segment_ms
        if too_big or too_old:
            self.roll()

    def roll(self) -> None:
        old = self.active
        old.seal()
        segment = LogSegment(self.dir, old.next_offset, self.config.index_interval_bytes)
        self.segments.append(segment)
        self._base_offsets.append(segment.base_offset)
        log.debug("%s: rolled new segment at offset %d", self.dir, segment.base_offset)
        if self._on_roll is not None:
            self._on_roll(segment.base_offset)

    def flush(self) -> None:
        self.active.flush()
        self.last_flush_ms = _now_ms()

    def maybe_flush_by_time(self, now_ms: int) -> None:
        if self.active.unflushed_messages and now_ms - self.last_flush_ms >= self.config.flush_ms:
            self.flush()

    # --- reading -------------------------------------------------------------------------

    def _segment_for(self, offset: int) -> int:
        return max(0, bisect.bisect_right(self._base_offsets, offset) - 1)

    def read(self, offset: int, max_bytes: int, min_one_batch: bool = True) -> ReadResult:
        """Whole batches from the one holding ``offset``, at most ``max_bytes`` of them.

        With ``min_one_batch`` the first batch is returned even when it is larger than
        ``max_bytes`` (KIP-74), so a consumer can always make progress.
        """
        i = self._segment_for(offset)
        while i < len(self.segments):
            segment = self.segments[i]
            position = segment.position_of(offset)
            if position is not None:
                return self._read_from(segment, position, max_bytes, min_one_batch)
            i += 1
        return ReadResult(b"", -1)

    def _read_from(self, segment: LogSegment, position: int, max_bytes: int,
                   min_one_batch: bool) -> ReadResult:
        available = segment.size - position
        data = segment.read_at(position, min(max_bytes, available))
        end = 0
        first = -1
        for pos, header in scan_batches(data):
            if first < 0:
                first = header.base_offset
            end = pos + header.size
        if end == 0:
            if not min_one_batch or available <= 0:
                return ReadResult(b"", -1)
            header = read_header(segment.read_at(position, HEADER_SIZE))
            return ReadResult(segment.read_at(position, header.size), header.base_offset)
        if end < len(data):
            data = data[:end]
        return ReadResult(data, first)

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(base offset, max timestamp) of the first batch with max timestamp >= ``timestamp``."""
        for segment in self.segments:
            if segment.max_timestamp < timestamp:
                continue
            relative = segment.time_index.lookup(timestamp)
            start = segment.offset_index.lookup(relative)
            for _, header in segment.headers_from(start):
                if header.max_timestamp >= timestamp:
                    return header.base_offset, header.max_timestamp
        return None

    def headers_from(self, offset: int):
        """Headers of every batch whose last offset is at or after ``offset``, in order."""
        i = self._segment_for(offset)
        for segment in self.segments[i:]:
            position = segment.position_of(max(offset, segment.base_offset))
            if position is None:
                continue
            for _, header in segment.headers_from(position):
                yield header

    def batch_at(self, offset: int) -> bytes:
        """The whole batch holding ``offset`` (b"" when there is none)."""
        return self.read(offset, 1, min_one_batch=True).records

    # --- retention -----------------------------------------------------------------------

    def delete_old_segments(self, now_ms: int, retention_ms: int, retention_bytes: int) -> int:
        """Apply retention by time and size; returns how many segments were deleted.

        The active segment is rolled first when all of it has expired, like Kafka, so an idle
        topic's data does ultimately go.
        """
        deleted = 0
        if retention_ms >= 0:
            while self.segments and self._expired(self.segments[0], now_ms, retention_ms):
                if len(self.segments) == 1:
                    if self.active.size == 0:
                        break
                    self.roll()
                self._delete_first()
                deleted += 1
        if retention_bytes >= 0:
            total = self.size
            while len(self.segments) > 1 and total - self.segments[0].size >= retention_bytes:
                total -= self.segments[0].size
                self._delete_first()
                deleted += 1
        return deleted

    @staticmethod
    def _expired(segment: LogSegment, now_ms: int, retention_ms: int) -> bool:
        if segment.size == 0:
            return False
        newest = segment.max_timestamp
        if newest < 0:
            # No record in it has a timestamp: its age is the file's, as Kafka takes it.
            newest = int(os.stat(segment.path).st_mtime * 1000)
        return now_ms - newest > retention_ms

    def _delete_first(self) -> None:
        segment = self.segments.pop(0)
        self._base_offsets.pop(0)
        log.info("%s: deleting segment %d by retention", self.dir, segment.base_offset)
        segment.delete()

    # --- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Clean shutdown: seal the active segment and leave the marker that skips recovery."""
        self.active.seal()
        for segment in self.segments:
            segment.close()
        with open(os.path.join(self.dir, CLEAN_SHUTDOWN_FILE), "wb"):
            pass

    def delete(self) -> None:
        for segment in self.segments:
            segment.delete()
        self.segments.clear()
        self._base_offsets.clear()
