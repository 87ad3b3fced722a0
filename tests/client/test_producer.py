"""oncelog.Producer and AIOProducer against real brokers, read back by real clients."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import kafka
import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka import TopicPartition as ConfluentTP
from confluent_kafka.admin import AdminClient
from support.brokers import create_topic
from support.sigstop import sigstop

import oncelog
from oncelog import AIOProducer, Consumer, KafkaError, Producer, TopicPartition
from oncelog.chaos.proxy import ChaosProxy
from oncelog.chaos.rules import Action, Rule

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
NOW = int(time.time() * 1000)
TIMEOUT = 30


def read_back(bootstrap: str, topic: str, partitions: int = 1) -> list[oncelog.ConsumerRecord]:
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([(topic, p) for p in range(partitions)])
        return list(c)


def wait_for(condition, what: str, timeout: float = TIMEOUT) -> None:
    """Until ``condition()`` holds; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout}s for {what}"
        time.sleep(0.005)


def records(n: int, null_header: bool = True) -> list[tuple[bytes | None, bytes | None, list,
                                                            int]]:
    # Null keys, null values (never both: kafka-python refuses that), headers with nulls.
    return [(b"k%d" % i if i % 3 else None,
             None if i % 11 == 0 and i % 3 else b"v%d" % i * (i % 5 + 1),
             [("n", b"%d" % i), ("empty", b""), ("null", None if null_header else b"-")]
             if i % 2 else [], NOW + i)
            for i in range(n)]


# --- round trips and interoperability ------------------------------------------------------

def test_produce_returns_futures_with_offsets_and_calls_on_delivery(broker):
    reports = []
    with Producer({"bootstrap.servers": broker.bootstrap}) as p:
        futures = [p.produce("futures", b"v%d" % i, partition=0,
                             on_delivery=lambda err, meta: reports.append((err, meta)))
                   for i in range(300)]
        p.flush(TIMEOUT)
        metas = [f.result(0) for f in futures]
    assert [m.offset for m in metas] == list(range(300))
    assert {(m.topic, m.partition) for m in metas} == {("futures", 0)}
    assert all(f.done() and f.exception() is None for f in futures)
    assert sorted(meta.offset for err, meta in reports if err is None) == list(range(300))
    assert [r.value for r in read_back(broker.bootstrap, "futures")] == \
        [b"v%d" % i for i in range(300)]


@pytest.mark.parametrize("codec", CODECS)
def test_what_it_writes_confluent_and_kafka_python_read(broker, codec):
    topic = f"interop-{codec}"
    create_topic(broker.bootstrap, topic)
    sent = records(300)
    with Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec,
                   "linger.ms": 20}) as p:
        for key, value, headers, ts in sent:
            p.produce(topic, value, key=key, partition=0, headers=headers, timestamp=ts)
        p.flush(TIMEOUT)

    consumer = ConfluentConsumer({"bootstrap.servers": broker.bootstrap, "group.id": "x",
                                  "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([ConfluentTP(topic, 0, 0)])
    got = []
    try:
        for _ in range(1000):
            msg = consumer.poll(10)
            assert msg is not None
            if msg.error():
                break
            got.append((msg.key(), msg.value(), msg.headers() or [], msg.timestamp()[1]))
    finally:
        consumer.close()
    assert got == [(k, v, h, ts) for k, v, h, ts in sent]

    # Read up to the partition's end (not until a quiet time runs out: 5 s a codec)
    kp = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=int(TIMEOUT * 1000))
    tp = kafka.TopicPartition(topic, 0)
    kp.assign([tp])
    kp.seek_to_beginning()
    end = kp.end_offsets([tp])[tp]
    got = []
    for m in kp:
        got.append((m.key, m.value, list(m.headers), m.timestamp))
        if m.offset + 1 >= end:
            break
    kp.close()
    assert end == len(sent)
    assert got == [(k, v, h, ts) for k, v, h, ts in sent]


@pytest.mark.parametrize("codec", CODECS)
def test_what_kafka_python_writes_this_consumer_reads(broker, codec):
    topic = f"from-kafka-python-{codec}"
    create_topic(broker.bootstrap, topic)
    sent = records(200, null_header=False)  # kafka-python refuses null header values
    producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap,
                                   compression_type=None if codec == "none" else codec,
                                   linger_ms=20)
    for key, value, headers, ts in sent:
        producer.send(topic, value=value, key=key, partition=0, headers=headers,
                      timestamp_ms=ts)
    producer.flush(TIMEOUT)
    producer.close(TIMEOUT)
    got = [(r.key, r.value, list(r.headers), r.timestamp)
           for r in read_back(broker.bootstrap, topic)]
    assert got == [(k, v, list(h), ts) for k, v, h, ts in sent]


def test_keys_land_where_confluent_puts_them(broker):
    create_topic(broker.bootstrap, "keys-ours", 6)
    create_topic(broker.bootstrap, "keys-theirs", 6)
    keys = [b"key-%d" % i for i in range(200)] + [b"", "unicode-\u00e9".encode()]
    theirs = ConfluentProducer({"bootstrap.servers": broker.bootstrap,
                                "partitioner": "murmur2_random"})
    placed = {}
    for key in keys:
        theirs.produce("keys-theirs", b"x", key=key,
                       on_delivery=lambda err, msg: placed.__setitem__(msg.key(),
                                                                       msg.partition()))
    assert theirs.flush(TIMEOUT) == 0
    with Producer({"bootstrap.servers": broker.bootstrap}) as ours:
        futures = {key: ours.produce("keys-ours", b"x", key=key) for key in keys}
        ours.flush(TIMEOUT)
    assert {key: f.result().partition for key, f in futures.items()} == placed
    assert len(set(placed.values())) == 6


def test_keyless_records_stick_to_a_partition_for_a_batch(broker):
    create_topic(broker.bootstrap, "sticky", 4)
    with Producer({"bootstrap.servers": broker.bootstrap, "batch.size": 1000,
                   "batching": "deterministic"}) as p:
        futures = [p.produce("sticky", b"x" * 100) for _ in range(100)]
        p.flush(TIMEOUT)
    partitions = [f.result().partition for f in futures]
    # Ten records fill batch.size, then the next partition takes over, in turn.
    assert partitions == [(i // 10) % 4 for i in range(100)]


def test_aio_producer_round_trip(broker):
    async def main() -> list:
        async with AIOProducer({"bootstrap.servers": broker.bootstrap,
                                "compression.type": "zstd"}) as p:
            first = await p.send_and_wait("aio", b"first", key=b"k")
            futures = [await p.send("aio", b"v%d" % i, partition=0) for i in range(500)]
            await p.flush()
            metas = [await f for f in futures]
            checkpoint = await p.checkpoint()
        return [first, *metas], checkpoint

    metas, checkpoint = asyncio.run(main())
    assert [m.offset for m in metas] == list(range(501))
    assert checkpoint["sequences"] == {"aio": {"0": 501}}
    assert len(read_back(broker.bootstrap, "aio")) == 501


# --- configuration and misuse -----------------------------------------------------------------

@pytest.mark.parametrize("config, message", [
    ({"max.in.flight.requests.per.connection": 6, "enable.idempotence": True},
     "at most 5"),
    ({"acks": "1", "enable.idempotence": True}, "acks must be all"),
    ({"compression.type": "brotli"}, r"compression\.type"),
    ({"batching": "sometimes"}, "batching"),
    ({"linger.ms": "soon"}, r"linger\.ms"),
    ({"no.such.key": 1}, r"unknown producer config no\.such\.key"),
    ({"transactional.id": "t", "acks": 1}, "transactional.id needs acks=all"),
    ({"transactional.id": "t", "enable.idempotence": False}, "needs enable.idempotence"),
    ({"transactional.id": "t", "max.in.flight.requests.per.connection": 6}, "at most 5"),
    ({"transaction.two.phase.commit.enable": True}, "needs a transactional.id"),
    ({"stats_cb": 3}, "stats_cb"),
    ({"delivery.timeout.ms": 100}, r"delivery\.timeout\.ms"),
    ({"partitioner": "fnv"}, "partitioner"),
])
def test_bad_config_is_refused_naming_the_key(config, message):
    with pytest.raises(ValueError, match=message):
        Producer({"bootstrap.servers": "127.0.0.1:1", **config})


def test_idempotence_by_default_yields_to_settings_that_exclude_it(broker):
    with Producer({"bootstrap.servers": broker.bootstrap, "acks": 1,
                   "max.in.flight.requests.per.connection": 10}) as p:
        assert not p.config.idempotence
        p.produce("plain", b"x").result(TIMEOUT)
    assert read_back(broker.bootstrap, "plain")[0].producer_id == -1


def test_misuse_gets_clear_errors(broker):
    create_topic(broker.bootstrap, "two", 2)
    p = Producer({"bootstrap.servers": broker.bootstrap, "max.request.size": 2048})
    with pytest.raises(KafkaError, match="UNKNOWN_TOPIC_OR_PARTITION"):
        p.produce("two", b"x", partition=2)
    with pytest.raises(KafkaError, match="MESSAGE_TOO_LARGE"):
        p.produce("two", b"x" * 4096)
    with pytest.raises(TypeError, match="value must be bytes"):
        p.produce("two", 12)
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p.produce("two", b"x")
    with pytest.raises(ValueError, match="checkpoint"):
        Producer({"bootstrap.servers": broker.bootstrap}, resume={"producer_id": 1})


def test_no_broker_is_a_clear_error_within_max_block():
    with pytest.raises(KafkaError, match="cannot connect"):
        Producer({"bootstrap.servers": "127.0.0.1:1", "max.block.ms": 500})


def test_full_buffer_blocks_then_raises_and_recovers(broker):
    p = Producer({"bootstrap.servers": broker.bootstrap, "buffer.memory": 4096,
                  "max.block.ms": 300, "linger.ms": 0})
    p.produce("full", b"warm-up").result(TIMEOUT)
    sigstop(broker.proc.pid)  # the broker stops answering
    try:
        with pytest.raises(KafkaError, match=r"buffer\.memory is full"):
            for _ in range(100):
                p.produce("full", b"x" * 500, partition=0)
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)
    p.flush(TIMEOUT)
    p.close()
    assert len(read_back(broker.bootstrap, "full")) >= 2


def test_a_delivery_callback_may_produce_even_with_the_buffer_full(broker):
    """on_delivery runs on the sender's thread, which is also the one that makes room in
    buffer.memory and learns topics: produce() there must never wait for it. Each callback
    here produces until the buffer is full, which raises at once; the originals all arrive,
    and so does every chained record produce() took."""
    create_topic(broker.bootstrap, "chain")
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0,
                  "buffer.memory": 4096, "batch.size": 1024})
    chained: list = []
    refused: list[KafkaError] = []
    misuse: list[RuntimeError] = []

    def on_delivery(err, meta) -> None:
        assert err is None
        try:
            for _ in range(100):  # far more than buffer.memory holds
                chained.append(p.produce("chain", b"c" * 300, partition=0))
        except KafkaError as exc:
            refused.append(exc)
        try:
            p.flush(1)
        except RuntimeError as exc:
            misuse.append(exc)

    originals = [p.produce("chain", b"o" * 300, partition=0, on_delivery=on_delivery)
                 for _ in range(20)]
    p.flush(TIMEOUT)  # the sender was never stuck in a callback
    p.flush(TIMEOUT)  # and the chained records are delivered too
    assert [f.result(0).offset >= 0 for f in originals] == [True] * 20
    assert len(refused) == 20 and len(misuse) == 20
    assert all("cannot wait for room" in str(exc) for exc in refused)
    assert all("would wait for the producer's sender thread" in str(exc) for exc in misuse)
    assert all(f.result(0).offset >= 0 for f in chained)
    with pytest.raises(KafkaError, match="cannot wait for its metadata"):
        errors: list[BaseException] = []
        done = threading.Event()

        def to_a_new_topic(err, meta) -> None:
            try:
                p.produce("chain-elsewhere", b"x")
            except BaseException as exc:
                errors.append(exc)
            done.set()

        p.produce("chain", b"last", partition=0, on_delivery=to_a_new_topic)
        p.flush(TIMEOUT)
        assert done.wait(TIMEOUT)
        raise errors[0]
    p.produce("chain-elsewhere", b"x").result(TIMEOUT)  # from here it may wait for metadata
    p.close()
    values = [r.value for r in read_back(broker.bootstrap, "chain")]
    assert values.count(b"o" * 300) == 20 and values.count(b"c" * 300) == len(chained)


# --- idempotence through faults (the seeds' flows) ----------------------------------------------

@pytest.fixture
def proxy(broker):
    with ChaosProxy(("127.0.0.1", broker.port)) as p:
        yield p


def faulty(bootstrap: str, **extra) -> Producer:
    """One record per batch and short timeouts, so that each rule hits one batch."""
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1,
                     "request.timeout.ms": 1000, "retry.backoff.ms": 20, **extra})


def send_all(p: Producer, topic: str, n: int) -> list:
    futures = [p.produce(topic, b"%d" % i, partition=0) for i in range(n)]
    p.flush(TIMEOUT)
    metas = [f.result(0) for f in futures]
    p.close()
    return metas


@pytest.mark.parametrize("rules", [
    [(Action.DROP_RESPONSE, "produce:4,5")],            # figure 3: ACKs of D and E lost
    [(Action.DROP_REQUEST, "produce:3")],               # figure 4: C lost on the way
    [(Action.DROP_RESPONSE, "produce:2,3"), (Action.CUT_AFTER_REQUEST, "produce:6")],
    [(Action.DUPLICATE_REQUEST, "produce:1,3,7")],
    [(Action.DELAY_RESPONSE, "produce:2=1500")],       # answered after the request timeout
], ids=["missing-acks", "missing-records", "lost-acks-and-cut", "duplicated", "late-answer"])
def test_seed_flows_store_each_record_once_in_order(broker, proxy, rules):
    create_topic(broker.bootstrap, "flow")
    for action, spec in rules:
        proxy.add_rule(Rule.parse(action, spec))
    metas = send_all(faulty(proxy.bootstrap), "flow", 12)
    stored = read_back(broker.bootstrap, "flow")
    assert [r.value for r in stored] == [b"%d" % i for i in range(12)]
    assert len({(r.producer_id, r.producer_epoch) for r in stored}) == 1
    assert [m.offset for m in metas] == list(range(12))
    fired = {e.what for e in proxy.events}
    assert {action.value for action, _ in rules} <= fired, fired


def test_broker_restart_mid_stream(start_broker):
    broker = start_broker()
    create_topic(broker.bootstrap, "restart", 2)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2,
                  "request.timeout.ms": 2000, "retry.backoff.ms": 50})
    futures = []
    for i in range(6000):
        futures.append(p.produce("restart", b"%d" % i, partition=i % 2))
        if i in (2000, 4000):
            broker.kill()
            broker.start()
    p.flush(60)
    p.close()
    stored = read_back(broker.bootstrap, "restart", 2)
    for partition in (0, 1):
        values = [int(r.value) for r in stored if r.partition == partition]
        assert values == list(range(partition, 6000, 2))
    assert len({(r.producer_id, r.producer_epoch) for r in stored}) == 1


def test_a_forgotten_producer_never_hears_delivered_for_records_the_log_lacks(start_broker):
    """Issue 12's case against a real broker. The broker forgets the idle producer
    (producer.id.expiration.ms, then producer.id.tombstone.ms); the producer's next request
    (record a) is lost on the way, the one after it (record b) is stored first (rules.py row
    2), and a's retry is refused (row 11: before what the broker stored of it since, so it
    "may never have arrived"). The producer once asked DescribeProducers, saw the broker
    held its epoch past a, and reported a delivered: flush() succeeded and the log did not
    hold a. Now a fails, outcome unknown, and every record reported delivered is in the log,
    read back by a consumer."""
    broker = start_broker(producer_id_expiration_ms=1000, producer_id_tombstone_ms=1000,
                          producer_id_expiration_check_interval_ms=100)
    create_topic(broker.bootstrap, "forgotten")
    with ChaosProxy(("127.0.0.1", broker.port)) as proxy:
        proxy.add_rule(Rule.parse(Action.DROP_REQUEST, "produce[forgotten-0]:2"))
        p = faulty(proxy.bootstrap)
        first = p.produce("forgotten", b"first", partition=0)
        assert first.result(TIMEOUT).offset == 0
        wait_for(lambda: "1 records dropped" in broker.log_text(),
                 "the broker to forget the idle producer")
        a = p.produce("forgotten", b"a", partition=0)
        wait_for(lambda: any(e.what == "drop-request" for e in proxy.events),
                 "a's request to be lost")
        b = p.produce("forgotten", b"b", partition=0)
        assert b.result(TIMEOUT).offset == 1
        # Row 11 of client/idempotence.py, or 12 if the broker moved the producer to a
        # compact record again meanwhile (DescribeProducers then lists nothing).
        with pytest.raises(oncelog.OutcomeUnknown,
                           match=r"may never have arrived|holds no state of this producer"):
            a.result(TIMEOUT)
        with pytest.raises(oncelog.OutcomeUnknown):
            p.flush(TIMEOUT)
        p.close()
    stored = [r.value for r in read_back(broker.bootstrap, "forgotten")]
    assert stored == [b"first", b"b"]


# --- identity: checkpoints, resume, new epochs ----------------------------------------------------

def test_checkpoint_is_json_and_resume_continues_the_sequences(broker):
    create_topic(broker.bootstrap, "resume", 2)
    config = {"bootstrap.servers": broker.bootstrap}
    with Producer(config) as p:
        for i in range(10):
            p.produce("resume", b"a%d" % i, partition=i % 2)
        saved = json.loads(json.dumps(p.checkpoint()))
    assert saved["sequences"] == {"resume": {"0": 5, "1": 5}}
    with Producer(config, resume=saved) as p:
        for i in range(4):
            p.produce("resume", b"b%d" % i, partition=0)
        after = p.checkpoint()
    assert (after["producer_id"], after["producer_epoch"]) == \
        (saved["producer_id"], saved["producer_epoch"])
    assert after["sequences"]["resume"] == {"0": 9, "1": 5}
    stored = read_back(broker.bootstrap, "resume", 2)
    assert {r.producer_id for r in stored} == {saved["producer_id"]}
    assert [r.sequence for r in stored if r.partition == 0] == list(range(9))


def test_resending_after_resume_is_answered_as_duplicate(broker):
    """Seed 001's copy process: restart from a checkpoint and produce the same input again.
    Deterministic batches are aligned on sequence numbers (multiples of batch.num.messages),
    so each one lies within one the broker stored, or after all of them."""
    config = {"bootstrap.servers": broker.bootstrap, "batching": "deterministic",
              "batch.num.messages": 10}
    with Producer(config) as p:
        p.produce("again", b"before", partition=0)   # sequence 0, offset 0
        saved = p.checkpoint()
        for i in range(100):  # sequences 1..100: [1-9] [10-19] ... [90-99], [100] at close
            p.produce("again", b"%d" % i, partition=0)
    with Producer(config, resume=saved) as p:
        futures = [p.produce("again", b"%d" % i, partition=0) for i in range(120)]
        p.flush(TIMEOUT)
    offsets = [f.result().offset for f in futures]
    # Older than the broker's cache of five batches: DUPLICATE_SEQUENCE_NUMBER, offset unknown.
    assert offsets[:59] == [-1] * 59
    # The five cached batches ([60-69] .. [90-99]; [100] is below) answer their own offsets.
    assert offsets[59:99] == list(range(60, 100))
    # [100-109] straddles the end of what the broker holds (it had [100] alone): the producer
    # asks DescribeProducers (up to 100), sends [100] alone, which the broker answers with
    # its offset (cached), then [101-109] (client/idempotence.py row 10).
    assert offsets[99:] == list(range(100, 121))
    stored = read_back(broker.bootstrap, "again")
    assert [r.value for r in stored] == [b"before"] + [b"%d" % i for i in range(120)]
    assert {(r.producer_id, r.producer_epoch) for r in stored} == \
        {(saved["producer_id"], saved["producer_epoch"])}


def test_a_resumed_producer_meeting_a_broker_without_its_state_stops(broker):
    """Resuming against a partition that lost the producer's state (here: the topic was
    recreated) gets OUT_OF_ORDER_SEQUENCE_NUMBER for the first batch. Its sequences continue
    the checkpoint, which the process before may have sent, and the broker holds nothing of
    the producer to say otherwise: the batch fails as of unknown outcome (client/idempotence.py
    rows 8 and 12), never as delivered. A new epoch would follow, under which the broker
    could not recognise what the process before stored: a resumed producer stops instead
    (row 13). Without resume, a producer carries on under a new epoch from 0."""
    create_topic(broker.bootstrap, "lost", 1)
    config = {"bootstrap.servers": broker.bootstrap}
    with Producer(config) as p:
        for i in range(5):
            p.produce("lost", b"old%d" % i)
        saved = p.checkpoint()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics(["lost"])["lost"].result(20)
    create_topic(broker.bootstrap, "lost", 1)
    with Producer(config, resume=saved) as p:
        first = p.produce("lost", b"new0")
        with pytest.raises(oncelog.OutcomeUnknown, match="holds no state of this producer"):
            first.result(TIMEOUT)
        with pytest.raises(oncelog.OutcomeUnknown):
            p.flush(TIMEOUT)
        wait_for(lambda: p._core.sender.fatal is not None, "the producer to stop")
        with pytest.raises(KafkaError, match="continues a resumed checkpoint"):
            p.produce("lost", b"new1")
    assert read_back(broker.bootstrap, "lost") == []
    with Producer(config) as p:
        metas = [p.produce("lost", b"new%d" % i).result(TIMEOUT) for i in (1, 2)]
    assert [m.offset for m in metas] == [0, 1]


def test_a_checkpoint_naming_an_unknown_producer_id_stops_the_producer(broker):
    """A checkpoint from another cluster names an id this one never issued (seed 000):
    UNKNOWN_PRODUCER_ID says the record is not stored, and a resumed producer does not carry
    on under a new id (client/idempotence.py rows 4 and 13): it stops, saying why."""
    forged = {"version": 1, "producer_id": 10**12, "producer_epoch": 3, "sequences": {},
              "sticky": {}}
    with Producer({"bootstrap.servers": broker.bootstrap}, resume=forged) as p:
        future = p.produce("forged", b"x")
        with pytest.raises(KafkaError, match="continues a resumed checkpoint") as failed:
            future.result(TIMEOUT)
        assert not isinstance(failed.value, oncelog.OutcomeUnknown)
        assert failed.value.args[0].endswith("; not stored")
        wait_for(lambda: p._core.sender.fatal is not None, "the producer to stop")
        with pytest.raises(KafkaError, match="continues a resumed checkpoint"):
            p.produce("forged", b"y")
    assert read_back(broker.bootstrap, "forged") == []


def test_consumer_assignment_of_what_was_produced(broker):
    with Producer({"bootstrap.servers": broker.bootstrap}) as p:
        p.produce("assigned", b"x", partition=0).result(TIMEOUT)
    with Consumer({"bootstrap.servers": broker.bootstrap,
                   "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition("assigned", 0)])
        assert [r.value for r in c] == [b"x"]


def test_works_against_another_kafka_implementation():
    """librdkafka's mock cluster (C, in-process) is a Kafka broker oncelog did not write."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from _support import MockCluster

    with MockCluster() as mock:
        with Producer({"bootstrap.servers": mock.bootstrap, "compression.type": "lz4"}) as p:
            futures = [p.produce("mock", b"v%d" % i, key=b"k%d" % i) for i in range(500)]
            p.flush(TIMEOUT)
            saved = p.checkpoint()
        placed = [f.result() for f in futures]
        partitions = sorted({m.partition for m in placed})
        stored = []
        with Consumer({"bootstrap.servers": mock.bootstrap,
                       "auto.offset.reset": "earliest"}) as c:
            c.assign([("mock", q) for q in partitions])
            stored = list(c)
    assert sorted(r.value for r in stored) == sorted(b"v%d" % i for i in range(500))
    assert {r.producer_id for r in stored} == {saved["producer_id"]}
    assert sum(saved["sequences"]["mock"].values()) == 500


def test_threads_producing_at_once_lose_nothing(broker):
    """produce() from several threads while the sender drains batches that are still open
    (linger.ms=0): every record stored once, each thread's records in its order."""
    create_topic(broker.bootstrap, "threads", 2)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})

    def work(t: int) -> None:
        for i in range(4000):
            p.produce("threads", b"%d-%d" % (t, i), partition=i % 2)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(TIMEOUT)
    p.flush(TIMEOUT)
    p.close()
    stored = read_back(broker.bootstrap, "threads", 2)
    assert len(stored) == 16000
    for t in range(4):
        for partition in (0, 1):
            mine = [int(r.value.split(b"-")[1]) for r in stored
                    if r.partition == partition and r.value.startswith(b"%d-" % t)]
            assert mine == list(range(partition, 4000, 2))


def test_a_failed_lookup_is_asked_again_not_taken_for_nothing_stored(broker, proxy):
    """The resolve path of test_resending_after_resume_is_answered_as_duplicate, with the
    first DescribeProducers answer lost: the producer asks again instead of bumping its
    epoch and resending what the broker holds."""
    config = {"bootstrap.servers": proxy.bootstrap, "batching": "deterministic",
              "batch.num.messages": 10, "request.timeout.ms": 1000, "retry.backoff.ms": 20}
    with Producer(config) as p:
        p.produce("lookup", b"before", partition=0)
        saved = p.checkpoint()
        for i in range(100):
            p.produce("lookup", b"%d" % i, partition=0)
    proxy.add_rule(Rule.parse(Action.DROP_RESPONSE, "describe-producers:1"))
    with Producer(config, resume=saved) as p:
        for i in range(120):
            p.produce("lookup", b"%d" % i, partition=0)
        p.flush(TIMEOUT)
    assert "drop-response" in {e.what for e in proxy.events}
    stored = read_back(broker.bootstrap, "lookup")
    assert [r.value for r in stored] == [b"before"] + [b"%d" % i for i in range(120)]


def test_delivery_timeout_fails_the_record_and_the_next_flush(broker):
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0,
                  "request.timeout.ms": 500, "delivery.timeout.ms": 1000,
                  "retry.backoff.ms": 50})
    p.produce("fails", b"first").result(TIMEOUT)
    broker.kill()
    future = p.produce("fails", b"lost")
    with pytest.raises(KafkaError, match="REQUEST_TIMED_OUT"):
        future.result(TIMEOUT)
    with pytest.raises(KafkaError, match="REQUEST_TIMED_OUT"):
        p.flush(TIMEOUT)  # the record failed before this flush began: still reported
    p.flush(TIMEOUT)      # and only once
    p.close(1)


def test_a_held_back_deterministic_batch_does_not_expire(broker):
    config = {"bootstrap.servers": broker.bootstrap, "batching": "deterministic",
              "batch.num.messages": 2, "request.timeout.ms": 500, "delivery.timeout.ms": 600,
              "linger.ms": 0}
    with Producer(config) as p:
        p.produce("held", b"a", partition=0)  # one of two: the open batch waits on purpose
        deadline = time.monotonic() + 0.6
        wait_for(lambda: time.monotonic() > deadline, "delivery.timeout.ms to pass")
        # A full batch sent and acknowledged since: the sender has checked for expired
        # batches with the held one past its delivery timeout.
        [p.produce("held-probe", b"%d" % i, partition=0) for i in range(2)][-1].result(TIMEOUT)
        p.produce("held", b"b", partition=0)
        p.checkpoint()
    assert [r.value for r in read_back(broker.bootstrap, "held")] == [b"a", b"b"]


def test_close_with_a_timeout_settles_every_future(broker):
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    p.produce("stuck", b"warm-up").result(TIMEOUT)
    sigstop(broker.proc.pid)  # stopped, not only signalled: "x" is never answered
    try:
        future = p.produce("stuck", b"x")
        p.close(timeout=0.5)
        assert future.done()
        assert isinstance(future.exception(0), KafkaError)
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)


# A program that ends without closing its producer. ``slow_exit`` (argv[2], when given), a
# shared library whose destructor sleeps, holds the process in exit() for 1.5 s after
# Py_FinalizeEx (which takes a few tenths of a second here), as a loaded machine may hold it:
# the sender's loop, idle, its next timer retry.backoff.ms * 10 (1 s) after the flush, then
# wakes there if it still runs.
EXIT_WITHOUT_CLOSE = """
import atexit, ctypes, sys, threading, time
import oncelog

def sender_threads():
    names = [t.name for t in threading.enumerate() if t.name == "oncelog-producer-sender"]
    print("sender threads at finalisation:", len(names), flush=True)

atexit.register(sender_threads)  # runs after what the producer registers later (LIFO)
if len(sys.argv) > 2:
    ctypes.CDLL(sys.argv[2])
p = oncelog.Producer({"bootstrap.servers": sys.argv[1]})
p.produce("exit", b"v", partition=0)
p.flush(30)
time.sleep(0.1)  # the sender idle, waiting on its timer
"""
SLOW_EXIT_C = """
#include <unistd.h>
__attribute__((destructor)) static void slow_exit(void) { usleep(1500000); }
"""


def test_a_program_ending_without_close_exits_cleanly(broker, tmp_path):
    """The sender thread runs uvloop, whose callbacks take the GIL with PyGILState_Ensure:
    woken after Py_FinalizeEx has torn down the thread states, that makes a thread state for
    a NULL interpreter, a SIGSEGV with nothing logged (a transactional copier that returned
    without close() died so, once, under load). At exit the producer stops its loop, so
    nothing of it runs once the interpreter finalises."""
    create_topic(broker.bootstrap, "exit")
    done = subprocess.run([sys.executable, "-c", EXIT_WITHOUT_CLOSE, broker.bootstrap],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "sender threads at finalisation: 0" in done.stdout, done.stdout + done.stderr
    assert done.stderr == ""
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")
    # oncelog's own extensions are built with it, so make test always has one
    assert shutil.which(compiler[0]) is not None, f"no C compiler {compiler[0]!r}"
    (tmp_path / "slow_exit.c").write_text(SLOW_EXIT_C)
    library = tmp_path / "slow_exit.so"
    subprocess.run([*compiler, "-shared", "-fPIC", "-o", str(library),
                    str(tmp_path / "slow_exit.c")], check=True, capture_output=True)
    done = subprocess.run([sys.executable, "-c", EXIT_WITHOUT_CLOSE, broker.bootstrap,
                           str(library)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"exited {done.returncode}: {done.stderr}"  # -11 before


def test_giving_up_on_one_record_does_not_cancel_its_batch(broker):
    async def main() -> list:
        async with AIOProducer({"bootstrap.servers": broker.bootstrap,
                                "linger.ms": 200}) as p:
            first = await p.send("shield", b"1", partition=0)
            second = await p.send("shield", b"2", partition=0)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(first, 0.01)
            await p.flush()
            return [await first, await second]

    metas = asyncio.run(main())
    assert [m.offset for m in metas] == [0, 1]
