"""The consumer group protocol (KIP-848) with real clients: confluent-kafka consumers with
``group.protocol=consumer`` against a broker whose session timeout is made short."""

from __future__ import annotations

import datetime
import time

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    Producer,
)
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode
from support.brokers import create_topic
from support.consumer_protocol_helpers import (
    SESSION_MS,
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

from oncelog.protocol import api_versions as apis


@pytest.fixture
def members():
    started: list[Member] = []
    yield started
    for m in started:
        m.stop()


def test_members_share_a_topic_take_over_from_leavers_and_move_incrementally(
        start_broker, members):
    broker = start_broker(**SETTINGS)
    bootstrap, topic, n = broker.bootstrap, "shared", 6
    create_topic(bootstrap, topic, n)
    produce(bootstrap, topic, n, 20)
    group = [Member(bootstrap, "g1", topic, f"c{i}") for i in range(3)]
    members.extend(group)
    wait_shared(group, n, "three members sharing six partitions")
    # The members hold all six as soon as the first hand-offs are done; the uniform
    # assignor's balanced target ([2, 2, 2]) is reached once the last revocations are
    # acknowledged, a heartbeat later: wait for it rather than look at a moment in between.
    group[0].wait_for(lambda _: sorted(len(m.assignment()) for m in group) == [2, 2, 2],
                      "the uniform assignor's balanced split")
    wait_consumed(group, end_offsets(bootstrap, topic, n))

    # A member that closes leaves at once: the others take its partitions.
    group[0].close()
    wait_shared(group[1:], n, "two members after one left")
    produce(bootstrap, topic, n, 20)
    wait_consumed(group, end_offsets(bootstrap, topic, n))

    # A member killed with SIGKILL is removed after the session timeout.
    killed_at = time.monotonic()
    group[1].kill()
    survivor = group[2]
    survivor.wait_for(lambda m: m.assignment() == set(range(n)), "all partitions",
                      timeout=SESSION_MS / 1000 + WAIT)
    assert time.monotonic() - killed_at >= SESSION_MS / 1000 * 0.9
    produce(bootstrap, topic, n, 20)
    wait_consumed(group, end_offsets(bootstrap, topic, n))

    # A fourth joins: only what it receives is revoked from the survivor.
    mark = len(survivor.events)
    newcomer = Member(bootstrap, "g1", topic, "c3")
    members.append(newcomer)
    wait_shared([survivor, newcomer], n, "the newcomer's share")
    assert len(newcomer.assignment()) == 3
    assert survivor.revoked(mark) == newcomer.assignment()
    # (librdkafka calls on_assign with nothing after an incremental revocation)
    assert not [e for e in survivor.events[mark:] if e["ev"] in ("assign", "lost")
                and e["parts"]]
    produce(bootstrap, topic, n, 20)
    ends = end_offsets(bootstrap, topic, n)
    wait_consumed([*group, newcomer], ends)
    # Nothing was skipped, and commits and committed() work for both.
    assert all_records(ends) <= set().union(*(m.records() for m in [*group, newcomer]))
    committed = {**survivor.commit(), **newcomer.commit()}
    assert committed == ends
    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("g1")])
    offsets = listed["g1"].result(timeout=WAIT).topic_partitions
    assert {tp.partition: tp.offset for tp in offsets} == ends
    errors = [e for m in [*group, newcomer] for e in m.events if e["ev"] == "error"]
    assert not [e for e in errors if "Broker transport failure" not in e["error"]], errors


def test_a_broker_restart_keeps_the_group_and_its_offsets(start_broker, members):
    broker = start_broker(**SETTINGS)
    bootstrap, topic, n = broker.bootstrap, "kept", 4
    create_topic(bootstrap, topic, n)
    produce(bootstrap, topic, n, 10)
    group = [Member(bootstrap, "g2", topic, f"r{i}") for i in range(2)]
    members.extend(group)
    wait_shared(group, n, "two members")
    ends = end_offsets(bootstrap, topic, n)
    wait_consumed(group, ends)
    committed = {**group[0].commit(), **group[1].commit()}
    assert committed == ends
    before = {m.name: m.assignment() for m in group}
    marks = [len(m.events) for m in group]

    broker.restart(clean=False)  # SIGKILL, then start on the same port and data
    produce(bootstrap, topic, n, 10)
    ends = end_offsets(bootstrap, topic, n)
    wait_consumed(group, ends)
    # The members carried on with their partitions: the group was loaded, not rebuilt.
    assert {m.name: m.assignment() for m in group} == before
    for m, mark in zip(group, marks, strict=True):
        assert not m.revoked(mark)
        # Nothing consumed twice: they resumed where they were.
        consumed = [(e["p"], e["o"]) for e in m.events if e["ev"] == "rec"]
        assert len(consumed) == len(set(consumed))
    committed = {**group[0].commit(), **group[1].commit()}
    assert committed == ends
    for m in group:
        m.close()
    # A new member of the group starts from the committed offsets.
    late = Member(bootstrap, "g2", topic, "late")
    members.append(late)
    late.wait_for(lambda m: m.assignment() == set(range(n)), "all partitions")
    produce(bootstrap, topic, n, 1)
    ends2 = end_offsets(bootstrap, topic, n)
    late.wait_for(lambda m: all_records(ends2) - all_records(ends) <= m.records(),
                  "the new records")
    assert not late.records() & all_records(ends)


def test_a_static_member_comes_back_to_its_partitions(start_broker, members):
    broker = start_broker(**SETTINGS)
    bootstrap, topic, n = broker.bootstrap, "static", 4
    create_topic(bootstrap, topic, n)
    first = Member(bootstrap, "gs", topic, "s1", instance_id="i1")
    other = Member(bootstrap, "gs", topic, "s2", instance_id="i2")
    members.extend([first, other])
    wait_shared([first, other], n, "two static members")
    held, mark = first.assignment(), len(other.events)
    first.close()  # a static member leaves for now (epoch -2): its partitions wait for it
    again = Member(bootstrap, "gs", topic, "s1-again", instance_id="i1")
    members.append(again)
    again.wait_for(lambda m: m.assignment() == held, "its old partitions")
    produce(bootstrap, topic, n, 3)
    ends = end_offsets(bootstrap, topic, n)
    wait_consumed([first, other, again], ends)
    assert not [e for e in other.events[mark:] if e["ev"] != "rec" and e["parts"]]
    # A second process with the same instance id while it is in use is refused.
    dup = Member(bootstrap, "gs", topic, "s1-dup", instance_id="i1")
    members.append(dup)
    dup.wait_for(lambda m: [e for e in m.events if e["ev"] == "error"], "an error")
    assert "instance ID is still used" in str(dup.events)  # UNRELEASED_INSTANCE_ID
    assert again.assignment() == held


def heartbeat(conn, group_id: str, member_id: str, epoch: int, **fields):
    defaults = {"topic_partitions": () if epoch == 0 else None}
    if epoch == 0:
        defaults.update(rebalance_timeout=datetime.timedelta(seconds=30),
                        subscribed_topic_names=("t",))
    body = {**defaults, **fields}
    return conn.call(apis.CONSUMER_GROUP_HEARTBEAT, lambda mod, v:
                     mod.ConsumerGroupHeartbeatRequest(group_id=group_id, member_id=member_id,
                                                       member_epoch=epoch, **body))


def test_classic_and_consumer_groups_share_a_broker(start_broker, members):
    # Without online migration (test_group_migration.py has it), each keeps to its kind.
    broker = start_broker(**SETTINGS, group_consumer_migration_policy="disabled")
    bootstrap, topic, n = broker.bootstrap, "both", 2
    create_topic(bootstrap, topic, n)
    produce(bootstrap, topic, n, 5)
    modern = Member(bootstrap, "modern", topic, "m")
    classic = Member(bootstrap, "classic", topic, "c", protocol="classic")
    members.extend([modern, classic])
    ends = end_offsets(bootstrap, topic, n)
    for m in (modern, classic):
        m.wait_for(lambda m: all_records(ends) <= m.records(), "every record")
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def listed(**kw):
        result = admin.list_consumer_groups(**kw).result(timeout=WAIT)
        return {g.group_id: g for g in result.valid}

    both = listed()
    assert both["modern"].type == ConsumerGroupType.CONSUMER
    assert both["classic"].type == ConsumerGroupType.CLASSIC
    assert set(listed(types={ConsumerGroupType.CONSUMER})) == {"modern"}
    assert set(listed(types={ConsumerGroupType.CLASSIC})) >= {"classic"}
    described = admin.describe_consumer_groups(["modern"])["modern"].result(timeout=WAIT)
    assert [m.client_id for m in described.members] == ["m"]
    assert {tp.partition for tp in described.members[0].assignment.topic_partitions} == {0, 1}

    with raw(bootstrap) as conn:
        # A consumer-protocol member cannot join the active classic group, nor the other way
        # (group.consumer.migration.policy=disabled).
        answer = heartbeat(conn, "classic", "x" * 22, 0)
        assert answer.error_code == ErrorCode.group_id_not_found
        joined = conn.call(apis.JOIN_GROUP, lambda mod, v: mod.JoinGroupRequest(
            group_id="modern", session_timeout=datetime.timedelta(seconds=10),
            rebalance_timeout=datetime.timedelta(seconds=10), member_id="",
            protocol_type="consumer", protocols=(mod.JoinGroupRequestProtocol(
                name="range", metadata=b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"),)))
        assert joined.error_code == ErrorCode.inconsistent_group_protocol
        # DescribeGroups answers as Kafka 4 does for a consumer group.
        described = conn.call(apis.DESCRIBE_GROUPS, lambda mod, v: mod.DescribeGroupsRequest(
            groups=("modern",), include_authorized_operations=False))
        assert described.groups[0].error_code == ErrorCode.group_id_not_found
    # Both still work.
    produce(bootstrap, topic, n, 5)
    ends = end_offsets(bootstrap, topic, n)
    for m in (modern, classic):
        m.wait_for(lambda m: all_records(ends) <= m.records(), "every record")
    modern.close()
    result = admin.delete_consumer_groups(["modern"])["modern"]
    assert result.result(timeout=WAIT) is None
    assert "modern" not in listed()


def test_bad_heartbeats_get_kafkas_errors_and_disturb_nobody(start_broker, members):
    broker = start_broker(**SETTINGS)
    bootstrap, topic = broker.bootstrap, "t"
    create_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, 2, 3)
    bystander = Member(bootstrap, "bystander", topic, "b")
    members.append(bystander)
    bystander.wait_for(lambda m: m.assignment() == {0, 1}, "its partitions")
    E = ErrorCode
    with raw(bootstrap) as conn:
        assert heartbeat(conn, "g", "m1", 0, server_assignor="sticky").error_code \
            == E.unsupported_assignor
        assert heartbeat(conn, "g", "m1", 0, subscribed_topic_regex="t(").error_code \
            == E.invalid_regular_expression
        assert heartbeat(conn, "g", "", 0).error_code == E.invalid_request
        assert heartbeat(conn, "g", "m" * 5000, 0).error_code == E.invalid_request
        assert heartbeat(conn, "g" * 40_000, "m1", 0).error_code == E.invalid_group_id
        assert heartbeat(conn, "g", "m1", 3).error_code == E.group_id_not_found
        joined = heartbeat(conn, "g", "m1", 0, server_assignor="range")
        assert joined.error_code == E.none and joined.member_epoch >= 1
        assert joined.heartbeat_interval == datetime.timedelta(milliseconds=300)
        assert {p for t in joined.assignment.topic_partitions for p in t.partitions} == {0, 1}
        assert heartbeat(conn, "g", "m1", joined.member_epoch + 1).error_code \
            == E.fenced_member_epoch
        assert heartbeat(conn, "g", "nobody", 1).error_code == E.unknown_member_id
        assert heartbeat(conn, "g", "m1", -5).error_code == E.invalid_request
        # Offsets of a consumer group check the member epoch.
        commit = conn.call(apis.OFFSET_COMMIT, lambda mod, v: mod.OffsetCommitRequest(
            group_id="g", generation_id_or_member_epoch=joined.member_epoch + 7,
            member_id="m1", topics=(mod.OffsetCommitRequestTopic(name=topic, partitions=(
                mod.OffsetCommitRequestPartition(partition_index=0, committed_offset=1,
                                                 committed_metadata=None),)),)))
        assert commit.topics[0].partitions[0].error_code == E.stale_member_epoch
        left = heartbeat(conn, "g", "m1", -1)
        assert left.error_code == E.none and left.member_epoch == -1
        described = conn.call(apis.CONSUMER_GROUP_DESCRIBE, lambda mod, v:
                              mod.ConsumerGroupDescribeRequest(
                                  group_ids=("g", "bystander", "missing"),
                                  include_authorized_operations=False))
        g, by, missing = described.groups
        assert (g.error_code, g.group_state, g.members) == (E.none, "Empty", ())
        assert by.group_state == "Stable" and by.assignor_name == "uniform"
        assert [m.client_id for m in by.members] == ["b"]
        assert missing.error_code == E.group_id_not_found
    produce(bootstrap, topic, 2, 3)
    ends = end_offsets(bootstrap, topic, 2)
    bystander.wait_for(lambda m: all_records(ends) <= m.records(), "every record")
    assert not bystander.revoked()


def test_a_regex_subscription_takes_new_topics(start_broker, members):
    broker = start_broker(**SETTINGS)
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "logs-a", 1)
    create_topic(bootstrap, "metrics", 1)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "rx",
                         "group.protocol": "consumer", "auto.offset.reset": "earliest",
                         "topic.metadata.refresh.interval.ms": 500})
    try:
        consumer.subscribe(["^logs-.*"])
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and not consumer.assignment():
            consumer.poll(0.1)
        assert {tp.topic for tp in consumer.assignment()} == {"logs-a"}
        create_topic(bootstrap, "logs-b", 2)  # matched when it appears
        producer = Producer({"bootstrap.servers": bootstrap})
        for name in ("logs-a", "logs-b", "metrics"):
            producer.produce(name, name.encode())
        assert producer.flush(WAIT) == 0
        seen: set[str] = set()
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and seen != {"logs-a", "logs-b"}:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                seen.add(msg.topic())
        assert seen == {"logs-a", "logs-b"}
        assert {tp.topic for tp in consumer.assignment()} == {"logs-a", "logs-b"}
        with raw(bootstrap) as conn:
            described = conn.call(apis.CONSUMER_GROUP_DESCRIBE, lambda mod, v:
                                  mod.ConsumerGroupDescribeRequest(
                                      group_ids=("rx",), include_authorized_operations=False))
        (member,) = described.groups[0].members
        assert "^logs-.*" in member.subscribed_topic_regex  # resolved by the broker
    finally:
        consumer.close()
