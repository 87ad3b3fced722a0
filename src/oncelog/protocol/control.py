"""Control batches: the transaction markers (COMMIT / ABORT) a partition's log holds.

Kafka's layout (EndTransactionMarker, ControlRecordType): a batch with the control and the
transactional attribute bits, the producer id and epoch of the transaction, base sequence -1,
and one record whose key is (version int16 = 0, type int16: 0 ABORT, 1 COMMIT) and whose
value is (version int16 = 0, coordinator epoch int32). Readers never see control records;
read_committed readers learn from them (through the Fetch answer's aborted transactions)
which records to drop.

Pure: bytes in, bytes or facts out.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import crc32c

from .record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CONTROL_BIT,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TRANSACTIONAL_BIT,
    BatchHeader,
    pack_header,
    read_header,
)
from .records import NONE, decompress, encode_record
from .sequences import NO_SEQUENCE
from .varint import read_varint

ABORT, COMMIT = 0, 1
_KEY = struct.Struct(">hh")  # version, type
_VALUE = struct.Struct(">hi")  # version, coordinator epoch
CONTROL_KEY_SIZE = _KEY.size


class Marker(NamedTuple):
    commit: bool
    coordinator_epoch: int


def marker_batch(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                 timestamp: int, base_offset: int = 0) -> bytes:
    """A whole control batch holding one COMMIT or ABORT marker."""
    record = encode_record(0, 0, _KEY.pack(0, COMMIT if commit else ABORT),
                           _VALUE.pack(0, coordinator_epoch), ())
    header = BatchHeader(base_offset, HEADER_SIZE - LOG_OVERHEAD + len(record), -1, 2, 0,
                         CONTROL_BIT | TRANSACTIONAL_BIT, 0, timestamp, timestamp,
                         producer_id, producer_epoch, NO_SEQUENCE, 1)
    crc = crc32c.crc32c(record, crc32c.crc32c(pack_header(header)[ATTRIBUTES_OFFSET:]))
    return pack_header(header._replace(crc=crc)) + record


def control_type(key: bytes | None) -> int | None:
    """The type a control record's key names (ABORT, COMMIT, or another Kafka defines);
    None when the key is not a control key."""
    if key is None or len(key) < _KEY.size:
        return None
    version, kind = _KEY.unpack_from(key)
    return kind if version >= 0 else None


def read_marker(batch: bytes | memoryview, pos: int = 0) -> Marker | None:
    """The marker in the control batch at ``pos``; None for an empty control batch (the
    cleaner emptied it) or a control record that is no transaction marker. ValueError when
    the batch does not parse."""
    header = read_header(batch, pos)
    if header.records_count < 1:
        return None
    view = memoryview(batch)[pos + HEADER_SIZE:pos + header.size]
    codec = header.attributes & COMPRESSION_MASK
    payload = bytes(view) if codec == NONE else decompress(codec, view)
    try:
        key, value = _key_and_value(payload)
    except IndexError:
        raise ValueError("control record does not parse") from None
    kind = control_type(key)
    if kind not in (ABORT, COMMIT):
        return None
    coordinator_epoch = -1
    if value is not None and len(value) >= _VALUE.size:
        coordinator_epoch = _VALUE.unpack_from(value)[1]
    return Marker(kind == COMMIT, coordinator_epoch)


def _key_and_value(payload: bytes) -> tuple[bytes | None, bytes | None]:
    """Key and value of the first record of an uncompressed payload."""
    _, p = read_varint(payload, 0)  # length
    _, p = read_varint(payload, p + 1)  # after the attributes byte: timestamp delta
    _, p = read_varint(payload, p)  # offset delta
    fields: list[bytes | None] = []
    for _ in range(2):
        length, p = read_varint(payload, p)
        if length < 0:
            fields.append(None)
            continue
        if p + length > len(payload):
            raise IndexError("field runs past the record")
        fields.append(payload[p:p + length])
        p += length
    return fields[0], fields[1]
