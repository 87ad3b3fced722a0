"""Producer state snapshots: the whole of a ProducerStateManager as versioned, CRC'd bytes.

Unlike Kafka's snapshot, which keeps only each producer's last batch, this one keeps every
cached batch, so right after a restart a retry of any of the last N batches is still answered
with its original offset. Tombstones are kept too.

Layout (little-endian):
    magic b"OLPS", version u16, crc32c u32 of everything after it,
    offset i64 (the state covers the log up to, not including, this offset),
    forgotten up to i64 (see ProducerStateManager.forgotten_up_to),
    entry count u32, then per entry: producer id i64, epoch i16, start seq i32,
        last timestamp i64, last append ms i64, batch count u8, then per batch: first seq i32,
        last seq i32, last offset i64,
    tombstone count u32, then per tombstone: producer id i64, epoch i16, start seq i32,
        last seq i32, last offset i64, since i64.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from .manager import ProducerStateManager
from .rules import CachedBatch, ProducerStateEntry, Tombstone

MAGIC = b"OLPS"
VERSION = 2  # 2 added the start sequence; a version-1 snapshot is rebuilt from the log
_PREFIX = struct.Struct("<4sHI")
_OFFSET = struct.Struct("<qq")
_COUNT = struct.Struct("<I")
_ENTRY = struct.Struct("<qhiqqB")
_BATCH = struct.Struct("<iiq")
_TOMBSTONE = struct.Struct("<qhiiqq")


class BadSnapshot(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Snapshot:
    offset: int
    forgotten_up_to: int
    entries: list[ProducerStateEntry]
    tombstones: list[Tombstone]


def of_state(offset: int, state: ProducerStateManager) -> bytes:
    return encode(Snapshot(offset, state.forgotten_up_to, list(state.entries()),
                           list(state.tombstones())))


def encode(snapshot: Snapshot) -> bytes:
    offset, entries, tombstones = snapshot.offset, snapshot.entries, snapshot.tombstones
    body = bytearray(_OFFSET.pack(offset, snapshot.forgotten_up_to))
    body += _COUNT.pack(len(entries))
    for e in entries:
        body += _ENTRY.pack(e.producer_id, e.epoch, e.start_seq, e.last_timestamp,
                            e.last_append_ms, len(e.batches))
        for b in e.batches:
            body += _BATCH.pack(b.first_seq, b.last_seq, b.last_offset)
    body += _COUNT.pack(len(tombstones))
    for t in tombstones:
        body += _TOMBSTONE.pack(t.producer_id, t.epoch, t.start_seq, t.last_seq, t.last_offset,
                                t.since)
    return _PREFIX.pack(MAGIC, VERSION, crc32c.crc32c(body)) + bytes(body)


def decode(data: bytes) -> Snapshot:
    """Raises BadSnapshot for anything not written by encode."""
    if len(data) < _PREFIX.size + _OFFSET.size:
        raise BadSnapshot("snapshot is truncated")
    magic, version, crc = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise BadSnapshot("not a producer state snapshot")
    if version != VERSION:
        raise BadSnapshot(f"snapshot version {version} is not supported")
    body = memoryview(data)[_PREFIX.size:]
    if crc32c.crc32c(body) != crc:
        raise BadSnapshot("snapshot CRC does not match")
    try:
        return _decode_body(body)
    except struct.error as exc:
        raise BadSnapshot(f"snapshot does not parse: {exc}") from None


def _decode_body(body: memoryview) -> Snapshot:
    offset, forgotten_up_to = _OFFSET.unpack_from(body, 0)
    pos = _OFFSET.size
    (count,) = _COUNT.unpack_from(body, pos)
    pos += _COUNT.size
    entries = []
    for _ in range(count):
        pid, epoch, start_seq, last_ts, last_append, nbatches = _ENTRY.unpack_from(body, pos)
        pos += _ENTRY.size
        batches = []
        for _ in range(nbatches):
            batches.append(CachedBatch(*_BATCH.unpack_from(body, pos)))
            pos += _BATCH.size
        entries.append(ProducerStateEntry(pid, epoch, start_seq, batches, last_ts, last_append))
    (count,) = _COUNT.unpack_from(body, pos)
    pos += _COUNT.size
    tombstones = []
    for _ in range(count):
        tombstones.append(Tombstone(*_TOMBSTONE.unpack_from(body, pos)))
        pos += _TOMBSTONE.size
    if pos != len(body):
        raise BadSnapshot(f"{len(body) - pos} bytes after the last tombstone")
    return Snapshot(offset, forgotten_up_to, entries, tombstones)
