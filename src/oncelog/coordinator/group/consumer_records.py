"""The records of a consumer group (KIP-848) in ``__consumer_offsets``, in Kafka's formats.

Kafka's new group coordinator keeps a consumer group as six kinds of records, each keyed by
the group (and the member where it is about one member); the key's int16 version says which
kind it is, the value (int16 version 0, then a flexible struct) is the latest state of that
thing, and a null value (a tombstone) says it is gone:

====  ======================================  ==========================================
key   kind                                    value
====  ======================================  ==========================================
3     ConsumerGroupMetadata (group)           group epoch
4     ConsumerGroupPartitionMetadata (group)  the subscribed topics: id, name, partitions
5     ConsumerGroupMemberMetadata (member)    instance id, rack, client id and host,
                                              subscription (names, regex), rebalance
                                              timeout, server assignor; a member of the
                                              classic protocol: its session timeout and
                                              protocols (tagged field 0)
6     ConsumerGroupTargetAssignmentMetadata   the target assignment's epoch
7     ConsumerGroupTargetAssignmentMember     the member's target partitions
8     ConsumerGroupCurrentMemberAssignment    member epoch, previous epoch, state,
                                              assigned partitions, pending revocation
====  ======================================  ==========================================

The layouts are Kafka's (``group-coordinator/src/main/resources/common/message``); tagged
fields are written empty and skipped on reading. Simplified: partition racks are written as
an empty list (oncelog has no racks) and the resolved regular expressions (Kafka's key 16)
are not stored: they are resolved again from the topics after a restart.

Pure: objects in, bytes out and back.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field

from .group_records import BadRecord

GROUP_METADATA, PARTITION_METADATA, MEMBER_METADATA = 3, 4, 5
TARGET_METADATA, TARGET_MEMBER, CURRENT_ASSIGNMENT = 6, 7, 8
KINDS = frozenset(range(GROUP_METADATA, CURRENT_ASSIGNMENT + 1))
_MEMBER_KINDS = frozenset({MEMBER_METADATA, TARGET_MEMBER, CURRENT_ASSIGNMENT})
MAX_STRING_BYTES = 0x7FFF  # a key's strings are int16-length STRINGs

# topic id -> partitions
Assignment = dict[uuid.UUID, frozenset[int]]


@dataclass(frozen=True, slots=True)
class Key:
    kind: int
    group: str
    member: str | None = None  # the member's id for kinds 5, 7 and 8


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    epoch: int


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    topic_id: uuid.UUID
    name: str
    num_partitions: int


@dataclass(frozen=True, slots=True)
class PartitionMetadataValue:
    topics: tuple[TopicMetadata, ...]


@dataclass(frozen=True, slots=True)
class ClassicMemberMetadata:
    """A member that speaks the classic protocol to a consumer group (KIP-848's online
    migration): what its JoinGroup said."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata), the member's order


@dataclass(frozen=True, slots=True)
class MemberMetadataValue:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    classic: ClassicMemberMetadata | None = None


@dataclass(frozen=True, slots=True)
class TargetMetadataValue:
    assignment_epoch: int


@dataclass(frozen=True, slots=True)
class TargetMemberValue:
    partitions: Assignment = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CurrentAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)


Value = (GroupMetadataValue | PartitionMetadataValue | MemberMetadataValue
         | TargetMetadataValue | TargetMemberValue | CurrentAssignmentValue)


@dataclass(frozen=True, slots=True)
class Record:
    key: Key
    value: Value | None  # None: a tombstone


def is_consumer_key(data: bytes) -> bool:
    """Whether a key of ``__consumer_offsets`` is one of these kinds."""
    return len(data) >= 2 and struct.unpack_from(">h", data)[0] in KINDS


# --- writing --------------------------------------------------------------------------------

def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Flexible:
    def __init__(self, version: int) -> None:
        self.parts: list[bytes] = [struct.pack(">h", version)]

    def int8(self, v: int) -> _Flexible:
        self.parts.append(struct.pack(">b", v))
        return self

    def int32(self, v: int) -> _Flexible:
        self.parts.append(struct.pack(">i", v))
        return self

    def string(self, v: str | None) -> _Flexible:
        if v is None:
            self.parts.append(b"\x00")
        else:
            data = v.encode()
            self.parts.append(_uvarint(len(data) + 1) + data)
        return self

    def uuid(self, v: uuid.UUID) -> _Flexible:
        self.parts.append(v.bytes)
        return self

    def array(self, n: int) -> _Flexible:
        self.parts.append(_uvarint(n + 1))
        return self

    def bytes_(self, v: bytes) -> _Flexible:
        self.parts.append(_uvarint(len(v) + 1) + v)
        return self

    def no_tags(self) -> _Flexible:
        self.parts.append(b"\x00")
        return self

    def assignment(self, a: Assignment) -> _Flexible:
        self.array(len(a))
        for topic_id in sorted(a):
            partitions = sorted(a[topic_id])
            self.uuid(topic_id).array(len(partitions))
            for p in partitions:
                self.int32(p)
            self.no_tags()
        return self

    def done(self) -> bytes:
        return b"".join(self.parts)


def key_bytes(key: Key) -> bytes:
    parts = [struct.pack(">h", key.kind)]
    for text in (key.group, key.member) if key.kind in _MEMBER_KINDS else (key.group,):
        data = (text or "").encode()
        if len(data) > MAX_STRING_BYTES:
            raise ValueError(f"{len(data)} bytes do not fit a record key's string")
        parts.append(struct.pack(">h", len(data)) + data)
    return b"".join(parts)


def value_bytes(value: Value | None) -> bytes | None:
    if value is None:
        return None
    w = _Flexible(0)
    if isinstance(value, GroupMetadataValue):
        w.int32(value.epoch)
    elif isinstance(value, PartitionMetadataValue):
        w.array(len(value.topics))
        for t in value.topics:
            w.uuid(t.topic_id).string(t.name).int32(t.num_partitions).array(0).no_tags()
    elif isinstance(value, MemberMetadataValue):
        w.string(value.instance_id).string(value.rack_id).string(value.client_id)
        w.string(value.client_host).array(len(value.subscribed_topic_names))
        for name in value.subscribed_topic_names:
            w.string(name)
        w.string(value.subscribed_topic_regex).int32(value.rebalance_timeout_ms)
        w.string(value.server_assignor)
        if value.classic is not None:
            return w.done() + _classic_tag(value.classic)
    elif isinstance(value, TargetMetadataValue):
        w.int32(value.assignment_epoch)
    elif isinstance(value, TargetMemberValue):
        w.assignment(value.partitions)
    else:
        w.int32(value.member_epoch).int32(value.previous_member_epoch).int8(value.state)
        w.assignment(value.assigned).assignment(value.pending_revocation)
    return w.no_tags().done()


def _classic_tag(classic: ClassicMemberMetadata) -> bytes:
    """The tagged fields of a member's metadata: tag 0, ClassicMemberMetadata."""
    inner = _Flexible(0)
    inner.parts.clear()  # a struct has no version of its own
    inner.int32(classic.session_timeout_ms).array(len(classic.protocols))
    for name, metadata in classic.protocols:
        inner.string(name).bytes_(metadata).no_tags()
    body = inner.no_tags().done()
    return _uvarint(1) + _uvarint(0) + _uvarint(len(body)) + body


def to_bytes(record: Record) -> tuple[bytes, bytes | None]:
    return key_bytes(record.key), value_bytes(record.value)


# --- reading --------------------------------------------------------------------------------

class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def _raw(self, size: int) -> memoryview:
        if size < 0 or self.pos + size > len(self.data):
            raise BadRecord("record ends early")
        out = self.data[self.pos:self.pos + size]
        self.pos += size
        return out

    def int8(self) -> int:
        return struct.unpack(">b", self._raw(1))[0]

    def int16(self) -> int:
        return struct.unpack(">h", self._raw(2))[0]

    def int32(self) -> int:
        return struct.unpack(">i", self._raw(4))[0]

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self._raw(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 35:
                raise BadRecord("varint too long")

    def string(self) -> str:
        """A non-flexible (int16-length) string, as in keys."""
        return bytes(self._raw(self.int16())).decode("utf-8", "replace")

    def compact_string(self) -> str | None:
        size = self.uvarint()
        return None if size == 0 else bytes(self._raw(size - 1)).decode("utf-8", "replace")

    def array(self) -> int:
        n = self.uvarint() - 1
        if n < 0:
            raise BadRecord("null array")
        return n

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=bytes(self._raw(16)))

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self._raw(self.uvarint())

    def compact_bytes(self) -> bytes:
        size = self.uvarint()
        if size == 0:
            raise BadRecord("null bytes")
        return bytes(self._raw(size - 1))

    def assignment(self) -> Assignment:
        out: Assignment = {}
        for _ in range(self.array()):
            topic_id = self.uuid()
            out[topic_id] = frozenset(self.int32() for _ in range(self.array()))
            self.skip_tags()
        return out


def read_key(data: bytes) -> Key:
    r = _Reader(data)
    kind = r.int16()
    if kind not in KINDS:
        raise BadRecord(f"not a consumer group key (version {kind})")
    group = r.string()
    return Key(kind, group, r.string() if kind in _MEMBER_KINDS else None)


def read_value(kind: int, data: bytes) -> Value:
    r = _Reader(data)
    version = r.int16()
    if version != 0:
        raise BadRecord(f"unknown value version {version} of key version {kind}")
    value: Value
    if kind == GROUP_METADATA:
        value = GroupMetadataValue(r.int32())
    elif kind == PARTITION_METADATA:
        topics = []
        for _ in range(r.array()):
            topic_id, name, count = r.uuid(), r.compact_string() or "", r.int32()
            for _ in range(r.array()):  # partition racks: unused
                r.int32()
                for _ in range(r.array()):
                    r.compact_string()
                r.skip_tags()
            r.skip_tags()
            topics.append(TopicMetadata(topic_id, name, count))
        value = PartitionMetadataValue(tuple(topics))
    elif kind == MEMBER_METADATA:
        instance, rack = r.compact_string(), r.compact_string()
        client_id, client_host = r.compact_string() or "", r.compact_string() or ""
        names = tuple(r.compact_string() or "" for _ in range(r.array()))
        value = MemberMetadataValue(instance, rack, client_id, client_host, names,
                                    r.compact_string(), r.int32(), r.compact_string(),
                                    _read_member_tags(r))
        return value
    elif kind == TARGET_METADATA:
        value = TargetMetadataValue(r.int32())
    elif kind == TARGET_MEMBER:
        value = TargetMemberValue(r.assignment())
    else:
        epoch, previous, state = r.int32(), r.int32(), r.int8()
        value = CurrentAssignmentValue(epoch, previous, state, r.assignment(), r.assignment())
    r.skip_tags()
    return value


def _read_member_tags(r: _Reader) -> ClassicMemberMetadata | None:
    classic = None
    for _ in range(r.uvarint()):
        tag, size = r.uvarint(), r.uvarint()
        if tag != 0:
            r._raw(size)
            continue
        end = r.pos + size
        timeout = r.int32()
        protocols = []
        for _ in range(r.array()):
            protocols.append((r.compact_string() or "", r.compact_bytes()))
            r.skip_tags()
        r.skip_tags()
        if r.pos != end:
            raise BadRecord("ClassicMemberMetadata of the wrong size")
        classic = ClassicMemberMetadata(timeout, tuple(protocols))
    return classic


def from_bytes(key: bytes, value: bytes | None) -> Record:
    k = read_key(key)
    return Record(k, None if value is None else read_value(k.kind, value))
