"""Data survives a clean restart and a kill -9; the torn tail of a crash is cut away."""

import os

from confluent_kafka import Consumer, Producer, TopicPartition
from support.brokers import BrokerProcess

from oncelog.log.disk import cut_to_journal

TOPIC = "restart"


def produce(bootstrap: str, n: int, start: int = 0, **config) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    errors = []
    for i in range(start, start + n):
        producer.produce(TOPIC, value=b"value-%d" % i, key=b"key-%d" % i,
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(30) == 0
    assert not errors


def consume_all(bootstrap: str, expected: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    values = []
    try:
        for _ in range(expected + 200):
            msg = consumer.poll(10)
            assert msg is not None, f"timed out after {len(values)} records"
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    break
                raise AssertionError(msg.error())
            assert msg.offset() == len(values)
            values.append(msg.value())
    finally:
        consumer.close()
    return values


def test_clean_restart_keeps_everything(start_broker):
    broker = start_broker(**{"log.internal.segment.bytes": "5000"})
    produce(broker.bootstrap, 2000, **{"batch.num.messages": 20})
    broker.restart(clean=True)
    produce(broker.bootstrap, 500, start=2000, **{"batch.num.messages": 20})
    values = consume_all(broker.bootstrap, 2500)
    assert values == [b"value-%d" % i for i in range(2500)]
    segments = [f for f in os.listdir(broker.data_dir / f"{TOPIC}-0") if f.endswith(".log")]
    assert len(segments) > 5


def test_power_loss_keeps_acknowledged_records(tmp_path):
    """With log.flush.interval.messages=1 an acknowledged record is on disk. A kill -9 alone
    cannot show it (the page cache survives a kill), so the broker journals what each fsync
    made durable (ONCELOG_FSYNC_JOURNAL), and after the kill every segment is cut back to
    that, which is what a power cut may leave."""
    journal = tmp_path / "fsync-journal"
    broker = BrokerProcess(tmp_path / "data", {"log.flush.interval.messages": "1",
                                               "log.internal.segment.bytes": "5000"},
                           env={"ONCELOG_FSYNC_JOURNAL": str(journal)}).start()
    try:
        produce(broker.bootstrap, 1000, acks="all", **{"batch.num.messages": 7})
        broker.kill()
        kept = cut_to_journal(str(journal), str(broker.data_dir))
        assert len(kept) > 3  # segments rolled: every one of them was made durable
        broker.start()
        assert consume_all(broker.bootstrap, 1000) == [b"value-%d" % i for i in range(1000)]
    finally:
        broker.kill()
    assert "Traceback" not in broker.log_text()


def test_kill_9_keeps_acknowledged_records(start_broker):
    broker = start_broker()
    produce(broker.bootstrap, 1000, acks="all")
    broker.restart(clean=False)
    assert consume_all(broker.bootstrap, 1000) == [b"value-%d" % i for i in range(1000)]


def test_torn_tail_is_truncated_on_recovery(start_broker):
    broker = start_broker()
    produce(broker.bootstrap, 100)
    broker.kill()
    log_file = broker.data_dir / f"{TOPIC}-0" / f"{0:020d}.log"
    good_size = log_file.stat().st_size
    with open(log_file, "ab") as f:
        f.write(b"\x00" * 7 + b"\x01" * 50)  # half a batch header: what a crash mid-write leaves
    broker.start()
    assert consume_all(broker.bootstrap, 100) == [b"value-%d" % i for i in range(100)]
    assert log_file.stat().st_size == good_size
    produce(broker.bootstrap, 10, start=100)
    assert len(consume_all(broker.bootstrap, 110)) == 110
    assert "truncating 57 bytes" in broker.log_text()
