"""The classic group protocol's member-side decisions, without sockets: answers in, the next
step, requests and hand-offs out (group_membership.py's table, row by row)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode as E

from oncelog.client.consumer.assignors import parse_strategy
from oncelog.client.consumer.consumer_protocol import (
    Assignment,
    Subscription,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from oncelog.client.consumer.group_membership import (
    SIMPLE_COMMIT,
    ClassicMembership,
    Handoff,
    JoinResult,
    Step,
    SyncResult,
)
from oncelog.client.network.connection import KafkaError
from oncelog.client.topic_partition import TopicPartition as TP

T = [TP("t", p) for p in range(6)]


def member(strategy="range", instance_id=None, **kw) -> ClassicMembership:
    m = ClassicMembership("g", parse_strategy(strategy), instance_id=instance_id,
                          session_timeout_ms=10_000, rebalance_timeout_ms=60_000,
                          heartbeat_interval_ms=1_000, retry_backoff_ms=100, **kw)
    m.set_subscription({"t"})
    return m


def assignment(*partitions) -> bytes:
    return encode_assignment(Assignment(tuple(partitions)))


def join_as(m, member_id="m1", generation=1, leader="other", members=(), protocol=None):
    """Coordinator known, JoinGroup sent and answered successfully."""
    if m.coordinator is None:
        m.on_coordinator(1, "127.0.0.1", 9092)
    assert m.next_step(0) == Step.JOIN
    handoff = m.prepare_join()
    m.join_request()
    m.on_join(JoinResult(E.none, generation, protocol or next(iter(m.assignors)), leader,
                         member_id, members), 0)
    return handoff


def sync(m, *partitions, now=0.0):
    m.sync_request()
    return m.on_sync(SyncResult(E.none, assignment(*partitions)), now)


def test_first_join_member_id_required_then_leader_assigns():
    m = member()
    assert m.next_step(0) == Step.FIND_COORDINATOR
    m.on_coordinator(1, "127.0.0.1", 9092)
    assert m.next_step(0) == Step.JOIN
    assert m.prepare_join() == Handoff()
    first = m.join_request()
    assert (first.member_id, first.instance_id) == ("", None)
    assert [name for name, _ in first.protocols] == ["range"]
    assert decode_subscription(first.protocols[0][1]).topics == ("t",)
    assert m.next_step(0) == Step.AWAIT
    m.on_join(JoinResult(E.member_id_required, member_id="m1"), 0)  # KIP-394
    assert m.next_step(0) == Step.JOIN
    assert m.join_request().member_id == "m1"
    other = encode_subscription(Subscription(("t",)))
    m.on_join(JoinResult(E.none, 1, "range", "m1", "m1",
                         (("m1", None, first.protocols[0][1]), ("m2", None, other))), 0)
    assert m.next_step(0) == Step.ASSIGN
    assert m.leader_topics() == {"t"}
    assignments = m.assign({"t": 6})
    assert assignments == {"m1": T[:3], "m2": T[3:]}
    request = m.sync_request(assignments)
    assert (request.generation, request.member_id, request.protocol_name) == (1, "m1", "range")
    assert m.next_step(0) == Step.AWAIT
    change = m.on_sync(SyncResult(E.none, dict(request.assignments)["m1"]), 0)
    assert change.assigned == change.added == frozenset(T[:3]) and not change.revoked
    assert m.next_step(0) == Step.STABLE and m.owned == frozenset(T[:3])


def test_follower_syncs_without_assigning_and_an_empty_assignment_is_nothing():
    m = member()
    join_as(m, "m2", leader="m1")
    assert m.next_step(0) == Step.SYNC
    assert m.sync_request().assignments == ()
    change = m.on_sync(SyncResult(E.none, b""), 0)
    assert change.assigned == frozenset() and m.stable


def test_heartbeats_are_due_every_interval_one_at_a_time():
    m = member()
    join_as(m)
    sync(m, *T[:2], now=100.0)
    assert m.heartbeat_request(100.5) is None
    beat = m.heartbeat_request(101.0)
    assert (beat.generation, beat.member_id) == (1, "m1")
    assert m.heartbeat_request(101.5) is None  # its answer is not in yet
    m.on_heartbeat(beat, E.none, 101.6)
    assert m.heartbeat_request(102.5) is None and m.heartbeat_request(102.6) is not None


def test_rebalance_in_progress_eager_revokes_everything_before_joining():
    m = member("range")
    join_as(m)
    sync(m, *T[:3])
    m.on_heartbeat(m.heartbeat_request(5), E.rebalance_in_progress, 5)
    assert m.next_step(5) == Step.JOIN
    assert m.heartbeat_request(6.5) is not None  # still a member until it rejoins
    assert m.prepare_join() == Handoff(revoked=frozenset(T[:3]))
    assert decode_subscription(m.join_request().protocols[0][1]).owned_partitions == ()


def test_cooperative_keeps_partitions_through_the_join_and_revokes_only_what_moved():
    m = member("cooperative-sticky")
    join_as(m)
    sync(m, *T[:3])
    m.request_rejoin("a member joined")
    assert m.prepare_join() == Handoff()
    join = m.join_request()
    owned = decode_subscription(join.protocols[0][1])
    assert owned.owned_partitions == tuple(T[:3]) and owned.generation == 1
    m.on_join(JoinResult(E.none, 2, "cooperative-sticky", "other", "m1"), 0)
    change = sync(m, T[0], T[1])
    assert change.revoked == {T[2]} and change.added == frozenset()
    assert m.next_step(0) == Step.JOIN  # rejoin at once so T[2] can move on
    assert m.prepare_join() == Handoff()
    m.join_request()
    m.on_join(JoinResult(E.none, 3, "cooperative-sticky", "other", "m1"), 0)
    change = sync(m, T[0], T[1], T[5])
    assert change.added == {T[5]} and not change.revoked and m.next_step(0) == Step.STABLE


def test_cooperative_drops_unsubscribed_topics_before_joining():
    m = member("cooperative-sticky")
    m.set_subscription({"t", "u"})
    join_as(m)
    sync(m, T[0], TP("u", 0))
    m.set_subscription({"t"})
    assert m.prepare_join() == Handoff(revoked=frozenset({TP("u", 0)}))


@pytest.mark.parametrize("error", [E.unknown_member_id, E.illegal_generation])
def test_a_membership_the_coordinator_forgot_loses_its_partitions(error):
    m = member("cooperative-sticky")
    join_as(m)
    sync(m, *T[:2])
    m.on_heartbeat(m.heartbeat_request(5), error, 5)
    assert (m.member_id, m.generation) == ("", -1)
    assert m.heartbeat_request(100) is None
    assert m.prepare_join() == Handoff(lost=frozenset(T[:2]))


def test_sync_errors_after_a_cooperative_join_lose_or_keep():
    m = member("cooperative-sticky")
    join_as(m)
    sync(m, *T[:2])
    m.request_rejoin("test")
    join_as(m, generation=2)
    m.sync_request()
    m.on_sync(SyncResult(E.rebalance_in_progress), 0)
    assert m.next_step(0) == Step.JOIN and m.prepare_join() == Handoff()  # still ours
    m.join_request()
    m.on_join(JoinResult(E.none, 3, "cooperative-sticky", "other", "m1"), 0)
    m.sync_request()
    m.on_sync(SyncResult(E.illegal_generation), 0)
    assert m.prepare_join() == Handoff(lost=frozenset(T[:2]))


def test_coordinator_moves_and_loads():
    m = member()
    m.on_coordinator(1, "127.0.0.1", 9092)
    m.join_request()
    m.on_join(JoinResult(E.not_coordinator), 10.0)
    assert m.coordinator is None and m.next_step(10.0) == Step.BACKOFF
    assert m.next_step(10.2) == Step.FIND_COORDINATOR
    m.on_coordinator_error(E.coordinator_not_available, 10.2)
    assert m.next_step(10.25) == Step.BACKOFF and m.next_step(10.4) == Step.FIND_COORDINATOR
    m.on_coordinator(2, "127.0.0.1", 9093)
    m.join_request()
    m.on_join(JoinResult(E.coordinator_load_in_progress), 11.0)
    assert m.coordinator is not None
    assert m.next_step(11.05) == Step.BACKOFF and m.next_step(11.2) == Step.JOIN


def test_a_lost_connection_abandons_the_join_and_a_late_answer_is_ignored():
    m = member()
    m.on_coordinator(1, "127.0.0.1", 9092)
    m.join_request()
    m.coordinator_lost(1.0, "connection closed")
    assert m.next_step(2.0) == Step.FIND_COORDINATOR
    m.on_join(JoinResult(E.none, 1, "range", "m1", "m1"), 2.0)  # from the old connection
    assert m.next_step(2.0) == Step.FIND_COORDINATOR and m.generation == -1


@pytest.mark.parametrize("where", ["join", "sync", "heartbeat"])
def test_fenced_instance_id_is_fatal(where):
    m = member(instance_id="i-1")
    m.on_coordinator(1, "127.0.0.1", 9092)
    join = m.join_request()
    assert join.instance_id == "i-1"
    if where == "join":
        m.on_join(JoinResult(E.fenced_instance_id), 0)
    else:
        m.on_join(JoinResult(E.none, 1, "range", "other", "m1"), 0)
        m.sync_request()
        if where == "sync":
            m.on_sync(SyncResult(E.fenced_instance_id), 0)
        else:
            m.on_sync(SyncResult(E.none, assignment(T[0])), 0)
            m.on_heartbeat(m.heartbeat_request(5), E.fenced_instance_id, 5)
    assert m.next_step(10) == Step.FAILED and m.fatal.error == E.fenced_instance_id
    with pytest.raises(KafkaError, match="FENCED_INSTANCE_ID"):
        m.commit_identity()


@pytest.mark.parametrize("error", [E.inconsistent_group_protocol, E.invalid_session_timeout,
                                   E.group_max_size_reached, E.group_authorization_failed])
def test_join_errors_that_retrying_cannot_fix_are_fatal(error):
    m = member()
    m.on_coordinator(1, "127.0.0.1", 9092)
    m.join_request()
    m.on_join(JoinResult(error), 0)
    assert m.next_step(0) == Step.FAILED and m.fatal.error == error


def test_an_assignor_we_did_not_offer_is_fatal():
    m = member("range")
    m.on_coordinator(1, "127.0.0.1", 9092)
    m.join_request()
    m.on_join(JoinResult(E.none, 1, "roundrobin", "m1", "m1"), 0)
    assert m.fatal.error == E.inconsistent_group_protocol


def test_a_stale_heartbeat_answer_changes_nothing():
    m = member("cooperative-sticky")
    join_as(m)
    sync(m, T[0])
    beat = m.heartbeat_request(5)
    m.request_rejoin("test")
    join_as(m, generation=2)
    sync(m, T[0])
    m.on_heartbeat(beat, E.illegal_generation, 6)  # about generation 1
    assert m.generation == 2 and m.stable


def test_poll_timeout_leaves_dynamic_members_and_quietly_resets_static_ones():
    for instance_id, sends_leave in ((None, True), ("i-1", False)):
        m = member(instance_id=instance_id)
        join_as(m)
        sync(m, T[0])
        m.on_poll(100.0)
        assert not m.poll_timed_out(160.0)
        assert m.poll_timed_out(160.1)
        leave = m.leave_request("consumer poll timeout has expired")
        assert (leave is not None) == sends_leave
        if leave is not None:
            assert leave.member_id == "m1"
        assert not m.poll_timed_out(200)  # once
        assert m.prepare_join() == Handoff(lost=frozenset({T[0]}))


def test_no_heartbeat_answered_for_a_session_means_the_coordinator_is_lost():
    m = member()
    join_as(m)
    sync(m, T[0], now=0.0)
    m.heartbeat_request(1.0)  # never answered
    assert m.heartbeat_request(10.5) is None and m.coordinator is None


def test_commits_are_made_as_the_current_generation_and_their_errors_count():
    m = member()
    with pytest.raises(KafkaError, match="REBALANCE_IN_PROGRESS"):
        m.commit_identity()
    join_as(m)
    sync(m, T[0])
    identity = m.commit_identity()
    assert (identity.generation, identity.member_id) == (1, "m1")
    assert m.on_commit_error(identity, E.coordinator_load_in_progress, 0) is True
    assert m.on_commit_error(identity, E.rebalance_in_progress, 0) is False
    assert m.next_step(0) == Step.JOIN
    assert m.on_commit_error(identity, E.illegal_generation, 0) is False
    assert m.generation == -1
    assert m.on_commit_error(SIMPLE_COMMIT, E.unknown_member_id, 0) is False


def test_prepare_leave_revokes_or_loses_everything():
    m = member()
    join_as(m)
    sync(m, T[0], T[1])
    assert m.prepare_leave() == Handoff(revoked=frozenset(T[:2]))
    assert m.owned == frozenset() and m.prepare_leave() == Handoff()


ANSWERS = [E.none, E.rebalance_in_progress, E.unknown_member_id, E.illegal_generation,
           E.not_coordinator, E.coordinator_not_available, E.coordinator_load_in_progress,
           E.member_id_required, E.network_exception]
JOIN_ONLY = {E.member_id_required}


@settings(derandomize=True, database=None, max_examples=400, deadline=None)
@given(st.sampled_from(["range", "cooperative-sticky"]),
       st.lists(st.tuples(st.sampled_from(ANSWERS), st.sets(st.sampled_from(T))),
                max_size=40))
def test_any_sequence_of_answers_keeps_the_books_straight(strategy, answers):
    """Whatever the coordinator answers: a partition is handed over at most once between
    being assigned and assigned again, and the member always knows its next step."""
    m = member(strategy)
    held: set[TP] = set()  # what the consumer holds, from the hand-offs and changes
    now = 0.0
    for error, partitions in answers:
        now += 1.0
        step = m.next_step(now)
        assert step != Step.FAILED
        if step == Step.FIND_COORDINATOR:
            m.on_coordinator(1, "127.0.0.1", 9092)
        elif step == Step.JOIN:
            handoff = m.prepare_join()
            assert not handoff.revoked & handoff.lost
            assert handoff.revoked | handoff.lost <= held
            held -= handoff.revoked | handoff.lost
            m.join_request()
            m.on_join(JoinResult(error, 1, strategy, "other", "m1"), now)
        elif step in (Step.SYNC, Step.ASSIGN):
            m.sync_request()
            if error in JOIN_ONLY:
                error = E.none
            change = m.on_sync(SyncResult(error, assignment(*partitions)), now)
            if change is not None:
                assert change.revoked <= held and not change.added & held
                held = (held - change.revoked) | change.added
                assert held == change.assigned
        elif step == Step.STABLE:
            beat = m.heartbeat_request(now + 5)
            if beat is not None:
                m.on_heartbeat(beat, E.none if error in JOIN_ONLY else error, now + 5)
        assert held == m.owned
