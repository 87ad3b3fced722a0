"""Consumer group records of ``__consumer_offsets`` (key versions 3-8) in Kafka's layouts,
and the group coordinator's handling of consumer groups around them (loading, conversion
from and to classic groups, deletion, expiry of offsets)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from oncelog.coordinator.group import consumer_records as cr
from oncelog.coordinator.group.consumer_group import ConsumerGroup, HeartbeatRequest
from oncelog.coordinator.group.group_coordinator import (
    GroupConfig,
    GroupCoordinator,
    OffsetCommitPartition,
)

texts = st.text(max_size=8)
ids = st.uuids()
assignments = st.dictionaries(ids, st.frozensets(st.integers(0, 2**31 - 1), max_size=4),
                              max_size=3)
values = st.one_of(
    st.builds(cr.GroupMetadataValue, st.integers(-(2**31), 2**31 - 1)),
    st.builds(cr.PartitionMetadataValue, st.lists(st.builds(
        cr.TopicMetadata, ids, texts, st.integers(0, 1000)), max_size=3).map(tuple)),
    st.builds(cr.MemberMetadataValue, st.none() | texts, st.none() | texts, texts, texts,
              st.lists(texts, max_size=3).map(tuple), st.none() | texts,
              st.integers(-1, 2**31 - 1), st.none() | texts,
              st.none() | st.builds(cr.ClassicMemberMetadata, st.integers(0, 2**31 - 1),
                                    st.lists(st.tuples(texts, st.binary(max_size=8)),
                                             max_size=3).map(tuple))),
    st.builds(cr.TargetMetadataValue, st.integers(0, 2**31 - 1)),
    st.builds(cr.TargetMemberValue, assignments),
    st.builds(cr.CurrentAssignmentValue, st.integers(-2, 2**31 - 1),
              st.integers(-1, 2**31 - 1), st.integers(0, 2), assignments, assignments),
)
KIND_OF = {cr.GroupMetadataValue: 3, cr.PartitionMetadataValue: 4, cr.MemberMetadataValue: 5,
           cr.TargetMetadataValue: 6, cr.TargetMemberValue: 7, cr.CurrentAssignmentValue: 8}


@given(values, texts, texts)
def test_records_round_trip(value, group, member):
    kind = KIND_OF[type(value)]
    key = cr.Key(kind, group, member if kind in (5, 7, 8) else None)
    record = cr.Record(key, value)
    assert cr.from_bytes(*cr.to_bytes(record)) == record
    assert cr.from_bytes(cr.key_bytes(key), None) == cr.Record(key, None)
    assert cr.is_consumer_key(cr.key_bytes(key))


def test_records_have_kafkas_layout():
    assert cr.key_bytes(cr.Key(3, "g")) == b"\x00\x03\x00\x01g"
    assert cr.key_bytes(cr.Key(8, "g", "m")) == b"\x00\x08\x00\x01g\x00\x01m"
    # value version 0, int32 epoch, no tagged fields
    assert cr.value_bytes(cr.GroupMetadataValue(5)) == b"\x00\x00\x00\x00\x00\x05\x00"
    topic = uuid.UUID(int=1)
    assert cr.value_bytes(cr.TargetMemberValue({topic: frozenset({2})})) == (
        b"\x00\x00" + b"\x02" + topic.bytes + b"\x02" + b"\x00\x00\x00\x02" + b"\x00" + b"\x00")
    # Tagged fields a newer Kafka writes (e.g. ConsumerGroupMetadataValue's MetadataHash)
    # are skipped.
    tagged = b"\x00\x00\x00\x00\x00\x07" + b"\x01" + b"\x00\x08" + bytes(8)
    assert cr.read_value(3, tagged) == cr.GroupMetadataValue(7)
    with pytest.raises(cr.BadRecord):
        cr.read_value(8, b"\x00\x00\x00")
    with pytest.raises(ValueError):
        cr.key_bytes(cr.Key(3, "g" * 40_000))


class MemoryLog:
    """The coordinator's OffsetsLog as a list per partition (the broker's is a topic)."""

    def __init__(self) -> None:
        self.partitions: dict[int, list[tuple[bytes, bytes | None]]] = {}

    def append(self, partition, records):
        self.partitions.setdefault(partition, []).extend(records)

    def append_at(self, partition, records, producer=None):
        assert producer is None
        base = len(self.partitions.get(partition, []))
        return base, self.append(partition, records)

    def read(self, partition):
        return list(self.partitions.get(partition, []))


TOPIC = uuid.UUID(int=7)


def coordinator(log: MemoryLog, clock: list[int]) -> GroupCoordinator:
    return GroupCoordinator(log, GroupConfig(num_partitions=3, offsets_retention_ms=60_000,
                                             initial_rebalance_delay_ms=0),
                            lambda t, p: t == "t" and p < 2, now_ms=lambda: clock[0],
                            topic_image={"t": (TOPIC, 2)})


def join(c: GroupCoordinator, group: str, member: str):
    return c.consumer_groups.heartbeat(HeartbeatRequest(
        group, member, 0, rebalance_timeout_ms=1000, subscribed_topic_names=("t",),
        owned={}))


def test_consumer_groups_load_convert_delete_and_expire():
    async def scenario():
        log, clock = MemoryLog(), [1_000]
        c = coordinator(log, clock)
        await c.load_all()
        # Offsets committed without a group make an empty classic group; a consumer-protocol
        # member turns it into a consumer group that keeps them.
        assert await c.commit("g", -1, "", None, -1,
                              [OffsetCommitPartition("t", 0, 5, -1, None)]) == [ErrorCode.none]
        answer = await join(c, "g", "m1")
        assert answer.error is ErrorCode.none and answer.assignment == {
            TOPIC: frozenset({0, 1})}
        assert isinstance(c.groups["g"], ConsumerGroup)
        assert await c.commit("g", answer.member_epoch, "m1", None, -1,
                              [OffsetCommitPartition("t", 1, 9, -1, None)]) == [ErrorCode.none]
        assert await c.commit("g", 99, "m1", None, -1, [OffsetCommitPartition(
            "t", 1, 9, -1, None)]) == [ErrorCode.stale_member_epoch]
        assert c.fetch("g", None, "m1", 99)[0] is ErrorCode.stale_member_epoch
        assert await c.delete_group("g") is ErrorCode.non_empty_group
        listed = c.list_groups(set(), {"consumer"})
        assert [(g.group_id, g.group_type, g.state) for g in listed] == [
            ("g", "consumer", "Stable")]
        assert c.list_groups(set(), {"classic"}) == []
        # Restart: the group, its member and its offsets are read back.
        c.close()
        c = coordinator(log, clock)
        await c.load_all()
        group = c.groups["g"]
        assert isinstance(group, ConsumerGroup) and list(group.members) == ["m1"]
        assert group.members["m1"].assigned == {TOPIC: frozenset({0, 1})}
        assert {tp: v.offset for tp, v in group.offsets.items()} == {("t", 0): 5, ("t", 1): 9}
        # A classic join makes a classic member of it (KIP-848's online migration, first
        # asked for a member id), unless its subscription cannot be read ...
        joined = await c.join("g", "", None, "x", "/h", 10_000, 10_000, "consumer",
                              [("range", b"")], True, True)
        assert joined.error is ErrorCode.member_id_required
        joined = await c.join("g", joined.member_id, None, "x", "/h", 10_000, 10_000,
                              "consumer", [("range", b"")], True, True)
        assert joined.error is ErrorCode.inconsistent_group_protocol
        # ... it leaves; the empty group's offsets expire after the retention.
        left = await c.consumer_groups.heartbeat(HeartbeatRequest("g", "m1", -1))
        assert left.error is ErrorCode.none and group.state.value == "Empty"
        clock[0] += 59_000
        assert c.expire_offsets() == 0
        clock[0] += 2_000
        assert c.expire_offsets() == 2 and "g" not in c.groups
        c.close()
        c = coordinator(log, clock)
        await c.load_all()
        assert "g" not in c.groups
        # An empty consumer group becomes a classic group when a classic member joins.
        await join(c, "h", "m1")
        await c.consumer_groups.heartbeat(HeartbeatRequest("h", "m1", -1))
        assert await c.delete_group("h") is ErrorCode.none and "h" not in c.groups
        await join(c, "h", "m1")
        await c.consumer_groups.heartbeat(HeartbeatRequest("h", "m1", -1))
        joined = await asyncio.wait_for(c.join("h", "", None, "x", "/h", 10_000, 10_000,
                                               "consumer", [("range", b"")], False, True), 10)
        assert joined.error is ErrorCode.none and joined.generation == 1
        assert not isinstance(c.groups["h"], ConsumerGroup)
        c.close()
        c = coordinator(log, clock)
        await c.load_all()  # the consumer group's records are gone
        assert not isinstance(c.groups.get("h"), ConsumerGroup)
        c.close()

    asyncio.run(scenario())
