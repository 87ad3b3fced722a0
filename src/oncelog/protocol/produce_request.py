"""ProduceRequest v3-v9 read directly from the frame, records left in place.

kio copies each partition's records out of the frame into new bytes; at a megabyte a
request that copy is a measurable share of the broker's time. This reader returns
memoryviews into the frame instead, with the same field names kio's entities have, so the
produce handler reads either. tests/test_produce_request.py checks it against kio.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .errors import ProtocolError
from .varint import read_uvarint

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">hi")  # acks, timeout
FLEXIBLE_FROM = 9


class PartitionProduceData(NamedTuple):
    index: int
    records: memoryview | None


class TopicProduceData(NamedTuple):
    name: str
    partition_data: list[PartitionProduceData]


class ProduceRequest(NamedTuple):
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicProduceData]


class _Reader:
    def __init__(self, frame: bytes | bytearray, pos: int) -> None:
        self.view = memoryview(frame)
        self.pos = pos

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.view):
            raise ProtocolError("produce request is truncated")
        chunk = self.view[self.pos:end]
        self.pos = end
        return chunk

    def unpack(self, fmt: struct.Struct) -> tuple:
        return fmt.unpack(self.take(fmt.size))

    def uvarint(self) -> int:
        try:
            value, self.pos = read_uvarint(self.view, self.pos, max_bits=32)
        except IndexError:
            raise ProtocolError("produce request is truncated") from None
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
            raise ProtocolError("null array in a produce request")
        return n


def read_header(frame: bytes | bytearray, version: int) -> tuple[str | None, int]:
    """(client id, position after the header): header v1, or v2 with tagged fields."""
    reader = _Reader(frame, 8)
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
    r = _Reader(frame, pos)
    transactional_id = r.string(flexible)
    acks, timeout_ms = r.unpack(_HEAD)
    topics = []
    for _ in range(r.count(flexible)):
        name = r.string(flexible)
        if name is None:
            raise ProtocolError("null topic name in a produce request")
        partitions = []
        for _ in range(r.count(flexible)):
            (index,) = r.unpack(_I32)
            size = r.length(flexible, wide=True)
            records = None if size < 0 else r.take(size)
            r.tags(flexible)
            partitions.append(PartitionProduceData(index, records))
        r.tags(flexible)
        topics.append(TopicProduceData(name, partitions))
    r.tags(flexible)
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)
