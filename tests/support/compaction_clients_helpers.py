"""What tests besides tests/e2e/test_compaction_clients.py use of it."""
from __future__ import annotations

import os
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT = 60.0


TOPIC = "compacted"


def create_compacted(bootstrap: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    settings = {"cleanup.policy": "compact", "internal.segment.bytes": "2048",
                "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "600000", **configs}
    admin.create_topics([NewTopic(TOPIC, 1, 1, config=settings)])[TOPIC].result(TIMEOUT)


def produce(producer: Producer, records: list[tuple[bytes, bytes | None]]) -> list[int]:
    """Produce and return each record's offset from its delivery report."""
    offsets: list[int | None] = [None] * len(records)
    errors = []

    def report(index):
        def on_delivery(err, msg):
            if err is not None:
                errors.append(err)
            else:
                offsets[index] = msg.offset()
        return on_delivery

    for i, (key, value) in enumerate(records):
        producer.produce(TOPIC, key=key, value=value, partition=0, on_delivery=report(i))
        producer.poll(0)
    assert producer.flush(TIMEOUT) == 0
    assert not errors, errors
    return offsets  # type: ignore[return-value]


def wait_until_cleaned(broker, partition_dir: Path) -> None:
    """Until the cleaner's checkpoint reaches the active segment: every sealed segment is
    clean (the condition the broker itself goes by, read from its files)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        bases = [int(n[:-4]) for n in os.listdir(partition_dir) if n.endswith(".log")]
        try:
            checkpoint = int((partition_dir / "cleaner-offset-checkpoint").read_text())
        except (FileNotFoundError, ValueError):
            checkpoint = -1
        if len(bases) > 1 and checkpoint == max(bases):
            return
        time.sleep(0.05)
    raise AssertionError(f"not cleaned within {TIMEOUT}s; broker log:\n{broker.log_text()}")
