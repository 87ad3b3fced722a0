"""The records of ``__consumer_offsets``, in Kafka's own formats.

A record's key says what it is about; its value is the latest state of that thing, or null
(a tombstone) when the thing is gone, so compaction keeps exactly the current state:

* offset commit: key version 0/1 (group, topic, partition), value version 1 or 3
  (offset, leader epoch, metadata, commit timestamp);
* group metadata: key version 2 (group), value version 0 to 3 (protocol type, generation,
  chosen protocol, leader, state timestamp, members with subscription and assignment).

The layouts are Kafka's (``OffsetCommitKey``, ``OffsetCommitValue``, ``GroupMetadataKey``,
``GroupMetadataValue``), so Kafka's tools can read an oncelog offsets topic and the other way
round. Pure: bytes in, values out.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 3
GROUP_VALUE_VERSION = 3
MAX_STRING_BYTES = 0x7FFF


class BadRecord(ValueError):
    """A record of the offsets topic that is not one of Kafka's known layouts."""


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetValue:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int = -1  # only in version 1 values (explicit retention_time commits)
    # Where the record is in __consumer_offsets (not part of the value; -1: not written):
    # a transactional offset takes effect only over an older one (offset_rules.py, O4).
    record_offset: int = field(default=-1, compare=False)


@dataclass(frozen=True, slots=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    state_timestamp: int
    members: tuple[MemberValue, ...]


# --- writing --------------------------------------------------------------------------------

class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def int16(self, v: int) -> _Writer:
        self.parts.append(struct.pack(">h", v))
        return self

    def int32(self, v: int) -> _Writer:
        self.parts.append(struct.pack(">i", v))
        return self

    def int64(self, v: int) -> _Writer:
        self.parts.append(struct.pack(">q", v))
        return self

    def string(self, v: str | None) -> _Writer:
        if v is None:
            return self.int16(-1)
        data = v.encode()
        if len(data) > MAX_STRING_BYTES:
            raise ValueError(f"string of {len(data)} bytes does not fit a Kafka STRING")
        self.parts.append(struct.pack(">h", len(data)) + data)
        return self

    def bytes_(self, v: bytes) -> _Writer:
        self.parts.append(struct.pack(">i", len(v)) + v)
        return self

    def done(self) -> bytes:
        return b"".join(self.parts)


# An offset commit's key and value are written once per committed partition, on the path
# of every OffsetCommit: packed with precompiled layouts, the same bytes _Writer would give
# (tests/coordinator/test_group_records_layout.py holds them to it).
_INT16 = struct.Struct(">h")
_KEY_HEAD = struct.Struct(">hh")  # version, the group's length
_INT32 = struct.Struct(">i")
_VALUE3_HEAD = struct.Struct(">hqih")  # version 3, offset, leader epoch, metadata's length
_VALUE1_HEAD = struct.Struct(">hqh")  # version 1, offset, metadata's length
_INT64 = struct.Struct(">q")
_TIMES = struct.Struct(">qq")  # commit and expire timestamps (version 1)


def _string_bytes(v: str | None) -> tuple[int, bytes]:
    """A STRING's length field (-1: null) and its bytes."""
    if v is None:
        return -1, b""
    data = v.encode()
    if len(data) > MAX_STRING_BYTES:
        raise ValueError(f"string of {len(data)} bytes does not fit a Kafka STRING")
    return len(data), data


def offset_key(group: str, topic: str, partition: int) -> bytes:
    (g_len, g), (t_len, t) = _string_bytes(group), _string_bytes(topic)
    return b"".join((_KEY_HEAD.pack(OFFSET_KEY_VERSION, g_len), g, _INT16.pack(t_len), t,
                     _INT32.pack(partition)))


def group_key(group: str) -> bytes:
    return _Writer().int16(GROUP_KEY_VERSION).string(group).done()


def offset_value(value: OffsetValue) -> bytes:
    return offset_value_of(value.offset, value.leader_epoch, value.metadata,
                           value.commit_timestamp, value.expire_timestamp)


def offset_value_of(offset: int, leader_epoch: int, metadata: str | None, commit_timestamp: int,
                    expire_timestamp: int = -1) -> bytes:
    """``offset_value`` of the OffsetValue these fields make, without making it."""
    try:
        m_len, m = _string_bytes(metadata)
    except ValueError:
        # The fields before the metadata are written first: one out of range is the error.
        if expire_timestamp >= 0:
            _VALUE1_HEAD.pack(1, offset, 0)
        else:
            _VALUE3_HEAD.pack(OFFSET_VALUE_VERSION, offset, leader_epoch, 0)
        raise
    if expire_timestamp >= 0:  # version 1 carries the explicit expiry
        return b"".join((_VALUE1_HEAD.pack(1, offset, m_len), m,
                         _TIMES.pack(commit_timestamp, expire_timestamp)))
    return b"".join((_VALUE3_HEAD.pack(OFFSET_VALUE_VERSION, offset, leader_epoch, m_len), m,
                     _INT64.pack(commit_timestamp)))


def group_value(value: GroupValue) -> bytes:
    w = (_Writer().int16(GROUP_VALUE_VERSION).string(value.protocol_type).int32(value.generation)
         .string(value.protocol).string(value.leader).int64(value.state_timestamp)
         .int32(len(value.members)))
    for m in value.members:
        (w.string(m.member_id).string(m.group_instance_id).string(m.client_id)
         .string(m.client_host).int32(m.rebalance_timeout).int32(m.session_timeout)
         .bytes_(m.subscription).bytes_(m.assignment))
    return w.done()


# --- reading --------------------------------------------------------------------------------

class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def _take(self, fmt: str, size: int) -> int:
        if self.pos + size > len(self.data):
            raise BadRecord("record ends early")
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return v

    def int16(self) -> int:
        return self._take(">h", 2)

    def int32(self) -> int:
        return self._take(">i", 4)

    def int64(self) -> int:
        return self._take(">q", 8)

    def string(self) -> str | None:
        size = self.int16()
        if size < 0:
            return None
        return bytes(self._raw(size)).decode("utf-8", "replace")

    def bytes_(self) -> bytes:
        size = self.int32()
        return b"" if size < 0 else bytes(self._raw(size))

    def _raw(self, size: int) -> memoryview:
        if self.pos + size > len(self.data):
            raise BadRecord("record ends early")
        out = self.data[self.pos:self.pos + size]
        self.pos += size
        return out


def read_key(data: bytes) -> OffsetKey | GroupKey:
    r = _Reader(data)
    version = r.int16()
    if version in (0, 1):
        return OffsetKey(r.string() or "", r.string() or "", r.int32())
    if version == 2:
        return GroupKey(r.string() or "")
    raise BadRecord(f"unknown key version {version}")


def read_offset_value(data: bytes, record_offset: int = -1) -> OffsetValue:
    r = _Reader(data)
    version = r.int16()
    if version in (0, 1):
        offset, metadata, ts = r.int64(), r.string() or "", r.int64()
        expire = r.int64() if version == 1 else -1
        return OffsetValue(offset, -1, metadata, ts, expire, record_offset)
    if version in (2, 3):
        offset = r.int64()
        epoch = r.int32() if version == 3 else -1
        return OffsetValue(offset, epoch, r.string() or "", r.int64(), -1, record_offset)
    raise BadRecord(f"unknown offset value version {version}")


def read_group_value(data: bytes) -> GroupValue:
    r = _Reader(data)
    version = r.int16()
    if not 0 <= version <= 3:
        raise BadRecord(f"unknown group value version {version}")
    protocol_type = r.string() or ""
    generation = r.int32()
    protocol, leader = r.string(), r.string()
    state_ts = r.int64() if version >= 2 else -1
    members = []
    for _ in range(r.int32()):
        member_id = r.string() or ""
        instance = r.string() if version >= 3 else None
        client_id, client_host = r.string() or "", r.string() or ""
        rebalance_timeout = r.int32() if version >= 1 else -1
        session_timeout = r.int32()
        if rebalance_timeout < 0:
            rebalance_timeout = session_timeout
        members.append(MemberValue(member_id, instance, client_id, client_host,
                                   rebalance_timeout, session_timeout, r.bytes_(), r.bytes_()))
    return GroupValue(protocol_type, generation, protocol, leader, state_ts, tuple(members))
