"""What tests besides tests/spark/test_spark_read.py use of it."""
from __future__ import annotations

from confluent_kafka import Producer

import oncelog

TIMEOUT = 180.0  # seconds: the bound on any single wait (Spark is slow on a busy machine)


def create(bootstrap: str, topic: str, partitions: int = 1, **configs: str) -> None:
    with oncelog.Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(topic, partitions, configs=configs or None)


def produce(bootstrap: str, topic: str, items, **config) -> None:
    """items: (partition, key, value, headers, timestamp ms or None for now)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "message.timeout.ms": int(TIMEOUT * 1000), **config})
    for partition, key, value, headers, timestamp in items:
        producer.produce(topic, value=value, key=key, partition=partition, headers=headers,
                         timestamp=timestamp or 0)  # librdkafka: 0 is now
    assert producer.flush(TIMEOUT) == 0
