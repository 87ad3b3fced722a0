"""KIP-848's online migration with real clients: confluent-kafka consumers of the classic
protocol hold a group; one of the consumer protocol (``group.protocol=consumer``) joins it,
which upgrades it to a consumer group (Kafka 4's default
``group.consumer.migration.policy=bidirectional``); the broker restarts; the consumer-protocol
member leaves, which downgrades it back to a classic group. Committed offsets carry the
group through all of it: nothing is lost, nothing committed is read again."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import ConsumerGroupType
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer
from kafka.coordinator.assignors.range import RangePartitionAssignor
from support.brokers import create_topic
from support.consumer_protocol_helpers import (
    SETTINGS,
    WAIT,
    Member,
    all_records,
    end_offsets,
    produce,
    raw,
    wait_consumed,
    wait_shared,
)
from support.group_member import kafka_python_subscribe

from oncelog.protocol import api_versions as apis

GROUP = "migrating"


@pytest.fixture
def members():
    started: list[Member] = []
    yield started
    for m in started:
        m.stop()


def group_type(bootstrap: str, group: str = GROUP) -> ConsumerGroupType:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_consumer_groups().result(timeout=WAIT)
    return {g.group_id: g.type for g in listed.valid}[group]


def group_errors(group: list[Member]) -> list[dict]:
    """What the members reported, less the broker being down during its restart."""
    return [e for m in group for e in m.events if e["ev"] == "error"
            and "_TRANSPORT" not in e["error"] and "_ALL_BROKERS_DOWN" not in e["error"]]


def wait_reconciled(bootstrap: str, group: list[Member]) -> None:
    """Until the consumer group's target assignment is reached: every member holds its target
    (ConsumerGroupDescribe) and says so itself. Partitions move one revocation at a time, so
    "every partition held" (wait_shared) can come before this."""
    def described() -> dict[str, set[int]] | None:
        with raw(bootstrap) as conn:
            answer = conn.call(apis.CONSUMER_GROUP_DESCRIBE, lambda mod, v:
                               mod.ConsumerGroupDescribeRequest(
                                   group_ids=(GROUP,), include_authorized_operations=False))
        held = {}
        for m in answer.groups[0].members:
            now = {p for t in m.assignment.topic_partitions for p in t.partitions}
            target = {p for t in m.target_assignment.topic_partitions for p in t.partitions}
            if now != target:
                return None
            held[m.client_id] = now
        return held

    def reconciled(_) -> bool:
        held = described()
        return held is not None and held == {m.name: m.assignment() for m in group}
    group[0].wait_for(reconciled, "the group at its target assignment")


def test_a_consumer_member_upgrades_a_classic_group_and_its_leaving_downgrades_it(
        start_broker, members, monkeypatch):
    # Classic sessions outlast the restart and librdkafka's reconnect backoff (up to 10 s),
    # so that the members carry on with what they held.
    monkeypatch.setenv("CLASSIC_SESSION_MS", "30000")
    broker = start_broker(**SETTINGS)
    bootstrap, topic, n = broker.bootstrap, "migrated", 6
    create_topic(bootstrap, topic, n)
    produce(bootstrap, topic, n, 10)

    # Two classic members share the topic, consume it and commit.
    classic = [Member(bootstrap, GROUP, topic, f"classic{i}", protocol="classic")
               for i in range(2)]
    members.extend(classic)
    wait_shared(classic, n, "two classic members")
    ends = end_offsets(bootstrap, topic, n)
    wait_consumed(classic, ends)
    assert {**classic[0].commit(), **classic[1].commit()} == ends
    assert group_type(bootstrap) == ConsumerGroupType.CLASSIC
    before_upgrade = all_records(ends)

    # A consumer-protocol member joins: no error, the group becomes a consumer group and the
    # partitions are spread over all three.
    modern = Member(bootstrap, GROUP, topic, "modern")
    members.append(modern)
    group = [*classic, modern]
    wait_shared(group, n, "two classic members and a consumer-protocol one")
    assert group_type(bootstrap) == ConsumerGroupType.CONSUMER
    with raw(bootstrap) as conn:  # ConsumerGroupDescribe v1: 0 classic, 1 consumer member
        described = conn.call(apis.CONSUMER_GROUP_DESCRIBE, lambda mod, v:
                              mod.ConsumerGroupDescribeRequest(
                                  group_ids=(GROUP,), include_authorized_operations=False))
    assert sorted((m.client_id, m.member_type) for m in described.groups[0].members) == [
        ("classic0", 0), ("classic1", 0), ("modern", 1)]
    produce(bootstrap, topic, n, 10)
    ends = end_offsets(bootstrap, topic, n)
    wait_consumed(group, ends)
    # The new member started from the classic members' committed offsets.
    assert not modern.records() & before_upgrade
    assert {**classic[0].commit(), **classic[1].commit(), **modern.commit()} == ends

    # The broker restarts (SIGKILL): the converted group is loaded as it was.
    wait_reconciled(bootstrap, group)
    held = {m.name: m.assignment() for m in group}
    broker.restart(clean=False)
    assert group_type(bootstrap) == ConsumerGroupType.CONSUMER
    produce(bootstrap, topic, n, 10)
    ends = end_offsets(bootstrap, topic, n)
    wait_consumed(group, ends)
    assert {m.name: m.assignment() for m in group} == held
    assert {**classic[0].commit(), **classic[1].commit(), **modern.commit()} == ends
    before_downgrade = all_records(ends)

    # The consumer-protocol member leaves: the group is classic again and its classic
    # members take over its partitions from the committed offsets.
    marks = [len(m.events) for m in classic]
    modern.close()
    wait_shared(classic, n, "the classic members after the downgrade")
    assert group_type(bootstrap) == ConsumerGroupType.CLASSIC
    produce(bootstrap, topic, n, 10)
    ends = end_offsets(bootstrap, topic, n)
    wait_consumed(group, ends)
    for m, mark in zip(classic, marks, strict=True):
        read_again = {(e["p"], e["o"]) for e in m.events[mark:] if e["ev"] == "rec"}
        assert not read_again & before_downgrade, m.name
    assert {**classic[0].commit(), **classic[1].commit()} == ends
    assert not group_errors(group), group_errors(group)


class KafkaPythonMember:
    """A kafka-python consumer (classic protocol, the eager range assignor), polled by the
    test itself: its rebalances happen inside ``poll``."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
            enable_auto_commit=False, session_timeout_ms=10_000, heartbeat_interval_ms=300,
            partition_assignment_strategy=[RangePartitionAssignor])
        kafka_python_subscribe(self.consumer, topic, time.monotonic() + WAIT)
        self.read: list[tuple[int, int]] = []

    def poll_until(self, condition, what: str) -> None:
        deadline = time.monotonic() + WAIT
        while not condition():
            assert time.monotonic() < deadline, f"kafka-python: no {what} within {WAIT}s"
            for tp, records in self.consumer.poll(timeout_ms=100).items():
                self.read += [(tp.partition, r.offset) for r in records]

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}


def test_a_kafka_python_group_takes_a_consumer_protocol_member_and_goes_back(
        start_broker, members):
    broker = start_broker(**SETTINGS)
    bootstrap, topic, n, group = broker.bootstrap, "mixed", 4, "kafka-python-group"
    create_topic(bootstrap, topic, n)
    produce(bootstrap, topic, n, 5)
    classic = KafkaPythonMember(bootstrap, group, topic)
    try:
        ends = end_offsets(bootstrap, topic, n)
        classic.poll_until(lambda: all_records(ends) <= set(classic.read), "records")
        classic.consumer.commit()
        before = all_records(ends)

        # Upgrade: kafka-python (eager, subscription v0) stays a classic member.
        modern = Member(bootstrap, group, topic, "modern")
        members.append(modern)

        def shared() -> bool:
            mine, theirs = classic.assignment(), modern.assignment()
            return bool(mine and theirs) and not mine & theirs and mine | theirs == set(
                range(n))

        classic.poll_until(shared, "the partitions shared with the consumer-protocol member")
        assert group_type(bootstrap, group) == ConsumerGroupType.CONSUMER
        produce(bootstrap, topic, n, 5)
        ends = end_offsets(bootstrap, topic, n)
        classic.poll_until(lambda: all_records(ends) <= set(classic.read) | modern.records(),
                           "records")
        assert not modern.records() & before
        classic.consumer.commit()
        modern.commit()
        before = all_records(ends)

        # Downgrade: the consumer-protocol member leaves, kafka-python takes everything.
        mark = len(classic.read)
        modern.close()
        classic.poll_until(lambda: classic.assignment() == set(range(n)), "every partition")
        assert group_type(bootstrap, group) == ConsumerGroupType.CLASSIC
        produce(bootstrap, topic, n, 5)
        ends = end_offsets(bootstrap, topic, n)
        classic.poll_until(lambda: all_records(ends) - before <= set(classic.read[mark:]),
                           "records")
        assert not set(classic.read[mark:]) & before
        assert not group_errors([modern]), group_errors([modern])
    finally:
        classic.consumer.close()
