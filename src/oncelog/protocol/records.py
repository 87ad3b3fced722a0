"""Records inside a v2 batch: encode and decode, with every Kafka compression codec.

The broker never calls this on the produce or fetch path; clients, the CLI, and ListOffsets
by timestamp (which must name the exact record) do.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import cramjam
import crc32c

from .record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CRC_OFFSET,
    HEADER_SIZE,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    BatchHeader,
    read_header,
)
from .sequences import NO_SEQUENCE
from .varint import read_varint, varint_bytes

# The compiled codec (_records.c), when it was built and not turned off with
# ONCELOG_PURE_PYTHON=1 (to compare, or to test the Python rules alone). Decoders look it up
# here at each use, so a test can set it to None; RecordBuilder is chosen once, below.
compiled: Any = None
if not os.environ.get("ONCELOG_PURE_PYTHON"):
    try:
        from . import _records as compiled
    except ImportError:  # built without a C compiler: the Python codec below does it all
        pass

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
CODECS = {"none": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
_I32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def _read_bytes(buf: bytes | memoryview, pos: int) -> tuple[bytes | None, int]:
    length, pos = read_varint(buf, pos)
    if length < 0:
        return None, pos
    end = pos + length
    if end > len(buf):
        raise ValueError("record field runs past the end of the batch")
    return bytes(buf[pos:end]), end


# --- compression ----------------------------------------------------------------------------

def compress(codec: int, data: bytes | memoryview, level: int | None = None
             ) -> bytes | memoryview:
    """``data`` compressed with ``codec``; ``level`` None (or gzip's -1) is the codec's
    default (snappy has no levels)."""
    if codec == NONE:
        return data
    if codec == GZIP:
        if level is not None and level > 0:
            return bytes(cramjam.gzip.compress(data, level=level))
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        # xerial framing, as Java's producer writes: every Kafka client can read it.
        out = bytearray(_XERIAL_HEADER)
        for start in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(data[start:start + _XERIAL_BLOCK]))
            out += _I32.pack(len(block))
            out += block
        return bytes(out)
    if codec == LZ4:
        if level is not None:
            return bytes(cramjam.lz4.compress(data, level=level))
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        if level is not None:
            return bytes(cramjam.zstd.compress(data, level=level))
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression codec {codec}")


def _xerial_blocks(data: bytes):
    """The raw snappy blocks of xerial framing (magic, version, compatible version, then
    blocks each behind its length); ValueError when a length lies."""
    pos = len(_XERIAL_HEADER)
    while pos < len(data):
        if pos + _I32.size > len(data):
            raise ValueError("xerial snappy block length is cut short")
        (size,) = _I32.unpack_from(data, pos)
        pos += _I32.size
        if size < 0 or pos + size > len(data):
            raise ValueError(f"xerial snappy block of {size} bytes runs past the end")
        yield data[pos:pos + size]
        pos += size


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return bytes(cramjam.gzip.decompress(bytes(data)))
    if codec == SNAPPY:
        data = bytes(data)
        if data.startswith(_XERIAL_MAGIC):
            return b"".join(bytes(cramjam.snappy.decompress_raw(block))
                            for block in _xerial_blocks(data))
        return bytes(cramjam.snappy.decompress_raw(data))
    if codec == LZ4:
        return bytes(cramjam.lz4.decompress(bytes(data)))
    if codec == ZSTD:
        return bytes(cramjam.zstd.decompress(bytes(data)))
    raise ValueError(f"unknown compression codec {codec}")


class TooLarge(ValueError):
    """The data decompresses to more than the caller allows."""


# The most an LZ4 frame can expand (a match length grows by 255 per byte) and the most a
# deflate stream can (258-byte matches in about two bits): data this much smaller than the
# limit cannot exceed it, and decompresses in one call.
_LZ4_MOST_RATIO = 256
_DEFLATE_MOST_RATIO = 1032
_CUT_SHORT = "failed to write whole buffer"  # cramjam's *_into when the output is full


def decompress_at_most(codec: int, data: bytes | memoryview, limit: int
                       ) -> bytes | memoryview:
    """``decompress`` for data nobody vouches for: TooLarge rather than more than ``limit``
    bytes (a few hundred bytes of zstd can claim gigabytes), ValueError when it does not
    decompress."""
    try:
        return _decompress_at_most(codec, bytes(data), limit)
    except cramjam.DecompressionError as exc:
        raise ValueError(str(exc)) from None


def _decompress_at_most(codec: int, data: bytes, limit: int) -> bytes | memoryview:
    if codec == NONE:
        return data
    if codec == SNAPPY:
        # Snappy says its size up front, block by block with xerial framing.
        blocks = list(_xerial_blocks(data)) if data.startswith(_XERIAL_MAGIC) else [data]
        size = sum(cramjam.snappy.decompress_raw_len(block) for block in blocks)
        if size > limit:
            raise TooLarge(f"says it decompresses to {size} bytes, more than {limit}")
        return b"".join(bytes(cramjam.snappy.decompress_raw(block)) for block in blocks)
    if codec == GZIP:
        return _gunzip_at_most(data, limit)
    if codec == LZ4 and len(data) * _LZ4_MOST_RATIO <= limit:
        # a view, not bytes(): copying 200 MB into fresh pages holds the GIL for tenths of
        # a second, and this may run in a worker thread beside the event loop
        return memoryview(cramjam.lz4.decompress(data))
    if codec in (LZ4, ZSTD):
        return _decompress_into_at_most(getattr(cramjam, "lz4" if codec == LZ4 else "zstd"),
                                        data, limit)
    raise ValueError(f"unknown compression codec {codec}")


def _gunzip_at_most(data: bytes, limit: int) -> bytes | memoryview:
    if len(data) * _DEFLATE_MOST_RATIO <= limit:
        return memoryview(cramjam.gzip.decompress(data))  # no copy (see LZ4 above)
    out = bytearray()
    while data:  # gzip members one after the other, as Java's GZIPInputStream reads them
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += member.decompress(data, limit + 1 - len(out))
        except zlib.error as exc:
            raise ValueError(f"gzip: {exc}") from None
        if len(out) > limit:
            raise TooLarge(f"decompresses to more than {limit} bytes")
        if not member.eof:
            raise ValueError("gzip: the stream is cut short")
        data = member.unused_data
    return bytes(out)


def _decompress_into_at_most(codec: Any, data: bytes, limit: int) -> memoryview:
    # Into a buffer that grows until the data fits or the limit is reached: the decompressor
    # stops at the buffer's end, so nothing past the limit is ever made.
    size = min(limit, max(4 * len(data), 1 << 20))
    while True:
        # An anonymous map's pages are zeroed by the kernel as the decompressor (which lets
        # go of the GIL) first writes them; a bytearray of 256 MB is zeroed first, 0.3 s
        # with the GIL held, in whatever thread allocates it.
        out = bytearray(size) if size <= 1 << 20 else mmap.mmap(-1, size)
        try:
            return memoryview(out)[:codec.decompress_into(data, out)]
        except cramjam.DecompressionError as exc:
            if _CUT_SHORT not in str(exc):
                raise
            if size >= limit:
                raise TooLarge(f"decompresses to more than {limit} bytes") from None
            size = min(limit, size * 4)


# --- a batch being filled (the producer's) --------------------------------------------------

_NULL = varint_bytes(-1)
_CRC = struct.Struct(">I")
_ATTRIBUTES = b"\x00"


class PyRecordBuilder:
    """The records of one batch, encoded as they are appended after ``header_size`` bytes of
    room for the header: the Python twin of _records.RecordBuilder, which ``RecordBuilder``
    below is when the compiled codec is there."""

    __slots__ = ("_buffer", "_timestamps", "accounted", "base_ts", "closed", "count", "max_ts")

    def __init__(self, header_size: int) -> None:
        self._buffer: bytearray | None = bytearray(header_size)
        self._timestamps: list[int] = []
        self.count = 0
        self.base_ts = self.max_ts = 0
        # The producer's bookkeeping for the batch being filled (see record_builder.h).
        self.closed = False
        self.accounted = 0

    @property
    def size(self) -> int:
        return 0 if self._buffer is None else len(self._buffer)

    def delta(self, timestamp: int) -> int:
        """The timestamp delta the next record would have."""
        return timestamp - self.base_ts if self.count else 0

    def append(self, timestamp: int | None, key: bytes | None, value: bytes | None) -> int:
        """A record without headers (a timestamp of None is now); returns its index."""
        if timestamp is None:
            timestamp = now_ms()
        return self.append_encoded(timestamp, encode_record(
            self.count, self.delta(timestamp), key, value, ()))

    def append_encoded(self, timestamp: int, record: bytes) -> int:
        """A record the caller encoded with offset delta ``count`` and timestamp delta
        ``delta(timestamp)``; returns its index."""
        if self._buffer is None:
            raise RuntimeError("the builder's buffer was taken: no more records")
        self._buffer += record
        return self._appended(timestamp)

    def _appended(self, timestamp: int) -> int:
        index = self.count
        if index == 0:
            self.base_ts = self.max_ts = timestamp
        elif timestamp > self.max_ts:
            self.max_ts = timestamp
        self._timestamps.append(timestamp)
        self.count = index + 1
        return index

    def timestamp(self, index: int) -> int:
        if not 0 <= index < self.count:
            raise IndexError("no record at that index")
        return self._timestamps[index]

    def take_buffer(self) -> bytearray:
        """The buffer (header room, then the records); the builder keeps its count and
        timestamps, is closed, and takes no more records."""
        if self._buffer is None:
            raise RuntimeError("the builder's buffer was taken already")
        buffer, self._buffer = self._buffer, None
        self.closed = True
        return buffer


def now_ms() -> int:
    """Now as Kafka's record timestamps count it: milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def encode_record(offset_delta: int, ts_delta: int, key: bytes | None, value: bytes | None,
                  headers: Iterable[tuple[bytes, bytes | None]]) -> bytes:
    """One record of a v2 batch, length prefix included (header keys already encoded)."""
    parts = [_ATTRIBUTES, varint_bytes(ts_delta), varint_bytes(offset_delta)]
    for field in (key, value):
        if field is None:
            parts.append(_NULL)
        else:
            parts += (varint_bytes(len(field)), field)
    headers = list(headers)
    parts.append(varint_bytes(len(headers)))
    for name, hvalue in headers:
        parts += (varint_bytes(len(name)), name)
        if hvalue is None:
            parts.append(_NULL)
        else:
            parts += (varint_bytes(len(hvalue)), hvalue)
    body = b"".join(parts)
    return varint_bytes(len(body)) + body


RecordBuilder: Any = compiled.RecordBuilder if compiled is not None else PyRecordBuilder


# --- batches --------------------------------------------------------------------------------

def encode_batch(
    records: Sequence[tuple[bytes | None, bytes | None, Iterable[tuple[str, bytes | None]], int]],
    compression: int = NONE,
    base_offset: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
) -> bytes:
    """A complete v2 batch from (key, value, headers, timestamp ms) tuples."""
    if not records:
        raise ValueError("a batch needs at least one record")
    base_ts = records[0][3]
    if len(records) == 1:  # a coordinator's record, most often: no loop, no copy
        key, value, headers, max_ts = records[0]
        body: bytes | bytearray = encode_record(
            0, 0, key, value, [(name.encode(), hvalue) for name, hvalue in headers])
    else:
        max_ts = max(r[3] for r in records)
        body = bytearray()
        for delta, (key, value, headers, ts) in enumerate(records):
            body += encode_record(delta, ts - base_ts, key, value,
                                  [(name.encode(), hvalue) for name, hvalue in headers])
    payload = body if compression == NONE else compress(compression, bytes(body))
    attributes = compression | (0x10 if transactional else 0)
    batch = bytearray(HEADER_STRUCT.pack(
        base_offset, HEADER_SIZE - LOG_OVERHEAD + len(payload), -1, 2, 0, attributes,
        len(records) - 1, base_ts, max_ts, producer_id, producer_epoch, base_sequence,
        len(records)))
    batch += payload
    # The CRC covers everything from the attributes on, header and records.
    _CRC.pack_into(batch, CRC_OFFSET, crc32c.crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return bytes(batch)


def decode_batch(buf: bytes | memoryview, pos: int = 0) -> tuple[BatchHeader, list[Record]]:
    """Header and records of the batch at ``pos``; raises ValueError when it does not parse."""
    header, fields = decode_record_fields(buf, pos)
    base_offset, base_ts = header.base_offset, header.base_timestamp
    return header, [Record(base_offset + delta, base_ts + ts_delta, key, value, headers)
                    for delta, ts_delta, key, value, headers in fields]


RecordFields = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


def decode_record_fields(buf: bytes | memoryview, pos: int = 0
                         ) -> tuple[BatchHeader, list[RecordFields]]:
    """Header and (offset delta, timestamp delta, key, value, headers) of each record of the
    batch at ``pos``: for consumers that build their own record objects. Raises ValueError
    when the batch does not parse."""
    try:
        return _decode_record_fields(buf, pos)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"record batch does not parse: {exc}") from None


def batch_payload(buf: bytes | memoryview, pos: int = 0
                  ) -> tuple[BatchHeader, bytes | memoryview]:
    """Header and uncompressed records of the batch at ``pos`` (empty for control batches)."""
    header = read_header(buf, pos)
    end = pos + header.size
    if end > len(buf):
        raise ValueError("batch is truncated")
    if header.is_control:
        return header, b""
    codec = header.attributes & COMPRESSION_MASK
    payload = memoryview(buf)[pos + HEADER_SIZE:end]
    return header, payload if codec == NONE else decompress(codec, payload)


def _decode_record_fields(buf: bytes | memoryview, pos: int
                          ) -> tuple[BatchHeader, list[RecordFields]]:
    header, payload = batch_payload(buf, pos)
    if header.is_control:
        return header, []
    if compiled is not None:
        return header, compiled.decode_records(payload, header.records_count)
    return header, _decode_records(payload, header.records_count)


def _decode_records(payload: bytes | memoryview, count: int) -> list[RecordFields]:
    """The Python twin of _records.decode_records: the first ``count`` records of an
    uncompressed payload."""
    # Where the compiled codec is missing; written for clarity, not speed.
    payload = bytes(payload)
    records = []
    p = 0
    for _ in range(count):
        length, p = read_varint(payload, p)
        record_end = p + length
        p += 1  # attributes, unused in v2
        ts_delta, p = read_varint(payload, p)
        delta, p = read_varint(payload, p)
        key, p = _read_bytes(payload, p)
        value, p = _read_bytes(payload, p)
        header_count, p = read_varint(payload, p)
        items = []
        for _ in range(header_count):
            name, p = _read_bytes(payload, p)
            hvalue, p = _read_bytes(payload, p)
            items.append(((name or b"").decode("utf-8", "replace"), hvalue))
        headers = tuple(items)
        if p != record_end:
            raise ValueError("record length does not match its fields")
        records.append((delta, ts_delta, key, value, headers))
    return records
