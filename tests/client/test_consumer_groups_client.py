"""oncelog.Consumer in consumer groups, against oncelog brokers (subprocesses): members
joining, leaving, killed with SIGKILL, static members, cooperative-sticky, commits, auto
commit, patterns, poll timeouts, and groups shared with confluent-kafka (librdkafka)
consumers."""

from __future__ import annotations

import re
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
from oncelog.client.consumer.group_membership import Phase

# Fast groups: no initial rebalance delay, and short sessions allowed.
GROUP_BROKER = {"group_initial_rebalance_delay_ms": 0, "group_min_session_timeout_ms": 1000}
SESSION = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 300}


@pytest.fixture
def group_broker(start_broker):
    broker = start_broker(**GROUP_BROKER)
    create_topic(broker.bootstrap, TOPIC, 6)
    return broker


class Member(group_members.Member):
    BASE = SESSION



def test_members_join_and_leave_and_every_record_is_read_exactly_once(group_broker):
    boot = group_broker.bootstrap
    expected = produce(boot, 0, 300)
    first = Member(boot, "shares")
    poll_until([first], lambda: len(first.values) >= 50, "the first member reads")
    second = Member(boot, "shares")
    expected += produce(boot, 300, 300)
    members = [first, second]
    poll_until(members, lambda: split_evenly(members), "two members share the topic")
    third = Member(boot, "shares")
    members.append(third)
    expected += produce(boot, 600, 300)
    poll_until(members, lambda: split_evenly(members) and sum(consumed(members).values())
               >= len(expected), "three members read everything")
    second.close()  # commits, revokes, leaves: the others take its partitions at once
    expected += produce(boot, 900, 300)
    poll_until(members, lambda: split_evenly(members) and sum(consumed(members).values())
               >= len(expected), "two members read everything")
    for m in members:
        m.close()
    counts = consumed(members)
    assert set(counts) == set(expected), "a record was skipped"
    assert [v for v, n in counts.items() if n > 1] == [], "a record was read twice"
    # eager (range): every rebalance revoked everything first, then assigned anew
    assert [kind for kind, _ in first.events[:3]] == ["assign", "revoke", "assign"]


def test_a_member_closed_while_its_join_waits_leaves_at_once(group_broker):
    boot = group_broker.bootstrap
    first = Member(boot, "hasty")
    poll_until([first], lambda: first.settled, "the first member joins")
    mark = len(first.events)
    second = Member(boot, "hasty")
    membership = second.consumer._group.membership
    poll_until([second], lambda: membership.phase == Phase.JOINING and membership.member_id,
               "the second member's JoinGroup waits for the first to rejoin")
    second.close()  # gives up the JoinGroup in flight and sends LeaveGroup
    poll_until([first], lambda: first.settled and membership.generation == -1
               and len(first.events) > mark, "the first member rebalances")
    # The group never counted the second member in: no generation split the topic.
    assert first.events[mark:] == [("revoke", frozenset(partitions())),
                                   ("assign", frozenset(partitions()))]
    first.close()


CHILD = r"""
import sys
from oncelog import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "auto.offset.reset": "earliest", "enable.auto.commit": False,
              "session.timeout.ms": 3000, "heartbeat.interval.ms": 300})
c.subscribe(["orders"], on_assign=lambda c, p: print("A", len(p), flush=True))
while True:
    records = c.poll(0.1, max_records=5)
    for r in records:
        print("R", r.value.decode(), flush=True)
    if records:
        c.commit()
"""


def test_a_killed_member_s_partitions_go_to_the_others_after_its_session(group_broker):
    boot = group_broker.bootstrap
    expected = produce(boot, 0, 600)
    members = [Member(boot, "survive"), Member(boot, "survive")]
    poll_until(members, lambda: split_evenly(members), "two members share the topic")
    child = subprocess.Popen([sys.executable, "-c", CHILD, boot, "survive"],
                             stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(child.stdout.readline, "")),
                              daemon=True)
    reader.start()
    try:
        poll_until(members, lambda: any(line.startswith("A 2") for line in lines)
                   and split_evenly(members, 4), "a third member, in its own process, joins")
        expected += produce(boot, 600, 300)
        poll_until(members, lambda: sum(line.startswith("R") for line in lines) >= 20,
                   "the third member reads its share")
        child.send_signal(signal.SIGKILL)
        child.wait(WAIT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(WAIT)
    reader.join(WAIT)
    assert not reader.is_alive()
    # Killed in the middle of a print: with PYTHONUNBUFFERED (the sessions that run the
    # suite set it, and the child inherits it) print("R", value) is four write()s to the
    # pipe ("R", " ", the value, "\n"), so the child's output may end in "R" or "R " or
    # "R 123" without its newline (readline hands such a line over at the end of the
    # output only). Only that last, unfinished line is left out: its record was not
    # committed (the child commits after printing a whole poll's records), so the
    # survivors read it again.
    if lines and not lines[-1].endswith("\n"):
        unfinished = lines.pop()
        assert re.fullmatch(r"(R|A)( \d*)?", unfinished), unfinished
    assert all(re.fullmatch(r"(R|A) \d+\n", line) for line in lines), lines
    expected += produce(boot, 900, 300)
    poll_until(members, lambda: split_evenly(members), "the survivors take its partitions")
    # The coordinator handed them on when the dead member's session expired.
    assert re.search(r"member \S+ session timed out", group_broker.log_text())
    poll_until(members, lambda: set(consumed(members)) | {line.split()[1].encode()
                                                          for line in lines
                                                          if line.startswith("R")}
               >= set(expected), "every record read")
    child_values = Counter(line.split()[1].encode() for line in lines if line.startswith("R"))
    everything = consumed(members) + child_values
    assert set(everything) == set(expected), "a record was skipped"
    twice = {v for v, n in everything.items() if n > 1}
    # Only what the killed member read but had not committed yet is read again.
    assert twice <= set(child_values), twice - set(child_values)
    assert len(twice) <= 5 * 6  # one poll's worth (max_records=5) per partition at most
    for m in members:
        m.close()


def test_a_restarted_static_member_gets_its_partitions_back_without_a_rebalance(group_broker):
    boot = group_broker.bootstrap
    produce(boot, 0, 60)
    a = Member(boot, "static", **{"group.instance.id": "a"})
    b = Member(boot, "static", **{"group.instance.id": "b"})
    poll_until([a, b], lambda: split_evenly([a, b]), "two static members share the topic")
    # range orders static members by instance id
    assert a.assignment == {TopicPartition(TOPIC, p) for p in (0, 1, 2)}
    b_partitions, generation = b.assignment, a.consumer._group.membership.generation
    a_events = list(a.events)
    b.close()  # a static member sends no LeaveGroup: its place waits for session.timeout.ms
    restarted = Member(boot, "static", **{"group.instance.id": "b"})
    poll_until([a, restarted], lambda: restarted.settled, "the static member is back")
    assert restarted.assignment == b_partitions
    assert restarted.events == [("assign", frozenset(b_partitions))]
    for _ in range(20):  # a few heartbeats' time: the others see no rebalance
        a.poll()
    assert a.events == a_events and a.consumer._group.membership.generation == generation
    # The leader too (KIP-814: the coordinator tells it to skip the assignment).
    assert a.consumer._group.membership.leader == a.consumer._group.membership.member_id
    a_partitions, b_events = a.assignment, list(restarted.events)
    a.close()
    leader = Member(boot, "static", **{"group.instance.id": "a"})
    poll_until([leader, restarted], lambda: leader.settled, "the static leader is back")
    assert leader.assignment == a_partitions and leader.consumer._group.membership.skip_assignment
    for _ in range(20):
        restarted.poll()
    assert restarted.events == b_events
    assert restarted.consumer._group.membership.generation == generation
    leader.close()
    restarted.close()


def test_cooperative_sticky_moves_only_what_the_new_member_takes(group_broker):
    boot = group_broker.bootstrap
    expected = produce(boot, 0, 300)
    config = {"partition.assignment.strategy": "cooperative-sticky"}
    members = [Member(boot, "coop", **config), Member(boot, "coop", **config)]
    poll_until(members, lambda: split_evenly(members), "two members share the topic")
    before = [m.assignment for m in members]
    marks = [len(m.events) for m in members]
    newcomer = Member(boot, "coop", **config)
    everyone = [*members, newcomer]
    expected += produce(boot, 300, 300)
    poll_until(everyone, lambda: split_evenly(everyone) and sum(consumed(everyone).values())
               >= len(expected), "three members read everything")
    for m, had, mark in zip(members, before, marks, strict=True):
        kept = m.assignment
        assert kept < had and len(kept) == 2
        later = m.events[mark:]
        revoked = frozenset().union(*(p for kind, p in later if kind == "revoke"))
        assert revoked == had - kept  # only what moved was revoked
        assert not [p for kind, p in later if kind == "assign" and p]  # nothing added
        assert not [e for e in later if e[0] == "lost"]
    moved = (before[0] - members[0].assignment) | (before[1] - members[1].assignment)
    assert newcomer.assignment == moved
    counts = consumed(everyone)
    assert set(counts) == set(expected) and max(counts.values()) == 1
    for m in everyone:
        m.close()


def test_commit_and_committed_round_trip(group_broker):
    boot = group_broker.bootstrap
    produce(boot, 0, 60)
    m = Member(boot, "commits", **{"enable.auto.commit": False})
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
    assert {tp: o.offset for tp, o in answers[0][1].items()} == {tp: 10 for tp in partitions()}
    assert {tp: o.offset for tp, o in c.committed(sorted(partitions())).items()} == \
        {tp: 10 for tp in partitions()}
    c.commit({tp0: 3})
    m.close()
    # assign() with the group.id: positions from the committed offsets
    with Consumer({"bootstrap.servers": boot, "group.id": "commits",
                   "enable.auto.commit": False}) as reader:
        reader.assign([tp0, tp1])
        assert [r.offset for r in reader if r.partition == 0] == list(range(3, 10))
        reader.commit({tp1: 9})  # a commit outside any generation, to an empty group
        assert reader.committed([tp1])[tp1].offset == 9
    # assign() and auto commit: committed in the background of poll()
    with Consumer({"bootstrap.servers": boot, "group.id": "commits",
                   "auto.commit.interval.ms": 100}) as reader:
        reader.assign([tp1])
        assert [r.offset for r in reader.poll(5)] == [9]
        deadline = time.monotonic() + WAIT
        while reader.committed([tp1])[tp1].offset != 10:
            assert time.monotonic() < deadline
            reader.poll(0.05)
        for _ in range(10):
            reader.poll(0.05)
        assert len(reader._group._inflight) <= 1  # answers read: no commits piling up


def test_auto_commit_commits_positions_and_a_new_member_resumes_there(group_broker):
    boot = group_broker.bootstrap
    produce(boot, 0, 120)
    m = Member(boot, "auto", **{"auto.commit.interval.ms": 200})
    poll_until([m], lambda: len(m.values) == 120, "one member reads everything")
    poll_until([m], lambda: all(o is not None and o.offset == 20 for o in
                                m.consumer.committed(sorted(partitions())).values()),
               "positions committed in the background of poll()")
    m.close()
    produce(boot, 120, 60)
    again = Member(boot, "auto")
    poll_until([again], lambda: len(again.values) == 60, "the next member reads the rest")
    for _ in range(10):
        again.poll()
    assert sorted(again.values) == sorted(b"%d" % i for i in range(120, 180))
    again.close()


def test_a_pattern_subscription_takes_new_topics(group_broker):
    boot = group_broker.bootstrap
    create_topic(boot, "logs-a", 2)
    create_topic(boot, "other", 1)
    m = Member(boot, "patterns", topics=("^logs-.*",), **{"metadata.max.age.ms": 300})
    poll_until([m], lambda: m.settled and m.assignment == partitions("logs-a", 2),
               "the pattern's topics assigned")
    create_topic(boot, "logs-b", 1)
    poll_until([m], lambda: m.settled and m.assignment ==
               partitions("logs-a", 2) | partitions("logs-b", 1), "a new topic joins in")
    produce(boot, 0, 6, topic="logs-b", partitions=1)
    poll_until([m], lambda: len(m.values) == 6, "its records are read")
    m.close()


def test_a_subscribed_topic_created_later_is_assigned(group_broker):
    boot = group_broker.bootstrap
    m = Member(boot, "later", topics=(TOPIC, "later"))
    poll_until([m], lambda: m.settled and m.assignment == partitions(), "the existing topic")
    create_topic(boot, "later", 2)
    poll_until([m], lambda: m.settled and m.assignment == partitions() | partitions("later", 2),
               "the new topic is assigned (its leader looks again every second)")
    m.close()


def test_a_slow_handler_keeps_its_partitions_until_max_poll_interval(group_broker):
    boot = group_broker.bootstrap
    produce(boot, 0, 60)
    config = {"session.timeout.ms": 1500, "heartbeat.interval.ms": 200,
              "max.poll.interval.ms": 3500}
    slow, other = Member(boot, "slow", **config), Member(boot, "slow", **config)
    poll_until([slow, other], lambda: split_evenly([slow, other]), "two members")
    mine, mark = slow.assignment, len(slow.events)
    generation = other.consumer._group.membership.generation
    time.sleep(2.5)  # longer than a session: the heartbeat thread keeps the membership
    poll_until([slow, other], lambda: True, "one round")
    assert slow.assignment == mine and slow.events[mark:] == []
    assert other.consumer._group.membership.generation == generation
    time.sleep(4.0)  # longer than max.poll.interval.ms: it left the group
    poll_until([slow, other], lambda: split_evenly([slow, other]) and
               any(kind == "lost" for kind, _ in slow.events), "it rejoins, its partitions lost")
    assert ("lost", frozenset(mine)) in slow.events
    slow.close()
    other.close()


def test_a_second_member_with_the_same_instance_id_fences_the_first(group_broker):
    boot = group_broker.bootstrap
    first = Member(boot, "fence", **{"group.instance.id": "only"})
    poll_until([first], lambda: first.settled, "the first member joins")
    second = Member(boot, "fence", **{"group.instance.id": "only"})
    poll_until([second], lambda: second.settled, "the second takes its place")
    with pytest.raises(KafkaError) as failure:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            first.poll()
    assert failure.value.error == ErrorCode.fenced_instance_id
    first.close()
    second.close()


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_one_group_with_confluent_kafka_consumers(group_broker, strategy):
    boot = group_broker.bootstrap
    ours = Member(boot, "mixed", **{"partition.assignment.strategy": strategy})
    theirs = ConfluentConsumer({"bootstrap.servers": boot, "group.id": "mixed",
                                "auto.offset.reset": "earliest",
                                "partition.assignment.strategy": strategy,
                                "session.timeout.ms": 3000, "heartbeat.interval.ms": 300})
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
    assert shared()
    assert len(their_values) > 0 and len(ours.values) > 0
    theirs.close()
    Theirs.closed = True
    expected += produce(boot, 600, 120)
    poll_until(both, lambda: ours.settled and ours.assignment == partitions()
               and len(ours.values) + len(their_values) >= 720, "ours takes everything")
    counts = Counter(ours.values) + Counter(their_values)
    assert set(counts) == set(expected) and max(counts.values()) == 1
    ours.close()


def test_group_configuration_is_checked():
    with pytest.raises(ValueError, match="unknown consumer config"):
        Consumer({"group.id": "g", "group.remote.assignors": "uniform"})
    with pytest.raises(ValueError, match="unknown assignor"):
        Consumer({"group.id": "g", "partition.assignment.strategy": "sticky"})
    with pytest.raises(ValueError, match=r"heartbeat\.interval\.ms"):
        Consumer({"group.id": "g", "session.timeout.ms": 1000, "heartbeat.interval.ms": 1000})


def test_subscribe_needs_a_group_and_excludes_assign(group_broker):
    with Consumer({"bootstrap.servers": group_broker.bootstrap}) as c:
        with pytest.raises(ValueError, match=r"group\.id"):
            c.subscribe([TOPIC])
    with Consumer({"bootstrap.servers": group_broker.bootstrap, "group.id": "g"}) as c:
        c.assign([TopicPartition(TOPIC, 0)])
        with pytest.raises(ValueError, match="exclusive"):
            c.subscribe([TOPIC])
        c.unassign()
        c.subscribe([re.compile("ord.*")])
        with pytest.raises(ValueError, match="exclusive"):
            c.assign([TopicPartition(TOPIC, 0)])
