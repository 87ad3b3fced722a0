"""ProduceRequest v3-v13 read directly from the frame, records left in place, and written
directly for oncelog's producer.

kio copies each partition's records out of the frame into new bytes; at a megabyte a
request that copy is a measurable share of the broker's time. This reader returns
memoryviews into the frame instead, with the same field names kio's entities have, so the
produce handler reads either. tests/protocol/test_produce_request.py checks it against kio. From v13
a topic is named by its id (KIP-516): ``name`` is None and ``topic_id`` set.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from typing import NamedTuple

from .api_versions import PRODUCE
from .errors import ProtocolError
from .varint import read_uvarint, write_uvarint

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">hi")  # acks, timeout
_HEADER_START = struct.Struct(">ihhi")  # frame size, api key, api version, correlation id
FLEXIBLE_FROM = 9
TOPIC_IDS_FROM = 13


class PartitionProduceData(NamedTuple):
    index: int
    records: memoryview | None


class TopicProduceData(NamedTuple):
    name: str | None
    partition_data: list[PartitionProduceData]
    topic_id: uuid.UUID | None = None


class ProduceRequest(NamedTuple):
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicProduceData]


class WireReader:
    """Kafka's primitive types from a frame, classic and flexible (compact) encodings;
    ProtocolError naming ``what`` when the frame ends early or holds nonsense."""

    def __init__(self, frame: bytes | bytearray | memoryview, pos: int,
                 what: str = "produce request") -> None:
        self.view = memoryview(frame)
        self.pos = pos
        self.what = what

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.view):
            raise ProtocolError(f"{self.what} is truncated")
        chunk = self.view[self.pos:end]
        self.pos = end
        return chunk

    def skip(self, n: int) -> None:
        self.take(n)

    def unpack(self, fmt: struct.Struct) -> tuple:
        return fmt.unpack(self.take(fmt.size))

    def uvarint(self) -> int:
        try:
            value, self.pos = read_uvarint(self.view, self.pos, max_bits=32)
        except IndexError:
            raise ProtocolError(f"{self.what} is truncated") from None
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        return value

    def length(self, flexible: bool, wide: bool = False) -> int:
        """-1 for null; compact lengths are stored plus one."""
        if flexible:
            return self.uvarint() - 1
        return self.unpack(_I32 if wide else _I16)[0]

    def string(self, flexible: bool) -> str | None:
        n = self.length(flexible)
        if n < 0:
            return None
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("string is not UTF-8") from None

    def tags(self, flexible: bool) -> None:
        if flexible:
            for _ in range(self.uvarint()):
                self.uvarint()
                self.take(self.uvarint())

    def count(self, flexible: bool) -> int:
        n = self.length(flexible, wide=True)
        if n < 0:
            raise ProtocolError(f"null array in a {self.what}")
        return n


def read_header(frame: bytes | bytearray, version: int) -> tuple[str | None, int]:
    """(client id, position after the header): header v1, or v2 with tagged fields."""
    reader = WireReader(frame, 8)
    (length,) = reader.unpack(_I16)
    client_id = None
    if length >= 0:
        try:
            client_id = str(reader.take(length), "utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("client id is not UTF-8") from None
    reader.tags(version >= FLEXIBLE_FROM)
    return client_id, reader.pos


def decode(frame: bytes | bytearray, version: int, pos: int) -> ProduceRequest:
    flexible = version >= FLEXIBLE_FROM
    r = WireReader(frame, pos)
    transactional_id = r.string(flexible)
    acks, timeout_ms = r.unpack(_HEAD)
    by_id = version >= TOPIC_IDS_FROM
    topics = []
    for _ in range(r.count(flexible)):
        topic_id = uuid.UUID(bytes=bytes(r.take(16))) if by_id else None
        name = None if by_id else r.string(flexible)
        if name is None and not by_id:
            raise ProtocolError("null topic name in a produce request")
        partitions = []
        for _ in range(r.count(flexible)):
            (index,) = r.unpack(_I32)
            size = r.length(flexible, wide=True)
            records = None if size < 0 else r.take(size)
            r.tags(flexible)
            partitions.append(PartitionProduceData(index, records))
        r.tags(flexible)
        topics.append(TopicProduceData(name, partitions, topic_id))
    r.tags(flexible)
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)


# --- writing (oncelog's producer) -----------------------------------------------------------

def _string(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return b"\x00" if flexible else b"\xff\xff"
    data = value.encode()
    return (_uvarint(len(data) + 1) if flexible else _I16.pack(len(data))) + data


def _uvarint(value: int) -> bytes:
    out = bytearray()
    write_uvarint(out, value)
    return bytes(out)


def _count(n: int, flexible: bool) -> bytes:
    return _uvarint(n + 1) if flexible else _I32.pack(n)


def encode(version: int, correlation_id: int, client_id: str | None,
           transactional_id: str | None, acks: int, timeout_ms: int,
           topics: Sequence[tuple[str | uuid.UUID, Sequence[tuple[int, bytes | bytearray]]]]
           ) -> list[bytes | bytearray]:
    """A complete request frame as parts to write in order (the records are not copied):
    the bytes kio writes for the same request, in a fraction of its time (the producer
    sends one per batch or so). Topics are named by name, from v13 by id."""
    flexible = version >= FLEXIBLE_FROM
    client = b"\xff\xff" if client_id is None else _I16.pack(len(client_id.encode())) + \
        client_id.encode()  # header v1 and v2 both write it as a plain string
    head = [_HEADER_START.pack(0, PRODUCE, version, correlation_id), client]
    if flexible:
        head.append(b"\x00")  # header v2: no tagged fields
    head += (_string(transactional_id, flexible), _HEAD.pack(acks, timeout_ms),
             _count(len(topics), flexible))
    parts: list[bytes | bytearray] = []
    pending = head
    for name, partitions in topics:
        pending += (name.bytes if isinstance(name, uuid.UUID) else _string(name, flexible),
                    _count(len(partitions), flexible))
        for index, records in partitions:
            pending += (_I32.pack(index),
                        _uvarint(len(records) + 1) if flexible else _I32.pack(len(records)))
            parts.append(b"".join(pending))
            parts.append(records)
            pending = [b"\x00"] if flexible else []  # the partition's tagged fields
        if flexible:
            pending.append(b"\x00")
    if flexible:
        pending.append(b"\x00")
    if pending:
        parts.append(b"".join(pending))
    size = sum(len(part) for part in parts) - 4
    first = bytearray(parts[0])
    _I32.pack_into(first, 0, size)
    parts[0] = bytes(first)
    return parts
