"""A real full disk under a real broker: a small tmpfs as log.dirs, filled by a real producer.

The broker answers KAFKA_STORAGE_ERROR while the disk is full and keeps serving; once space
is freed the same partitions take records again; after a restart everything acknowledged is
there exactly once and nothing is there twice. CI runs as root, so the test mounts (and
always unmounts) its own tmpfs.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from support.brokers import BrokerProcess, create_topic, read_to_end
from support.full_disk_helpers import fill_up, small_tmpfs

TOPIC = "full"
PARTITIONS = 2
VALUE = b"x" * 300


def resize(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def produce_until(producer: Producer, first: int, stop, deadline: float,
                  delivered: dict, failed: dict) -> int:
    """Produce numbered records until ``stop()`` or the deadline; returns the next number."""
    n = first
    while not stop() and time.monotonic() < deadline:
        for _ in range(50):
            value = b"%08d:" % n + VALUE
            n += 1

            def report(err, msg, value=value):
                if err is None:
                    delivered[value] = (msg.partition(), msg.offset())
                else:
                    failed[value] = err

            try:
                producer.produce(TOPIC, value=value, on_delivery=report)
            except BufferError:
                producer.poll(0.1)
        producer.poll(0.05)
    producer.flush(30)
    return n


def test_full_disk_loses_nothing_acknowledged_and_stores_nothing_twice(tmp_path):
    with small_tmpfs(tmp_path / "disk", "1500k") as disk:
        broker = BrokerProcess(disk, {"log.internal.segment.bytes": "262144",
                                      "log.flush.interval.messages": "1"}).start()
        try:
            create_topic(broker.bootstrap, TOPIC, PARTITIONS)
            producer = Producer({"bootstrap.servers": broker.bootstrap,
                                 "enable.idempotence": True, "linger.ms": 5,
                                 "message.timeout.ms": 4000, "retry.backoff.ms": 50})
            delivered: dict[bytes, tuple[int, int]] = {}
            failed: dict[bytes, KafkaError] = {}
            deadline = time.monotonic() + 60
            n = produce_until(producer, 0, lambda: len(failed) > 200, deadline, delivered,
                              failed)
            assert failed, "the disk never filled"
            assert broker.alive
            log = broker.log_text()
            assert "No space left on device" in log
            assert "OFFLINE" not in log, "a full disk must not take the directory offline"
            acked_while_full = len(delivered)
            fill_up(disk / "filler")  # not a byte left, even for a topic's metadata
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            with pytest.raises(KafkaException) as refused:
                admin.create_topics([NewTopic("more", 1, 1)])["more"].result(30)
            assert refused.value.args[0].code() == KafkaError.KAFKA_STORAGE_ERROR
            (disk / "filler").unlink()

            resize(disk, "64m")  # space freed: the same broker takes records again
            more_failed: dict[bytes, KafkaError] = {}
            produce_until(producer, n, lambda: len(delivered) >= acked_while_full + 500,
                          time.monotonic() + 60, delivered, more_failed)
            assert len(delivered) >= acked_while_full + 500, more_failed
            broker.restart(clean=True)
            found = read_to_end(broker.bootstrap, TOPIC, PARTITIONS)
        finally:
            if broker.alive:
                broker.stop()
    assert "Traceback" not in broker.log_text(), broker.log_text()
    stored: dict[bytes, list[tuple[int, int]]] = {}
    for partition, records in found.items():
        offsets = [offset for offset, _ in records]
        assert offsets == sorted(offsets)
        for offset, value in records:
            stored.setdefault(value, []).append((partition, offset))
    twice = {v[:8]: places for v, places in stored.items() if len(places) > 1}
    assert not twice, f"stored twice: {list(twice.items())[:5]}"
    lost = [v[:8] for v, place in delivered.items() if stored.get(v) != [place]]
    assert not lost, f"acknowledged and lost or moved: {lost[:10]}"
