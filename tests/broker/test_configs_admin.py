"""Configuration after creation (issue 16): AlterConfigs, IncrementalAlterConfigs and
DescribeConfigs for topics and the broker, from kafka-python, confluent-kafka and oncelog's
Admin, each outcome read back through another client or after a restart; changes in effect
while producers run; compression.type recompression; bad input changes nothing."""

from __future__ import annotations

import threading
import time

import kafka
import kafka.admin
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigSource,
    ResourceType,
)
from confluent_kafka.admin import ConfigResource as CResource
from kio.schema.errors import ErrorCode
from support.broker_forks import run_oncelog
from support.brokers import batches_on_disk, create_topic, read_to_end, wait_for_log_start

from oncelog import Admin, AlterConfigOp, ConfigResource, Consumer, KafkaError, TopicPartition
from oncelog.client.network import calls
from oncelog.client.network.connection import connect
from oncelog.protocol import records

TIMEOUT = 20.0  # seconds: the bound on every wait in this file


def _confluent(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap})


def _kp(bootstrap):
    return kafka.KafkaAdminClient(bootstrap_servers=bootstrap,
                                  request_timeout_ms=int(TIMEOUT * 1000))


def _confluent_describe(admin, kind, name) -> dict:
    resource = CResource(kind, name)
    entries = admin.describe_configs([resource], request_timeout=TIMEOUT)[resource].result(
        TIMEOUT)
    return {k: (e.value, ConfigSource(e.source).name) for k, e in entries.items()}


def _overrides(bootstrap, topic) -> dict[str, str | None]:
    """A topic's overrides as oncelog's Admin reads them."""
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        entries = admin.describe_configs([ConfigResource("topic", topic)])[
            ConfigResource("topic", topic)]
    return {k: e.value for k, e in entries.items() if e.source == "TOPIC_CONFIG"}


def test_topic_configs_from_three_clients(broker):
    topic = "cfg-topic"
    create_topic(broker.bootstrap, topic)
    # kafka-python, AlterConfigs (the whole set): read back by confluent-kafka
    kp = _kp(broker.bootstrap)
    try:
        answer = kp.alter_configs([kafka.admin.ConfigResource(
            "TOPIC", topic, {"retention.ms": "3600000", "cleanup.policy": "delete"})],
            incremental=False)
        assert answer["topic"][topic] == "OK", answer
    finally:
        kp.close()
    described = _confluent_describe(_confluent(broker.bootstrap), ResourceType.TOPIC, topic)
    assert described["retention.ms"] == ("3600000", "DYNAMIC_TOPIC_CONFIG")  # its name
    assert described["segment.bytes"] == (str(1 << 30), "DEFAULT_CONFIG")

    # confluent-kafka, incremental SET + APPEND: read back by oncelog's Admin
    admin = _confluent(broker.bootstrap)
    resource = CResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", "500000",
                    incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
    ])
    assert admin.incremental_alter_configs([resource])[resource].result(TIMEOUT) is None
    assert _overrides(broker.bootstrap, topic) == {
        "retention.ms": "3600000", "cleanup.policy": "delete,compact",
        "max.message.bytes": "500000"}

    # oncelog's Admin, incremental DELETE + SUBTRACT, then validate_only: read by kafka-python
    with Admin({"bootstrap.servers": broker.bootstrap}) as ours:
        res = ConfigResource("topic", topic)
        assert ours.incremental_alter_configs({res: [
            AlterConfigOp("retention.ms", "DELETE"),
            AlterConfigOp("cleanup.policy", "SUBTRACT", "delete")]}) == {res: None}
        assert ours.alter_configs({res: {"retention.ms": "1"}}, validate_only=True) == \
            {res: None}
    kp = _kp(broker.bootstrap)
    try:
        seen = kp.describe_configs([kafka.admin.ConfigResource("TOPIC", topic)],
                                   config_filter="all")["topic"][topic]
    finally:
        kp.close()
    assert seen["cleanup.policy"]["value"] == "compact"
    assert seen["max.message.bytes"]["value"] == "500000"
    assert seen["retention.ms"]["value"] == str(168 * 3_600_000)  # back to the broker's
    assert seen["compression.type"]["value"] == "producer"

    # and after a restart
    broker.restart()
    assert _overrides(broker.bootstrap, topic) == {"cleanup.policy": "compact",
                                                   "max.message.bytes": "500000"}


def test_broker_dynamic_configs_sources_and_restart(start_broker):
    broker = start_broker(log_retention_hours="100")
    # the cluster-wide default from oncelog's Admin (kafka-python and librdkafka cannot name
    # the default entity ""), this broker's values from kafka-python and confluent-kafka
    with Admin({"bootstrap.servers": broker.bootstrap}) as ours:
        default = ConfigResource("broker", "")
        assert ours.alter_configs({default: {
            "log.retention.ms": "7200000", "message.max.bytes": "600000"}}) == {default: None}
    kp = _kp(broker.bootstrap)
    try:
        answer = kp.alter_configs([kafka.admin.ConfigResource(
            "BROKER", "0", {"log.cleaner.backoff.ms": "2000"})])
        assert answer["broker"]["0"] == "OK", answer
    finally:
        kp.close()
    admin = _confluent(broker.bootstrap)
    resource = CResource(ResourceType.BROKER, "0", incremental_configs=[
        ConfigEntry("message.max.bytes", "700000", incremental_operation=AlterConfigOpType.SET)])
    assert admin.incremental_alter_configs([resource])[resource].result(TIMEOUT) is None
    described = _confluent_describe(admin, ResourceType.BROKER, "0")
    assert described["log.cleaner.backoff.ms"] == ("2000", "DYNAMIC_BROKER_CONFIG")

    def check(bootstrap):
        with Admin({"bootstrap.servers": bootstrap}) as ours:
            this, default = ConfigResource("broker", "0"), ConfigResource("broker", "")
            got = ours.describe_configs([this, default], include_synonyms=True,
                                        include_documentation=True)
        entries = got[this]
        mmb = entries["message.max.bytes"]
        assert (mmb.value, mmb.source, mmb.read_only) == ("700000", "DYNAMIC_BROKER_CONFIG",
                                                          False)
        assert [(s.name, s.value, s.source) for s in mmb.synonyms] == [
            ("message.max.bytes", "700000", "DYNAMIC_BROKER_CONFIG"),
            ("message.max.bytes", "600000", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
            ("message.max.bytes", "1048588", "DEFAULT_CONFIG")]
        hours = entries["log.retention.hours"]
        assert (hours.value, hours.source) == ("100", "STATIC_BROKER_CONFIG")
        ms = entries["log.retention.ms"]
        assert (ms.value, ms.source) == ("7200000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
        assert [s.name for s in ms.synonyms] == ["log.retention.ms", "log.retention.hours",
                                                 "log.retention.hours"]
        assert entries["listeners"].read_only and not entries["log.segment.bytes"].read_only
        assert entries["advertised.listeners"].value is None  # unset is null
        assert entries["log.roll.ms"].value is None
        assert entries["log.segment.bytes"].config_type == "INT"
        assert entries["log.segment.bytes"].documentation
        # the default entity lists what is set there only
        assert {k: e.value for k, e in got[default].items()} == {
            "log.retention.ms": "7200000", "message.max.bytes": "600000"}

    check(broker.bootstrap)
    # a topic without overrides takes the dynamic values, and says where from
    create_topic(broker.bootstrap, "cfg-follows")
    described = _confluent_describe(admin, ResourceType.TOPIC, "cfg-follows")
    assert described["retention.ms"] == ("7200000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    assert described["max.message.bytes"] == ("700000", "DYNAMIC_BROKER_CONFIG")
    broker.restart()
    check(broker.bootstrap)
    # DELETE goes back to the next level
    with Admin({"bootstrap.servers": broker.bootstrap}) as ours:
        this = ConfigResource("broker", "0")
        assert ours.incremental_alter_configs(
            {this: [AlterConfigOp("message.max.bytes", "DELETE")]}) == {this: None}
    described = _confluent_describe(_confluent(broker.bootstrap), ResourceType.BROKER, "0")
    assert described["message.max.bytes"] == ("600000", "DYNAMIC_DEFAULT_BROKER_CONFIG")


def _bad_requests():
    """(resource type, name, ops, the key the message must name)."""
    return [
        ("topic", "cfg-bad", [("no.such.key", "SET", "1")], "no.such.key"),
        ("topic", "cfg-bad", [("retention.ms", "SET", "soon")], "retention.ms"),
        ("topic", "cfg-bad", [("retention.ms", "SET", "1000"),
                              ("segment.bytes", "SET", "-5")], "segment.bytes"),
        ("topic", "cfg-bad", [("retention.ms", "APPEND", "5")], "retention.ms"),
        ("topic", "cfg-bad", [("compression.type", "SET", "brotli")], "compression.type"),
        ("topic", "cfg-bad", [("remote.storage.enable", "SET", "true")],
         "remote.storage.enable"),
        ("broker", "0", [("listeners", "SET", "PLAINTEXT://127.0.0.1:1")], "listeners"),
        ("broker", "0", [("log.segment.bytes", "SET", "2000000"),
                         ("log.dirs", "SET", "/tmp/x")], "log.dirs"),
        ("broker", "", [("message.max.bytes", "SET", "big")], "message.max.bytes"),
        ("broker", "", [("no.such.key", "SET", "1")], "no.such.key"),
        ("broker", "0", [("log.cleaner.min.compaction.lag.ms", "SET", "10"),
                         ("log.cleaner.max.compaction.lag.ms", "SET", "5")],
         "compaction.lag.ms"),
    ]


def test_bad_input_is_invalid_config_and_changes_nothing(broker):
    create_topic(broker.bootstrap, "cfg-bad")
    with Admin({"bootstrap.servers": broker.bootstrap}) as ours:
        before = ours.describe_configs([ConfigResource("topic", "cfg-bad"),
                                        ConfigResource("broker", "0")])
        for kind, name, ops, key in _bad_requests():
            res = ConfigResource(kind, name)
            for validate_only in (True, False):
                error = ours.incremental_alter_configs(
                    {res: [AlterConfigOp(*op) for op in ops]}, validate_only)[res]
                assert error is not None and error.code() == ErrorCode.invalid_config, \
                    (ops, error)
                assert key in str(error), (key, str(error))
            # AlterConfigs too, where the ops are SETs
            if all(op == "SET" for _, op, _ in ops):
                error = ours.alter_configs({res: {k: v for k, _, v in ops}})[res]
                assert error is not None and error.code() == ErrorCode.invalid_config
        twice = ours.incremental_alter_configs({ConfigResource("topic", "cfg-bad"): [
            AlterConfigOp("retention.ms", "SET", "1"),
            AlterConfigOp("retention.ms", "DELETE")]})
        assert twice[ConfigResource("topic", "cfg-bad")].code() == ErrorCode.invalid_request
        missing = ours.incremental_alter_configs({ConfigResource("topic", "cfg-nope"): [
            AlterConfigOp("retention.ms", "SET", "1")]})
        assert missing[ConfigResource("topic", "cfg-nope")].code() == \
            ErrorCode.unknown_topic_or_partition
        after = ours.describe_configs([ConfigResource("topic", "cfg-bad"),
                                       ConfigResource("broker", "0")])
    assert after == before
    # the same refusals through confluent-kafka and kafka-python
    admin = _confluent(broker.bootstrap)
    resource = CResource(ResourceType.TOPIC, "cfg-bad", incremental_configs=[
        ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("segment.bytes", "x", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as caught:
        admin.incremental_alter_configs([resource])[resource].result(TIMEOUT)
    assert caught.value.args[0].code() == ErrorCode.invalid_config
    assert "segment.bytes" in caught.value.args[0].str()
    kp = _kp(broker.bootstrap)
    try:
        answer = kp.alter_configs([kafka.admin.ConfigResource(
            "BROKER", "0", {"listeners": "PLAINTEXT://127.0.0.1:1"})], raise_on_unknown=False)
    finally:
        kp.close()
    assert "InvalidConfig" in answer["broker"]["0"] and "listeners" in answer["broker"]["0"]
    assert _overrides(broker.bootstrap, "cfg-bad") == {}


def _idempotent_producer(bootstrap, **extra):
    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                     "linger.ms": 5, **extra})


def test_dynamic_changes_apply_while_producing(start_broker):
    broker = start_broker(log_retention_check_interval_ms="100")
    topic, aged = "cfg-live", "cfg-aged"
    create_topic(broker.bootstrap, topic)
    create_topic(broker.bootstrap, aged)
    acked: list[bytes] = []
    errors: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        producer = _idempotent_producer(broker.bootstrap)

        def done(err, msg):
            if err is None:
                acked.append(msg.value())
            else:
                errors.append(err.str())

        n = 0
        while not stop.is_set():
            producer.produce(topic, b"%08d" % n + b"x" * 200, callback=done)
            n += 1
            if n % 50 == 0:
                producer.poll(0)
                time.sleep(0.005)
        assert producer.flush(TIMEOUT) == 0

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(acked) < 300 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(batches_on_disk_segments(broker, topic)) == 1
        with Admin({"bootstrap.servers": broker.bootstrap}) as ours:
            res = ConfigResource("topic", topic)
            assert ours.incremental_alter_configs(
                {res: [AlterConfigOp("internal.segment.bytes", "SET", "20000")]}) == {res: None}
            # the next batches go to new segments: rolled at the new size
            deadline = time.monotonic() + 2 * TIMEOUT
            while len(batches_on_disk_segments(broker, topic)) < 3:
                assert time.monotonic() < deadline, "no roll at the new segment.bytes"
                time.sleep(0.05)
    finally:
        stop.set()
        thread.join(TIMEOUT)
    assert not errors, errors[:3]
    # max.message.bytes lower: the next batch bigger than it is refused
    with Admin({"bootstrap.servers": broker.bootstrap}) as ours:
        res = ConfigResource("topic", topic)
        assert ours.incremental_alter_configs(
            {res: [AlterConfigOp("max.message.bytes", "SET", "1000")]}) == {res: None}
    with connect(broker.bootstrap, timeout=TIMEOUT) as conn:
        big = records.encode_batch([(None, b"y" * 2000, (), int(time.time() * 1000))])
        with pytest.raises(KafkaError) as caught:
            calls.produce(conn, topic, 0, big)
        assert caught.value.code() == ErrorCode.message_too_large
        small = records.encode_batch([(None, b"z" * 100, (), int(time.time() * 1000))])
        calls.produce(conn, topic, 0, small)
    # nothing acknowledged was lost, nothing doubled
    values = [v for _, v in read_to_end(broker.bootstrap, topic)[0]]
    assert values[:-1] == acked and values[-1] == b"z" * 100

    # retention shorter, in effect without a restart: old segments go
    with connect(broker.bootstrap, timeout=TIMEOUT) as conn:
        old = int(time.time() * 1000) - 3_600_000
        for i in range(5):
            calls.produce(conn, aged, 0, records.encode_batch([(None, b"%d" % i, (), old)]))
    with Admin({"bootstrap.servers": broker.bootstrap}) as ours:
        res = ConfigResource("topic", aged)
        assert ours.incremental_alter_configs({res: [
            AlterConfigOp("internal.segment.bytes", "SET", "100"),
            AlterConfigOp("retention.ms", "SET", "60000")]}) == {res: None}
    with connect(broker.bootstrap, timeout=TIMEOUT) as conn:  # rolls the old ones behind it
        now = int(time.time() * 1000)
        calls.produce(conn, aged, 0, records.encode_batch([(None, b"new", (), now)]))
    assert wait_for_log_start(broker.bootstrap, aged, 0) == 5
    with Consumer({"bootstrap.servers": broker.bootstrap}) as consumer:
        consumer.assign([TopicPartition(aged, 0)])
        assert consumer.watermarks(TopicPartition(aged, 0)) == (5, 6)  # b"new" is kept


def batches_on_disk_segments(broker, topic) -> list[str]:
    directory = broker.data_dir / f"{topic}-0"
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".log"))


def test_recompression_to_the_topic_codec(broker):
    topic = "cfg-zstd"
    admin = _confluent(broker.bootstrap)
    from confluent_kafka.admin import NewTopic
    admin.create_topics([NewTopic(topic, 1, 1, config={"compression.type": "zstd"})])[
        topic].result(TIMEOUT)
    producer = _idempotent_producer(broker.bootstrap, **{"compression.type": "gzip"})
    sent = [b"value-%d-" % i + b"abc" * (i % 50) for i in range(500)]
    for i, value in enumerate(sent):
        producer.produce(topic, value, key=b"k%d" % (i % 7))
    assert producer.flush(TIMEOUT) == 0
    stored = batches_on_disk(broker, topic, 0)
    assert stored and all(h.compression == records.ZSTD for h in stored)
    assert all(h.producer_id >= 0 and h.base_sequence >= 0 for h in stored)
    assert [v for _, v in read_to_end(broker.bootstrap, topic)[0]] == sent
    consumer = kafka.KafkaConsumer(topic, bootstrap_servers=broker.bootstrap,
                                   auto_offset_reset="earliest", consumer_timeout_ms=5000)
    try:
        got = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < len(sent) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                got += [(m.key, m.value) for m in batch]
    finally:
        consumer.close()
    assert got == [(b"k%d" % (i % 7), v) for i, v in enumerate(sent)]

    # a retry of a recompressed batch is still a duplicate
    with connect(broker.bootstrap, timeout=TIMEOUT) as conn:
        pid, epoch = calls.init_producer_id(conn)
        now = int(time.time() * 1000)
        batch = records.encode_batch([(b"r", b"retry-%d" % i, (), now) for i in range(10)],
                                     compression=records.GZIP, producer_id=pid,
                                     producer_epoch=epoch, base_sequence=0)
        first = calls.produce(conn, topic, 0, batch)
        assert calls.produce(conn, topic, 0, batch) == first
    stored = batches_on_disk(broker, topic, 0)
    assert stored[-1].producer_id == pid and stored[-1].compression == records.ZSTD
    assert stored[-1].records_count == 10 and len([h for h in stored
                                                   if h.producer_id == pid]) == 1
    # producer keeps each batch as sent again, at once
    with Admin({"bootstrap.servers": broker.bootstrap}) as ours:
        res = ConfigResource("topic", topic)
        assert ours.incremental_alter_configs(
            {res: [AlterConfigOp("compression.type", "DELETE")]}) == {res: None}
    with connect(broker.bootstrap, timeout=TIMEOUT) as conn:
        calls.produce(conn, topic, 0, records.encode_batch(
            [(None, b"as-sent", (), int(time.time() * 1000))], compression=records.GZIP))
    assert batches_on_disk(broker, topic, 0)[-1].compression == records.GZIP
    values = [v for _, v in read_to_end(broker.bootstrap, topic)[0]]
    assert values[len(sent):] == [b"retry-%d" % i for i in range(10)] + [b"as-sent"]


def test_log_append_time_and_timestamp_bounds_at_once(broker):
    topic = "cfg-time"
    create_topic(broker.bootstrap, topic)
    old = int(time.time() * 1000) - 10 * 86_400_000
    with connect(broker.bootstrap, timeout=TIMEOUT) as conn:
        calls.produce(conn, topic, 0, records.encode_batch([(None, b"a", (), old)]))
        with Admin({"bootstrap.servers": broker.bootstrap}) as ours:
            res = ConfigResource("topic", topic)
            assert ours.incremental_alter_configs(
                {res: [AlterConfigOp("message.timestamp.before.max.ms", "SET",
                                     "86400000")]}) == {res: None}
            with pytest.raises(KafkaError) as caught:
                calls.produce(conn, topic, 0, records.encode_batch([(None, b"b", (), old)]))
            assert caught.value.code() == ErrorCode.invalid_timestamp
            assert ours.incremental_alter_configs(
                {res: [AlterConfigOp("message.timestamp.type", "SET", "LogAppendTime")]}) == \
                {res: None}
        before = int(time.time() * 1000)
        calls.produce(conn, topic, 0, records.encode_batch([(None, b"c", (), old)]))
    last = batches_on_disk(broker, topic, 0)[-1]
    assert last.attributes & 0x08 and last.max_timestamp >= before


def test_cli_configs(broker):
    create_topic(broker.bootstrap, "cfg-cli")

    def run(*args):
        return run_oncelog("configs", *args, "--bootstrap-server", broker.bootstrap,
                           timeout=TIMEOUT)

    done = run("alter", "--entity-type", "topics", "--entity-name", "cfg-cli",
               "--add-config", "retention.ms=60000,cleanup.policy=[delete,compact]")
    assert done.returncode == 0, done.stderr
    shown = run("--describe", "--entity-type", "topics", "--entity-name", "cfg-cli")
    assert shown.returncode == 0, shown.stderr
    assert "Dynamic configs for topic cfg-cli are:" in shown.stdout
    assert "  cleanup.policy=delete,compact sensitive=false synonyms={TOPIC_CONFIG:" \
           "cleanup.policy=delete,compact, DEFAULT_CONFIG:log.cleanup.policy=delete}" \
           in shown.stdout
    assert "segment.bytes" not in shown.stdout
    done = run("--alter", "--entity-type", "brokers", "--entity-default",
               "--add-config", "log.retention.ms=90000000", "--delete-config", "log.segment.bytes")
    assert done.returncode == 0, done.stderr
    shown = run("describe", "--entity-type", "brokers", "--entity-name", "0", "--all")
    assert "All configs for broker 0 are:" in shown.stdout
    assert "  log.retention.ms=90000000 sensitive=false synonyms={" \
           "DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=90000000" in shown.stdout
    assert "  advertised.listeners=null " in shown.stdout
    refused = run("alter", "--entity-type", "brokers", "--entity-name", "0",
                  "--add-config", "broker.id=3")
    assert refused.returncode == 1 and "broker.id" in refused.stderr
