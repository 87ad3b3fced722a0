"""The one walk over fetched record batches: every reader (oncelog.Consumer, the topic reader
behind the audit and Spark, the chaos scenarios through the Consumer) reads batches here.

Pure: bytes in, batches and the next position out; no I/O. The rules, each in one place:

* A fetched record set is whole batches, possibly followed by a partial one (a Fetch answer is
  cut at its byte limit). The walk stops before the partial batch and says so (``partial``);
  the caller fetches again from ``position``.
* ``position`` is the next offset to fetch. A walked batch moves it to the batch's last offset
  + 1, whatever the batch held: a control batch (transaction marker), a compacted batch whose
  records skip offsets or stop before its last offset, a batch whose records all lie below
  the wanted offset. Never to the last record's offset + 1: that would fetch the same batch
  again forever when the last offsets hold no record. A batch starting past ``position``
  moves it to that batch's base offset (the offsets between are not in the log: compaction).
* Batches entirely below ``position`` are skipped (a Fetch answer starts at the batch holding
  the offset asked for); with an ``end``, the walk ends at the first batch starting at or
  after it.
* Records are withheld from the reader for whole batches, in ``RecordSetWalk._withheld`` only:
  control batches always; with ``aborted`` (a read_committed reader: the Fetch answer's
  aborted transactions, (producer id, first offset) each), the transactional batches of
  aborted transactions too, as Kafka's consumer does: an aborted transaction's producer is
  "aborted" from the batch holding its first offset until its ABORT marker, and its
  transactional batches in between are dropped. A read_committed reader must also fetch
  with isolation_level 1, so that nothing past the last stable offset comes back.
* Only RecordBatch v2 (magic 2); anything else is ``UnsupportedFormat``. A batch failing its
  CRC32C (when checked) is ``CorruptBatch``, or skipped and counted with ``skip_corrupt``
  (the audit reports it and reads on); records that do not parse are ``CorruptBatch`` too.

Records are decoded only when the reader asks a ``Batch`` for them, through the compiled
codec (``_records.c``) when it was built.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import cramjam

from . import records as codec
from .control import read_marker
from .record_batch import (
    COMPRESSION_MASK,
    CURRENT_MAGIC,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    crc_of,
    read_header,
)
from .sequences import record_sequence

CREATE_TIME, LOG_APPEND_TIME = "CreateTime", "LogAppendTime"
# What decoding a damaged batch raises: the codec's ValueError, a decompressor's own error.
_UNREADABLE = (ValueError, cramjam.DecompressionError)


class RecordSetError(ValueError):
    """A fetched record set that cannot be read at ``offset``."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class CorruptBatch(RecordSetError):
    """A batch that fails its CRC32C check, or whose records do not parse."""


class UnsupportedFormat(RecordSetError):
    """A message set of an old format (magic 0 or 1): no producer ids, no sequences."""


class Batch:
    """One batch of a fetched record set, with the offsets the reader wants of it:
    ``first`` (at least the batch's base offset) up to ``end`` (exclusive; None: no bound)."""

    __slots__ = ("buf", "end", "first", "header", "pos")

    def __init__(self, header: BatchHeader, buf: memoryview, pos: int, first: int,
                 end: int | None) -> None:
        self.header = header
        self.buf = buf
        self.pos = pos
        self.first = first
        self.end = end

    def __repr__(self) -> str:
        h = self.header
        return (f"Batch(offsets {h.base_offset}..{h.last_offset}, wanted from {self.first}"
                f"{'' if self.end is None else f' to {self.end}'}, {h.records_count} records)")

    def payload(self) -> bytes | memoryview:
        """The batch's records, uncompressed (the walk checked the batch is whole)."""
        h = self.header
        data = self.buf[self.pos + HEADER_SIZE:self.pos + LOG_OVERHEAD + h.batch_length]
        compression = h.attributes & COMPRESSION_MASK
        return data if compression == codec.NONE else codec.decompress(compression, data)

    def _whole(self) -> bool:
        """Whether every record of the batch is wanted (no filtering needed)."""
        h = self.header
        return self.first <= h.base_offset and (self.end is None or h.last_offset < self.end)

    def _corrupt(self, exc: Exception) -> CorruptBatch:
        return CorruptBatch(f"batch at offset {self.header.base_offset}: {exc}",
                            self.header.base_offset)

    def record_fields(self) -> list[codec.RecordFields]:
        """(offset delta, timestamp delta, key, value, headers) of each wanted record."""
        try:
            _, fields = codec.decode_record_fields(self.buf, self.pos)
        except _UNREADABLE as exc:
            raise self._corrupt(exc) from None
        if self._whole():
            return fields
        base, first = self.header.base_offset, self.first
        end = (1 << 63) if self.end is None else self.end
        return [f for f in fields if first <= base + f[0] < end]

    def append_records(self, out: list, cls: Any, topic: str, partition: int) -> int:
        """Append one ``cls`` per wanted record to ``out``; returns how many.

        ``cls`` takes the 12 fields of oncelog.ConsumerRecord in its order: topic, partition,
        offset, timestamp, timestamp type, key, value, headers, producer id, producer epoch,
        sequence (-1 without one), transactional. The compiled codec builds them when it is
        there (it takes a NamedTuple class); the consumer's per-record work is this call.
        """
        h = self.header
        attributes = h.attributes
        log_append = bool(attributes & TIMESTAMP_TYPE_BIT)
        kind = LOG_APPEND_TIME if log_append else CREATE_TIME
        before = len(out)
        try:
            compiled = codec.compiled
            if compiled is not None:
                compiled.consumer_records(
                    out, cls, self.payload(), h.records_count, self.first, topic, partition,
                    h.base_offset, h.base_timestamp, log_append, h.max_timestamp, kind,
                    h.producer_id, h.producer_epoch, h.base_sequence,
                    bool(attributes & TRANSACTIONAL_BIT))
            else:
                out += self._python_records(cls, topic, partition, kind)
        except _UNREADABLE as exc:
            raise self._corrupt(exc) from None
        if self.end is not None and h.base_offset + h.last_offset_delta >= self.end:
            while len(out) > before and out[-1][2] >= self.end:
                out.pop()  # offsets rise within a batch: only the tail can be past the end
        return len(out) - before

    def _python_records(self, cls: Any, topic: str, partition: int,
                        kind: str) -> Iterator[Any]:
        """What consumer_records of the compiled codec builds, in Python."""
        h = self.header
        base_offset, base_ts, base_sequence = h.base_offset, h.base_timestamp, h.base_sequence
        fixed_ts = h.max_timestamp if kind == LOG_APPEND_TIME else None
        pid, epoch, transactional = h.producer_id, h.producer_epoch, h.is_transactional
        _, fields = codec.decode_record_fields(self.buf, self.pos)
        for delta, ts_delta, key, value, headers in fields:
            if base_offset + delta < self.first:
                continue
            yield cls(
                topic, partition, base_offset + delta,
                base_ts + ts_delta if fixed_ts is None else fixed_ts, kind, key, value,
                headers, pid, epoch,
                record_sequence(base_sequence, delta),
                transactional)


class RecordSetWalk:
    """Walks one fetched record set of one partition from ``position`` (see the module's
    rules). Iterate for the batches whose records the reader gets; afterwards (or at any
    point) ``position`` is where to fetch next, ``partial`` whether the set ended in an
    incomplete batch, ``corrupt_batches`` how many were skipped (with ``skip_corrupt``)."""

    __slots__ = ("_aborted", "_aborted_now", "check_crcs", "controls", "corrupt_batches", "end",
                 "partial", "position", "skip_corrupt", "view")

    def __init__(self, data: bytes | bytearray | memoryview, position: int,
                 end: int | None = None, *, check_crcs: bool = True,
                 skip_corrupt: bool = False,
                 aborted: Iterable[tuple[int, int]] | None = None,
                 controls: bool = False) -> None:
        """``aborted``: None reads uncommitted; a read_committed reader gives the aborted
        transactions of the Fetch answer, as (producer id, first offset). ``controls``: the
        control batches come out too (the audit reads the markers); no other reader wants
        them."""
        # (first offset, producer id), earliest first; producers within an aborted one
        self._aborted = None if aborted is None else deque(
            sorted((first, pid) for pid, first in aborted))
        self._aborted_now: set[int] = set()
        self.view = memoryview(data)
        self.position = position
        self.end = end
        self.check_crcs = check_crcs
        self.skip_corrupt = skip_corrupt
        self.corrupt_batches = 0
        self.partial = False
        self.controls = controls

    @property
    def done(self) -> bool:
        """Whether the walk reached ``end``."""
        return self.end is not None and self.position >= self.end

    def _withheld(self, header: BatchHeader, pos: int) -> bool:
        """Whether the reader gets none of this batch's records (it still moves the position).
        The one place for it: control batches, and aborted transactions' batches for a
        read_committed reader."""
        pending = self._aborted
        if pending is None or not header.has_producer_id:
            return header.is_control
        while pending and pending[0][0] <= header.last_offset:
            self._aborted_now.add(pending.popleft()[1])
        if header.producer_id not in self._aborted_now:
            return header.is_control
        if not header.is_control:
            return header.is_transactional
        try:
            marker = read_marker(self.view, pos)
        except (ValueError, IndexError) as exc:
            raise CorruptBatch(f"control batch at offset {header.base_offset}: {exc}",
                               header.base_offset) from None
        if marker is not None and not marker.commit:
            self._aborted_now.discard(header.producer_id)
        return True

    def __iter__(self) -> Iterator[Batch]:
        view = self.view
        total = len(view)
        end = self.end
        pos = 0
        while pos < total:
            if total - pos < HEADER_SIZE:
                self.partial = True
                return
            header = read_header(view, pos)
            if view[pos + MAGIC_OFFSET] != CURRENT_MAGIC:
                raise UnsupportedFormat(
                    f"message format v{view[pos + MAGIC_OFFSET]} at offset "
                    f"{header.base_offset}: only v2 record batches are read", header.base_offset)
            if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
                raise CorruptBatch(f"batch at offset {header.base_offset} has length "
                                   f"{header.batch_length}", header.base_offset)
            size = LOG_OVERHEAD + header.batch_length
            if pos + size > total:
                self.partial = True
                return
            pos += size
            base = header.base_offset
            after = base + header.last_offset_delta + 1
            position = self.position
            if after <= position:
                continue
            if base > position:
                position = self.position = base  # offsets in between are not in the log
            if end is not None and position >= end:
                return
            if self.check_crcs and crc_of(view, pos - size, size) != header.crc:
                if not self.skip_corrupt:
                    raise CorruptBatch(f"batch at offset {base} fails its CRC32C check", base)
                self.corrupt_batches += 1
                self.position = after
                continue
            self.position = after
            if not self._withheld(header, pos - size) or (self.controls and header.is_control):
                yield Batch(header, view, pos - size, position, end)
