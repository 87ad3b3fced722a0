"""``oncelog groups`` (list, describe, delete, reset-offsets) and the consumer-group lines of
/metrics, against a real broker with real confluent-kafka group consumers."""

from __future__ import annotations

import datetime
import subprocess
import time
import urllib.request

import pytest
from support.broker_forks import run_oncelog
from support.brokers import START_TIMEOUT, create_topic

GROUP_SETTINGS = {"group_initial_rebalance_delay_ms": "0"}


def groups(broker, *args: str) -> subprocess.CompletedProcess:
    bootstrap = ["--bootstrap-server", broker.bootstrap] if broker is not None else []
    done = run_oncelog("groups", *args, *bootstrap)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def table(stdout: str) -> list[list[str]]:
    """The rows of a Kafka-style table: a blank line, the header, the rows."""
    lines = stdout.splitlines()
    assert lines and lines[0] == "", stdout
    return [line.split() for line in lines[1:] if line]


def metrics(broker) -> list[str]:
    with urllib.request.urlopen(broker.metrics_url, timeout=30) as answer:
        return answer.read().decode().splitlines()


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int,
            timestamp_ms: int | None = None) -> None:
    """``per_partition`` records in each partition; with ``timestamp_ms`` record i of each
    partition has timestamp timestamp_ms + 1000 * i."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(per_partition):
        for p in range(partitions):
            extra = {} if timestamp_ms is None else {"timestamp": timestamp_ms + 1000 * i}
            producer.produce(topic, b"%d-%d" % (p, i), partition=p, **extra)
    assert producer.flush(START_TIMEOUT) == 0


def join(bootstrap: str, group: str, topic: str, count: int) -> list:
    """``count`` confluent-kafka consumers subscribed to ``topic`` in ``group``, polled until
    every partition is assigned to one of them and each has an assignment."""
    from confluent_kafka import Consumer

    consumers = [Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                           "client.id": f"client-{i}", "enable.auto.commit": False,
                           "auto.offset.reset": "earliest"}) for i in range(count)]
    for c in consumers:
        c.subscribe([topic])
    deadline = time.monotonic() + START_TIMEOUT
    while not all(c.assignment() for c in consumers):
        assert time.monotonic() < deadline, "the consumers got no assignment"
        for c in consumers:
            c.poll(0.05)
    return consumers


def wait_for_state(broker, group: str, state: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        found = admin.describe_consumer_groups([group])[group].result(START_TIMEOUT)
        if found.state.name.lower().replace("_", "") == state.lower():
            return
        assert time.monotonic() < deadline, f"{group} stayed {found.state}"
        time.sleep(0.05)


def test_a_live_group_listed_described_and_refused_then_deleted_once_empty(start_broker):
    from confluent_kafka import TopicPartition

    broker = start_broker(**GROUP_SETTINGS)
    create_topic(broker.bootstrap, "orders", 3)
    produce(broker.bootstrap, "orders", 3, 10)
    consumers = join(broker.bootstrap, "live", "orders", 2)
    try:
        wait_for_state(broker, "live", "Stable")
        owner = {(tp.topic, tp.partition): c for c in consumers for tp in c.assignment()}
        assert len(owner) == 3
        committer = owner["orders", 0]
        committer.commit(offsets=[TopicPartition("orders", 0, 4)], asynchronous=False)
        members = {c.memberid(): c for c in consumers}

        assert groups(broker, "list").stdout.split() == ["live"]
        listed = groups(broker, "list", "--state")
        assert [line.split() for line in listed.stdout.splitlines()] == \
            [["GROUP", "STATE"], ["live", "Stable"]]
        assert groups(broker, "list", "--state", "empty,preparingrebalance").stdout.split() \
            == ["GROUP", "STATE"]

        described = groups(broker, "describe", "--group", "live")
        assert described.returncode == 0, described.stderr
        header, *rows = table(described.stdout)
        assert header == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET",
                          "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"]
        by_partition = {int(r[2]): r for r in rows}
        assert sorted(by_partition) == [0, 1, 2]
        for (_, p), c in owner.items():
            row = by_partition[p]
            assert row[6] == c.memberid() and row[7] == "/127.0.0.1"
            assert row[8] == f"client-{consumers.index(c)}"
            assert row[4] == "10"
            assert row[3:6:2] == (["4", "6"] if p == 0 else ["-", "-"])

        shown = groups(broker, "describe", "--group", "live", "--members", "--verbose")
        header, *rows = table(shown.stdout)
        assert header == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS",
                          "ASSIGNMENT"]
        for row in rows:
            mine = sorted(tp.partition for tp in members[row[1]].assignment())
            assert row[4] == str(len(mine))
            assert row[5] == f"orders({','.join(map(str, mine))})"
        assert sorted(r[1] for r in rows) == sorted(members)
        plain = table(groups(broker, "describe", "--group", "live", "--members").stdout)
        assert plain[0][-1] == "#PARTITIONS" and len(plain) == 3

        state = groups(broker, "describe", "--group", "live", "--state")
        assert table(state.stdout) == [
            ["GROUP", "COORDINATOR", "(ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"],
            ["live", broker.bootstrap, "(0)", "range", "Stable", "2"]]

        refused = groups(broker, "delete", "--group", "live")
        assert refused.returncode == 1
        assert "* Group 'live' could not be deleted due to: NON_EMPTY_GROUP" in refused.stderr
        active = groups(broker, "reset-offsets", "--group", "live", "--all-topics",
                        "--to-earliest", "--execute")
        assert active.returncode == 1
        assert ("Assignments can only be reset if the group 'live' is inactive, but the "
                "current state is Stable.") in active.stderr
        assert committer.committed([TopicPartition("orders", 0)], 30)[0].offset == 4

        lines = metrics(broker)
        assert 'oncelog_consumer_group_lag{group="live",topic="orders",partition="0"} 6' \
            in lines
        assert 'oncelog_consumer_group_members{group="live"} 2' in lines
        assert 'oncelog_consumer_groups{state="Stable"} 1' in lines
        assert 'oncelog_consumer_group_series_omitted{metric="lag"} 0' in lines
    finally:
        for c in consumers:
            c.close()

    wait_for_state(broker, "live", "Empty")
    empty = groups(broker, "describe", "--group", "live")
    assert empty.returncode == 0
    assert "Consumer group 'live' has no active members." in empty.stderr
    assert table(empty.stdout)[1:] == [["live", "orders", "0", "4", "10", "6", "-", "-", "-"]]
    assert groups(broker, "describe", "--group", "live", "--members").stdout == ""
    lines = metrics(broker)
    assert 'oncelog_consumer_groups{state="Empty"} 1' in lines
    assert not any(line.startswith("oncelog_consumer_group_members{") for line in lines)

    deleted = groups(broker, "delete", "--group", "live")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.strip() == \
        "Deletion of requested consumer groups ('live') was successful."
    gone = groups(broker, "describe", "--group", "live")
    assert gone.returncode == 1
    assert "Error: Consumer group 'live' does not exist." in gone.stderr
    again = groups(broker, "delete", "--group", "live")
    assert again.returncode == 1 and "GROUP_ID_NOT_FOUND" in again.stderr
    assert not any("group=\"live\"" in line for line in metrics(broker))


def committed(broker, group: str, topic: str, partitions: int) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                   START_TIMEOUT)
    finally:
        consumer.close()
    return [tp.offset for tp in found]


def plan(done: subprocess.CompletedProcess) -> dict[tuple[str, int], int]:
    assert done.returncode == 0, done.stderr
    header, *rows = table(done.stdout)
    assert header == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]
    return {(r[1], int(r[2])): int(r[3]) for r in rows}


def test_reset_offsets_every_mode_dry_run_and_execute(start_broker):
    broker = start_broker(**GROUP_SETTINGS)
    create_topic(broker.bootstrap, "t", 2)
    base = 1_700_000_000_000
    produce(broker.bootstrap, "t", 2, 10, timestamp_ms=base)

    def reset(*args: str) -> subprocess.CompletedProcess:
        return groups(broker, "reset-offsets", "--group", "g", *args)

    # A group that does not exist yet gets offsets, as with Kafka's tool.
    assert plan(reset("--topic", "t", "--to-offset", "5", "--execute")) == \
        {("t", 0): 5, ("t", 1): 5}
    assert committed(broker, "g", "t", 2) == [5, 5]

    dry = reset("--all-topics", "--to-earliest")
    assert plan(dry) == {("t", 0): 0, ("t", 1): 0}
    assert "No action will be performed" in dry.stderr
    assert plan(reset("--all-topics", "--to-earliest", "--dry-run")) == \
        {("t", 0): 0, ("t", 1): 0}
    assert committed(broker, "g", "t", 2) == [5, 5]

    def execute(*args: str, expect: list[int]) -> subprocess.CompletedProcess:
        """Both partitions reset: the plan printed is what was committed."""
        done = reset(*args, "--execute")
        assert plan(done) == {("t", 0): expect[0], ("t", 1): expect[1]}
        assert committed(broker, "g", "t", 2) == expect
        return done

    execute("--all-topics", "--to-earliest", expect=[0, 0])
    execute("--all-topics", "--to-latest", expect=[10, 10])
    execute("--topic", "t", "--to-offset", "3", expect=[3, 3])
    high = execute("--topic", "t", "--to-offset", "99", expect=[10, 10])
    assert "New offset (99) is higher than latest offset for topic partition t-0. Value will " \
        "be set to 10." in high.stderr
    low = execute("--topic", "t", "--to-offset", "-4", expect=[0, 0])
    assert "is lower than earliest offset" in low.stderr
    execute("--all-topics", "--shift-by", "7", expect=[7, 7])
    execute("--all-topics", "--shift-by", "-2", expect=[5, 5])
    execute("--all-topics", "--shift-by", "100", expect=[10, 10])
    execute("--all-topics", "--shift-by", "-100", expect=[0, 0])

    at = datetime.datetime.fromtimestamp((base + 3500) / 1000, datetime.UTC)
    execute("--all-topics", "--to-datetime", at.isoformat(), expect=[4, 4])
    execute("--all-topics", "--to-datetime", "2000-01-01T00:00:00.000+01:00", expect=[0, 0])
    future = reset("--all-topics", "--to-datetime", "2100-01-01T00:00:00Z", "--execute")
    assert plan(future) == {("t", 0): 10, ("t", 1): 10}
    assert "Warn: Partition 1 from topic t is empty. Falling back to latest known offset." \
        in future.stderr

    assert plan(reset("--topic", "t:1", "--to-offset", "2", "--execute")) == {("t", 1): 2}
    assert committed(broker, "g", "t", 2) == [10, 2]

    described = table(groups(broker, "describe", "--group", "g").stdout)
    assert described[1:] == [["g", "t", "0", "10", "10", "0", "-", "-", "-"],
                             ["g", "t", "1", "2", "10", "8", "-", "-", "-"]]

    nothing = groups(broker, "reset-offsets", "--group", "other", "--all-topics",
                     "--to-earliest", "--execute")
    assert nothing.returncode == 0 and nothing.stdout == ""
    unshiftable = groups(broker, "reset-offsets", "--group", "other", "--topic", "t",
                         "--shift-by", "1")
    assert unshiftable.returncode == 2
    assert "Cannot shift offset for partition t-0 since there is no current committed " \
        "offset" in unshiftable.stderr
    missing = reset("--topic", "t:0,5", "--to-earliest")
    assert missing.returncode == 1
    assert 'The partitions "t-5" do not exist' in missing.stderr
    unknown = reset("--topic", "nope", "--to-earliest")
    assert unknown.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in unknown.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["describe"], "one of the arguments --group --all-groups is required"),
    (["describe", "--group", "g", "--members", "--state"], "not allowed with argument"),
    (["reset-offsets", "--group", "g", "--all-topics"], "--to-earliest"),
    (["reset-offsets", "--group", "g", "--to-latest"], "--topic --all-topics"),
    (["reset-offsets", "--group", "g", "--all-topics", "--to-latest", "--dry-run",
      "--execute"], "not allowed with argument"),
    (["reset-offsets", "--group", "g", "--all-topics", "--to-offset", "ten"],
     "invalid int value"),
    (["reset-offsets", "--group", "g", "--topic", "t:x", "--to-earliest"],
     "Invalid partition 'x' specified in topic arg 't:x'"),
    (["reset-offsets", "--group", "g", "--topic", "t:1:2", "--to-earliest"],
     "Invalid topic arg 't:1:2', expected topic name and partitions"),
    (["reset-offsets", "--group", "g", "--all-topics", "--to-datetime", "yesterday"],
     "'yesterday' is not a date and time"),
    (["list", "--state", "Stable,Bogus"], "Invalid state list 'Stable,Bogus'. Valid states"),
    (["list", "--bootstrap-server", "nohost"], "is not host:port"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_are_usage_errors(args, message):
    done = groups(None, *args)
    assert done.returncode == 2, done
    assert message in done.stderr


def test_an_unreachable_broker_is_an_error_not_a_traceback():
    done = groups(None, "list", "--bootstrap-server", "127.0.0.1:1")
    assert done.returncode == 1
    assert "NETWORK_EXCEPTION" in done.stderr and "cannot connect" in done.stderr


def test_lag_series_beyond_the_limit_keep_the_largest(tmp_path, monkeypatch):
    """In process, on a real broker's topics and coordinator: the per-group series are capped
    and what was left out is counted."""
    from oncelog.broker import metrics
    from oncelog.broker.config import BrokerConfig
    from oncelog.broker.server import Broker
    from oncelog.coordinator.group.classic_group import ClassicGroup
    from oncelog.coordinator.group.group_records import OffsetValue
    from oncelog.protocol.records import encode_batch

    broker = Broker(BrokerConfig({"log.dirs": str(tmp_path)}))
    try:
        topic = broker.topics.create("lagging", 1, 1, {})
        topic.partitions[0].append_records(encode_batch([(None, b"x", (), 0)] * 100))
        broker.topics.create("idle", 1, 1, {})
        for i in range(5):
            group = ClassicGroup(f"g{i}", offsets={
                ("lagging", 0): OffsetValue(10 * i, -1, "", 0),
                ("idle", 0): OffsetValue(0, -1, "", 0)})  # never opened: no line
            broker.groups.groups[group.group_id] = group
        monkeypatch.setattr(metrics, "GROUP_SERIES_LIMIT", 3)
        lines = metrics.render(broker).splitlines()
    finally:
        broker.topics.close()
    lags = [line for line in lines if line.startswith("oncelog_consumer_group_lag{")]
    assert lags == [f'oncelog_consumer_group_lag{{group="g{i}",topic="lagging",'
                    f'partition="0"}} {100 - 10 * i}' for i in range(3)]
    assert 'oncelog_consumer_group_series_omitted{metric="lag"} 2' in lines
    assert 'oncelog_consumer_groups{state="Empty"} 5' in lines


def test_offsets_of_a_deleted_topic_go_with_it(start_broker):
    """A topic deleted and created again under the same name starts empty: a group's old
    offset for it must go too, or its consumer would resume there and skip records."""
    from confluent_kafka.admin import AdminClient

    from oncelog.client.admin.admin import Admin

    broker = start_broker(**GROUP_SETTINGS)
    create_topic(broker.bootstrap, "gone", 1)
    produce(broker.bootstrap, "gone", 1, 10)
    assert plan(groups(broker, "reset-offsets", "--group", "g", "--topic", "gone",
                       "--to-latest", "--execute")) == {("gone", 0): 10}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics(["gone"])["gone"].result(START_TIMEOUT)
    create_topic(broker.bootstrap, "gone", 1)
    produce(broker.bootstrap, "gone", 1, 20)
    with Admin({"bootstrap.servers": broker.bootstrap}) as ours:
        assert ("gone", 0) not in ours.list_group_offsets("g")


def test_a_group_of_the_consumer_protocol_is_described_through_consumer_group_describe(
        start_broker):
    """KIP-848 groups (group.protocol=consumer) are unknown to DescribeGroups: the tool asks
    ConsumerGroupDescribe, as kafka-consumer-groups.sh does."""
    from confluent_kafka import Consumer, TopicPartition

    broker = start_broker(**GROUP_SETTINGS)
    create_topic(broker.bootstrap, "next", 2)
    produce(broker.bootstrap, "next", 2, 5)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "next-gen",
                         "group.protocol": "consumer", "client.id": "kip848"})
    try:
        consumer.subscribe(["next"])
        deadline = time.monotonic() + START_TIMEOUT
        while len(consumer.assignment()) < 2:
            assert time.monotonic() < deadline, "no assignment"
            consumer.poll(0.05)
        consumer.commit(offsets=[TopicPartition("next", 1, 3)], asynchronous=False)

        assert "next-gen" in groups(broker, "list").stdout.split()
        rows = table(groups(broker, "describe", "--group", "next-gen").stdout)[1:]
        assert [r[:6] for r in rows] == [["next-gen", "next", "0", "-", "5", "-"],
                                         ["next-gen", "next", "1", "3", "5", "2"]]
        assert {r[6] for r in rows} == {consumer.memberid()} and rows[0][8] == "kip848"
        members = table(groups(broker, "describe", "--group", "next-gen", "--members",
                               "--verbose").stdout)
        assert members[1][1:] == [consumer.memberid(), "/127.0.0.1", "kip848", "2",
                                  "next(0,1)"]
        state = table(groups(broker, "describe", "--group", "next-gen", "--state").stdout)
        assert state[1][3:] == ["uniform", "Stable", "1"]
        refused = groups(broker, "reset-offsets", "--group", "next-gen", "--all-topics",
                         "--to-earliest", "--execute")
        assert refused.returncode == 1 and "current state is Stable" in refused.stderr
        assert 'oncelog_consumer_group_members{group="next-gen"} 1' in metrics(broker)
    finally:
        consumer.close()
