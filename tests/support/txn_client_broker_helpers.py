"""What tests besides tests/client/test_txn_client_broker.py use of it."""
from __future__ import annotations

from oncelog import (
    Consumer,
    Producer,
)

TIMEOUT = 30


def txn_producer(bootstrap: str, transactional_id: str, **config) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                  **config})
    p.init_transactions(TIMEOUT)
    return p


def read_committed(bootstrap: str, topic: str, partition: int = 0) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    try:
        consumer.assign([(topic, partition)])
        return [r.value for r in consumer]  # to the end: the last stable offset
    finally:
        consumer.close()
