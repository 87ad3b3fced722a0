"""What tests besides tests/e2e/test_txn_copier.py use of it."""
from __future__ import annotations

import os
import time

from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as CTopicPartition

RECORDS = int(os.environ.get("ONCELOG_TXN_COPY_RECORDS", "20000"))


PARTITIONS = 4


WAIT = 120.0 * max(1.0, RECORDS / 20_000)


def read_committed(bootstrap: str, topic: str) -> dict[int, list[bytes]]:
    """Every value a read_committed confluent-kafka reader returns, per partition, until it
    reports the end of each partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "checker",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed"})
    consumer.assign([CTopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    found: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    at_end: set[int] = set()
    deadline = time.monotonic() + WAIT
    try:
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 1.0):
                if msg.error():
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    at_end.add(msg.partition())
                else:
                    found[msg.partition()].append(msg.value())
    finally:
        consumer.close()
    assert len(at_end) == PARTITIONS, f"did not reach the end of {topic}"
    return found
