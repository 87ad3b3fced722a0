"""Zero-copy Fetch (issue 26) against a real broker: every Kafka client reads the same records
through the sendfile path, across segments, read_committed with aborted transactions; a
reader that does not read holds only its own connection, and its answer survives the
deletion of its segments; a segment cut under a pending answer closes the connection rather
than send a short frame.

One broker for the module, 1 MiB segments (the smallest log.segment.bytes), each test on its
own topic. The broker's counter oncelog_fetch_zero_copy_bytes_total shows that the records
went by sendfile.
"""
from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from support.brokers import BrokerProcess, create_topic
from support.hostile_clients import metrics
from support.zero_copy_helpers import (
    READERS,
    TIMEOUT,
    decode_fetch,
    fetch_frame,
    read_until_closed,
    round_trips,
    slow_socket,
    unique,
    zero_copy_bytes,
)

from oncelog.log.regions import SPLICE_MIN

MiB = 1 << 20
VALUE = 1000  # bytes of each record's value, printable (kcat prints one a line)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    process = BrokerProcess(tmp_path_factory.mktemp("zero-copy") / "broker",
                            {"log.segment.bytes": str(MiB)}).start()
    yield process
    if process.alive:
        code = process.stop()
        assert code == 0, f"broker exited with {code}; its log:\n{process.log_text()}"
    assert "Traceback" not in process.log_text(), process.log_text()


def _value(prefix: str, i: int) -> bytes:
    head = b"%s-%d-" % (prefix.encode(), i)
    return head + b"v" * (VALUE - len(head))


def _transactional(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                         "linger.ms": 5, "transaction.timeout.ms": 60_000})
    producer.init_transactions(TIMEOUT)
    return producer


def _segments(broker: BrokerProcess, topic: str, partition: int = 0) -> list[Path]:
    directory = Path(broker.data_dir) / f"{topic}-{partition}"
    return sorted(directory.glob("*.log"))


@pytest.fixture(scope="module")
def transactions(broker):
    """A topic of about 2.5 MiB over three segments: two transactional producers interleaved
    (one aborts, one commits), plain records, then a committed transaction. Returns the topic,
    its end offset, and the values read_committed and read_uncommitted readers must see."""
    topic = unique("zc-txn")
    create_topic(broker.bootstrap, topic)
    a = _transactional(broker.bootstrap, unique("a"))
    b = _transactional(broker.bootstrap, unique("b"))
    plain = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    a.begin_transaction()
    b.begin_transaction()
    for i in range(600):
        (a if i % 2 else b).produce(topic, _value("a" if i % 2 else "b", i), partition=0)
        if i % 100 == 99:
            a.flush(TIMEOUT)
            b.flush(TIMEOUT)
    a.abort_transaction(TIMEOUT)
    b.commit_transaction(TIMEOUT)
    for i in range(1000):
        plain.produce(topic, _value("p", i), partition=0)
    assert plain.flush(TIMEOUT) == 0
    a.begin_transaction()
    for i in range(900):
        a.produce(topic, _value("c", i), partition=0)
    a.commit_transaction(TIMEOUT)
    committed = {_value("b", i) for i in range(0, 600, 2)} | \
        {_value("p", i) for i in range(1000)} | {_value("c", i) for i in range(900)}
    every = committed | {_value("a", i) for i in range(1, 600, 2)}
    assert len(_segments(broker, topic)) >= 3
    _, end = _watermarks(broker, topic)
    return topic, end, committed, every


def _watermarks(broker, topic: str) -> tuple[int, int]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "wm"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT)
    finally:
        consumer.close()


@pytest.mark.parametrize("client", sorted(READERS))
def test_every_client_reads_the_same_records_through_sendfile(broker, transactions, client):
    topic, end, committed, every = transactions
    before = zero_copy_bytes(broker)
    found = READERS[client](broker.bootstrap, topic, end, "read_committed")
    assert len(found) == len(set(found)), f"{client} read a record twice"
    assert set(found) == committed, sorted(set(found) ^ committed)[:5]
    # each producer's records in its own order
    for prefix in (b"b-", b"p-", b"c-"):
        mine = [int(v.split(b"-")[1]) for v in found if v.startswith(prefix)]
        assert mine == sorted(mine)
    assert zero_copy_bytes(broker) - before >= 0.9 * len(committed) * VALUE
    if client == "confluent-kafka":  # and the aborted ones are there for read_uncommitted
        found = READERS[client](broker.bootstrap, topic, end, "read_uncommitted")
        assert set(found) == every


def _fill(broker, topic: str, partitions: int, per_partition: int) -> None:
    """``per_partition`` bytes of records in each partition, then one more batch: each
    partition's first segment is sealed and full."""
    create_topic(broker.bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for p in range(partitions):
        for i in range(per_partition // VALUE):
            producer.produce(topic, _value(f"s{p}", i), partition=p)
    assert producer.flush(TIMEOUT) == 0


def _pending(sock, broker, topic: str, partitions: int) -> tuple[int, dict[int, bytes]]:
    """Send the Fetch, wait until the broker holds part of the answer for this reader
    (it paused the connection); the frame's size and each partition's first segment."""
    expected = {p: _segments(broker, topic, p)[0].read_bytes() for p in range(partitions)}
    assert all(len(e) >= SPLICE_MIN for e in expected.values())
    pauses = metrics(broker.metrics_port)["oncelog_write_pauses_total"]
    sock.sendall(fetch_frame(topic, partitions, 2 * MiB))
    (size,) = struct.unpack(">i", read_until_closed(sock, 4))
    assert size > sum(len(e) for e in expected.values())
    deadline = time.monotonic() + TIMEOUT
    while metrics(broker.metrics_port)["oncelog_write_pauses_total"] == pauses:
        assert time.monotonic() < deadline, "the broker never waited for the reader"
        time.sleep(0.01)
    return size, expected


def test_a_slow_reader_holds_only_its_connection_and_its_answer_survives_retention(broker):
    topic = unique("zc-slow")
    partitions = 6
    _fill(broker, topic, partitions, MiB + 100_000)
    quiet = round_trips(broker.bootstrap, topic, 200)
    sock = slow_socket(broker.port)
    try:
        size, expected = _pending(sock, broker, topic, partitions)
        meanwhile = round_trips(broker.bootstrap, topic, 200)
        # Retention (DeleteRecords: the same deletion) takes every first segment now.
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        firsts = {p: _segments(broker, topic, p)[0] for p in range(partitions)}
        starts = [TopicPartition(topic, p, int(_segments(broker, topic, p)[1].stem))
                  for p in range(partitions)]
        for future in admin.delete_records(starts, request_timeout=TIMEOUT).values():
            future.result(TIMEOUT)
        assert not any(path.exists() for path in firsts.values())
        frame = read_until_closed(sock, size)
    finally:
        sock.close()
    assert len(frame) == size
    assert decode_fetch(frame) == expected
    print(f"200 round trips: {quiet:.4f} s alone, {meanwhile:.4f} s with an answer pending")
    # A loop blocked on the reader would stall every other client (until the socket's
    # timeout); one spinning on it would share the CPU with them.
    assert meanwhile / quiet < 10


def test_a_segment_cut_under_a_pending_answer_closes_the_connection(broker):
    topic = unique("zc-cut")
    partitions = 6
    _fill(broker, topic, partitions, MiB + 100_000)
    sock = slow_socket(broker.port)
    try:
        size, _ = _pending(sock, broker, topic, partitions)
        for p in range(partitions):  # outside damage: the files shrink under the broker
            os.truncate(_segments(broker, topic, p)[0], 100)
        frame = read_until_closed(sock, size)
    finally:
        sock.close()
    assert len(frame) < size, "a frame was completed with bytes the file no longer has"
    deadline = time.monotonic() + TIMEOUT
    while "truncated under a pending fetch answer" not in broker.log_text():
        assert time.monotonic() < deadline, broker.log_text()[-2000:]
        time.sleep(0.01)
