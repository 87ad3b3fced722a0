"""produce()'s compiled fast path (client/_append.c) against the Python path it shortcuts.

The twin test drives two producers with the same calls, one with the compiled OpenBatches
and one with the Python stand-in (every record through the accumulator's lock), and wants the
same batches byte for byte, the same partitions, the same futures, the same buffer
accounting and the same sticky-partitioner state. The threaded test produces from several
threads at once through a real broker: the fast path runs without the lock, so this is where
a lost record or a leaked buffer byte would show.
"""

from __future__ import annotations

import array
import itertools
import random
import sys
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.brokers import create_topic

from oncelog import Consumer, KafkaError, Producer
from oncelog.client.producer import fast_append
from oncelog.client.producer.partitioner import murmur2, partition_for_key
from oncelog.client.producer.producer import _ProducerCore
from oncelog.client.producer.producer_batch import RecordFuture
from oncelog.protocol.records import NONE, decode_batch

_compiled = fast_append.compiled
TOPICS = {"one": 1, "three": 3, "five": 5}
TIMEOUT = 30


def test_the_fast_path_is_built():
    # make test builds it; the twin tests below would otherwise compare Python with itself.
    assert _compiled is not None, "oncelog.client.producer._append was not built"


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.binary(max_size=40))
def test_compiled_murmur2_equals_python(data):
    assert _compiled.murmur2(data) == murmur2(data)
    assert partition_for_key(data, 7) == (murmur2(data) & 0x7FFFFFFF) % 7


def offline_producer(config: dict[str, Any], open_batches: Any) -> Producer:
    """A Producer without a sender thread or a broker, its topics' partitions known: what
    produce() does up to the accumulator, and nothing after."""
    saved = fast_append.OpenBatches
    fast_append.OpenBatches = open_batches
    try:
        core = _ProducerCore({"bootstrap.servers": "127.0.0.1:1", "buffer.memory": 1 << 30,
                              **config}, None, None)
    finally:
        fast_append.OpenBatches = saved
    core.partition_counts.update(TOPICS)
    producer = Producer.__new__(Producer)
    producer._core = core
    return producer


# Few distinct keys and values, so that keys repeat (and land on batches already open) and
# batches fill: the fast path's cases, many times per script.
values = st.sampled_from([None, b"", b"v" * 10, b"w" * 70, "text", bytearray(b"ba")])
keys = st.sampled_from([None, None, b"a", b"b", b"key-3", b"\x00" * 9, "k"])
calls = st.lists(st.tuples(
    st.sampled_from(sorted(TOPICS)),
    values,
    keys,
    st.sampled_from([None, None, None, 0, 2, 4, -1, 5]),   # partition (some invalid)
    st.sampled_from([None, None, None, [("h", b"v")]]),     # headers
    st.booleans(),                                          # on_delivery
), min_size=20, max_size=300)
configs = st.fixed_dictionaries({
    "batch.size": st.sampled_from([100, 400, 16384]),
    "batch.num.messages": st.sampled_from([1, 4, 10_000]),
    "partitioner": st.sampled_from(["murmur2_random", "murmur2", "random"]),
    "batching": st.sampled_from(["linger", "linger", "deterministic"]),
})


def run(producer: Producer, script: list, seed: int) -> dict[str, Any]:
    random.seed(seed)  # the sticky and random partitioners' choices
    outcomes = []
    for i, (topic, value, key, partition, headers, callback) in enumerate(script):
        try:
            future = producer.produce(topic, value, key, partition, headers, 1_700_000_000_000 + i,
                                      (lambda _e, _m: None) if callback else None)
        except (KafkaError, TypeError) as exc:
            outcomes.append(type(exc).__name__)
            continue
        batch = future._batch
        queue = producer._core.acc.queues[(batch.topic, batch.partition)]
        outcomes.append((batch.topic, batch.partition, list(queue).index(batch), future._index,
                         len(batch._callbacks or ())))
    return {"outcomes": outcomes, "batches": queued(producer, lambda b: bytes(b.data)),
            "buffered": producer._core.acc.open.buffered, "sticky": producer._core.sticky}


def queued(producer: Producer, records) -> dict:
    """Each queued batch's bookkeeping, and ``records(batch)`` of it once built."""
    batches = {}
    for tp, queue in sorted(producer._core.acc.queues.items()):
        batches[tp] = []
        for batch in queue:
            closed, count, accounted = batch.closed, batch.count, batch.accounted
            batch.build(NONE)
            batches[tp].append((closed, count, accounted, records(batch)))
    return batches


@settings(max_examples=150, deadline=None, derandomize=True)
@given(config=configs, script=calls, seed=st.integers(0, 2**32))
def test_fast_path_appends_as_the_python_path_does(config, script, seed):
    fast = run(offline_producer(config, _compiled.OpenBatches), script, seed)
    slow = run(offline_producer(config, fast_append.PyOpenBatches), script, seed)
    assert fast == slow


def arrow_column(items: list, first: int, width: str = "binary") -> tuple:
    """``items`` in Arrow's layout behind ``first`` rows of another slice: a binary column
    (validity, int32 offsets, data, first row) or an int32 one (validity, values, first)."""
    rows = [b"x" if width == "binary" else 7] * first + items
    validity = bytearray((len(rows) + 7) // 8)
    offsets, data, ints = array.array("i", [0]), bytearray(), array.array("i")
    for i, item in enumerate(rows):
        if item is not None:
            validity[i >> 3] |= 1 << (i & 7)
        if width == "binary":
            data += item or b""
            offsets.append(len(data))
        else:
            ints.append(item or 0)
    mask = bytes(validity) if None in items else None
    return (mask, offsets, bytes(data), first) if width == "binary" else (mask, ints, first)


def produce_columns(producer: Producer, topic: str, rows: list, first: int) -> list:
    """What the Spark sink does with a batch: append_columns, and produce() for each row
    it leaves (a row that fails to produce is an outcome and is skipped)."""
    values, keys, partitions = (arrow_column([r[i] for r in rows], first, width)
                                for i, width in enumerate(("binary", "binary", "int")))
    outcomes, row = [], 0
    while row < len(rows):
        row = producer.append_columns(topic, row, len(rows), values, keys, partitions)
        if row < len(rows):
            try:
                producer.produce(topic, *rows[row])
            except KafkaError as exc:
                outcomes.append((row, exc.error))
            row += 1
    return outcomes


def records_of(producer: Producer) -> dict:
    """Each queued batch's bookkeeping and records (timestamps aside: now, as appended)."""
    return {"batches": queued(producer, lambda b: [
                (r.offset, r.key, r.value) for r in decode_batch(bytes(b.data))[1]]),
            "buffered": producer._core.acc.open.buffered, "sticky": producer._core.sticky}


rows_of = st.lists(st.tuples(
    st.sampled_from([None, b"", b"v" * 10, b"w" * 70, b"text"]),                # value
    st.sampled_from([None, None, b"a", b"b", b"key-3", b"\x00" * 9]),     # key
    st.sampled_from([None, None, None, 0, 2, 4, -1]),                      # partition
), min_size=20, max_size=300)
linger_configs = st.fixed_dictionaries({
    "batch.size": st.sampled_from([100, 400, 16384]),
    "batch.num.messages": st.sampled_from([1, 4, 10_000]),
    "partitioner": st.sampled_from(["murmur2_random", "murmur2", "random"]),
})


@settings(max_examples=150, deadline=None, derandomize=True)
@given(config=linger_configs, rows=rows_of,
       topic=st.sampled_from(sorted(TOPICS)), first=st.integers(0, 9),
       seed=st.integers(0, 2**32))
def test_append_columns_appends_as_produce_does_row_by_row(config, rows, topic, first, seed):
    """Columns in Arrow's layout through the compiled append_many, through the Python
    stand-in's (which appends none: every row through produce()), and row by row through
    produce(): the same records in the same batches, the same errors, buffer and sticky
    partitions."""
    results = []
    for open_batches, by_columns in ((_compiled.OpenBatches, True),
                                     (fast_append.PyOpenBatches, True),
                                     (fast_append.PyOpenBatches, False)):
        producer = offline_producer(config, open_batches)
        random.seed(seed)
        if by_columns:
            outcomes = produce_columns(producer, topic, rows, first)
        else:
            outcomes = []
            for row, (value, key, partition) in enumerate(rows):
                try:
                    producer.produce(topic, value, key, partition)
                except KafkaError as exc:
                    outcomes.append((row, exc.error))
        results.append((outcomes, records_of(producer)))
    assert results[0] == results[1] == results[2]


def test_append_columns_takes_every_row_that_fits_an_open_batch():
    producer = offline_producer({"linger.ms": 60_000, "batch.size": 100_000},
                                _compiled.OpenBatches)
    rows = [(b"v" * 10, b"key-%d" % i, None) for i in range(500)]
    values, keys = (arrow_column([r[i] for r in rows], 0) for i in (0, 1))
    # Nothing is open yet: the first row is produce()'s, then each partition's first.
    assert producer.append_columns("one", 0, 500, values, keys) == 0
    producer.produce("one", b"v" * 10, b"key-0")
    assert producer.append_columns("one", 1, 500, values, keys) == 500
    assert producer._core.acc.queues[("one", 0)][0].count == 500
    with pytest.raises(ValueError, match="fewer rows"):
        producer.append_columns("one", 0, 501, values, keys)


def test_fast_path_takes_the_common_case():
    producer = offline_producer({"linger.ms": 60_000}, _compiled.OpenBatches)
    fast = producer._core.fast_append
    first = producer.produce("three", b"v", b"key")  # opens the batch: the Python path
    assert isinstance(first, RecordFuture)
    future = fast("three", b"v", b"key", None, None, None, None)
    assert isinstance(future, RecordFuture)
    assert (future._batch, future._index) == (first._batch, 1)
    assert fast("three", b"v", b"key", 2, None, None, None) is None  # no batch open there
    assert fast("three", b"v", b"key", None, [("h", b"")], None, None) is None
    assert fast("three", "v", b"key", None, None, None, None) is None
    assert fast("unknown", b"v", None, 0, None, None, None) is None


def test_sticky_partition_moves_on_once_a_batch_size_of_bytes_went_to_it():
    producer = offline_producer({"linger.ms": 60_000, "batch.size": 1_000},
                                _compiled.OpenBatches)
    producer._core.sticky["three"] = [1, 0]
    partitions = [producer.produce("three", b"v" * 100)._batch.partition for _ in range(11)]
    # The tenth record brings the partition's bytes to batch.size: it is the last one there.
    assert partitions[:10] == [1] * 10 and partitions[10] != 1
    assert producer._core.sticky["three"] == [partitions[10], 100]


def test_fast_path_stops_at_a_full_buffer_and_when_closed():
    limited = offline_producer({"linger.ms": 60_000, "buffer.memory": 2_000},
                               _compiled.OpenBatches)._core
    while limited.produce("one", b"x" * 100, None, 0, None, None, None) is not None:
        pass
    assert limited.fast_append("one", b"x", None, 0, None, None, None) is None
    buffered = limited.acc.open.buffered
    assert limited.produce("one", b"x", None, 0, None, None, None) is None
    assert limited.acc.open.buffered == buffered
    limited.closed = True
    assert limited.fast_append("one", b"x", None, 0, None, None, None) is None
    with pytest.raises(RuntimeError, match="closed"):
        limited.produce("one", b"x", None, 0, None, None, None)


def test_threads_producing_at_once_lose_nothing_and_leak_no_buffer(broker):
    threads, per_thread, partitions = 4, 5_000, 3
    create_topic(broker.bootstrap, "threads", partitions)
    # Small batches sent at once: batches close and leave their queues all the time while
    # the threads append, keyed (murmur2 in C) and keyless (sticky, moving on in Python).
    config = {"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "batch.size": 2_000}
    errors: list[BaseException] = []
    with Producer(config) as producer:
        producer.produce("threads", b"warm-up", partition=0).result(TIMEOUT)

        def produce(t: int) -> None:
            try:
                for i in range(per_thread):
                    producer.produce("threads", b"%d-%d" % (t, i),
                                     key=b"%d" % (i % 7) if t % 2 else None)
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(TIMEOUT)
        producer.flush(TIMEOUT)
        assert not errors
        assert producer._core.acc.open.buffered == 0
    with Consumer({"bootstrap.servers": broker.bootstrap,
                   "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([("threads", p) for p in range(partitions)])
        stored = [r for r in consumer if r.value != b"warm-up"]
    values = [r.value for r in stored]
    expected = {b"%d-%d" % (t, i) for t in range(threads) for i in range(per_thread)}
    assert len(values) == len(expected) and set(values) == expected
    # One thread's records with one key share a partition, in the order produced.
    for t in range(1, threads, 2):
        for k in range(7):
            mine = [int(r.value.split(b"-")[1]) for r in stored
                    if r.value.startswith(b"%d-" % t) and r.key == b"%d" % k]
            assert mine == sorted(mine)


def test_topics_are_plain_str_to_the_producer():
    class Name(str):
        def __eq__(self, other: object) -> bool:  # would run inside the fast path's lookups
            raise AssertionError("compared")

        __hash__ = str.__hash__

    producer = offline_producer({"linger.ms": 60_000}, _compiled.OpenBatches)
    for _ in range(3):
        future = producer.produce(Name("one"), b"v", partition=0)
    assert type(future._batch.topic) is str and future._index == 2
    assert all(type(topic) is str for topic, _ in producer._core.acc.queues)
    with pytest.raises(TypeError, match="topic must be a str"):
        producer.produce(b"one", b"v")


@pytest.fixture
def eager_thread_switches():
    # Threads switch every microsecond instead of every 5 ms, so that a race between the
    # fast path and the Python path has thousands of chances in a short test.
    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(saved)


def run_threads(*targets: Any) -> None:
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads)


def test_records_with_headers_keep_their_place_among_fast_appends(eager_thread_switches):
    # A record with headers is encoded from the batch's count in Python: a fast append
    # slipping in meanwhile would give two records one offset delta.
    producer = offline_producer({"linger.ms": 60_000, "batch.size": 1 << 22,
                                 "batch.num.messages": 1 << 20}, _compiled.OpenBatches)
    futures: list[RecordFuture] = []
    producer.produce("one", b"first", partition=0)
    run_threads(
        lambda: futures.extend(producer.produce("one", b"p%d" % i, partition=0)
                               for i in range(20_000)),
        lambda: futures.extend(producer.produce("one", b"h%d" % i, partition=0,
                                                headers=[("h", b"x")]) for i in range(5_000)))
    (batch,) = producer._core.acc.queues[("one", 0)]
    batch.build(NONE)
    _, stored = decode_batch(bytes(batch.data))
    assert [r.offset for r in stored] == list(range(25_001))
    by_index = {f._index: f for f in futures}
    assert all(stored[i].value[:1] == (b"h" if stored[i].headers else b"p")
               for i in by_index)


def test_delivery_callbacks_run_on_the_sender_in_record_order(eager_thread_switches):
    producer = offline_producer({"linger.ms": 0, "batch.num.messages": 50},
                                _compiled.OpenBatches)
    acc = producer._core.acc
    done = threading.Event()
    sender_thread: list[threading.Thread] = []

    def sender() -> None:  # takes every batch as soon as it is there, and completes it
        sender_thread.append(threading.current_thread())
        while not done.is_set() or any(acc.queues.values()):
            heads, _ = acc.ready_heads(float("inf"))
            for batch in heads:
                acc.take(batch)
                batch.build(NONE)
                acc.finished(batch, None)  # as Delivery.deliver: before the futures
                batch.complete(0)

    calls: list[tuple[threading.Thread, int]] = []

    def produce() -> None:
        for _ in range(20_000):
            producer.produce("one", b"v", partition=0,
                             on_delivery=lambda _e, meta: calls.append(
                                 (threading.current_thread(), meta.offset)))

    thread = threading.Thread(target=sender)
    thread.start()
    run_threads(produce, produce)
    done.set()
    thread.join(TIMEOUT)
    assert len(calls) == 40_000
    assert {t for t, _ in calls} == set(sender_thread)
    # complete(0) gives every batch base offset 0: offsets are indexes, in order per batch.
    runs = [offset for _, offset in calls]
    assert all(b == a + 1 or b == 0 for a, b in itertools.pairwise(runs))
