"""Hand-made record batches for the readers' tests: control batches (transaction markers, which
no client may produce) and compacted batches (records that skip offsets), as a log may hold
them."""

from __future__ import annotations

import struct
import time

import crc32c

from oncelog.protocol.record_batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_BIT,
    HEADER_SIZE,
    TRANSACTIONAL_BIT,
)
from oncelog.protocol.records import encode_record

T0 = 1_700_000_000_000
_HEADER = struct.Struct(">qiibIhiqqqhii")
ABORT, COMMIT = 0, 1


def craft_batch(base_offset: int, records: list[tuple[int, bytes | None, bytes | None]],
                last_offset_delta: int | None = None, *, attributes: int = 0,
                producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                timestamp: int | None = None) -> bytes:
    """A v2 batch of (offset delta, key, value) records, uncompressed. ``last_offset_delta``
    past the last record's delta makes a compacted batch (its last offsets hold no record).
    Timestamps are now by default (retention would delete an old segment of them)."""
    if timestamp is None:
        timestamp = int(time.time() * 1000)
    body = b"".join(encode_record(delta, delta, key, value, ()) for delta, key, value in records)
    last = records[-1][0] if last_offset_delta is None else last_offset_delta
    batch = bytearray(HEADER_SIZE) + body
    _HEADER.pack_into(batch, 0, base_offset, len(batch) - 12, 0, 2, 0, attributes, last,
                      timestamp, timestamp + last, producer_id, producer_epoch, base_sequence,
                      len(records))
    struct.pack_into(">I", batch, 17, crc32c.crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return bytes(batch)


def control_batch(base_offset: int, producer_id: int = 1000, producer_epoch: int = 0,
                  kind: int = COMMIT) -> bytes:
    """A transaction marker as a transaction coordinator writes it: one control record whose key
    is (version 0, type) and value (version 0, coordinator epoch 0)."""
    return craft_batch(base_offset, [(0, struct.pack(">hh", 0, kind), struct.pack(">hi", 0, 0))],
                       attributes=TRANSACTIONAL_BIT | CONTROL_BIT, producer_id=producer_id,
                       producer_epoch=producer_epoch)


def data_batch(base_offset: int, values: list[bytes], *, producer_id: int = -1,
               producer_epoch: int = -1, base_sequence: int = -1,
               transactional: bool = False) -> bytes:
    return craft_batch(base_offset, [(i, None, v) for i, v in enumerate(values)],
                       attributes=TRANSACTIONAL_BIT if transactional else 0,
                       producer_id=producer_id, producer_epoch=producer_epoch,
                       base_sequence=base_sequence)
