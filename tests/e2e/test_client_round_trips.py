"""Round trips through the broker with real clients: confluent-kafka, kafka-python, aiokafka, kcat.

Every producer writes the same fixed records with every codec; every consumer reads them back
and must see the exact keys, values, headers, timestamps, partitions and offsets. Beyond the
round trip: seeking into the middle of a batch, fetch limits below a batch's size, a parked
fetch woken by an append, ListOffsets (earliest, latest, max timestamp, by timestamp, and the
earliest offset moved by retention), topic administration and its errors, auto-creation, key
partitioning, and a 10,000-partition Metadata answer.

Consumers use assign() and never commit: the broker has no group coordinator yet. Producers run
without idempotence, the plain path; the idempotent one has tests of its own.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import time
import zlib
from dataclasses import dataclass, replace

import aiokafka.errors
import kafka
import kafka.admin
import kafka.errors
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from kafka.partitioner.default import murmur2
from kio.schema.errors import ErrorCode
from support.brokers import BrokerProcess, batches_on_disk

from oncelog.protocol.records import CODECS

TIMEOUT = 20.0  # seconds: the bound on every wait in this file
T0 = 1_700_000_000_000  # a fixed CreateTime, in ms
GROUP = "oncelog-tests"  # librdkafka insists on a group.id even for assign(); nothing joins it
SHARED_SETTINGS = {
    # The fixed timestamps are years old: keep them from retention. Set through the hours key
    # so that DescribeConfigs must trace retention.ms back to it.
    "log.retention.hours": "-1",
    "num.partitions": "2",
}


# --- records ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rec:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int | None  # None: set by the producer's clock (kcat cannot choose one)


def numbered(*specs) -> tuple[Rec, ...]:
    """(partition, key, value, headers, timestamp) specs -> Recs with their expected offsets."""
    next_offset: dict[int, int] = {}
    out = []
    for partition, key, value, headers, timestamp in specs:
        offset = next_offset.get(partition, 0)
        next_offset[partition] = offset + 1
        out.append(Rec(partition, offset, key, value, headers, timestamp))
    return tuple(out)


RECORDS = numbered(
    (0, b"k0", b"v0", (("h", b"1"),), T0),
    (1, None, b"null key", (), T0 + 1),
    (0, b"", b"empty key", (("dup", b"a"), ("dup", b"b")), T0 + 2),
    (1, b"k3", None, (("empty", b""), ("null", None)), T0 + 3),  # a tombstone
    (0, b"k4", b"x" * 4000, (("big", b"yes"),), T0 - 60_000),  # older than the one before
    (1, b"\x00\xff\n", bytes(range(256)), (("bin", b"ok"),), T0 + 5),
    (0, "schlüssel".encode(), "wert äöü 日本".encode(), (("größe", "groß".encode()),), T0 + 6),
    (0, b"k7", b"", (), T0 + 7),
    (1, b"k8", b"y" * 3000, (), T0 + 8),  # each partition has something worth compressing
)

# kcat reads one message per line, takes one header set per run and stamps the time itself.
KCAT_RUNS = (
    (0, (("h", b"1"), ("dup", b"a"), ("dup", b"b")),
     (b"k0\tv0", b"\tnull key", b"k2\t" + b"x" * 4000, b"k3\t")),
    (1, (("utf", "groß".encode()),),
     ("schlüssel\twert äöü 日本".encode(), b"k5\tv5", b"k6\t" + b"y" * 3000)),
)


def _kcat_line(line: bytes) -> tuple[bytes | None, bytes | None]:
    """What ``kcat -K '\\t' -Z`` makes of a line: an empty key or value is sent as null."""
    key, value = line.split(b"\t", 1)
    return key or None, value or None


KCAT_RECORDS = numbered(*(
    (partition, *_kcat_line(line), headers, None)
    for partition, headers, lines in KCAT_RUNS for line in lines
))


def without_null_headers(records):
    """kafka-python's producer refuses a null header value; it writes an empty one instead."""
    return tuple(replace(r, headers=tuple((k, b"" if v is None else v) for k, v in r.headers))
                 for r in records)


# --- brokers and topics -------------------------------------------------------------------------

def _stop_cleanly(broker: BrokerProcess) -> None:
    code = broker.stop()
    assert code == 0, f"broker exited with {code}; its log:\n{broker.log_text()}"
    assert "Traceback" not in broker.log_text(), broker.log_text()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One broker for the tests that each work in topics of their own."""
    broker = BrokerProcess(tmp_path_factory.mktemp("clients") / "data", SHARED_SETTINGS).start()
    yield broker
    _stop_cleanly(broker)


def create_topics(bootstrap: str, partitions: int, *names: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [NewTopic(name, num_partitions=partitions, replication_factor=1,
                       config={k.replace("_", "."): v for k, v in configs.items()})
              for name in names]
    for future in admin.create_topics(topics, request_timeout=TIMEOUT).values():
        future.result(TIMEOUT)


def kcat(*args: str, stdin: bytes = b"") -> bytes:
    done = subprocess.run(["kcat", *args], input=stdin, capture_output=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"ERROR" not in done.stderr and b"fail" not in done.stderr.lower(), done.stderr
    return done.stdout


# --- producers: each returns (records as they should now be stored, (t_before, t_after)) -----

def _clock_ms() -> int:
    return int(time.time() * 1000)


def produce_confluent(bootstrap: str, topic: str, codec: str, records=RECORDS, **config):
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                         "linger.ms": 20, **config})
    reports: dict[int, tuple] = {}

    def on_delivery(i, err, msg):
        reports[i] = (err, msg.partition(), msg.offset())

    before = _clock_ms()
    for i, r in enumerate(records):
        producer.produce(topic, value=r.value, key=r.key, partition=r.partition,
                         headers=list(r.headers), timestamp=r.timestamp,
                         on_delivery=functools.partial(on_delivery, i))
    assert producer.flush(TIMEOUT) == 0
    assert reports == {i: (None, r.partition, r.offset) for i, r in enumerate(records)}
    return records, (before, _clock_ms())


def produce_kafka_python(bootstrap: str, topic: str, codec: str, records=RECORDS):
    records = without_null_headers(records)
    producer = kafka.KafkaProducer(
        # A linger no test reaches: each flush() sends what it gathered as one batch per
        # partition, which the tests that depend on batch boundaries rely on.
        bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=int(TIMEOUT * 1000),
        compression_type=None if codec == "none" else codec,
        request_timeout_ms=int(TIMEOUT * 1000), max_block_ms=int(TIMEOUT * 1000))
    before = _clock_ms()
    try:
        futures = [producer.send(topic, value=r.value, key=r.key, partition=r.partition,
                                 headers=list(r.headers), timestamp_ms=r.timestamp)
                   for r in records]
        producer.flush(TIMEOUT)
        placed = [(m.partition, m.offset) for m in (f.get(TIMEOUT) for f in futures)]
    finally:
        producer.close(TIMEOUT)
    assert placed == [(r.partition, r.offset) for r in records]
    return records, (before, _clock_ms())


def produce_aiokafka(bootstrap: str, topic: str, codec: str, records=RECORDS):
    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20,
                                    compression_type=None if codec == "none" else codec,
                                    request_timeout_ms=int(TIMEOUT * 1000))
        await asyncio.wait_for(producer.start(), TIMEOUT)
        try:
            futures = [await producer.send(topic, value=r.value, key=r.key,
                                           partition=r.partition, headers=list(r.headers),
                                           timestamp_ms=r.timestamp)
                       for r in records]
            metas = await asyncio.wait_for(asyncio.gather(*futures), TIMEOUT)
        finally:
            await asyncio.wait_for(producer.stop(), TIMEOUT)
        return [(m.partition, m.offset) for m in metas]

    before = _clock_ms()
    assert asyncio.run(run()) == [(r.partition, r.offset) for r in records]
    return records, (before, _clock_ms())


def produce_kcat(bootstrap: str, topic: str, codec: str):
    before = _clock_ms()
    for partition, headers, lines in KCAT_RUNS:
        args = ["-P", "-b", bootstrap, "-t", topic, "-p", str(partition), "-K", "\t", "-Z"]
        for name, value in headers:
            args += ["-H", f"{name}={value.decode()}"]
        if codec != "none":
            args += ["-z", codec]
        kcat(*args, stdin=b"\n".join(lines) + b"\n")
    return KCAT_RECORDS, (before, _clock_ms())


PRODUCERS = {
    "confluent": produce_confluent,
    "kafka-python": produce_kafka_python,
    "aiokafka": produce_aiokafka,
    "kcat": produce_kcat,
}


# --- consumers: each reads ``count`` records from ``starts`` ({partition: offset}) ------------

def consume_confluent(bootstrap: str, topic: str, starts: dict[int, int], count: int,
                      **config):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                         "enable.auto.commit": False, "enable.auto.offset.store": False,
                         **config})
    got = []
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        deadline = time.monotonic() + TIMEOUT
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            ts_type, ts = msg.timestamp()
            assert ts_type == TIMESTAMP_CREATE_TIME
            got.append(Rec(msg.partition(), msg.offset(), msg.key(), msg.value(),
                           tuple(msg.headers() or ()), ts))
    finally:
        consumer.close()
    return got


def consume_kafka_python(bootstrap: str, topic: str, starts: dict[int, int], count: int,
                         **config):
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                   enable_auto_commit=False,
                                   request_timeout_ms=int(TIMEOUT * 1000) + 5000, **config)
    got = []
    try:
        consumer.assign([kafka.TopicPartition(topic, p) for p in starts])
        for p, o in starts.items():
            consumer.seek(kafka.TopicPartition(topic, p), o)
        deadline = time.monotonic() + TIMEOUT
        while len(got) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                for m in batch:
                    assert m.timestamp_type == 0  # CreateTime
                    got.append(Rec(m.partition, m.offset, m.key, m.value, tuple(m.headers),
                                   m.timestamp))
    finally:
        consumer.close()
    return got


def consume_aiokafka(bootstrap: str, topic: str, starts: dict[int, int], count: int,
                     **config):
    async def run():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                    enable_auto_commit=False, **config)
        await asyncio.wait_for(consumer.start(), TIMEOUT)
        got = []
        try:
            consumer.assign([AioTopicPartition(topic, p) for p in starts])
            for p, o in starts.items():
                consumer.seek(AioTopicPartition(topic, p), o)
            deadline = time.monotonic() + TIMEOUT
            while len(got) < count and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    for m in batch:
                        assert m.timestamp_type == 0  # CreateTime
                        got.append(Rec(m.partition, m.offset, m.key, m.value,
                                       tuple(m.headers), m.timestamp))
        finally:
            await asyncio.wait_for(consumer.stop(), TIMEOUT)
        return got

    return asyncio.run(run())


# One text line of metadata, then the key and the value bytes, whose lengths it gives.
KCAT_FORMAT = "%p %o %T %K %S %h\\n%k%s\\n"


def _parse_kcat(out: bytes) -> list[Rec]:
    got = []
    pos = 0
    while pos < len(out):
        eol = out.index(b"\n", pos)
        partition, offset, ts, klen, vlen, *hdr = out[pos:eol].decode().split(" ", 5)
        pos = eol + 1
        key = value = None
        if int(klen) >= 0:
            key, pos = out[pos:pos + int(klen)], pos + int(klen)
        if int(vlen) >= 0:
            value, pos = out[pos:pos + int(vlen)], pos + int(vlen)
        assert out[pos:pos + 1] == b"\n"
        pos += 1
        got.append(Rec(int(partition), int(offset), key, value, _kcat_headers(hdr[0]), int(ts)))
    return got


def _kcat_headers(text: str) -> tuple[tuple[str, bytes | None], ...]:
    """kcat's ``%h``: ``name=value`` pairs joined by commas, a null value printed as NULL."""
    if not text:
        return ()
    pairs = (item.split("=", 1) for item in text.split(","))
    return tuple((k, None if v == "NULL" else v.encode()) for k, v in pairs)


def consume_kcat(bootstrap: str, topic: str, starts: dict[int, int], count: int):
    got = []
    for partition, offset in starts.items():
        got += _parse_kcat(kcat("-C", "-b", bootstrap, "-t", topic, "-p", str(partition),
                                "-o", str(offset), "-e", "-q", "-f", KCAT_FORMAT,
                                "-X", "fetch.wait.max.ms=50"))
    return got


CONSUMERS = {
    "confluent": consume_confluent,
    "kafka-python": consume_kafka_python,
    "aiokafka": consume_aiokafka,
    "kcat": consume_kcat,
}


def assert_records(got, expected, window, what: str) -> None:
    """Exact match, in partition then offset order; a producer-clock timestamp within window."""
    got = sorted(got, key=lambda r: (r.partition, r.offset))
    expected = sorted(expected, key=lambda r: (r.partition, r.offset))
    assert len(got) == len(expected), f"{what}: {len(got)} records, expected {len(expected)}"
    lo, hi = window
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if e.timestamp is None:
            assert lo <= g.timestamp <= hi, f"{what}: timestamp of {g} outside {window}"
            expected[i] = replace(e, timestamp=g.timestamp)
    assert got == expected, what


def assert_compressed(broker: BrokerProcess, topic: str, records, codec: str, producer: str):
    """Each batch holding a big record is compressed with ``codec``; no batch uses another.

    librdkafka sends a batch uncompressed when compressing would not make it smaller, so a
    batch of small records alone may be plain.
    """
    for partition in {r.partition for r in records}:
        big = {r.offset for r in records if r.partition == partition and len(r.value or b"") > 1000}
        for h in batches_on_disk(broker, topic, partition):
            holds_big = any(h.base_offset <= o <= h.last_offset for o in big)
            allowed = {CODECS[codec]} if holds_big else {CODECS[codec], CODECS["none"]}
            assert h.compression in allowed, f"{producer} wrote a batch with codec " \
                f"{h.compression} at {topic}-{partition}@{h.base_offset}, not {codec}"


# --- the round trip ----------------------------------------------------------------------------

@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_round_trip_every_codec_every_client(shared, producer, codec):
    topic = f"rt-{producer}-{codec}"
    create_topics(shared.bootstrap, 2, topic)
    expected, window = PRODUCERS[producer](shared.bootstrap, topic, codec)
    assert_compressed(shared, topic, expected, codec, producer)
    for reader, consume in CONSUMERS.items():
        got = consume(shared.bootstrap, topic, {0: 0, 1: 0}, len(expected))
        assert_records(got, expected, window, f"{producer} wrote {codec}, {reader} read")


# --- seeking -----------------------------------------------------------------------------------

SEEK_RECORDS = numbered(
    *((0, b"a%d" % i, b"first batch %d " % i * 20, (("i", b"%d" % i),), T0 + i)
      for i in range(10)),
    *((1, b"c%d" % i, b"other partition %d " % i * 20, (), T0 + i) for i in range(6)),
)
SEEK_SECOND_BATCH = numbered(
    *((0, b"b%d" % i, b"second batch %d" % i, (), T0 + 10 + i) for i in range(10)),
)


@pytest.fixture(scope="module")
def seek_topic(shared):
    """Partition 0: an lz4 batch of offsets 0-9, then a plain one of 10-19; partition 1: 0-5."""
    topic = "seek"
    create_topics(shared.bootstrap, 2, topic)
    produce_kafka_python(shared.bootstrap, topic, "lz4", SEEK_RECORDS)
    second = tuple(replace(r, offset=r.offset + 10) for r in SEEK_SECOND_BATCH)
    produce_kafka_python(shared.bootstrap, topic, "none", second)
    layout = [(h.base_offset, h.records_count, h.compression)
              for h in batches_on_disk(shared, topic, 0)]
    assert layout == [(0, 10, CODECS["lz4"]), (10, 10, CODECS["none"])]
    assert len(batches_on_disk(shared, topic, 1)) == 1
    return topic, SEEK_RECORDS + second


@pytest.mark.parametrize("reader", list(CONSUMERS))
def test_seek_into_the_middle_of_a_batch(shared, seek_topic, reader):
    topic, records = seek_topic
    for starts in ({0: 5, 1: 3}, {0: 13, 1: 0}, {0: 10, 1: 5}, {0: 19, 1: 6}, {0: 1}):
        expected = [r for r in records
                    if r.partition in starts and r.offset >= starts[r.partition]]
        got = CONSUMERS[reader](shared.bootstrap, topic, starts, len(expected))
        assert_records(got, expected, (0, 0), f"{reader} from {starts}")


def reseek_confluent(bootstrap: str, topic: str, back_to: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                         "enable.auto.commit": False})
    offsets: list[int] = []
    deadline = time.monotonic() + TIMEOUT
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        while len(offsets) < 20 + 20 - back_to and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            offsets.append(msg.offset())
            if len(offsets) == 20:
                consumer.seek(TopicPartition(topic, 0, back_to))
    finally:
        consumer.close()
    return offsets


def reseek_kafka_python(bootstrap: str, topic: str, back_to: int) -> list[int]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                   enable_auto_commit=False)
    tp = kafka.TopicPartition(topic, 0)
    offsets: list[int] = []
    deadline = time.monotonic() + TIMEOUT
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        while len(offsets) < 20 and time.monotonic() < deadline:
            offsets += [m.offset for m in consumer.poll(timeout_ms=500).get(tp, [])]
        consumer.seek(tp, back_to)
        while len(offsets) < 20 + 20 - back_to and time.monotonic() < deadline:
            offsets += [m.offset for m in consumer.poll(timeout_ms=500).get(tp, [])]
    finally:
        consumer.close()
    return offsets


def reseek_aiokafka(bootstrap: str, topic: str, back_to: int) -> list[int]:
    async def run():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                    enable_auto_commit=False)
        await asyncio.wait_for(consumer.start(), TIMEOUT)
        tp = AioTopicPartition(topic, 0)
        offsets: list[int] = []
        deadline = time.monotonic() + TIMEOUT
        try:
            consumer.assign([tp])
            consumer.seek(tp, 0)
            while len(offsets) < 20 and time.monotonic() < deadline:
                offsets += [m.offset for m in (await consumer.getmany(timeout_ms=500))
                            .get(tp, [])]
            consumer.seek(tp, back_to)
            while len(offsets) < 20 + 20 - back_to and time.monotonic() < deadline:
                offsets += [m.offset for m in (await consumer.getmany(timeout_ms=500))
                            .get(tp, [])]
        finally:
            await asyncio.wait_for(consumer.stop(), TIMEOUT)
        return offsets

    return asyncio.run(run())


RESEEKS = {"confluent": reseek_confluent, "kafka-python": reseek_kafka_python,
           "aiokafka": reseek_aiokafka}


@pytest.mark.parametrize("reader", list(RESEEKS))
def test_seek_back_into_a_batch_while_consuming(shared, seek_topic, reader):
    topic, _ = seek_topic
    offsets = RESEEKS[reader](shared.bootstrap, topic, 7)
    assert offsets == list(range(20)) + list(range(7, 20))


TINY_FETCHES = {
    # librdkafka wants fetch.max.bytes >= message.max.bytes (its floor is 1000)
    "confluent": {"fetch.max.bytes": 1000, "message.max.bytes": 1000,
                  "max.partition.fetch.bytes": 100},
    "kafka-python": {"fetch_max_bytes": 100, "max_partition_fetch_bytes": 100},
    "aiokafka": {"fetch_max_bytes": 100, "max_partition_fetch_bytes": 100},
}


@pytest.mark.parametrize("reader", list(TINY_FETCHES))
def test_fetch_limits_smaller_than_a_batch_still_make_progress(shared, seek_topic, reader):
    """KIP-74: the first batch comes whole even when it is over the fetch's byte limits."""
    topic, records = seek_topic
    starts = {0: 3, 1: 0}
    expected = [r for r in records if r.offset >= starts[r.partition]]
    got = CONSUMERS[reader](shared.bootstrap, topic, starts, len(expected),
                            **TINY_FETCHES[reader])
    assert_records(got, expected, (0, 0), f"{reader} with 100-byte fetches")


def test_a_waiting_fetch_wakes_when_records_arrive(shared):
    topic = "long-poll"
    create_topics(shared.bootstrap, 1, topic)
    consumer = Consumer({"bootstrap.servers": shared.bootstrap, "group.id": GROUP,
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10_000})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        assert consumer.poll(1.0) is None  # now a Fetch is parked at the broker
        sent = time.monotonic()
        produce_confluent(shared.bootstrap, topic, "none", numbered((0, b"k", b"v", (), T0)))
        msg = consumer.poll(TIMEOUT)
        waited = time.monotonic() - sent
    finally:
        consumer.close()
    assert msg is not None and msg.error() is None and msg.value() == b"v"
    assert waited < 5, f"the parked fetch answered after {waited:.1f}s, not on the append"


# --- ListOffsets ------------------------------------------------------------------------------

# Partition 0 in three batches, timestamps deliberately not in offset order; partition 1 empty.
TIMED_BATCHES = (
    (T0 + 1000, T0 + 2000, T0 + 2000, T0 + 3000),  # offsets 0-3
    (T0 + 1500, T0 + 4000),  # offsets 4-5: the first goes back in time
    (T0 + 4000,),  # offset 6: ties the maximum
)
# target timestamp -> (offset, timestamp) of the first record at or after it (Kafka's rule:
# the lowest offset whose timestamp is >= the target), None when there is none.
BY_TIME = {
    T0: (0, T0 + 1000),
    T0 + 1000: (0, T0 + 1000),
    T0 + 1001: (1, T0 + 2000),
    T0 + 1200: (1, T0 + 2000),  # not offset 4 (T0+1500): it comes later in the log
    T0 + 2000: (1, T0 + 2000),
    T0 + 2001: (3, T0 + 3000),
    T0 + 3001: (5, T0 + 4000),
    T0 + 4000: (5, T0 + 4000),
    T0 + 4001: None,
}
EARLIEST, LATEST, MAX_TIMESTAMP = 0, 7, (5, T0 + 4000)  # the first record to reach the max


def lookups_confluent(bootstrap: str, topic: str):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP})
    try:
        # One lookup per call: librdkafka keeps one lookup per partition in a call.
        found = [consumer.offsets_for_times([TopicPartition(topic, p, ts)], timeout=TIMEOUT)[0]
                 for p, ts in [(0, ts) for ts in BY_TIME] + [(1, T0)]]
        marks = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT,
                                                cached=False) for p in (0, 1)]
    finally:
        consumer.close()
    assert all(tp.error is None for tp in found)
    return [None if tp.offset < 0 else tp.offset for tp in found], marks


def lookups_kafka_python(bootstrap: str, topic: str):
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    try:
        tps = [kafka.TopicPartition(topic, p) for p in (0, 1)]
        found = [consumer.offsets_for_times({tp: ts}, timeout_ms=TIMEOUT * 1000)[tp]
                 for tp, ts in [(tps[0], ts) for ts in BY_TIME] + [(tps[1], T0)]]
        low = consumer.beginning_offsets(tps, timeout_ms=TIMEOUT * 1000)
        high = consumer.end_offsets(tps, timeout_ms=TIMEOUT * 1000)
    finally:
        consumer.close()
    return found, [(low[tp], high[tp]) for tp in tps]


def lookups_aiokafka(bootstrap: str, topic: str):
    async def run():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        await asyncio.wait_for(consumer.start(), TIMEOUT)
        try:
            tps = [AioTopicPartition(topic, p) for p in (0, 1)]
            found = []
            for tp, ts in [(tps[0], ts) for ts in BY_TIME] + [(tps[1], T0)]:
                answer = await asyncio.wait_for(consumer.offsets_for_times({tp: ts}), TIMEOUT)
                found.append(answer[tp])
            low = await asyncio.wait_for(consumer.beginning_offsets(tps), TIMEOUT)
            high = await asyncio.wait_for(consumer.end_offsets(tps), TIMEOUT)
        finally:
            await asyncio.wait_for(consumer.stop(), TIMEOUT)
        return found, [(low[tp], high[tp]) for tp in tps]

    return asyncio.run(run())


def lookups_kcat(bootstrap: str, topic: str):
    def query(*specs: tuple[int, int]) -> list[int | None]:
        args = ["-Q", "-b", bootstrap]
        for partition, ts in specs:
            args += ["-t", f"{topic}:{partition}:{ts}"]
        lines = kcat(*args).decode().splitlines()
        # "<topic> [<partition>] offset <offset>", one line per partition asked for
        offsets = {int(line.split()[1].strip("[]")): int(line.split()[-1]) for line in lines}
        return [None if offsets[p] < 0 else offsets[p] for p, _ in specs]

    # kcat asks once per partition per run, so each lookup is a run of its own.
    found = [query((0, ts))[0] for ts in BY_TIME] + [query((1, T0))[0]]
    low, high = query((0, -2), (1, -2)), query((0, -1), (1, -1))
    return found, list(zip(low, high, strict=True))


LOOKUPS = {
    "confluent": lookups_confluent,
    "kafka-python": lookups_kafka_python,
    "aiokafka": lookups_aiokafka,
    "kcat": lookups_kcat,
}

LAYOUTS = {
    "one-segment": {},
    "every-batch-indexed": {"index.interval.bytes": "1"},
    "segment-per-batch": {"internal.segment.bytes": "100"},
}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def timed_topic(request, shared):
    topic = f"times-{request.param}"
    create_topics(shared.bootstrap, 2, topic, **LAYOUTS[request.param])
    offset = 0
    for stamps in TIMED_BATCHES:
        batch = numbered(*((0, b"k", b"v", (), ts) for ts in stamps))
        # kafka-python sends what one flush gathered as one batch; librdkafka may split it.
        produce_kafka_python(shared.bootstrap, topic, "none",
                             tuple(replace(r, offset=r.offset + offset) for r in batch))
        offset += len(stamps)
    bases = [h.base_offset for h in batches_on_disk(shared, topic, 0)]
    assert bases == [0, 4, 6]
    return topic


@pytest.mark.parametrize("client", list(LOOKUPS))
def test_list_offsets(shared, timed_topic, client):
    found, marks = LOOKUPS[client](shared.bootstrap, timed_topic)
    offsets = [f if f is None or isinstance(f, int) else f.offset for f in found]
    assert offsets == [None if e is None else e[0] for e in BY_TIME.values()] + [None]
    if client in ("kafka-python", "aiokafka"):  # they also tell the timestamp found
        stamps = [None if f is None else f.timestamp for f in found]
        assert stamps == [None if e is None else e[1] for e in BY_TIME.values()] + [None]
    assert marks == [(EARLIEST, LATEST), (0, 0)]


def test_list_offsets_by_spec_with_admin_clients(shared, timed_topic):
    """ListOffsets v7 through the admin APIs, max timestamp (-3) included."""
    tp0, tp1 = TopicPartition(timed_topic, 0), TopicPartition(timed_topic, 1)
    specs = {"earliest": OffsetSpec.earliest(), "latest": OffsetSpec.latest(),
             "max": OffsetSpec.max_timestamp(), "t": OffsetSpec.for_timestamp(T0 + 3001)}
    admin = AdminClient({"bootstrap.servers": shared.bootstrap})
    answers = {}
    for name, spec in specs.items():
        futures = admin.list_offsets({tp0: spec, tp1: spec}, request_timeout=TIMEOUT)
        answers[name] = [(futures[tp].result(TIMEOUT).offset,
                          futures[tp].result(TIMEOUT).timestamp) for tp in (tp0, tp1)]
    assert answers == {
        "earliest": [(EARLIEST, -1), (0, -1)],
        "latest": [(LATEST, -1), (0, -1)],
        "max": [MAX_TIMESTAMP, (-1, -1)],
        "t": [BY_TIME[T0 + 3001], (-1, -1)],
    }

    kadmin = kafka.KafkaAdminClient(bootstrap_servers=shared.bootstrap)
    try:
        ktp0, ktp1 = kafka.TopicPartition(timed_topic, 0), kafka.TopicPartition(timed_topic, 1)
        for spec, expected in ((kafka.admin.OffsetSpec.MAX_TIMESTAMP, MAX_TIMESTAMP),
                               (kafka.admin.OffsetSpec.EARLIEST, (EARLIEST, -1)),
                               (kafka.admin.OffsetSpec.LATEST, (LATEST, -1)),
                               (T0 + 1001, BY_TIME[T0 + 1001])):
            got = kadmin.list_partition_offsets({ktp0: spec, ktp1: spec},
                                                timeout_ms=TIMEOUT * 1000)
            assert (got[ktp0].offset, got[ktp0].timestamp) == expected, spec
    finally:
        kadmin.close()


# --- topic administration ---------------------------------------------------------------------

class ConfluentAdmin:
    def __init__(self, bootstrap: str) -> None:
        self.admin = AdminClient({"bootstrap.servers": bootstrap})

    @staticmethod
    def _outcome(future) -> ErrorCode:
        try:
            future.result(TIMEOUT)
        except KafkaException as exc:
            return ErrorCode(exc.args[0].code())
        return ErrorCode.none

    def create(self, name, partitions=-1, replication=-1, configs=None, validate_only=False):
        topic = NewTopic(name, num_partitions=partitions, replication_factor=replication,
                         config=configs or {})
        futures = self.admin.create_topics([topic], request_timeout=TIMEOUT,
                                           validate_only=validate_only)
        return self._outcome(futures[name])

    def delete(self, name):
        return self._outcome(self.admin.delete_topics([name], request_timeout=TIMEOUT)[name])

    def topics(self) -> dict[str, int]:
        return {name: len(t.partitions)
                for name, t in self.admin.list_topics(timeout=TIMEOUT).topics.items()}

    def describe(self, name):
        resource = ConfigResource(ResourceType.TOPIC, name)
        try:
            entries = self.admin.describe_configs([resource])[resource].result(TIMEOUT)
        except KafkaException as exc:
            return ErrorCode(exc.args[0].code())
        return {k: (e.value, ConfigSource(e.source).name) for k, e in entries.items()}

    def close(self) -> None:
        pass



class KafkaPythonAdmin:
    def __init__(self, bootstrap: str) -> None:
        self.admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap,
                                            request_timeout_ms=int(TIMEOUT * 1000))

    @staticmethod
    def _outcome(call) -> ErrorCode:
        try:
            call()
        except kafka.errors.KafkaError as exc:
            return ErrorCode(exc.errno)
        return ErrorCode.none

    def create(self, name, partitions=-1, replication=-1, configs=None, validate_only=False):
        spec = {name: {"num_partitions": partitions, "replication_factor": replication,
                       "configs": configs or {}}}
        return self._outcome(lambda: self.admin.create_topics(spec, validate_only=validate_only))

    def delete(self, name):
        return self._outcome(lambda: self.admin.delete_topics([name]))

    def topics(self) -> dict[str, int]:
        return {t["name"]: len(t["partitions"]) for t in self.admin.describe_topics()}

    def describe(self, name):
        resource = kafka.admin.ConfigResource(kafka.admin.ConfigResourceType.TOPIC, name)
        try:
            answer = self.admin.describe_configs([resource], config_filter="all")
        except kafka.errors.KafkaError as exc:
            return ErrorCode(exc.errno)
        return {k: (e["value"], e["config_source"]) for k, e in answer["topic"][name].items()}

    def close(self) -> None:
        self.admin.close()


ADMINS = {"confluent": ConfluentAdmin, "kafka-python": KafkaPythonAdmin}
LONG_MAX = str((1 << 63) - 1)


@pytest.mark.parametrize("client", list(ADMINS))
def test_topic_admin(shared, client):
    admin = ADMINS[client](shared.bootstrap)
    a, b, c = (f"admin-{client}-{x}" for x in "abc")
    try:
        assert admin.create(a, 3, 1, {"retention.ms": "12345", "segment.bytes": "1048576"}) \
            == ErrorCode.none
        assert admin.create(b) == ErrorCode.none  # the broker's partitions and replication
        assert admin.create(c, 4, 1, validate_only=True) == ErrorCode.none
        topics = admin.topics()
        assert (topics.get(a), topics.get(b), topics.get(c)) == (3, 2, None)

        configs = admin.describe(a)
        assert configs["retention.ms"] == ("12345", "DYNAMIC_TOPIC_CONFIG")
        assert configs["segment.bytes"] == ("1048576", "DYNAMIC_TOPIC_CONFIG")
        assert configs["cleanup.policy"] == ("delete", "DEFAULT_CONFIG")
        assert configs["flush.ms"] == (LONG_MAX, "DEFAULT_CONFIG")
        configs = admin.describe(b)
        assert configs["retention.ms"] == ("-1", "STATIC_BROKER_CONFIG")  # log.retention.hours
        assert configs["segment.bytes"] == ("1073741824", "DEFAULT_CONFIG")

        refusals = {
            "exists": admin.create(a, 1, 1),
            "space": admin.create("bad name", 1, 1),
            "dots": admin.create("..", 1, 1),
            "long": admin.create("x" * 250, 1, 1),
            "replicas": admin.create(f"admin-{client}-rf", 1, 3),
            "unknown config": admin.create(f"admin-{client}-cfg", 1, 1, {"no.such.config": "1"}),
            "bad value": admin.create(f"admin-{client}-val", 1, 1, {"retention.ms": "soon"}),
        }
        assert refusals == {
            "exists": ErrorCode.topic_already_exists,
            "space": ErrorCode.invalid_topic_exception,
            "dots": ErrorCode.invalid_topic_exception,
            "long": ErrorCode.invalid_topic_exception,
            "replicas": ErrorCode.invalid_replication_factor,
            "unknown config": ErrorCode.invalid_config,
            "bad value": ErrorCode.invalid_config,
        }
        assert not {f"admin-{client}-{x}" for x in ("rf", "cfg", "val")} & set(admin.topics())

        assert (admin.delete(a), admin.delete(b)) == (ErrorCode.none, ErrorCode.none)
        assert not {a, b} & set(admin.topics())
        assert admin.delete(a) == ErrorCode.unknown_topic_or_partition
        # kafka-python drops DescribeConfigs' per-resource errors: it shows no configs.
        gone = {} if client == "kafka-python" else ErrorCode.unknown_topic_or_partition
        assert admin.describe(a) == gone
        assert admin.create(a, 1, 1) == ErrorCode.none  # the name is free again
        assert admin.topics()[a] == 1
    finally:
        admin.close()


def test_a_topic_named_twice_in_one_request_is_refused(shared):
    """Kafka answers a name given twice once, INVALID_REQUEST, and goes on with the others.

    kafka-python only: confluent-kafka 2.16.1 sends the duplicate too, and then crashes the
    process (SIGSEGV) on Kafka's one answer for two futures.
    """
    admin = kafka.KafkaAdminClient(bootstrap_servers=shared.bootstrap)
    try:
        created = admin.create_topics(["twice", "twice", "once"], raise_errors=False)
        topics = set(admin.list_topics())
        deleted = admin.delete_topics(["once", "once"], raise_errors=False)
    finally:
        admin.close()
    assert sorted((t["name"], t["error_code"]) for t in created["topics"]) == \
        [("once", ErrorCode.none), ("twice", ErrorCode.invalid_request)]
    assert "once" in topics and "twice" not in topics
    assert [(t["name"], t["error_code"]) for t in deleted["topics"]] == \
        [("once", ErrorCode.invalid_request)]


def test_validate_only_answers_what_would_be_created(shared):
    admin = kafka.KafkaAdminClient(bootstrap_servers=shared.bootstrap)
    try:
        answer = admin.create_topics({"validated": {}}, validate_only=True)
        topics = set(admin.list_topics())
    finally:
        admin.close()
    (result,) = answer["topics"]
    assert (result["error_code"], result["num_partitions"], result["replication_factor"]) == \
        (ErrorCode.none, 2, 1)  # the broker's num.partitions, not the -1 asked for
    assert result["configs"]["retention.ms"]["config_source"] == "STATIC_BROKER_CONFIG"
    assert "validated" not in topics


# --- auto-creation ----------------------------------------------------------------------------

def test_producing_to_a_new_topic_creates_it(start_broker):
    broker = start_broker(**{"auto.create.topics.enable": "true", "num.partitions": "3"})
    one = numbered((0, b"k", b"auto", (), T0))
    produce_confluent(broker.bootstrap, "auto-confluent", "none", one)
    produce_kafka_python(broker.bootstrap, "auto-kafka-python", "none", one)
    produce_aiokafka(broker.bootstrap, "auto-aiokafka", "none", one)
    kcat("-P", "-b", broker.bootstrap, "-t", "auto-kcat", "-p", "0", stdin=b"auto\n")
    topics = ConfluentAdmin(broker.bootstrap).topics()
    assert {name: topics.get(name) for name in
            ("auto-confluent", "auto-kafka-python", "auto-aiokafka", "auto-kcat")} == \
        dict.fromkeys(("auto-confluent", "auto-kafka-python", "auto-aiokafka", "auto-kcat"), 3)
    got = consume_confluent(broker.bootstrap, "auto-kcat", {0: 0}, 1)
    assert [(r.offset, r.key, r.value) for r in got] == [(0, None, b"auto")]


def test_producing_to_a_missing_topic_fails_without_auto_creation(start_broker):
    broker = start_broker(**{"auto.create.topics.enable": "false"})
    producer = Producer({"bootstrap.servers": broker.bootstrap,
                         "topic.metadata.propagation.max.ms": 500, "message.timeout.ms": 5000})
    errors = []
    producer.produce("missing", b"v", on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(TIMEOUT) == 0
    del producer
    assert [e.code() for e in errors] == [KafkaError.UNKNOWN_TOPIC_OR_PART]

    async def aiokafka_send():
        # aiokafka waits request_timeout_ms for the topic to appear before it says so.
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, request_timeout_ms=1000)
        await asyncio.wait_for(producer.start(), TIMEOUT)
        try:
            await asyncio.wait_for(producer.send_and_wait("missing", b"v"), TIMEOUT)
        finally:
            await asyncio.wait_for(producer.stop(), TIMEOUT)

    with pytest.raises(aiokafka.errors.UnknownTopicOrPartitionError):
        asyncio.run(aiokafka_send())

    # kafka-python waits for the topic to appear and gives up after max_block_ms.
    kproducer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap,
                                    enable_idempotence=False, max_block_ms=1000)
    try:
        with pytest.raises(kafka.errors.KafkaTimeoutError):
            kproducer.send("missing", b"v").get(TIMEOUT)
    finally:
        kproducer.close(TIMEOUT)

    done = subprocess.run(["kcat", "-P", "-b", broker.bootstrap, "-t", "missing",
                           "-X", "topic.metadata.propagation.max.ms=500",
                           "-X", "message.timeout.ms=5000"],
                          input=b"v\n", capture_output=True, timeout=TIMEOUT)
    assert done.returncode != 0
    assert b"Unknown topic or partition" in done.stderr
    assert "missing" not in ConfluentAdmin(broker.bootstrap).topics()


# --- partitioning by key ----------------------------------------------------------------------

KEYED_PARTITIONS = 12
KEYS = [b"key-%d" % i for i in range(120)]


def java_partition(key: bytes) -> int:
    """The Java client's choice, which kafka-python, aiokafka and librdkafka's murmur2 share."""
    return (murmur2(key) & 0x7FFFFFFF) % KEYED_PARTITIONS


def send_keyed_confluent(bootstrap: str, topic: str, partitioner: str) -> dict[bytes, tuple]:
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": partitioner,
                         "linger.ms": 5})
    placed = {}
    for key in KEYS:
        producer.produce(topic, key=key, value=b"%s %s" % (partitioner.encode(), key),
                         on_delivery=lambda err, msg: placed.__setitem__(
                             msg.key(), err or (msg.partition(), msg.offset())))
    assert producer.flush(TIMEOUT) == 0
    return placed


def send_keyed_kafka_python(bootstrap: str, topic: str) -> dict[bytes, tuple]:
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False)
    try:
        futures = {key: producer.send(topic, key=key, value=b"kafka-python %s" % key)
                   for key in KEYS}
        producer.flush(TIMEOUT)
        return {key: (m.partition, m.offset)
                for key, m in ((k, f.get(TIMEOUT)) for k, f in futures.items())}
    finally:
        producer.close(TIMEOUT)


def send_keyed_aiokafka(bootstrap: str, topic: str) -> dict[bytes, tuple]:
    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await asyncio.wait_for(producer.start(), TIMEOUT)
        try:
            futures = [await producer.send(topic, key=key, value=b"aiokafka %s" % key)
                       for key in KEYS]
            metas = await asyncio.wait_for(asyncio.gather(*futures), TIMEOUT)
        finally:
            await asyncio.wait_for(producer.stop(), TIMEOUT)
        return {key: (m.partition, m.offset) for key, m in zip(KEYS, metas, strict=True)}

    return asyncio.run(run())


def test_keys_land_in_the_partition_the_client_chose(shared):
    topic = "keyed"
    create_topics(shared.bootstrap, KEYED_PARTITIONS, topic)
    java = {key: java_partition(key) for key in KEYS}
    crc = {key: zlib.crc32(key) % KEYED_PARTITIONS for key in KEYS}  # librdkafka's default
    assert len(set(java.values())) == len(set(crc.values())) == KEYED_PARTITIONS
    sent = {
        "murmur2_random": (send_keyed_confluent(shared.bootstrap, topic, "murmur2_random"), java),
        "consistent_random": (send_keyed_confluent(shared.bootstrap, topic,
                                                   "consistent_random"), crc),
        "kafka-python": (send_keyed_kafka_python(shared.bootstrap, topic), java),
        "aiokafka": (send_keyed_aiokafka(shared.bootstrap, topic), java),
    }
    for producer, (placed, expected) in sent.items():
        assert {k: p for k, (p, _) in placed.items()} == expected, producer

    starts = dict.fromkeys(range(KEYED_PARTITIONS), 0)
    stored = {(r.value.split(b" ")[0].decode(), r.key): (r.partition, r.offset)
              for r in consume_confluent(shared.bootstrap, topic, starts, 4 * len(KEYS))}
    assert len(stored) == 4 * len(KEYS)
    for producer, (placed, _) in sent.items():
        assert {k: stored[producer, k] for k in KEYS} == placed, producer


# --- 10,000 partitions ------------------------------------------------------------------------

def test_metadata_for_ten_thousand_partitions(start_broker):
    broker = start_broker()
    create_topics(broker.bootstrap, 10_000, "wide")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    partitions = admin.list_topics(topic="wide", timeout=TIMEOUT).topics["wide"].partitions
    assert sorted(partitions) == list(range(10_000))
    assert {(p.leader, tuple(p.replicas), tuple(p.isrs)) for p in partitions.values()} == \
        {(0, (0,), (0,))}

    kadmin = kafka.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        (described,) = kadmin.describe_topics(["wide"])
    finally:
        kadmin.close()
    assert len(described["partitions"]) == 10_000
    listing = kcat("-L", "-b", broker.bootstrap, "-t", "wide").decode()
    assert "topic \"wide\" with 10000 partitions:" in listing
    assert listing.count("partition ") == 10_000

    last = numbered(*((0, b"k", b"last partition", (), T0),))
    last = (replace(last[0], partition=9_999),)
    produce_confluent(broker.bootstrap, "wide", "none", last)
    assert_records(consume_kafka_python(broker.bootstrap, "wide", {9_999: 0}, 1), last, (0, 0),
                   "partition 9999")
    # What keeps 10,000 partitions cheap: an idle partition holds no files (no directory,
    # no segment) until something is written to it.
    assert [name for name in os.listdir(broker.data_dir) if name.startswith("wide-")] == \
        ["wide-9999"]


# --- retention moves the earliest offset -------------------------------------------------------

def test_earliest_offset_follows_retention(start_broker):
    broker = start_broker(**{"log.retention.check.interval.ms": "100"})
    topic = "retained"
    # Every batch in a segment of its own; an hour's retention drops the ones stamped T0.
    create_topics(broker.bootstrap, 1, topic, internal_segment_bytes="100",
                  retention_ms="3600000")
    now = _clock_ms()
    stamps = (T0, T0, T0, now, now)
    for offset, ts in enumerate(stamps):
        produce_kafka_python(broker.bootstrap, topic, "none",
                             (Rec(0, offset, b"k", b"v%d" % offset, (), ts),))
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": GROUP})
    deadline = time.monotonic() + TIMEOUT
    try:
        while True:
            marks = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT,
                                                   cached=False)
            if marks[0] > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        consumer.close()
    assert marks == (3, 5)

    # Reading from offset 0 is now out of range: each client resets to the earliest offset.
    expected = [(3, b"v3"), (4, b"v4")]
    confluent = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": GROUP,
                          "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        confluent.assign([TopicPartition(topic, 0, 0)])
        got = []
        while len(got) < 2 and time.monotonic() < deadline:
            msg = confluent.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append((msg.offset(), msg.value()))
    finally:
        confluent.close()
    assert got == expected
    kconsumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        tp = kafka.TopicPartition(topic, 0)
        kconsumer.assign([tp])
        kconsumer.seek(tp, 0)
        got = []
        while len(got) < 2 and time.monotonic() < deadline:
            got += [(m.offset, m.value) for m in kconsumer.poll(timeout_ms=500).get(tp, [])]
    finally:
        kconsumer.close()
    assert got == expected
    assert kcat("-C", "-b", broker.bootstrap, "-t", topic, "-p", "0", "-o", "beginning", "-e",
                "-q", "-f", "%o %s\\n", "-X", "fetch.wait.max.ms=50") == b"3 v3\n4 v4\n"


# --- what a topic asks of its records: keys when compacted, the broker's clock ----------------

@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_a_compacted_topic_refuses_keyless_records_from_every_client(shared, codec):
    topic = f"compacted-{codec}"
    create_topics(shared.bootstrap, 1, topic, cleanup_policy="compact")
    compression = None if codec == "none" else codec

    reports = []
    producer = Producer({"bootstrap.servers": shared.bootstrap, "compression.type": codec})
    producer.produce(topic, value=b"no key", on_delivery=lambda err, _: reports.append(err))
    producer.flush(TIMEOUT)
    assert [e.code() for e in reports] == [KafkaError.INVALID_RECORD]

    kproducer = kafka.KafkaProducer(bootstrap_servers=shared.bootstrap,
                                    enable_idempotence=False, compression_type=compression)
    try:
        with pytest.raises(kafka.errors.InvalidRecordError):
            kproducer.send(topic, value=b"no key").get(TIMEOUT)
    finally:
        kproducer.close(TIMEOUT)

    async def aiokafka_keyless():
        aproducer = AIOKafkaProducer(bootstrap_servers=shared.bootstrap,
                                     compression_type=compression)
        await asyncio.wait_for(aproducer.start(), TIMEOUT)
        try:
            with pytest.raises(aiokafka.errors.KafkaError):
                await asyncio.wait_for(aproducer.send_and_wait(topic, b"no key"), TIMEOUT)
        finally:
            await asyncio.wait_for(aproducer.stop(), TIMEOUT)

    asyncio.run(aiokafka_keyless())
    failed = subprocess.run(["kcat", "-P", "-b", shared.bootstrap, "-t", topic, "-z", codec],
                            input=b"no key\n", capture_output=True, timeout=TIMEOUT)
    assert failed.returncode != 0
    assert b"Broker failed to validate record" in failed.stderr, failed.stderr

    # Records with keys go in, from every client, and nothing keyless was stored.
    records = numbered(*((0, b"k%d" % i, b"v%d" % i, (), T0 + i) for i in range(3)))
    produce_confluent(shared.bootstrap, topic, codec, records[:1])
    produce_kafka_python(shared.bootstrap, topic, codec,
                         tuple(replace(r, offset=1) for r in records[1:2]))
    produce_aiokafka(shared.bootstrap, topic, codec,
                     tuple(replace(r, offset=2) for r in records[2:]))
    got = consume_confluent(shared.bootstrap, topic, {0: 0}, 3)
    assert [(r.offset, r.key) for r in got] == [(0, b"k0"), (1, b"k1"), (2, b"k2")]


def test_log_append_time_with_every_client(shared):
    """The broker's clock replaces the producers' (here years old), in the producers'
    delivery reports and in what every consumer reads."""
    topic = "append-time"
    create_topics(shared.bootstrap, 1, topic, message_timestamp_type="LogAppendTime")
    before = _clock_ms()
    stamps = []
    producer = Producer({"bootstrap.servers": shared.bootstrap, "compression.type": "lz4"})
    for i in range(3):
        producer.produce(topic, key=b"k", value=b"v%d" % i, timestamp=T0 + i,
                         on_delivery=lambda err, msg: stamps.append(msg.timestamp()))
    producer.flush(TIMEOUT)
    kproducer = kafka.KafkaProducer(bootstrap_servers=shared.bootstrap, enable_idempotence=False)
    try:
        meta = kproducer.send(topic, key=b"k", value=b"v3", timestamp_ms=T0).get(TIMEOUT)
    finally:
        kproducer.close(TIMEOUT)
    after = _clock_ms()
    assert all(kind == TIMESTAMP_LOG_APPEND_TIME and before <= ts <= after
               for kind, ts in stamps), stamps
    assert before <= meta.timestamp <= after

    seen = {}
    consumer = Consumer({"bootstrap.servers": shared.bootstrap, "group.id": GROUP,
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + TIMEOUT
        while len(seen) < 4 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen[("confluent", msg.offset())] = msg.timestamp()
    finally:
        consumer.close()
    kconsumer = kafka.KafkaConsumer(bootstrap_servers=shared.bootstrap, group_id=None,
                                    enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        kconsumer.assign([kafka.TopicPartition(topic, 0)])
        deadline = time.monotonic() + TIMEOUT
        while len([k for k in seen if k[0] == "kafka-python"]) < 4 \
                and time.monotonic() < deadline:
            for batch in kconsumer.poll(timeout_ms=500).values():
                for m in batch:
                    seen[("kafka-python", m.offset)] = (m.timestamp_type + 1, m.timestamp)
    finally:
        kconsumer.close()

    async def aiokafka_read():
        aconsumer = AIOKafkaConsumer(bootstrap_servers=shared.bootstrap, group_id=None,
                                     enable_auto_commit=False, auto_offset_reset="earliest")
        await asyncio.wait_for(aconsumer.start(), TIMEOUT)
        try:
            aconsumer.assign([AioTopicPartition(topic, 0)])
            deadline = time.monotonic() + TIMEOUT
            while len([k for k in seen if k[0] == "aiokafka"]) < 4 \
                    and time.monotonic() < deadline:
                for batch in (await aconsumer.getmany(timeout_ms=500)).values():
                    for m in batch:
                        seen[("aiokafka", m.offset)] = (m.timestamp_type + 1, m.timestamp)
        finally:
            await asyncio.wait_for(aconsumer.stop(), TIMEOUT)

    asyncio.run(aiokafka_read())
    for line in kcat("-C", "-b", shared.bootstrap, "-t", topic, "-p", "0", "-o", "beginning",
                     "-e", "-q", "-f", "%o %T\\n", "-X", "fetch.wait.max.ms=50").splitlines():
        offset, ts = map(int, line.split())
        seen[("kcat", offset)] = (TIMESTAMP_LOG_APPEND_TIME, ts)
    assert len(seen) == 16, sorted(seen)
    for (client, offset), (kind, ts) in seen.items():
        assert kind == TIMESTAMP_LOG_APPEND_TIME, (client, offset, kind)
        assert before <= ts <= after, (client, offset, ts)
    # A batch's records share its stamp; every client reads the same one.
    assert len({ts for (client, offset), (_, ts) in seen.items() if offset < 3}) == 1
