"""The records of ``__transaction_state``, in Kafka's formats (TransactionLogKey v0,
TransactionLogValue v0 and v1).

Key: version int16 (0), transactional id. Value: version int16, producer id int64, producer
epoch int16, transaction timeout ms int32, status int8, partitions (nullable array of topic
and partition ids), last update timestamp int64, start timestamp int64. Version 1 is the
flexible form (compact strings and arrays, tagged fields) that KIP-890 added, with the
previous and next producer ids and the client's transaction version as tagged fields 0, 1
and 2. A null value (tombstone) is a transactional id that expired. Pure: bytes in, values
out.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from ...protocol.varint import read_uvarint, write_uvarint
from ..group.group_records import BadRecord, _Reader, _Writer

KEY_VERSION = 0


def uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    write_uvarint(out, value)
    return bytes(out)


VALUE_VERSION = 1


class TxnState(enum.IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def label(self) -> str:
        """The name Kafka's tools and DescribeTransactions use."""
        return "".join(word.capitalize() for word in self.name.split("_"))


@dataclass(frozen=True, slots=True)
class TxnValue:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: tuple[tuple[str, tuple[int, ...]], ...]
    last_update_ms: int
    start_ms: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    transaction_version: int = 0


def txn_key(transactional_id: str) -> bytes:
    return _Writer().int16(KEY_VERSION).string(transactional_id).done()


def read_txn_key(data: bytes) -> str:
    r = _Reader(data)
    version = r.int16()
    if version != KEY_VERSION:
        raise BadRecord(f"unknown transaction key version {version}")
    return r.string() or ""


def _compact_string(text: str) -> bytes:
    data = text.encode()
    return uvarint_bytes(len(data) + 1) + data


def txn_value(value: TxnValue) -> bytes:
    parts = [struct.pack(">hqhib", VALUE_VERSION, value.producer_id, value.producer_epoch,
                         value.timeout_ms, int(value.state))]
    parts.append(uvarint_bytes(len(value.partitions) + 1))
    for topic, ids in value.partitions:
        parts.append(_compact_string(topic))
        parts.append(uvarint_bytes(len(ids) + 1))
        parts.append(b"".join(struct.pack(">i", p) for p in ids))
        parts.append(b"\x00")  # no tagged fields in the topic entry
    parts.append(struct.pack(">qq", value.last_update_ms, value.start_ms))
    tags = [(0, struct.pack(">q", value.previous_producer_id)),
            (1, struct.pack(">q", value.next_producer_id)),
            (2, struct.pack(">h", value.transaction_version))]
    parts.append(uvarint_bytes(len(tags)))
    for tag, data in tags:
        parts += (uvarint_bytes(tag), uvarint_bytes(len(data)), data)
    return b"".join(parts)


def read_txn_value(data: bytes) -> TxnValue:
    r = _Reader(data)
    version = r.int16()
    if version not in (0, 1):
        raise BadRecord(f"unknown transaction value version {version}")
    producer_id, epoch, timeout = r.int64(), r.int16(), r.int32()
    status = r._take(">b", 1)
    try:
        state = TxnState(status)
    except ValueError:
        raise BadRecord(f"unknown transaction status {status}") from None
    if version == 0:
        partitions = []
        count = r.int32()
        for _ in range(max(count, 0)):
            topic = r.string() or ""
            partitions.append((topic, tuple(r.int32() for _ in range(r.int32()))))
        return TxnValue(producer_id, epoch, timeout, state, tuple(partitions), r.int64(),
                        r.int64())
    view = r.data
    pos = r.pos

    def uvarint() -> int:
        nonlocal pos
        try:
            value, pos = read_uvarint(view, pos)
        except (IndexError, ValueError) as exc:
            raise BadRecord(f"bad varint: {exc}") from None
        return value

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(view):
            raise BadRecord("record ends early")
        out = bytes(view[pos:pos + n])
        pos += n
        return out

    partitions = []
    for _ in range(uvarint() - 1):
        topic = take(uvarint() - 1).decode("utf-8", "replace")
        ids = tuple(struct.unpack(">i", take(4))[0] for _ in range(uvarint() - 1))
        for _ in range(uvarint()):  # tagged fields of the entry: none we know
            uvarint()
            take(uvarint())
        partitions.append((topic, ids))
    last_update, start = struct.unpack(">qq", take(16))
    previous = next_ = -1
    txn_version = 0
    for _ in range(uvarint()):
        tag, size = uvarint(), uvarint()
        field = take(size)
        if tag == 0 and size == 8:
            previous = struct.unpack(">q", field)[0]
        elif tag == 1 and size == 8:
            next_ = struct.unpack(">q", field)[0]
        elif tag == 2 and size == 2:
            txn_version = struct.unpack(">h", field)[0]
    return TxnValue(producer_id, epoch, timeout, state, tuple(partitions), last_update, start,
                    previous, next_, txn_version)
