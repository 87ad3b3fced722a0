"""oncelog.Consumer against a real broker, reading what real clients wrote."""

import os
import socket
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer
from support.brokers import create_topic

import oncelog
from oncelog import Admin, Consumer, TopicPartition
from oncelog.client.network.connection import KafkaError

NOW = int(time.time() * 1000)


def produce(bootstrap: str, topic: str, records, **config) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, **config})
    for partition, key, value, headers, timestamp in records:
        producer.produce(topic, value=value, key=key, partition=partition, headers=headers,
                         timestamp=timestamp)
    assert producer.flush(30) == 0


def read_all(consumer: Consumer) -> list:
    return list(consumer)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_reads_every_codec_with_keys_headers_timestamps(broker, codec):
    create_topic(broker.bootstrap, "codec")
    records = [(0, b"k%d" % i if i % 3 else None, b"v%d" % i * (i % 7 + 1),
                [("h", b"%d" % i), ("empty", b"")], NOW + i) for i in range(200)]
    produce(broker.bootstrap, "codec", records, **{"compression.type": codec})
    with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition("codec", 0)])
        got = read_all(c)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in got] == \
        [(i, k, v, ts) for i, (_, k, v, _, ts) in enumerate(records)]
    assert all(r.headers == (("h", b"%d" % r.offset), ("empty", b"")) for r in got)
    assert {r.timestamp_type for r in got} == {"CreateTime"}


def test_records_carry_producer_id_epoch_and_sequence(broker):
    create_topic(broker.bootstrap, "idem", 2)
    produce(broker.bootstrap, "idem", [(i % 2, None, b"%d" % i, None, NOW) for i in range(40)],
            **{"enable.idempotence": True})
    produce(broker.bootstrap, "idem", [(0, None, b"plain", None, NOW)])
    with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition("idem", 0), TopicPartition("idem", 1)])
        got = read_all(c)
    for partition in (0, 1):
        idempotent = [r for r in got if r.partition == partition and r.producer_id >= 0]
        assert [r.sequence for r in idempotent] == list(range(20))
        assert {(r.producer_id, r.producer_epoch) for r in idempotent} == \
            {(idempotent[0].producer_id, 0)}
    plain = [r for r in got if r.value == b"plain"]
    assert [(r.producer_id, r.sequence) for r in plain] == [(-1, -1)]


def test_seek_position_and_offsets_for_times(broker):
    create_topic(broker.bootstrap, "seek")
    produce(broker.bootstrap, "seek", [(0, None, b"%d" % i, None, 1_000 + i * 10)
                                       for i in range(50)])
    tp = TopicPartition("seek", 0)
    with Consumer({"bootstrap.servers": broker.bootstrap}) as c:
        c.assign([tp])
        assert c.position(tp) == 50  # auto.offset.reset=latest by default, as in Kafka
        assert c.offsets_for_times({tp: 1_105}) == {tp: 11}
        assert c.offsets_for_times({tp: 9_999}) == {tp: -1}
        c.seek(tp, 17)
        assert [r.offset for r in c.poll(5, max_records=3)] == [17, 18, 19]
        assert c.position(tp) == 20  # the rest of that fetch is buffered, not yet returned
        c.seek(tp, oncelog.client.consumer.consumer.EARLIEST)
        assert [r.value for r in c.poll(5, max_records=2)] == [b"0", b"1"]
        assert c.watermarks(tp) == (0, 50)


def test_fetches_sent_ahead_never_skip_or_repeat_records(broker):
    # Small fetches (one batch each), so polls keep finding a Fetch sent ahead in flight,
    # while other calls use the same connection and seeks move the position under it.
    create_topic(broker.bootstrap, "ahead", 2)
    produce(broker.bootstrap, "ahead", [(i % 2, None, b"%d" % i, None, NOW) for i in range(600)],
            **{"batch.num.messages": 10})
    tps = [TopicPartition("ahead", 0), TopicPartition("ahead", 1)]
    config = {"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest",
              "max.partition.fetch.bytes": 256}
    with Consumer(config) as c:
        c.assign(tps)
        first = c.poll(5, max_records=1000)
        assert first and c._ahead  # a Fetch went ahead
        assert c.watermarks(tps[0]) == (0, 300)  # answered past the Fetch in flight
        assert c.offsets_for_times({tps[1]: NOW}) == {tps[1]: 0}
        seen = list(first)
        for _ in range(3):
            seen += c.poll(5, max_records=1000)
        c.seek(tps[0], 5)  # the Fetch sent ahead asked for another position: dropped
        after_seek = c.poll(5, max_records=1000)
        assert [r.offset for r in after_seek if r.partition == 0][:1] == [5]
        seen = [r for r in seen if r.partition == 1] + after_seek
        seen += list(c)
    for partition in (0, 1):
        offsets = [r.offset for r in seen if r.partition == partition]
        assert offsets == list(range(5 if partition == 0 else 0, 300))
        assert all(r.value == b"%d" % (2 * r.offset + partition) for r in seen
                   if r.partition == partition)


def test_out_of_range_follows_auto_offset_reset(broker):
    create_topic(broker.bootstrap, "range")
    produce(broker.bootstrap, "range", [(0, None, b"x", None, NOW)] * 5)
    tp = TopicPartition("range", 0)
    with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([tp], offsets={tp: 1_000})
        assert [r.offset for r in c.poll(5)] == [0, 1, 2, 3, 4]
    with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "error"}) as c:
        c.assign([tp], offsets={tp: 1_000})
        with pytest.raises(KafkaError, match="OFFSET_OUT_OF_RANGE"):
            c.poll(2)


def test_poll_waits_for_new_records_and_survives_a_restart(broker):
    create_topic(broker.bootstrap, "live")
    tp = TopicPartition("live", 0)
    with Consumer({"bootstrap.servers": broker.bootstrap}) as c:
        c.assign([tp])
        assert c.poll(0.3) == []
        produce(broker.bootstrap, "live", [(0, None, b"first", None, NOW)])
        assert [r.value for r in c.poll(10)] == [b"first"]
        broker.restart(clean=False)
        produce(broker.bootstrap, "live", [(0, None, b"second", None, NOW)])
        got = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = c.poll(1)
        assert [r.value for r in got] == [b"second"]


def test_a_batch_that_fails_its_crc_is_reported_not_returned(broker):
    create_topic(broker.bootstrap, "crc")
    produce(broker.bootstrap, "crc", [(0, None, b"payload-%d" % i, None, NOW)
                                      for i in range(10)])
    log_file = broker.data_dir / "crc-0" / f"{0:020d}.log"
    with open(log_file, "r+b") as f:  # damage the stored bytes under the running broker
        f.seek(os.path.getsize(log_file) - 5)
        f.write(b"XXXXX")
    tp = TopicPartition("crc", 0)
    with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([tp])
        with pytest.raises(KafkaError, match=r"CORRUPT_MESSAGE.*fails its CRC32C check"):
            c.poll(5)
    with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest",
                   "check.crcs": False}) as c:
        c.assign([tp])  # unchecked, as asked: the damaged record still does not parse
        with pytest.raises(KafkaError, match=r"CORRUPT_MESSAGE.*does not parse"):
            c.poll(5)


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match=r"unknown consumer config group\.idd"):
        Consumer({"group.idd": "x"})
    with pytest.raises(ValueError, match="read_uncommitted or read_committed"):
        Consumer({"isolation.level": "snapshot"})


PURE_ROUND_TRIP = """
import sys
import oncelog
from oncelog import Admin, Consumer, TopicPartition
from oncelog.protocol import records
assert records.compiled is None, "ONCELOG_PURE_PYTHON=1 should turn the compiled codec off"
bootstrap = sys.argv[1]
sent = [(b"k%d" % i if i % 3 else None, b"v" * (i % 300), [("h", b"%d" % i)] if i % 5 == 0
         else None) for i in range(3000)]
with oncelog.Producer({"bootstrap.servers": bootstrap}) as producer:
    for key, value, headers in sent:
        producer.produce("pure", value, key=key, partition=0, headers=headers)
    producer.flush(30)
with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as consumer:
    consumer.assign([TopicPartition("pure", 0)])
    consumer.seek(TopicPartition("pure", 0), 1000)
    got = list(consumer)
assert [(r.key, r.value, list(r.headers)) for r in got] == \\
    [(k, v, h or []) for k, v, h in sent[1000:]], "round trip differs"
assert [r.sequence for r in got] == list(range(1000, 3000))
print("pure round trip ok")
"""


def test_the_pure_python_codec_round_trips(broker):
    """Where the compiled codec was not built (no C compiler) oncelog runs on the Python one:
    a producer and a consumer in a process that turns it off, end to end."""
    create_topic(broker.bootstrap, "pure")
    done = subprocess.run([sys.executable, "-c", PURE_ROUND_TRIP, broker.bootstrap],
                          env={**os.environ, "ONCELOG_PURE_PYTHON": "1"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "pure round trip ok" in done.stdout


def test_making_a_client_with_no_broker_up_does_not_fail():
    """As with Kafka's clients: the connection is opened on first use, which then fails
    clearly."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = f"127.0.0.1:{s.getsockname()[1]}"
    with Consumer({"bootstrap.servers": free, "group.id": "g"}) as c, \
            Admin({"bootstrap.servers": free}) as admin:
        with pytest.raises(KafkaError, match="NETWORK_EXCEPTION .* cannot connect to " + free):
            admin.metadata()
        with pytest.raises(KafkaError, match="NETWORK_EXCEPTION"):
            c.assign([TopicPartition("t", 0)])
