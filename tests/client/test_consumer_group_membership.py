"""The consumer group protocol's member-side decisions (KIP-848), without sockets: heartbeat
answers in, the next step, requests and hand-offs out (consumer_group_membership.py's table,
row by row), and a property test that random answers keep the partition books straight."""

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode as E

from oncelog.client.consumer.consumer_group_membership import (
    ConsumerMembership,
    HeartbeatResult,
    Phase,
    Step,
)
from oncelog.client.consumer.group_membership import SIMPLE_COMMIT
from oncelog.client.network.connection import KafkaError
from oncelog.client.topic_partition import TopicPartition as TP

T_ID, U_ID = uuid.UUID(int=1), uuid.UUID(int=2)
NAMES = {T_ID: "t", U_ID: "u"}


def member(instance_id=None, assignor=None, **kw) -> ConsumerMembership:
    m = ConsumerMembership("g", instance_id=instance_id, server_assignor=assignor,
                           rebalance_timeout_ms=60_000, retry_backoff_ms=100,
                           member_id="m1", **kw)
    m.set_subscription({"t"})
    m.on_coordinator(1, "127.0.0.1", 9092)
    return m


def ok(epoch, assignment=None, interval_ms=1000):
    return HeartbeatResult(E.none, None, "m1", epoch, interval_ms, assignment)


def beat(m, result, now=0.0, force=False):
    request = m.heartbeat_request(now, force=force)
    assert request is not None
    m.on_heartbeat(request, result, now)
    return request


def reconcile(m, now=0.0):
    """The driver's RESOLVE and RECONCILE steps; the change handed over."""
    if m.next_step(now) == Step.RESOLVE:
        m.on_topic_names(NAMES, now)
    assert m.next_step(now) == Step.RECONCILE
    change = m.reconcile()
    m.on_reconciled(change)
    return change


def joined(m, *partitions, epoch=1):
    beat(m, ok(epoch, {T_ID: frozenset(partitions)}))
    return reconcile(m)


def test_the_join_carries_every_field_and_later_heartbeats_only_what_changed():
    m = member(instance_id="i1", assignor="range")
    assert m.next_step(0) == Step.HEARTBEAT
    join = m.heartbeat_request(0)
    assert (join.member_id, join.member_epoch, join.instance_id, join.rebalance_timeout_ms,
            join.subscribed_topic_names, join.subscribed_topic_regex, join.server_assignor,
            join.owned) == ("m1", 0, "i1", 60_000, ("t",), None, "range", ())
    m.on_heartbeat(join, ok(3, {T_ID: frozenset({0, 1})}, interval_ms=500), 0)
    assert m.phase == Phase.MEMBER and m.member_epoch == 3 and m.heartbeat_interval == 0.5
    assert m.next_step(0) == Step.RESOLVE  # the topic id's name comes from Metadata
    m.on_topic_names(NAMES, 0)
    change = m.reconcile()
    assert (change.added, change.revoked) == ({TP("t", 0), TP("t", 1)}, set())
    m.on_reconciled(change)
    # The acknowledgement goes at once, with the partitions owned and nothing else.
    assert m.next_step(0) == Step.HEARTBEAT and not m.stable
    ack = beat(m, ok(3), 0.1)
    assert (ack.member_epoch, ack.owned, ack.instance_id, ack.rebalance_timeout_ms,
            ack.subscribed_topic_names, ack.server_assignor) == (
        3, ((T_ID, (0, 1)),), None, -1, None, None)
    assert m.stable and m.next_step(0.2) == Step.STABLE
    # Then one every heartbeat interval, with nothing but the identity.
    assert m.heartbeat_request(0.3) is None
    regular = m.heartbeat_request(1.1)
    assert (regular.member_epoch, regular.owned, regular.subscribed_topic_names) == (3, None, None)
    m.on_heartbeat(regular, ok(3), 1.1)
    # A new subscription goes at once; a regular expression cleared is sent as "".
    m.set_subscription({"t", "u"}, "^logs-.*")
    sub = beat(m, ok(3), 1.2)
    assert (sub.subscribed_topic_names, sub.subscribed_topic_regex) == (("t", "u"), "^logs-.*")
    m.set_subscription({"t"})
    sub = beat(m, ok(3), 1.3)
    assert (sub.subscribed_topic_names, sub.subscribed_topic_regex) == (("t",), "")


def test_reconciliation_revokes_only_what_moved_and_adds_only_what_is_new():
    m = member()
    joined(m, 0, 1, 2)
    beat(m, ok(1), 0.1)
    # The coordinator takes 2 away: the member revokes it, then says so at once.
    beat(m, ok(1, {T_ID: frozenset({0, 1})}), 1.0, force=True)
    change = reconcile(m)
    assert (change.revoked, change.added) == ({TP("t", 2)}, set())
    ack = beat(m, ok(2, {T_ID: frozenset({0, 1, 3})}), 1.1)
    assert ack.owned == ((T_ID, (0, 1)),)
    change = reconcile(m)
    assert (change.revoked, change.added) == (set(), {TP("t", 3)})
    assert m.owned == {TP("t", p) for p in (0, 1, 3)}


def test_partitions_of_unknown_topic_ids_wait_for_their_names():
    m = member()
    beat(m, ok(1, {T_ID: frozenset({0}), U_ID: frozenset({0})}))
    m.on_topic_names({T_ID: "t"}, 0)  # u is not in the metadata yet
    assert m.next_step(0) == Step.RECONCILE
    change = m.reconcile()
    assert change.added == {TP("t", 0)}
    m.on_reconciled(change)
    assert m.next_step(0.05) == Step.HEARTBEAT  # the acknowledgement does not wait
    beat(m, ok(1), 0.05)
    assert m.next_step(0.06) == Step.STABLE and not m.stable  # resolved again after a backoff
    assert m.next_step(0.2) == Step.RESOLVE
    m.on_topic_names(NAMES, 0.2)
    assert reconcile(m, 0.2).added == {TP("u", 0)}


@pytest.mark.parametrize("error", [E.fenced_member_epoch, E.unknown_member_id])
def test_a_fenced_member_loses_everything_and_rejoins_with_epoch_0(error):
    m = member()
    joined(m, 0, 1)
    beat(m, ok(1), 0.1)
    beat(m, HeartbeatResult(error), 1.5)
    assert m.next_step(1.5) == Step.LOSE
    with pytest.raises(KafkaError):
        m.commit_identity()  # nothing of a fenced member may be committed
    handoff = m.take_lost()
    assert handoff.lost == {TP("t", 0), TP("t", 1)} and not handoff.revoked
    assert m.phase == Phase.JOINING and m.owned == frozenset()
    join = m.heartbeat_request(1.5)
    assert (join.member_id, join.member_epoch, join.owned, join.subscribed_topic_names) == \
        ("m1", 0, (), ("t",))


def test_coordinator_errors_rediscover_or_retry_and_then_send_everything():
    m = member()
    joined(m, 0)
    beat(m, ok(1), 0.1)
    beat(m, HeartbeatResult(E.not_coordinator), 1.2)
    assert m.coordinator is None and m.next_step(1.2) == Step.BACKOFF
    assert m.next_step(1.4) == Step.FIND_COORDINATOR
    m.on_coordinator(2, "127.0.0.1", 9093)
    full = beat(m, HeartbeatResult(E.coordinator_load_in_progress), 1.4)
    assert full.owned == ((T_ID, (0,)),) and full.subscribed_topic_names == ("t",)
    assert full.rebalance_timeout_ms == 60_000
    assert m.next_step(1.45) == Step.STABLE and m.heartbeat_request(1.45) is None
    again = beat(m, ok(1), 1.6)
    assert again.owned is not None  # everything again after a failure
    assert m.stable


@pytest.mark.parametrize("error", [E.unreleased_instance_id, E.group_max_size_reached,
                                   E.unsupported_assignor, E.invalid_regular_expression,
                                   E.fenced_instance_id, E.invalid_request])
def test_errors_that_retrying_cannot_fix_are_fatal(error):
    m = member(instance_id="i1")
    beat(m, HeartbeatResult(error, "the broker's words"))
    assert m.next_step(0) == Step.FAILED
    assert m.fatal.error == error and "the broker's words" in str(m.fatal)
    with pytest.raises(KafkaError):
        m.commit_identity()


@pytest.mark.parametrize("instance_id, epoch", [(None, -1), ("i1", -2)])
def test_leaving_revokes_then_sends_the_leave_epoch(instance_id, epoch):
    m = member(instance_id=instance_id)
    joined(m, 0, 1, epoch=4)
    handoff = m.prepare_leave()
    assert handoff.revoked == {TP("t", 0), TP("t", 1)} and not handoff.lost
    leave = m.leave_request("closing")
    assert (leave.member_epoch, leave.instance_id, leave.member_id) == (epoch, instance_id, "m1")
    assert m.phase == Phase.UNSUBSCRIBED and m.next_step(0) == Step.IDLE
    assert m.leave_request("again") is None


def test_a_poll_timeout_leaves_and_the_next_poll_loses_and_rejoins():
    m = member()
    m.on_poll(0)
    joined(m, 0)
    beat(m, ok(1), 0.1)
    assert not m.poll_timed_out(59)
    assert m.poll_timed_out(61)
    leave = m.leave_request("poll timeout", stale=True)
    assert leave.member_epoch == -1
    assert m.next_step(61) == Step.LOSE
    assert m.take_lost().lost == {TP("t", 0)}
    assert m.next_step(62) == Step.HEARTBEAT and m.heartbeat_request(62).member_epoch == 0


def test_commits_use_the_latest_epoch_and_stale_epochs_are_retried():
    m = member()
    with pytest.raises(KafkaError):
        m.commit_identity()  # not in the group yet
    assert m.fetch_identity() == (None, -1)
    joined(m, 0, epoch=5)
    identity = m.commit_identity()
    assert (identity.generation, identity.member_id) == (5, "m1")
    assert m.fetch_identity() == ("m1", 5)
    assert m.on_commit_error(identity, E.stale_member_epoch, 0) is True
    assert m.on_commit_error(identity, E.unknown_member_id, 0) is False
    assert m.on_commit_error(identity, E.coordinator_load_in_progress, 0) is True
    assert m.on_commit_error(SIMPLE_COMMIT, E.stale_member_epoch, 0) is False
    assert m.on_commit_error(identity, E.not_coordinator, 0) is True and m.coordinator is None


def test_an_answer_about_a_membership_given_up_changes_nothing():
    m = member()
    joined(m, 0)
    request = m.heartbeat_request(0, force=True)
    m.prepare_leave()
    m.leave_request("closing")
    m.on_heartbeat(request, ok(2, {T_ID: frozenset({0, 1})}), 0)
    assert m.phase == Phase.UNSUBSCRIBED and m.target == {} and m.member_epoch == 0


# --- the property: whatever the coordinator answers, the books stay straight ------------------

PARTITIONS = [(t, p) for t in (T_ID, U_ID) for p in range(3)]
ERRORS = [E.none] * 6 + [E.fenced_member_epoch, E.unknown_member_id, E.not_coordinator,
                         E.coordinator_not_available, E.coordinator_load_in_progress,
                         E.network_exception]
ACTIONS = ["answer", "reconcile", "resolve", "poll timeout", "resubscribe", "tick"]


@settings(derandomize=True, database=None, max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(ACTIONS), st.sampled_from(ERRORS),
                          st.none() | st.sets(st.sampled_from(PARTITIONS)),
                          st.integers(1, 5), st.booleans()), max_size=50))
def test_any_sequence_of_answers_keeps_the_books_straight(steps):
    """Whatever the coordinator answers, in whatever order the driver's steps come: what the
    consumer holds is exactly what the hand-offs gave it, each partition is revoked or lost
    only while held and added only while not held, every heartbeat reports exactly what is
    held (in ids), a join reports nothing, and a member that settles holds its assignment."""
    m = member()
    held: set[TP] = set()
    now = 0.0
    epoch = 0
    for action, error, assigned, bump, names_known in steps:
        now += 0.5
        step = m.next_step(now)
        assert step != Step.FAILED
        if step == Step.LOSE:
            handoff = m.take_lost()
            assert handoff.lost <= held and not handoff.revoked
            held -= handoff.lost
        elif step == Step.FIND_COORDINATOR:
            m.on_coordinator(1, "127.0.0.1", 9092)
        elif action == "reconcile" and step == Step.RECONCILE:
            change = m.reconcile()
            assert change.revoked <= held and not change.added & held
            held = (held - change.revoked) | change.added
            assert held == change.assigned
            m.on_reconciled(change)
        elif action == "resolve" and step == Step.RESOLVE:
            m.on_topic_names(NAMES if names_known else {T_ID: "t"}, now)
        elif action == "poll timeout" and m.phase == Phase.MEMBER:
            m.leave_request("poll timeout", stale=True)
        elif action == "resubscribe":
            m.set_subscription({"t"} if names_known else {"t", "u"})
        else:
            request = m.heartbeat_request(now, force=True)
            if request is None:
                continue
            if request.member_epoch == 0:
                assert request.owned == ()
            elif request.owned is not None:
                reported = {(t, p) for t, ps in request.owned for p in ps}
                assert reported == {(NAMES_BY_NAME[tp.topic], tp.partition) for tp in held}
            epoch = epoch + bump if error == E.none else epoch
            assignment = None
            if assigned is not None:
                assignment = {}
                for t, p in assigned:
                    assignment[t] = assignment.get(t, frozenset()) | {p}
            m.on_heartbeat(request, HeartbeatResult(error, None, "m1", epoch, 1000, assignment),
                           now)
        assert held == m.owned
    # Settle: answers without errors and every name known bring the member to its target.
    m.on_coordinator(1, "127.0.0.1", 9092)
    for _ in range(10):
        now += 0.5
        step = m.next_step(now)
        if step == Step.LOSE:
            held -= m.take_lost().lost
        elif step == Step.RESOLVE:
            m.on_topic_names(NAMES, now)
        elif step == Step.RECONCILE:
            change = m.reconcile()
            held = (held - change.revoked) | change.added
            m.on_reconciled(change)
        elif step == Step.HEARTBEAT:
            request = m.heartbeat_request(now)
            m.on_heartbeat(request, HeartbeatResult(E.none, None, "m1", epoch + 1, 1000), now)
    assert m.stable and held == m.owned == m._resolved_target()


NAMES_BY_NAME = {name: topic_id for topic_id, name in NAMES.items()}
