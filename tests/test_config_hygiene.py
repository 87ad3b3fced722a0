"""Configs a real broker takes from real clients: an empty cleanup.policy (KIP-1161), every
broker key Kafka 4.1 knows, and the internal topics' configs, which nobody may break
(issue 21, issue 28 #8)."""

from __future__ import annotations

import time

import pytest
from brokers import create_topic
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    NewTopic,
    ResourceType,
)
from confluent_kafka.admin import ConfigResource as CResource
from kio.schema.errors import ErrorCode

TIMEOUT = 20.0


def _describe(admin, kind, name) -> dict[str, str | None]:
    resource = CResource(kind, name)
    entries = admin.describe_configs([resource], request_timeout=TIMEOUT)[resource].result(
        TIMEOUT)
    return {k: e.value for k, e in entries.items()}


def _incremental(admin, kind, name, *entries) -> None:
    resource = CResource(kind, name, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=op) for key, op, value in entries])
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT)


def _records(bootstrap: str, topic: str) -> tuple[int, int]:
    from oncelog import Consumer, TopicPartition
    with Consumer({"bootstrap.servers": bootstrap}) as c:
        c.assign([TopicPartition(topic, 0)])
        return c.watermarks(TopicPartition(topic, 0))


def test_empty_cleanup_policy_keeps_everything(start_broker):
    """KIP-1161: an empty cleanup.policy is neither delete nor compact: retention never
    deletes (as retention.ms=-1 and retention.bytes=-1), keys are not required."""
    broker = start_broker(log_retention_check_interval_ms="100")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = "empty-policy"
    futures = admin.create_topics([NewTopic(topic, 1, 1, config={
        "cleanup.policy": "", "retention.ms": "1", "segment.bytes": "1048576",
        "segment.ms": "1"})])
    futures[topic].result(TIMEOUT)
    assert _describe(admin, ResourceType.TOPIC, topic)["cleanup.policy"] == ""
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(20):
        producer.produce(topic, value=b"v%d" % i)  # no key: fine without compact
        producer.flush(TIMEOUT)
    time.sleep(1.0)  # ten retention checks with retention.ms=1
    assert _records(broker.bootstrap, topic) == (0, 20)

    create_topic(broker.bootstrap, "set-empty")
    _incremental(admin, ResourceType.TOPIC, "set-empty",
                 ("cleanup.policy", AlterConfigOpType.SET, ""))
    assert _describe(admin, ResourceType.TOPIC, "set-empty")["cleanup.policy"] == ""

    create_topic(broker.bootstrap, "subtract-empty")
    _incremental(admin, ResourceType.TOPIC, "subtract-empty",
                 ("cleanup.policy", AlterConfigOpType.SUBTRACT, "delete"))
    assert _describe(admin, ResourceType.TOPIC, "subtract-empty")["cleanup.policy"] == ""
    broker.restart()
    assert _describe(admin, ResourceType.TOPIC, "subtract-empty")["cleanup.policy"] == ""
    assert _records(broker.bootstrap, topic) == (0, 20)
