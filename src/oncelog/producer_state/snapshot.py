"""Producer state snapshots: the whole of a ProducerStateManager as versioned, CRC'd bytes.

Each entry carries the producer's transaction as Kafka's snapshot does: the first offset of
its transaction ongoing here (so a restart finds the last stable offset where it was) and the
coordinator epoch of its last marker.

Unlike Kafka's snapshot, which keeps only each producer's last batch, this one keeps every
cached batch, so right after a restart a retry of any of the last N batches is still answered
with its original offset. Compact records (tombstones) and the forgotten-id mark are kept too.

Entries are stored in the manager's own packed form (ProducerStateManager.PACKED_HEAD and
PACKED_BATCH), so loading a snapshot is copying bytes into a dict: a million producers load
in about a second. A change to that form is a new VERSION. Version 3 (before transactions:
no transaction fields in the head, at least one batch) is read and converted; any other
version is refused and the partition rebuilds its state from the log.

Layout (little-endian):
    magic b"OLPS", version u16, crc32c u32 of everything after it,
    offset i64 (the state covers the log up to, not including, this offset),
    forgotten up to i64 (see ProducerStateManager.forgotten_up_to),
    entry count u32, then per entry: producer id i64, length u16, that many packed bytes,
    tombstone count u32, then per tombstone: producer id i64, packed tombstone bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from .manager import ProducerStateManager

MAGIC = b"OLPS"
VERSION = 4  # 4: with transactions; 3 is converted; older ones are rebuilt from the log
_V3 = 3
_V3_HEAD = struct.Struct("<hiqI")  # epoch, start seq, last timestamp, last append (s)
_V3_KEPT = 6  # epoch and start seq: the transaction fields go after them
_NO_TXN_FIELDS = struct.Struct("<qi").pack(-1, -1)  # no transaction, no coordinator epoch
_PREFIX = struct.Struct("<4sHI")
_OFFSET = struct.Struct("<qq")
_COUNT = struct.Struct("<I")
_ENTRY = struct.Struct("<qH")
_PID = struct.Struct("<q")


class BadSnapshot(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Snapshot:
    offset: int
    forgotten_up_to: int
    entries: list[tuple[int, bytes]]  # (producer id, packed entry), least recently active first
    tombstones: list[tuple[int, bytes]]  # (producer id, packed tombstone), oldest first


def of_state(offset: int, state: ProducerStateManager) -> bytes:
    return encode(Snapshot(offset, state.forgotten_up_to, state.packed_entries(),
                           state.packed_tombstones()))


def encode(snapshot: Snapshot) -> bytes:
    parts = [_OFFSET.pack(snapshot.offset, snapshot.forgotten_up_to),
             _COUNT.pack(len(snapshot.entries))]
    for pid, packed in snapshot.entries:
        parts.append(_ENTRY.pack(pid, len(packed)))
        parts.append(packed)
    parts.append(_COUNT.pack(len(snapshot.tombstones)))
    for pid, packed in snapshot.tombstones:
        parts.append(_PID.pack(pid))
        parts.append(packed)
    body = b"".join(parts)
    return _PREFIX.pack(MAGIC, VERSION, crc32c.crc32c(body)) + body


def decode(data: bytes) -> Snapshot:
    """Raises BadSnapshot for anything not written by encode."""
    if len(data) < _PREFIX.size + _OFFSET.size:
        raise BadSnapshot("snapshot is truncated")
    magic, version, crc = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise BadSnapshot("not a producer state snapshot")
    if version not in (VERSION, _V3):
        raise BadSnapshot(f"snapshot version {version} is not supported")
    body = bytes(memoryview(data)[_PREFIX.size:])
    if crc32c.crc32c(body) != crc:
        raise BadSnapshot("snapshot CRC does not match")
    try:
        return _decode_body(body, version)
    except struct.error as exc:
        raise BadSnapshot(f"snapshot does not parse: {exc}") from None


def _v3_entry_size(size: int) -> bool:
    batches, rest = divmod(size - _V3_HEAD.size, ProducerStateManager.PACKED_BATCH.size)
    return rest == 0 and 1 <= batches <= 255


def _decode_body(body: bytes, version: int = VERSION) -> Snapshot:
    offset, forgotten_up_to = _OFFSET.unpack_from(body, 0)
    pos = _OFFSET.size
    (count,) = _COUNT.unpack_from(body, pos)
    pos += _COUNT.size
    entries = []
    for _ in range(count):
        pid, length = _ENTRY.unpack_from(body, pos)
        pos += _ENTRY.size
        valid = ProducerStateManager.valid_packed_entry_size(length) if version == VERSION \
            else _v3_entry_size(length)
        if not valid or pos + length > len(body):
            raise BadSnapshot(f"entry of producer {pid} has an impossible size {length}")
        packed = body[pos:pos + length]
        if version == _V3:
            packed = packed[:_V3_KEPT] + _NO_TXN_FIELDS + packed[_V3_KEPT:]
        entries.append((pid, packed))
        pos += length
    (count,) = _COUNT.unpack_from(body, pos)
    pos += _COUNT.size
    size = ProducerStateManager.PACKED_TOMBSTONE.size
    tombstones = []
    for _ in range(count):
        (pid,) = _PID.unpack_from(body, pos)
        pos += _PID.size
        if pos + size > len(body):
            raise BadSnapshot("snapshot is truncated in its tombstones")
        tombstones.append((pid, body[pos:pos + size]))
        pos += size
    if pos != len(body):
        raise BadSnapshot(f"{len(body) - pos} bytes after the last tombstone")
    return Snapshot(offset, forgotten_up_to, entries, tombstones)
