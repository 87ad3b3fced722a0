"""What a one-member classic group holds (issue 26: 2,254 bytes a group, goal under 1 KiB):
no instance dicts, no maps of its own for static or pending members or offsets it does not
have, the names and numbers its members repeat kept once, its session deadline a small object
on the coordinator's one loop timer (session_deadlines.py). Structure, not bytes: the bytes
are bench/group_memory.py's and bench/groups.py's (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import threading
from types import SimpleNamespace
from typing import cast

from support.group_coordinator_helpers import MemoryOffsetsLog

from oncelog.broker import metrics
from oncelog.coordinator.group import classic_group, group_coordinator
from oncelog.coordinator.group.classic_group import NO_ENTRIES, ClassicGroup, GroupState, Member
from oncelog.coordinator.group.group_coordinator import (
    GroupConfig,
    GroupCoordinator,
    OffsetCommitPartition,
)
from oncelog.coordinator.group.session_deadlines import SessionDeadline


def fresh(text: str) -> str:
    """An equal string that is another object, as each request decodes its own."""
    copy = "".join(list(text))
    assert copy is not text or len(text) <= 1
    return copy


async def one_member_group(c: GroupCoordinator, group: str, protocol: str = "range") -> Member:
    protocols = [(fresh(protocol), b"\x00\x01")]
    timeout = int(fresh("30000"))  # an int of its own, as each request decodes its own
    args = (fresh("rdkafka"), fresh("/127.0.0.1"), timeout, timeout, fresh("consumer"))
    first = await c.join(group, "", None, *args, protocols,
                         require_known_member_id=True, supports_skip_assignment=True)
    joined = await c.join(group, first.member_id, None, *args, protocols,
                          require_known_member_id=True, supports_skip_assignment=True)
    synced = await c.sync(group, joined.generation, joined.member_id, None, "consumer",
                          protocol, [(joined.member_id, b"assignment")])
    assert synced.error.value == 0
    return c.groups[group].members[joined.member_id]


def test_a_one_member_group_holds_no_more_than_it_uses(monkeypatch):
    # the shared values' tables as a fresh broker has them, whatever tests ran before
    monkeypatch.setattr(classic_group, "_NAMES", {})
    monkeypatch.setattr(classic_group, "_NUMBERS", {})
    offsets_log = MemoryOffsetsLog()

    def coordinator() -> GroupCoordinator:
        return GroupCoordinator(offsets_log, GroupConfig(num_partitions=3,
                                                         initial_rebalance_delay_ms=0),
                                lambda t, p: True)

    async def scenario():
        c = coordinator()
        await c.load_all()
        try:
            a = await one_member_group(c, "a")
            b = await one_member_group(c, "b")
            for group, member in ((c.groups["a"], a), (c.groups["b"], b)):
                assert isinstance(group, ClassicGroup)
                # the member in the group itself, and no rebalance held once Stable
                assert group._members is member and group.rebalance is None
                # the KIP-394 handshake's pending member is gone, and its map with it
                assert group.pending_members is NO_ENTRIES
                assert group.static_members is NO_ENTRIES
                assert group.offsets is NO_ENTRIES  # nothing committed yet
            for field in ("session_timeout_ms", "rebalance_timeout_ms"):
                assert getattr(a, field) is getattr(b, field), field
            assert a.protocols[0] is b.protocols[0]
            assert a.protocols == ("range", b"\x00\x01")  # flat: one tuple, not one a pair
            # a member's own values, and long ones, are not kept for good in the tables
            assert a.client is not b.client  # client id and host: one string, a member's own
            assert (a.client_id, a.client_host) == ("rdkafka", "/127.0.0.1")
            assert c.groups["a"].protocol is c.groups["b"].protocol
            assert c.groups["a"].protocol_type is c.groups["b"].protocol_type
            group = c.groups["a"]
            errors = await c.commit("a", group.generation, a.member_id, None, -1,
                                    [OffsetCommitPartition("t", 0, 5, -1, "")])
            assert [e.value for e in errors] == [0]
            assert list(group.offsets) == [("t", 0)] and c.groups["b"].offsets == {}
            # one loop timer for every member's session, not one each
            assert isinstance(a.session_timer, SessionDeadline)
            assert len(c._sessions) == 2
            # the deadline's time inside it, not a float beside it, also once a Heartbeat
            # moved the member's session end past the deadline's: two times, one float object
            # (the heartbeat comes 2 ms later by the loop's clock: in the same millisecond,
            # the end would not move)
            await asyncio.sleep(0.002)
            assert c.heartbeat("a", group.generation, a.member_id, None).value == 0
            assert a.session_timer.when() < a.session_ends
            assert not [o for o in gc.get_referents(a.session_timer) if type(o) is float]
            # a partition's group ids: a dict's keys, no set's stored hashes
            assert {type(held) for held in c.groups._of.values()} == {dict}
            long = "p" * (classic_group.MAX_SHARED_LENGTH + 1)
            c1, c2 = [await one_member_group(c, g, long) for g in ("c1", "c2")]
            assert c1.protocols[0] is not c2.protocols[0]
            assert sorted(classic_group._NAMES) == ["consumer", "range"]
        finally:
            c.close()
        restarted = coordinator()  # the groups loaded from the log
        await restarted.load_all()
        try:
            assert restarted.groups["b"].offsets is NO_ENTRIES
            assert list(restarted.groups["a"].offsets) == [("t", 0)]
        finally:
            restarted.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_groups_and_members_have_no_instance_dict():
    assert not hasattr(ClassicGroup("g"), "__dict__")
    assert not hasattr(Member("m", None, "c", "/h", 1, 1, ()), "__dict__")


def test_the_shared_empty_maps_cannot_be_written():
    group = ClassicGroup("g")
    try:
        group.static_members["i"] = "m"
    except TypeError:
        pass
    else:
        raise AssertionError("the shared empty map took a write")
    group.own_static_members()["i"] = "m"
    assert ClassicGroup("h").static_members == {} and group.static_members == {"i": "m"}


def test_each_coordinator_runs_its_timers_in_a_context_of_its_own():
    """One Context for the timers saves a copy of the caller's for each; it is one a
    coordinator, as a Context is entered by one thread at a time: shared with a coordinator
    whose loop runs a timer on another thread at that moment, this one's timer failed
    ("cannot enter context") and its rebalance never completed."""
    def coordinator() -> GroupCoordinator:
        return GroupCoordinator(MemoryOffsetsLog(), GroupConfig(num_partitions=1,
                                                                initial_rebalance_delay_ms=1),
                                lambda t, p: True)

    other = coordinator()
    entered, release = threading.Event(), threading.Event()
    # the other coordinator's timer, running on its loop's thread
    elsewhere = threading.Thread(target=other._timers.run,
                                 args=(lambda: (entered.set(), release.wait(10)),))
    elsewhere.start()
    try:
        assert entered.wait(10)

        async def scenario():
            c = coordinator()
            await c.load_all()
            try:  # the initial rebalance delay's timer ends the rebalance
                joined = await asyncio.wait_for(c.join(
                    "g", "", None, "client", "/h", 30_000, 30_000, "consumer",
                    [("range", b"")], require_known_member_id=False,
                    supports_skip_assignment=True), 3)
                assert joined.error.value == 0 and joined.generation == 1
            finally:
                c.close()

        asyncio.run(scenario())
    finally:
        release.set()
        elsewhere.join(10)


def test_a_group_of_one_holds_its_member_in_itself():
    group = ClassicGroup("g")
    one = Member("m1", None, "c", "/h", 1, 1, ())
    two = Member("m2", None, "c", "/h", 1, 1, ())
    group.members["m1"] = one
    assert group._members is one and dict(group.members) == {"m1": one}
    group.members["m2"] = two  # a second member: a dict, in joining order
    assert type(group._members) is dict and list(group.members) == ["m1", "m2"]
    assert group.remove_member("m1") is one
    assert group._members is two and dict(group.members) == {"m2": two}  # inline again
    assert group.remove_member("m1") is None and group._members is two
    assert group.members.pop("m2") is two and group._members is None and not group.members
    group.members["m1"] = one
    try:
        group.members["m2"]
    except KeyError:
        pass
    else:
        raise AssertionError("found a member that is not there")


def test_only_a_rebalance_holds_a_rebalance():
    """Its timer, the waiting JoinGroups and SyncGroups, who joined during it: made with its
    first field, gone with the rebalance (Stable, Empty, Dead), none on a stable group."""
    group = ClassicGroup("g")
    member = Member("m1", None, "c", "/h", 1, 1, ())
    group.join_timer = None
    group.initial_delay = None
    assert group.rebalance is None and group.join_waiter(member) is None
    assert not hasattr(member, "join_waiter") and not hasattr(member, "is_new")
    group.set_new(member, True)
    group.set_sync_waiter(member, "waiting")
    group.assignment_write = 3
    assert group.rebalance is not None and group.is_new(member)
    assert group.sync_waiter(member) == "waiting" and group.assignment_write == 3
    group.transition(GroupState.COMPLETING_REBALANCE, 1)
    assert group.pop_sync_waiter(member) == "waiting" and group.sync_waiter(member) is None
    group.transition(GroupState.STABLE, 2)
    assert group.rebalance is None and not group.is_new(member)
    assert group.assignment_write is None


# --- reading the members, as the metrics scrape does from its own thread --------------------

@contextlib.contextmanager
def a_read_between_every_line(read, modules=(classic_group, group_coordinator)):
    """``read()`` run between any two lines the coordinator's group code runs, as a thread
    reading the groups (the metrics scrape, broker/metrics.py) may be switched to there."""
    files = {module.__file__ for module in modules}
    reading = False

    def each_line(frame, event, arg):
        nonlocal reading
        if event == "line" and not reading:
            reading = True
            try:
                read()
            finally:
                reading = False
        return each_line

    def each_call(frame, event, arg):
        return each_line if frame.f_code.co_filename in files else None

    before = sys.gettrace()
    sys.settrace(each_call)
    try:
        yield
    finally:
        sys.settrace(before)


def scrape(c: GroupCoordinator) -> list[str]:
    """The metrics scrape's lines of the groups, read from the coordinator ``c``."""
    broker = SimpleNamespace(groups=c, topics=SimpleNamespace(partition=lambda t, i: None))
    return metrics._groups(broker)


def test_reading_the_members_changes_nothing():
    """Reading is all a thread other than the loop does to a group: a group whose dict is
    down to one member keeps it as it is when read (it is made inline by the write that
    removed the other member, on the loop)."""
    group = ClassicGroup("g")
    one = Member("m1", None, "c", "/h", 1, 1, ())
    group._members = {"m1": one}
    held = group._members
    assert len(group.members) == 1 and group.members["m1"] is one and list(group.members)
    assert group.size == 1 and group._members is held


def test_a_read_between_two_steps_of_a_write_loses_no_member():
    """A member left a group of two, another joins: a read of the members between two lines
    of the join found a dict of one and made the member inline again, and the join's next
    line wrote into a Member (TypeError), or its dict was replaced, the new member lost."""
    group = ClassicGroup("g")
    a, b, c = (Member(m, None, "c", "/h", 1, 1, ()) for m in ("a", "b", "c"))
    group.members["a"] = a
    group.members["b"] = b
    coordinator = SimpleNamespace(groups={"g": group})
    with a_read_between_every_line(lambda: scrape(coordinator)):
        GroupCoordinator._drop_member(cast(GroupCoordinator, None), group, b)
        group.members["c"] = c
    assert dict(group.members) == {"a": a, "c": c}


def test_a_static_member_rejoins_while_the_members_are_read():
    """J6 (a static member restarted takes its old place under a new id) with the metrics
    scrape reading the groups between any two of its lines: the group keeps both members."""
    async def scenario():
        c = GroupCoordinator(MemoryOffsetsLog(), GroupConfig(num_partitions=1,
                                                             initial_rebalance_delay_ms=50),
                             lambda t, p: True)
        await c.load_all()
        try:
            def join(instance):
                return c.join("g", "", instance, "client", "/h", 10_000, 10_000, "consumer",
                              [("range", b"")], require_known_member_id=True,
                              supports_skip_assignment=True)

            a, b = await asyncio.gather(join("i-a"), join("i-b"))
            leader = a if a.member_id == a.leader else b
            follower = b if leader is a else a
            waiting = asyncio.ensure_future(c.sync("g", 1, follower.member_id, None, None,
                                                   None, []))
            await c.sync("g", 1, leader.member_id, None, None, None,
                         [(leader.member_id, b"L"), (follower.member_id, b"F")])
            await waiting
            instance = "i-b" if follower is b else "i-a"
            with a_read_between_every_line(lambda: scrape(c)):
                restarted = await join(instance)
            assert restarted.error.value == 0
            assert set(c.groups["g"].members) == {leader.member_id, restarted.member_id}
            assert 'oncelog_consumer_group_members{group="g"} 2' in scrape(c)
        finally:
            c.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))
