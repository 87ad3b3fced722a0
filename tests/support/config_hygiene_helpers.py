"""What tests besides tests/broker/test_config_hygiene.py use of it."""
from __future__ import annotations

from confluent_kafka.admin import ConfigResource as CResource

TIMEOUT = 20.0


def _describe(admin, kind, name) -> dict[str, str | None]:
    resource = CResource(kind, name)
    entries = admin.describe_configs([resource], request_timeout=TIMEOUT)[resource].result(
        TIMEOUT)
    return {k: e.value for k, e in entries.items()}


def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def _committed(bootstrap: str, group: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        return consumer.committed([TopicPartition(topic, 0)], timeout=TIMEOUT)[0].offset
    finally:
        consumer.close()
