"""A log directory whose fsync fails goes offline, as Kafka's does, and comes back at restart.

The broker runs with an injected fault (ONCELOG_DISK_FAULTS, see log/disk.py): after some
successful fsyncs of segment files, every further one fails with EIO. Then produce and fetch
answer KAFKA_STORAGE_ERROR, nothing that was not durable is acknowledged, the rest of the
broker (Metadata, /metrics) keeps serving, and after a restart without the fault everything
acknowledged is there exactly once.
"""

from __future__ import annotations

import time
import urllib.request

import pytest
from confluent_kafka import KafkaError, Producer
from kio.schema.errors import ErrorCode
from support.brokers import BrokerProcess, create_topic

from oncelog import Consumer as OncelogConsumer
from oncelog import TopicPartition as OncelogPartition
from oncelog.client.network.connection import KafkaError as OncelogError

TOPIC = "failing"


def produce_each(bootstrap: str, values: list[bytes]) -> tuple[dict, dict]:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "message.timeout.ms": 2000, "linger.ms": 0})
    delivered: dict[bytes, int] = {}
    failed: dict[bytes, KafkaError] = {}

    def report(err, msg):
        if err is None:
            delivered[msg.value()] = msg.offset()
        else:
            failed[msg.value()] = err

    for value in values:
        producer.produce(TOPIC, value=value, on_delivery=report)
        producer.flush(10)  # one at a time: each its own fsync
        if len(failed) >= 2:
            break
    assert producer.flush(30) == 0
    return delivered, failed


def metrics(broker) -> str:
    with urllib.request.urlopen(broker.metrics_url, timeout=10) as answer:
        return answer.read().decode()


def read_values(bootstrap: str) -> list[bytes]:
    """Everything in the partition, with oncelog's consumer (it raises a fetch error where
    librdkafka would retry KAFKA_STORAGE_ERROR quietly)."""
    consumer = OncelogConsumer({"bootstrap.servers": bootstrap})
    try:
        tp = OncelogPartition(TOPIC, 0)
        consumer.assign([tp], {tp: 0})
        values: list[bytes] = list(record.value for record in consumer.poll(5.0))
        end = consumer.watermarks(tp)[1]
        deadline = time.monotonic() + 20
        while len(values) < end and time.monotonic() < deadline:
            values += [record.value for record in consumer.poll(1.0)]
        assert len(values) == end, f"read {len(values)} of {end}"
        return values
    finally:
        consumer.close()


def test_failed_fsync_takes_the_directory_offline_until_restart(tmp_path):
    data = tmp_path / "data"
    settings = {"log.flush.interval.messages": "1"}
    broker = BrokerProcess(data, settings,
                           env={"ONCELOG_DISK_FAULTS": "fsync:.log:25:EIO"}).start()
    try:
        create_topic(broker.bootstrap, TOPIC)
        values = [b"value-%03d" % i for i in range(60)]
        delivered, failed = produce_each(broker.bootstrap, values)
        assert delivered and failed
        log = broker.log_text()
        assert "is now OFFLINE" in log and "Input/output error (injected)" in log
        assert f'oncelog_log_dir_offline{{path="{data}"}} 1' in metrics(broker)
        with pytest.raises(OncelogError) as fetched:  # fetch answers the storage error
            read_values(broker.bootstrap)
        assert fetched.value.error == ErrorCode.kafka_storage_error
        broker.stop()
        broker.env = {}
        broker.start()
        stored = read_values(broker.bootstrap)
        assert f'oncelog_log_dir_offline{{path="{data}"}} 0' in metrics(broker)
    finally:
        if broker.alive:
            broker.stop()
    assert "Traceback" not in broker.log_text()
    assert len(stored) == len(set(stored)), "a record stored twice"
    for value, offset in delivered.items():
        assert stored[offset] == value, f"acknowledged {value!r} lost or moved"
    # What failed was not acknowledged: it may have reached the disk or not, never twice.
    assert set(stored) <= set(values)
