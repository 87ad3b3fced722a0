"""The group coordinator's decisions, driven directly (no sockets) over an offsets log kept in
memory: Kafka's classic protocol flows, its errors, and state rebuilt from the records."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode as E
from support.group_coordinator_helpers import MemoryOffsetsLog

from oncelog.coordinator.group import group_records as rec
from oncelog.coordinator.group.classic_group import GroupState
from oncelog.coordinator.group.group_coordinator import (
    GroupConfig,
    GroupCoordinator,
    OffsetCommitPartition,
)
from oncelog.coordinator.internal_log import java_string_hash, partition_for

PROTOCOLS = [("range", b"\x00\x01"), ("roundrobin", b"\x00\x02")]


TOPICS = {("t", 0), ("t", 1), ("u", 0)}


def coordinator(offsets_log=None, **config) -> GroupCoordinator:
    defaults = {"num_partitions": 3, "initial_rebalance_delay_ms": 0,
                "min_session_timeout_ms": 100}
    c = GroupCoordinator(offsets_log or MemoryOffsetsLog(), GroupConfig(**{**defaults, **config}),
                         lambda t, p: (t, p) in TOPICS)
    return c


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


async def loaded(c: GroupCoordinator) -> GroupCoordinator:
    await c.load_all()
    return c


async def join(c, group="g", member="", instance=None, session=10_000, protocols=None,
               known=True):
    return await c.join(group, member, instance, "client", "/127.0.0.1", session, session,
                        "consumer", PROTOCOLS if protocols is None else protocols,
                        require_known_member_id=known,
                        supports_skip_assignment=True)


async def join_new(c, group="g", **kw):
    """The KIP-394 handshake: MEMBER_ID_REQUIRED, then the join with the id."""
    first = await join(c, group, **kw)
    assert first.error is E.member_id_required and first.member_id
    return await join(c, group, member=first.member_id, **kw)


# --- records -------------------------------------------------------------------------------

names = st.text(max_size=20)


@given(names, names, st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1),
       st.integers(-1, 2**31 - 1), names, st.integers(0, 2**63 - 1))
def test_offset_records_round_trip(group, topic, partition, offset, epoch, metadata, ts):
    assert rec.read_key(rec.offset_key(group, topic, partition)) == \
        rec.OffsetKey(group, topic, partition)
    value = rec.OffsetValue(offset, epoch, metadata, ts)
    assert rec.read_offset_value(rec.offset_value(value)) == value


@given(names, st.lists(st.tuples(names, st.none() | names, st.binary(max_size=8),
                                 st.binary(max_size=8)), max_size=4),
       st.integers(0, 2**31 - 1), st.none() | names)
def test_group_records_round_trip(group, members, generation, protocol):
    value = rec.GroupValue("consumer", generation, protocol, members[0][0] if members else None,
                           123, tuple(rec.MemberValue(m, i, "c", "/h", 300, 100, s, a)
                                      for m, i, s, a in members))
    assert rec.read_key(rec.group_key(group)) == rec.GroupKey(group)
    assert rec.read_group_value(rec.group_value(value)) == value


def test_unreadable_records_are_refused_not_crashed_on():
    for data in (b"", b"\x00", b"\x00\x09abc", b"\x00\x01\x00\x05ab"):
        with pytest.raises(rec.BadRecord):
            rec.read_key(data)


def test_partition_is_chosen_as_kafka_chooses_it():
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert partition_for("polygenelubricants", 50) == 0  # Utils.abs(MIN_VALUE) is 0
    assert partition_for("hello", 50) == 99162322 % 50
    assert partition_for("é€", 7) == abs(java_string_hash("é€")) % 7


# --- joining -------------------------------------------------------------------------------

def test_two_members_join_sync_and_stay_stable():
    async def scenario():
        # The initial delay lets both join the first generation (with none, the first member
        # would complete a generation alone at once, as in Kafka).
        c = await loaded(coordinator(initial_rebalance_delay_ms=100))
        a, b = await asyncio.gather(join_new(c), join_new(c))
        assert a.error is E.none and b.error is E.none
        assert a.generation == b.generation == 1
        assert a.protocol == "range"
        leader = a if a.member_id == a.leader else b
        follower = b if leader is a else a
        assert {m[0] for m in leader.members} == {a.member_id, b.member_id}
        assert follower.members == ()
        assignments = [(leader.member_id, b"L"), (follower.member_id, b"F")]
        s_follower = asyncio.ensure_future(
            c.sync("g", 1, follower.member_id, None, "consumer", "range", []))
        s_leader = await c.sync("g", 1, leader.member_id, None, "consumer", "range",
                                assignments)
        assert s_leader.assignment == b"L" and (await s_follower).assignment == b"F"
        assert c.groups["g"].state is GroupState.STABLE
        assert c.heartbeat("g", 1, follower.member_id, None) is E.none
        assert c.heartbeat("g", 0, follower.member_id, None) is E.illegal_generation
        assert c.heartbeat("g", 1, "nobody", None) is E.unknown_member_id
        # A follower rejoining with the same metadata keeps the generation.
        again = await join(c, member=follower.member_id)
        assert again.generation == 1 and c.groups["g"].state is GroupState.STABLE
        c.close()
    run(scenario())


def test_a_new_member_makes_the_others_rejoin():
    async def scenario():
        c = await loaded(coordinator())
        a = await join_new(c)
        await c.sync("g", 1, a.member_id, None, None, None, [(a.member_id, b"all")])
        pending = asyncio.ensure_future(join_new(c))
        await asyncio.sleep(0.01)
        assert c.heartbeat("g", 1, a.member_id, None) is E.rebalance_in_progress
        # Commits of the current generation still go through during the rebalance.
        assert await c.commit("g", 1, a.member_id, None, -1,
                              [OffsetCommitPartition("t", 0, 5, -1, "")]) == [E.none]
        a2 = await join(c, member=a.member_id)
        b = await pending
        assert a2.generation == b.generation == 2
        c.close()
    run(scenario())


def test_join_errors_are_kafkas():
    async def scenario():
        c = await loaded(coordinator(max_size=1))
        assert (await join(c, group="")).error is E.invalid_group_id
        assert (await join(c, session=10)).error is E.invalid_session_timeout
        assert (await join(c, protocols=[])).error is E.inconsistent_group_protocol
        assert (await join(c, member="made-up")).error is E.unknown_member_id
        a = await join_new(c)
        assert a.error is E.none
        assert (await join(c)).error is E.group_max_size_reached
        c2 = await loaded(coordinator())
        await join_new(c2)
        other = await join(c2, protocols=[("sticky-only", b"")])
        assert other.error is E.inconsistent_group_protocol
        c.close()
        c2.close()
    run(scenario())


def test_a_member_that_never_rejoins_is_dropped_after_the_rebalance_timeout():
    async def scenario():
        c = await loaded(coordinator())
        a = await join_new(c, session=300)
        await c.sync("g", 1, a.member_id, None, None, None, [])
        b = await join_new(c, session=300)  # a does not rejoin: dropped after 300 ms
        assert b.generation == 2 and [m[0] for m in b.members] == [b.member_id]
        assert c.heartbeat("g", 2, a.member_id, None) is E.unknown_member_id
        c.close()
    run(scenario())


def test_session_expiry_removes_a_silent_member():
    async def scenario():
        c = await loaded(coordinator())
        a = await join_new(c, session=200)
        await c.sync("g", 1, a.member_id, None, None, None, [])
        await asyncio.sleep(0.4)
        assert c.groups["g"].state is GroupState.EMPTY
        assert c.heartbeat("g", 1, a.member_id, None) is E.unknown_member_id
        c.close()
    run(scenario())


def test_static_member_gets_its_assignment_back_and_the_old_id_is_fenced():
    async def scenario():
        c = await loaded(coordinator(initial_rebalance_delay_ms=100))
        a, b = await asyncio.gather(join(c, instance="i-a"), join(c, instance="i-b"))
        leader = a if a.member_id == a.leader else b
        follower = b if leader is a else a
        sync_f = asyncio.ensure_future(c.sync("g", 1, follower.member_id, None, None, None, []))
        await c.sync("g", 1, leader.member_id, None, None, None,
                     [(leader.member_id, b"L"), (follower.member_id, b"F")])
        await sync_f
        instance = "i-b" if follower is b else "i-a"
        restarted = await join(c, instance=instance)  # a new process, no member id
        assert restarted.error is E.none and restarted.generation == 1  # no rebalance
        assert c.groups["g"].state is GroupState.STABLE
        s = await c.sync("g", 1, restarted.member_id, instance, None, None, [])
        assert s.assignment == b"F"
        assert c.heartbeat("g", 1, follower.member_id, instance) is E.fenced_instance_id
        c.close()
    run(scenario())


def test_a_static_member_whose_rejoin_was_refused_keeps_its_session():
    """J6 with the group record refused: undone, the old member back under its old id, and
    with its session (the rejoin had ended it: without one again, it never expired)."""
    async def scenario():
        c = await loaded(coordinator())
        a = await join(c, instance="i-a", session=200)
        await c.sync("g", 1, a.member_id, None, None, None, [(a.member_id, b"A")])
        c.log.fail_with = E.not_coordinator
        assert (await join(c, instance="i-a", session=200)).error is E.not_coordinator
        c.log.fail_with = None
        assert list(c.groups["g"].members) == [a.member_id]
        for _ in range(500):  # no heartbeats: the session ends
            if c.groups["g"].state is GroupState.EMPTY:
                break
            await asyncio.sleep(0.01)
        assert c.groups["g"].state is GroupState.EMPTY
        c.close()
    run(scenario())


def test_leave_group_per_member_errors():
    async def scenario():
        c = await loaded(coordinator())
        a = await join_new(c)
        await c.sync("g", 1, a.member_id, None, None, None, [])
        error, errors = c.leave("g", [(a.member_id, None), ("ghost", None)])
        assert error is E.none and errors == [E.none, E.unknown_member_id]
        assert c.groups["g"].state is GroupState.EMPTY
        assert c.leave("nothing", [("x", None)]) == (E.none, [E.unknown_member_id])
        c.close()
    run(scenario())


# --- offsets -------------------------------------------------------------------------------

def test_commits_without_a_group_and_their_errors():
    async def scenario():
        c = await loaded(coordinator(offset_metadata_max_bytes=4))
        parts = [OffsetCommitPartition("t", 0, 10, 3, "m"),
                 OffsetCommitPartition("nope", 0, 1, -1, ""),
                 OffsetCommitPartition("t", 1, -5, -1, ""),
                 OffsetCommitPartition("u", 0, 7, -1, "too long")]
        errors = await c.commit("solo", -1, "", None, -1, parts)
        assert errors == [E.none, E.unknown_topic_or_partition, E.offset_out_of_range,
                          E.offset_metadata_too_large]
        error, fetched = c.fetch("solo", [("t", [0, 1])])
        assert error is E.none
        assert [(t, p, v and (v.offset, v.leader_epoch, v.metadata)) for t, p, v in fetched] \
            == [("t", 0, (10, 3, "m")), ("t", 1, None)]
        assert c.fetch("", None)[0] is E.invalid_group_id
        # A member of a live group commits with its generation only.
        a = await join_new(c)
        await c.sync("g", 1, a.member_id, None, None, None, [])
        one = [OffsetCommitPartition("t", 0, 1, -1, "")]
        assert await c.commit("g", 0, a.member_id, None, -1, one) == [E.illegal_generation]
        assert await c.commit("g", 1, "x", None, -1, one) == [E.unknown_member_id]
        assert await c.commit("g", -1, "", None, -1, one) == [E.unknown_member_id]
        assert await c.commit("g", 1, a.member_id, None, -1, one) == [E.none]
        c.close()
    run(scenario())


def test_a_failed_write_changes_nothing():
    async def scenario():
        store = MemoryOffsetsLog()
        c = await loaded(coordinator(store))
        store.fail_with = E.not_coordinator
        errors = await c.commit("g", -1, "", None, -1, [OffsetCommitPartition("t", 0, 4, -1, "")])
        assert errors == [E.not_coordinator]
        assert c.fetch("g", [("t", [0])])[1] == [("t", 0, None)]
        store.fail_with = E.message_too_large
        errors = await c.commit("g", -1, "", None, -1, [OffsetCommitPartition("t", 0, 4, -1, "")])
        assert errors == [E.invalid_commit_offset_size]
        c.close()
    run(scenario())


def test_state_is_rebuilt_from_the_records():
    async def scenario():
        store = MemoryOffsetsLog()
        c = await loaded(coordinator(store))
        a = await join_new(c, instance=None)
        await c.sync("g", 1, a.member_id, None, None, None, [(a.member_id, b"mine")])
        await c.commit("g", 1, a.member_id, None, -1, [OffsetCommitPartition("t", 0, 42, 1, "x")])
        await c.commit("other", -1, "", None, -1, [OffsetCommitPartition("u", 0, 7, -1, "")])
        await c.commit("gone", -1, "", None, -1, [OffsetCommitPartition("u", 0, 9, -1, "")])
        assert await c.delete_group("gone") is E.none
        c.close()
        again = await loaded(coordinator(store))
        group = again.groups["g"]
        assert group.state is GroupState.STABLE and group.generation == 1
        assert group.members[a.member_id].assignment == b"mine"
        assert again.fetch("g", None)[1][0][2].offset == 42
        assert again.fetch("other", None)[1][0][2].offset == 7
        assert "gone" not in again.groups
        # The loaded member must keep heartbeating like any other.
        assert again.heartbeat("g", 1, a.member_id, None) is E.none
        again.close()
    run(scenario())


def test_delete_groups_and_offsets_and_list_and_describe():
    async def scenario():
        c = await loaded(coordinator())
        await c.commit("empty", -1, "", None, -1, [OffsetCommitPartition("t", 0, 1, -1, "")])
        a = await join_new(c)
        await c.sync("g", 1, a.member_id, None, None, None, [])
        assert await c.delete_group("g") is E.non_empty_group
        assert await c.delete_group("missing") is E.group_id_not_found
        assert {g.group_id for g in c.list_groups(set(), set())} == {"empty", "g"}
        assert [g.group_id for g in c.list_groups({"Stable"}, set())] == ["g"]
        assert c.list_groups(set(), {"consumer"}) == []
        assert c.describe("missing")[0] is E.group_id_not_found
        error, results = await c.delete_offsets("empty", [("t", [0]), ("zz", [0])])
        assert error is E.none
        assert results == [("t", 0, E.none), ("zz", 0, E.unknown_topic_or_partition)]
        assert c.fetch("empty", None)[1] == []
        assert (await c.delete_offsets("missing", [("t", [0])]))[0] is E.group_id_not_found
        c.close()
    run(scenario())


def test_offsets_of_empty_groups_expire():
    async def scenario():
        clock = [1_000_000]
        c = GroupCoordinator(MemoryOffsetsLog(), GroupConfig(
            num_partitions=1, offsets_retention_ms=1000, initial_rebalance_delay_ms=0),
            lambda t, p: True, now_ms=lambda: clock[0])
        await c.load_all()
        await c.commit("g", -1, "", None, -1, [OffsetCommitPartition("t", 0, 1, -1, "")])
        assert c.expire_offsets() == 0
        clock[0] += 1001
        assert c.expire_offsets() == 1
        assert "g" not in c.groups
        c.close()
    run(scenario())


def test_loading_partitions_answer_load_in_progress():
    async def scenario():
        c = coordinator()
        assert (await join(c)).error is E.coordinator_load_in_progress
        assert c.fetch("g", None)[0] is E.coordinator_load_in_progress
        await c.load_all()
        assert c.fetch("g", None)[0] is E.none
    run(scenario())


def test_offsets_of_a_deleted_topic_are_removed_for_good():
    async def scenario():
        store = MemoryOffsetsLog()
        c = await loaded(coordinator(store))
        for group in ("g1", "g2", "g3"):
            await c.commit(group, -1, "", None, -1, [OffsetCommitPartition("t", 0, 5, -1, ""),
                                                     OffsetCommitPartition("u", 0, 6, -1, "")])
        assert c.delete_topic_offsets("t") == 3
        assert c.fetch("g1", None)[1] == [("u", 0, c.groups["g1"].offsets["u", 0])]
        c.close()
        again = await loaded(coordinator(store))
        assert [(t, p) for t, p, _ in again.fetch("g2", None)[1]] == [("u", 0)]
        again.close()
    run(scenario())


def test_an_old_generations_commit_during_completing_rebalance_is_illegal_generation():
    """Kafka's ClassicGroup.validateOffsetCommit: member and generation first, so a commit
    of the previous generation handled while the group completes its rebalance gets
    ILLEGAL_GENERATION; only the current generation's gets REBALANCE_IN_PROGRESS."""
    async def scenario():
        c = await loaded(coordinator())
        a = await join_new(c)
        await c.sync("g", 1, a.member_id, None, None, None, [(a.member_id, b"all")])
        pending = asyncio.ensure_future(join_new(c))
        await asyncio.sleep(0.01)
        a2 = await join(c, member=a.member_id)
        await pending
        assert a2.generation == 2 and c.groups["g"].state is GroupState.COMPLETING_REBALANCE
        part = [OffsetCommitPartition("t", 0, 5, -1, "")]
        assert await c.commit("g", 1, a.member_id, None, -1, part) == [E.illegal_generation]
        assert await c.commit("g", 2, a.member_id, None, -1, part) == [E.rebalance_in_progress]
        assert await c.commit("g", 2, "nobody", None, -1, part) == [E.unknown_member_id]
        # Without member and generation (a tool): only an empty group takes it.
        assert await c.commit("g", -1, "", None, -1, part) == [E.unknown_member_id]
        c.close()
    run(scenario())


def test_two_classic_joins_converting_an_empty_consumer_group_meet_in_one_group():
    """The consumer group is dropped and the classic group put in its place before the
    drop's write is awaited: a second JoinGroup meanwhile joins that classic group (before,
    it made its own, which the first join then replaced, losing the second member)."""
    from oncelog.coordinator.group.consumer_group import ConsumerGroup

    class HeldLog(MemoryOffsetsLog):
        held: list = []

        def append(self, partition, records):
            super().append(partition, records)
            future = asyncio.get_running_loop().create_future()
            self.held.append(future)
            return future

    async def scenario():
        log = HeldLog()
        c = await loaded(coordinator(log, initial_rebalance_delay_ms=50))
        c.groups["g"] = ConsumerGroup("g")
        first = asyncio.ensure_future(join(c, known=False))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(join(c, known=False))
        await asyncio.sleep(0.01)
        for future in log.held:
            if not future.done():
                future.set_result(None)
        a, b = await asyncio.gather(first, second)
        assert a.error is E.none and b.error is E.none, (a, b)
        assert a.generation == b.generation
        assert set(c.groups["g"].members) == {a.member_id, b.member_id}
        c.close()
    run(scenario())


def test_a_marker_during_loading_is_replayed_by_the_loader_once():
    """A COMMIT marker appended to a partition still loading (markers cannot be refused) is
    read by the loader in its place in the log, not applied twice or half-way."""
    class TxnLog(MemoryOffsetsLog):
        def append(self, partition, records, producer=None):
            pid = producer[0] if producer is not None else -1
            lst = self.partitions.setdefault(partition, [])
            lst.extend((k, v, pid, None, len(lst) + i) for i, (k, v) in enumerate(records))

        def append_at(self, partition, records, producer=None):
            base = len(self.partitions.get(partition, []))
            return base, self.append(partition, records, producer)

        def read(self, partition):
            lst = self.partitions.get(partition, [])
            i = 0
            while i < len(lst):  # to the end as it grows, as the broker's reader does
                yield lst[i]
                i += 1

    async def scenario():
        log = TxnLog()
        c = await loaded(coordinator(log, num_partitions=1))
        assert await c.commit("g", -1, "", None, -1,
                              [OffsetCommitPartition("t", 0, 3, -1, "")]) == [E.none]
        part = [OffsetCommitPartition("t", 0, 7, -1, "")]
        assert await c.txn_commit("tx", "g", 5, 0, -1, "", None, part) == [E.none]
        for i in range(3000):  # enough records for the loader to yield on the way
            await c.commit("other", -1, "", None, -1, [OffsetCommitPartition("t", 1, i, -1,
                                                                             "")])
        c.close()
        again = coordinator(log, num_partitions=1)
        loading = asyncio.ensure_future(again.load_all())
        await asyncio.sleep(0)
        assert again.not_served("g") is E.coordinator_load_in_progress
        log.partitions[0].append((None, None, 5, "commit", len(log.partitions[0])))
        again.complete_txn(0, 5, True)
        await loading
        assert again.fetch("g", [("t", [0])])[1][0][2].offset == 7
        assert not again.unstable("g")
        again.close()
    run(scenario())


def test_a_repeated_leader_sync_waits_for_the_assignment_being_written():
    """S12: while the leader's assignment is being made durable, the leader's SyncGroup
    again writes nothing new; both members are answered when that one write is durable."""
    class HeldLog(MemoryOffsetsLog):
        def __init__(self):
            super().__init__()
            self.held = []
            self.writes = 0

        def append(self, partition, records):
            super().append(partition, records)
            self.writes += 1
            future = asyncio.get_running_loop().create_future()
            self.held.append(future)
            return future

    async def scenario():
        log = HeldLog()
        c = await loaded(coordinator(log, initial_rebalance_delay_ms=50))
        a, b = await asyncio.gather(join(c, known=False), join(c, known=False))
        leader = a if a.member_id == a.leader else b
        follower = b if leader is a else a
        writes = log.writes
        assignment = [(leader.member_id, b"L"), (follower.member_id, b"F")]
        first = asyncio.ensure_future(c.sync("g", 1, leader.member_id, None, None, None,
                                             assignment))
        other = asyncio.ensure_future(c.sync("g", 1, follower.member_id, None, None, None,
                                             []))
        await asyncio.sleep(0.01)
        again = asyncio.ensure_future(c.sync("g", 1, leader.member_id, None, None, None,
                                             assignment))
        await asyncio.sleep(0.01)
        assert (await first).error is E.rebalance_in_progress
        assert log.writes == writes + 1 and not again.done() and not other.done()
        for future in log.held:
            if not future.done():
                future.set_result(None)
        assert (await again).assignment == b"L" and (await other).assignment == b"F"
        assert c.groups["g"].state is GroupState.STABLE
        c.close()
    run(scenario())


def test_heartbeats_move_the_session_end_on_one_timer():
    """A member that heartbeats stays past its first session end, its timer set again when
    it fires (about once a session timeout), not made anew by each Heartbeat; once silent,
    the session still ends."""
    async def scenario():
        c = await loaded(coordinator())
        a = await join_new(c, session=400)
        await c.sync("g", 1, a.member_id, None, None, None, [])
        member = c.groups["g"].members[a.member_id]
        loop = asyncio.get_running_loop()
        timers, beats, until = [member.session_timer], 0, loop.time() + 0.6
        # Past the first session end, with at least 8 heartbeats (each made a timer before).
        while (loop.time() < until or beats < 8) and beats < 40:
            await asyncio.sleep(0.05)
            assert c.heartbeat("g", 1, a.member_id, None) is E.none
            beats += 1
            if member.session_timer is not timers[-1]:
                timers.append(member.session_timer)
        assert len(timers) < beats, (beats, timers)
        deadline = loop.time() + 5
        while c.groups["g"].state is not GroupState.EMPTY and loop.time() < deadline:
            await asyncio.sleep(0.02)
        assert c.groups["g"].state is GroupState.EMPTY
        assert c.heartbeat("g", 1, a.member_id, None) is E.unknown_member_id
        c.close()
    run(scenario())
