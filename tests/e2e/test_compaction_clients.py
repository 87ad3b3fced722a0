"""Log compaction end to end with clients we did not write: an idempotent confluent-kafka
producer writes keyed records (and tombstones) to a compacted topic, the broker's cleaner
compacts it, then confluent-kafka, kafka-python and kcat read exactly the latest record of
each key at its original offset (tombstones included, within delete.retention.ms), and the
same producer goes on producing without an error or a duplicate."""

from __future__ import annotations

import json
import subprocess
import time

import kafka
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource
from support.brokers import BrokerProcess, read_to_end
from support.compaction_clients_helpers import (
    TIMEOUT,
    TOPIC,
    create_compacted,
    produce,
    wait_until_cleaned,
)
from support.hostile_clients import metrics, wait_for_metrics

KEYS = 25


def describe(bootstrap: str) -> dict[str, tuple[str, bool]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, TOPIC)
    entries = admin.describe_configs([resource])[resource].result(TIMEOUT)
    return {name: (entry.value, entry.is_default) for name, entry in entries.items()}


def kcat_records(bootstrap: str) -> list[tuple[int, bytes, bytes | None]]:
    done = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", TOPIC, "-p", "0",
                           "-o", "beginning", "-e", "-J", "-q"],
                          capture_output=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    found = []
    for line in done.stdout.splitlines():
        message = json.loads(line)
        payload = message["payload"]
        found.append((message["offset"], message["key"].encode(),
                      None if payload is None else payload.encode()))
    return found


def kafka_python_records(bootstrap: str, end: int) -> list[tuple[int, bytes, bytes | None]]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                   enable_auto_commit=False, auto_offset_reset="earliest")
    found = []
    try:
        partition = kafka.TopicPartition(TOPIC, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        deadline = time.monotonic() + TIMEOUT
        while consumer.position(partition) < end and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                found += [(m.offset, m.key, m.value) for m in batch]
    finally:
        consumer.close()
    return found


def test_clients_read_the_latest_value_of_each_key_after_compaction(start_broker):
    broker = start_broker(log_cleaner_backoff_ms=100)
    create_compacted(broker.bootstrap)
    described = describe(broker.bootstrap)
    assert described["min.cleanable.dirty.ratio"] == ("0.01", False)
    assert described["delete.retention.ms"] == ("600000", False)
    assert described["min.compaction.lag.ms"] == ("0", True)
    assert described["max.compaction.lag.ms"] == (str((1 << 63) - 1), True)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                         "compression.type": "lz4", "linger.ms": 2})
    written: list[tuple[bytes, bytes | None]] = []
    for round_ in range(12):
        written += [(b"key-%02d" % k, None if (k + round_) % 11 == 0 else
                     b"value-%d-%d-" % (k, round_) + b"x" * 40) for k in range(KEYS)]
    offsets = produce(producer, written)
    # records with keys of their own, to roll every keyed record out of the active segment
    offsets += produce(producer, [(b"end-%d" % i, b"e" * 1500) for i in range(3)])
    written += [(b"end-%d" % i, b"e" * 1500) for i in range(3)]
    wait_until_cleaned(broker, broker.data_dir / f"{TOPIC}-0")

    latest = {key: (offset, value) for (key, value), offset in zip(written, offsets,
                                                                   strict=True)}
    expected = sorted((offset, key, value) for key, (offset, value) in latest.items())
    assert any(value is None for _, _, value in expected)  # tombstones, kept for now
    found = read_to_end(broker.bootstrap, TOPIC)[0]
    assert found == [(offset, value) for offset, _, value in expected]
    assert kcat_records(broker.bootstrap) == expected
    assert kafka_python_records(broker.bootstrap, offsets[-1] + 1) == expected
    samples = metrics(broker.metrics_port)
    assert samples["oncelog_log_cleaner_runs_total"] >= 1
    assert samples["oncelog_log_cleaner_removed_records_total"] > 0

    # the same idempotent producer goes on: no error, no duplicate, offsets run on
    more = [(b"key-%02d" % k, b"after-%d" % k) for k in range(KEYS)]
    after = produce(producer, more)
    assert after == list(range(offsets[-1] + 1, offsets[-1] + 1 + KEYS))
    tail = read_to_end(broker.bootstrap, TOPIC)[0]
    assert tail[-KEYS:] == [(o, v) for o, (_, v) in zip(after, more, strict=True)]
    assert len(tail) == len(found) + KEYS


def test_a_full_disk_during_cleaning_leaves_the_log_in_use(tmp_path):
    """The broker's disk refuses every write of a cleaned segment (ENOSPC, through
    ONCELOG_DISK_FAULTS): each clean fails, is counted and retried after the backoff; the
    log stays in use, readers get every latest value, the producer goes on."""
    broker = BrokerProcess(tmp_path / "full", {"log.cleaner.backoff.ms": "50"},
                           env={"ONCELOG_DISK_FAULTS": "write:.log.cleaned:0:ENOSPC"}).start()
    try:
        create_compacted(broker.bootstrap)
        producer = Producer({"bootstrap.servers": broker.bootstrap,
                             "enable.idempotence": True, "batch.num.messages": 25})
        written = [(b"key-%02d" % (i % KEYS), b"value-%d-" % i + b"x" * 60)
                   for i in range(40 * KEYS)]
        offsets = produce(producer, written)
        wait_for_metrics(broker.metrics_port,
                         lambda s: s["oncelog_log_cleaner_failures_total"] >= 2,
                         what="two failed cleans")
        found = dict(read_to_end(broker.bootstrap, TOPIC)[0])
        for offset, value in found.items():
            assert written[offset][1] == value
        latest = {key: offset for (key, _), offset in zip(written, offsets, strict=True)}
        assert set(latest.values()) <= set(found)
        assert produce(producer, [(b"key-00", b"after")]) == [offsets[-1] + 1]
        assert "No space left on device" in broker.log_text()
    finally:
        broker.stop()
    assert "Traceback" not in broker.log_text()


def test_committed_offsets_survive_the_compaction_of_the_offsets_topic(start_broker):
    """__consumer_offsets is compacted by the same cleaner: after many commits are cleaned
    away and the broker is killed and restarted, the group's last commit is what it fetches."""
    from confluent_kafka import Consumer, TopicPartition

    broker = start_broker(log_cleaner_backoff_ms=50, offsets_topic_num_partitions=1,
                          offsets_topic_segment_bytes=4096)
    create_compacted(broker.bootstrap)
    config = {"bootstrap.servers": broker.bootstrap, "group.id": "cleaned",
              "enable.auto.commit": False}
    consumer = Consumer(config)
    try:
        for offset in range(1, 301):
            consumer.commit(offsets=[TopicPartition(TOPIC, 0, offset)], asynchronous=False)
    finally:
        consumer.close()
    offsets_dir = broker.data_dir / "__consumer_offsets-0"
    wait_until_cleaned(broker, offsets_dir)
    assert len(read_to_end(broker.bootstrap, "__consumer_offsets")[0]) < 300
    broker.kill()
    broker.start()
    consumer = Consumer(config)
    try:
        committed = consumer.committed([TopicPartition(TOPIC, 0)], timeout=TIMEOUT)
    finally:
        consumer.close()
    assert committed[0].offset == 300
