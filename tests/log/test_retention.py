"""Retention deletes old segments on a running broker; consumers see the new log start."""

import os
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def produce(bootstrap, topic, n, timestamp_ms):
    producer = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 10,
                         "linger.ms": 0})
    for i in range(n):
        producer.produce(topic, value=b"x" * 100 + b"%d" % i, timestamp=timestamp_ms)
        producer.poll(0)
    assert producer.flush(30) == 0


def create_topic(bootstrap, topic, config):
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive its futures
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(30)


class Watermarks:
    """One consumer reused for watermark queries: creating one per query is slow under load."""

    def __init__(self, bootstrap):
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                                  "enable.auto.commit": False})

    def __call__(self, topic):
        return self.consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)

    def close(self):
        self.consumer.close()


def earliest(bootstrap, topic):
    marks = Watermarks(bootstrap)
    try:
        return marks(topic)
    finally:
        marks.close()


def wait_for(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_retention_by_time_deletes_expired_segments(start_broker):
    broker = start_broker(**{"log.internal.segment.bytes": "3000", "log.retention.ms": "60000",
                             "log.retention.check.interval.ms": "200"})
    now = int(time.time() * 1000)
    produce(broker.bootstrap, "old", 200, now - 3_600_000)
    marks = Watermarks(broker.bootstrap)
    assert wait_for(lambda: marks("old")[0] == 200), marks("old")
    marks.close()
    segments = sorted((broker.data_dir / "old-0").glob("*.log"))
    assert len(segments) == 1 and segments[0].name == f"{200:020d}.log"
    produce(broker.bootstrap, "old", 5, now)
    assert earliest(broker.bootstrap, "old") == (200, 205)


def test_retention_by_size_keeps_the_newest_data(start_broker):
    broker = start_broker(**{"log.internal.segment.bytes": "3000", "log.retention.bytes": "6000",
                             "log.retention.check.interval.ms": "200"})
    produce(broker.bootstrap, "big", 300, int(time.time() * 1000))
    marks = Watermarks(broker.bootstrap)
    assert wait_for(lambda: marks("big")[0] > 0), marks("big")
    marks.close()

    def sizes() -> dict[str, int]:
        return {p.name: p.stat().st_size for p in (broker.data_dir / "big-0").glob("*.log")}

    # A retention pass that ran while the records were still arriving deleted only what was
    # over the limit then; the next pass (every 200 ms) deletes the rest, until no segment
    # can go without leaving less than retention.bytes (Kafka's rule): nothing moves after.
    def settled() -> bool:
        now = sizes()
        return sum(now.values()) - now[min(now)] < 6000

    assert wait_for(settled), sizes()
    low, high = earliest(broker.bootstrap, "big")
    assert high == 300
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([TopicPartition("big", 0, 0)])  # below the log start: reset to earliest
    msg = None
    for _ in range(50):
        msg = consumer.poll(1)
        if msg is not None and not msg.error():
            break
    consumer.close()
    assert msg is not None, "no record after 50 polls"
    assert msg.offset() == low, (msg.offset(), low, high)


def test_retention_by_time_for_every_kind_of_timestamp(start_broker):
    """Data produced a moment ago is never deleted, whatever timestamps its records carry
    (the producer's clock, none at all, the broker's LogAppendTime); old data is."""
    broker = start_broker(**{"log.retention.ms": "60000",
                             "log.retention.check.interval.ms": "100"})
    now = int(time.time() * 1000)
    hour = 3_600_000
    create_topic(broker.bootstrap, "append-time", {"message.timestamp.type": "LogAppendTime"})
    create_topic(broker.bootstrap, "append-time-short",
                 {"message.timestamp.type": "LogAppendTime", "retention.ms": "1000"})
    produce(broker.bootstrap, "create-time", 5, now)
    produce(broker.bootstrap, "no-timestamp", 5, -1)  # librdkafka: records -1, header max 0
    produce(broker.bootstrap, "append-time", 5, now - 2 * hour)  # the broker's clock wins
    marks = Watermarks(broker.bootstrap)
    try:
        # Two retention passes after everything was stored: each deletes an old topic.
        for probe in ("old-1", "old-2"):
            produce(broker.bootstrap, probe, 5, now - 2 * hour)
            assert wait_for(lambda probe=probe: marks(probe) == (5, 5)), marks(probe)
        for topic in ("create-time", "no-timestamp", "append-time"):
            assert marks(topic) == (0, 5), topic
        # Old by the file's age when no record has a timestamp, as Kafka counts it.
        for segment in (broker.data_dir / "no-timestamp-0").glob("*.log"):
            os.utime(segment, (now / 1000 - 2 * 3600, now / 1000 - 2 * 3600))
        assert wait_for(lambda: marks("no-timestamp") == (5, 5)), marks("no-timestamp")
        # Old by the broker's clock with LogAppendTime: kept a second, then deleted.
        produce(broker.bootstrap, "append-time-short", 5, now - 2 * hour)
        assert wait_for(lambda: marks("append-time-short") == (5, 5))
        assert marks("create-time") == marks("append-time") == (0, 5)
    finally:
        marks.close()
