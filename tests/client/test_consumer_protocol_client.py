"""oncelog.Consumer with ``group.protocol=consumer`` (KIP-848) against oncelog brokers
(subprocesses) whose consumer-group session is made short: members sharing a topic, one killed
with SIGKILL, one joining (partitions move incrementally), commits, a pattern subscription,
static membership, the poll timeout, and groups shared with confluent-kafka consumers."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from kio.schema.errors import ErrorCode
from support import group_members
from support.brokers import create_topic
from support.group_members import (
    TOPIC,
    WAIT,
    consumed,
    partitions,
    poll_until,
    produce,
    split_evenly,
)

from oncelog import Consumer, KafkaError, OffsetAndMetadata, TopicPartition
from oncelog.client.network.connection import connect
from oncelog.protocol import api_versions as apis

SESSION_MS = 3000
BROKER = {
    "group_consumer_min_session_timeout_ms": 1000,
    "group_consumer_session_timeout_ms": SESSION_MS,
    "group_consumer_min_heartbeat_interval_ms": 100,
    "group_consumer_heartbeat_interval_ms": 300,
    "group_initial_rebalance_delay_ms": 0,
}
PROTOCOL = {"group.protocol": "consumer"}


@pytest.fixture
def group_broker(start_broker):
    broker = start_broker(**BROKER)
    create_topic(broker.bootstrap, TOPIC, 6)
    return broker


class Member(group_members.Member):
    """One oncelog consumer of the group (consumer protocol) and what happened to it."""

    BASE = PROTOCOL


def describe(bootstrap: str, group: str):
    with connect(bootstrap) as conn:
        return conn.call(apis.CONSUMER_GROUP_DESCRIBE, lambda mod, v:
                         mod.ConsumerGroupDescribeRequest(
                             group_ids=(group,), include_authorized_operations=False)).groups[0]


CHILD = r"""
import sys
from oncelog import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "group.protocol": "consumer", "auto.offset.reset": "earliest",
              "enable.auto.commit": False})
c.subscribe(["orders"], on_assign=lambda c, p: print("A", len(c.assignment()), flush=True),
            on_revoke=lambda c, p: print("V", len(p), flush=True))
while True:
    records = c.poll(0.1, max_records=5)
    for r in records:
        print("R", r.value.decode(), flush=True)
    if records:
        c.commit()
"""


def test_members_share_a_topic_survive_a_kill_and_a_newcomer_moves_only_its_share(
        group_broker):
    boot = group_broker.bootstrap
    expected = produce(boot, 0, 600)
    members = [Member(boot, "shares", **{"auto.commit.interval.ms": 200}) for _ in range(2)]
    child = subprocess.Popen([sys.executable, "-c", CHILD, boot, "shares"],
                             stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(child.stdout.readline, "")),
                              daemon=True)
    reader.start()
    try:
        poll_until(members, lambda: split_evenly(members, 4) and any(
            line.startswith("A 2") for line in lines), "three members share six partitions")
        expected += produce(boot, 600, 300)
        poll_until(members, lambda: sum(line.startswith("R") for line in lines) >= 20,
                   "the member in its own process reads its share")
        child.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        child.wait(WAIT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(WAIT)
    reader.join(WAIT)
    expected += produce(boot, 900, 300)
    poll_until(members, lambda: split_evenly(members), "the survivors take its partitions")
    # Its partitions waited for its session to expire on the coordinator.
    assert time.monotonic() - killed_at >= SESSION_MS / 1000 * 0.9
    before = [m.assignment for m in members]
    marks = [len(m.events) for m in members]
    newcomer = Member(boot, "shares")
    everyone = [*members, newcomer]
    expected += produce(boot, 1200, 300)
    # Only whole lines: SIGKILL may cut the child's last one short.
    child_values = Counter(line.split()[1].encode() for line in lines
                           if line.startswith("R") and line.endswith("\n")
                           and len(line.split()) > 1)
    poll_until(everyone, lambda: split_evenly(everyone) and
               set(consumed(everyone)) | set(child_values) >= set(expected),
               "the newcomer takes its share and everything is read")
    for m, had, mark in zip(members, before, marks, strict=True):
        later = m.events[mark:]
        revoked = frozenset().union(*(p for kind, p in later if kind == "revoke"))
        assert revoked == had - m.assignment  # only what moved was revoked
        assert not [p for kind, p in later if kind == "assign" and p]  # nothing added
        assert not [e for e in later if e[0] == "lost"]
    assert newcomer.assignment == (before[0] - members[0].assignment) | \
        (before[1] - members[1].assignment)
    everything = consumed(everyone) + child_values
    assert set(everything) == set(expected), "a record was skipped"
    twice = {v for v, n in everything.items() if n > 1}
    # Only what the killed member read but had not committed yet is read again.
    assert twice <= set(child_values), twice - set(child_values)
    assert len(twice) <= 5 * 6  # one poll's worth (max_records=5) per partition at most
    for m in everyone:
        m.close()
    assert describe(boot, "shares").group_state == "Empty"  # each left (epoch -1)


def test_commit_committed_and_the_server_assignor(group_broker):
    boot = group_broker.bootstrap
    produce(boot, 0, 60)
    m = Member(boot, "commits", **{"enable.auto.commit": False, "group.remote.assignor": "range"})
    poll_until([m], lambda: len(m.values) == 60, "one member reads everything")
    c = m.consumer
    tp0, tp1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
    c.commit({tp0: 5, tp1: OffsetAndMetadata(7, "checkpoint")})
    assert c.committed([tp0, tp1, TopicPartition(TOPIC, 2)]) == {
        tp0: OffsetAndMetadata(5, ""), tp1: OffsetAndMetadata(7, "checkpoint"),
        TopicPartition(TOPIC, 2): None}
    answers = []
    c.commit(asynchronous=True, callback=lambda error, offsets: answers.append((error, offsets)))
    poll_until([m], lambda: answers, "the asynchronous commit is answered")
    assert answers[0][0] is None
    assert {tp: o.offset for tp, o in c.committed(sorted(partitions())).items()} == \
        {tp: 10 for tp in partitions()}
    described = describe(boot, "commits")
    assert described.assignor_name == "range"
    (member,) = described.members
    assert member.member_id == c._group.membership.member_id
    assert member.member_epoch == c._group.membership.member_epoch
    # A commit as an epoch the coordinator has moved past is STALE_MEMBER_EPOCH; the
    # consumer retries it as its latest epoch.
    identity = c._group.commit_identity(True)
    stale = dataclasses.replace(identity, generation=identity.generation - 1)
    once = c._group._commit_once({tp0: OffsetAndMetadata(8)}, stale, time.monotonic() + WAIT)
    assert once.error == ErrorCode.stale_member_epoch
    c._group.commit({tp0: OffsetAndMetadata(8)}, stale)
    assert c.committed([tp0])[tp0].offset == 8
    m.close()
    # A new member starts from the committed offsets.
    produce(boot, 60, 6)
    again = Member(boot, "commits")
    poll_until([again], lambda: len(again.values) >= 6 + 2, "the next member")
    assert sorted(again.values) == sorted([b"48", b"54"] + [b"%d" % i for i in range(60, 66)])
    again.close()


def test_members_carry_on_through_a_broker_restart(group_broker):
    boot = group_broker.bootstrap
    expected = produce(boot, 0, 60)
    members = [Member(boot, "restart", **{"auto.commit.interval.ms": 200}) for _ in range(2)]
    poll_until(members, lambda: split_evenly(members) and
               sum(consumed(members).values()) >= 60, "two members read everything")
    held, marks = [m.assignment for m in members], [len(m.events) for m in members]
    group_broker.restart(clean=False)  # SIGKILL; the group is loaded from __consumer_offsets
    expected += produce(boot, 60, 60)
    poll_until(members, lambda: set(consumed(members)) >= set(expected), "the rest is read")
    # The coordinator found again, their full heartbeats were taken: nothing moved.
    assert [m.assignment for m in members] == held
    assert all(m.events[mark:] == [] for m, mark in zip(members, marks, strict=True))
    assert max(consumed(members).values()) == 1
    for m in members:
        m.close()


def test_a_pattern_subscription_is_resolved_by_the_coordinator(group_broker):
    boot = group_broker.bootstrap
    create_topic(boot, "logs-a", 2)
    create_topic(boot, "other", 1)
    m = Member(boot, "patterns", topics=("^logs-.*",))
    poll_until([m], lambda: m.settled and m.assignment == partitions("logs-a", 2),
               "the pattern's topics assigned")
    create_topic(boot, "logs-b", 1)
    poll_until([m], lambda: m.settled and m.assignment ==
               partitions("logs-a", 2) | partitions("logs-b", 1), "a new topic joins in")
    produce(boot, 0, 6, topic="logs-b", partitions=1)
    poll_until([m], lambda: len(m.values) == 6, "its records are read")
    (member,) = describe(boot, "patterns").members
    assert member.subscribed_topic_regex == "^logs-.*"
    m.close()


def test_a_static_member_comes_back_to_its_partitions_and_a_duplicate_is_refused(
        group_broker):
    boot = group_broker.bootstrap
    produce(boot, 0, 60)
    a = Member(boot, "static", **{"group.instance.id": "a"})
    b = Member(boot, "static", **{"group.instance.id": "b"})
    poll_until([a, b], lambda: split_evenly([a, b]), "two static members share the topic")
    b_partitions, a_events = b.assignment, list(a.events)
    b.close()  # epoch -2: its partitions wait for it
    restarted = Member(boot, "static", **{"group.instance.id": "b"})
    poll_until([a, restarted], lambda: restarted.settled and restarted.assignment,
               "the static member is back")
    assert restarted.assignment == b_partitions
    assert restarted.events == [("assign", frozenset(b_partitions))]
    for _ in range(20):  # a few heartbeats' time: the other sees nothing
        a.poll()
    assert a.events == a_events
    duplicate = Member(boot, "static", **{"group.instance.id": "b"})
    with pytest.raises(KafkaError) as failure:
        poll_until([duplicate], lambda: False, "UNRELEASED_INSTANCE_ID")
    assert failure.value.error == ErrorCode.unreleased_instance_id
    duplicate.close()
    assert restarted.assignment == b_partitions
    for m in (a, restarted):
        m.close()


def test_a_member_that_stops_polling_leaves_and_rejoins_at_the_next_poll(group_broker):
    boot = group_broker.bootstrap
    config = {"max.poll.interval.ms": 1500}
    slow, other = Member(boot, "slow", **config), Member(boot, "slow", **config)
    poll_until([slow, other], lambda: split_evenly([slow, other]), "two members")
    mine = slow.assignment
    deadline = time.monotonic() + WAIT
    while len(describe(boot, "slow").members) != 1:  # it left (epoch -1)
        assert time.monotonic() < deadline
        other.poll()
    poll_until([other], lambda: other.settled and other.assignment == partitions(),
               "the other takes everything")
    poll_until([slow, other], lambda: split_evenly([slow, other]) and
               any(kind == "lost" for kind, _ in slow.events), "it rejoins, its partitions lost")
    assert ("lost", frozenset(mine)) in slow.events
    slow.close()
    other.close()


def test_one_group_with_confluent_kafka_consumers(group_broker):
    boot = group_broker.bootstrap
    ours = Member(boot, "mixed")
    theirs = ConfluentConsumer({"bootstrap.servers": boot, "group.id": "mixed",
                                "group.protocol": "consumer", "auto.offset.reset": "earliest"})
    theirs.subscribe([TOPIC])
    their_values: list[bytes] = []

    class Theirs:
        closed = False

        @staticmethod
        def poll():
            if not Theirs.closed:
                for message in theirs.consume(500, 0.05):
                    assert message.error() is None, message.error()
                    their_values.append(message.value())

    both = [ours, Theirs]

    def shared() -> bool:
        mine, other = ours.assignment, {TopicPartition(t.topic, t.partition)
                                        for t in theirs.assignment()}
        return ours.settled and len(mine) == len(other) == 3 and mine | other == partitions()

    poll_until(both, shared, "oncelog and librdkafka share the topic")
    expected = produce(boot, 0, 600)
    poll_until(both, lambda: len(ours.values) + len(their_values) >= 600, "both read it all")
    assert shared() and their_values and ours.values
    assert {m.client_id for m in describe(boot, "mixed").members} == {
        "oncelog-consumer", "rdkafka"}
    theirs.close()
    Theirs.closed = True
    expected += produce(boot, 600, 120)
    poll_until(both, lambda: ours.settled and ours.assignment == partitions()
               and len(ours.values) + len(their_values) >= 720, "ours takes everything")
    counts = Counter(ours.values) + Counter(their_values)
    assert set(counts) == set(expected) and max(counts.values()) == 1
    ours.close()


def test_configuration_is_checked_as_kafkas_consumer_checks_it():
    for key, value in (("session.timeout.ms", 10_000), ("heartbeat.interval.ms", 1000),
                       ("partition.assignment.strategy", "range")):
        with pytest.raises(ValueError, match=rf"^{key} cannot be set when "
                                             r"group\.protocol=CONSUMER$"):
            Consumer({"group.id": "g", "group.protocol": "consumer", key: value})
    with pytest.raises(ValueError, match=r"^partition\.assignment\.strategy, "
                                         r"session\.timeout\.ms cannot be set"):
        Consumer({"group.id": "g", "group.protocol": "CONSUMER", "session.timeout.ms": 1,
                  "partition.assignment.strategy": "range"})
    with pytest.raises(ValueError, match=r"^group\.remote\.assignor cannot be set when "
                                         r"group\.protocol=CLASSIC$"):
        Consumer({"group.id": "g", "group.remote.assignor": "uniform"})
    with pytest.raises(ValueError, match="classic or consumer"):
        Consumer({"group.id": "g", "group.protocol": "share"})
