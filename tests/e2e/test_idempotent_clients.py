"""Idempotent producers of real clients against a broker that crashes and restarts under them.

confluent-kafka (librdkafka) and kafka-python each send 100,000 numbered records to three
partitions while the broker is killed with SIGKILL twice (or stopped once with SIGTERM) in the
middle of the stream. The clients reach the broker through a proxy that swallows its answers for
a moment before each kill, so that batches the broker stored are unacknowledged when it dies:
the clients retry them, and the restarted broker must answer each retry as a duplicate, with
its original offset, from producer state rebuilt from its newest snapshot (written at every
segment roll and at clean shutdown) and the log after it. Every delivery must succeed and every
record must be read back exactly once, in order, at the offset its delivery report named.

Then the broker's own side, on raw requests: DescribeProducers (also through kafka-python's
admin client) lists what a partition remembers of its producers, a producer id never issued is
refused (UNKNOWN_PRODUCER_ID), and an issued one is accepted at any first sequence on a
partition that never saw it (KIP-360), and continues there after a crash.

Consumers use assign() and never commit: the broker has no group coordinator.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import struct
import threading
import time
from pathlib import Path

import kafka
import kafka.admin
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.describe_producers.v0 import request as describe_req
from kio.schema.describe_producers.v0 import response as describe_resp
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4 import request as init_req
from kio.schema.init_producer_id.v4 import response as init_resp
from kio.schema.produce.v9 import request as produce_req
from kio.schema.produce.v9 import response as produce_resp
from support.brokers import BrokerProcess, batches_on_disk, create_topic
from support.idempotent_clients_helpers import TIMEOUT, produce_outcomes

import oncelog
from oncelog.protocol.messages import decode_response, encode_request
from oncelog.protocol.record_batch import scan_batches
from oncelog.protocol.records import decode_batch, encode_batch

STREAM_TIMEOUT = 150.0  # seconds: the bound on a whole 100,000-record stream
DELIVERY_TIMEOUT_MS = 120_000  # how long a client keeps retrying one record
GROUP = "oncelog-tests"  # librdkafka insists on a group.id even for assign(); nothing joins it
PARTITIONS = 3
COUNT = 100_000
KILLS_AT = (30_000, 65_000)  # delivered-record counts at which the broker is taken down
# How far past the next restart's count the stream may produce before the restart is done.
AHEAD = 5_000
SWALLOW_WAIT = TIMEOUT  # the bound on waiting for a produce answer to swallow
SWALLOW_SECONDS = 0.2  # the bound on swallowing more answers once one produce's was
SWALLOW_MORE = 5  # answers swallowed before the broker goes down, if they come that fast
SETTINGS = {
    # ~12 segments a partition over the stream (about 13 bytes a record): producer state is
    # snapshotted at every roll, so restarts load snapshots and replay the log after them.
    "log.internal.segment.bytes": "50000",
    # The records carry the clients' clocks; keep them clear of any retention check.
    "log.retention.hours": "-1",
}
T0 = 1_700_000_000_000  # a fixed CreateTime for hand-built batches, in ms

PRODUCE, INIT_PRODUCER_ID, DESCRIBE_PRODUCERS = 0, 22, 61


# --- topics and records -------------------------------------------------------------------------

def value_of(i: int) -> bytes:
    return b"%d" % i


def partition_of(i: int) -> int:
    return i % PARTITIONS


def expected_values(count: int) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for i in range(count):
        out[partition_of(i)].append(value_of(i))
    return out


def consume_all(bootstrap: str, topic: str) -> dict[int, list[tuple[int, bytes]]]:
    """Every (offset, value) of every partition, read from offset 0 to the high watermark."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                         "enable.auto.commit": False, "enable.auto.offset.store": False,
                         "fetch.max.bytes": 4 << 20})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), TIMEOUT)[1]
                for p in range(PARTITIONS)}
        got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS) if ends[p]])
        remaining = sum(ends.values())
        deadline = time.monotonic() + 3 * TIMEOUT
        while remaining:
            assert time.monotonic() < deadline, f"{remaining} records not read back in time"
            for msg in consumer.consume(10_000, 0.5):
                assert not msg.error(), msg.error()
                got[msg.partition()].append((msg.offset(), msg.value()))
                remaining -= 1
    finally:
        consumer.close()
    return got


def assert_exactly_once_in_order(bootstrap: str, topic: str, count: int) -> None:
    got = consume_all(bootstrap, topic)
    expected = expected_values(count)
    for p in range(PARTITIONS):
        offsets = [offset for offset, _ in got[p]]
        values = [value for _, value in got[p]]
        assert offsets == list(range(len(offsets))), f"partition {p}: offsets skip or repeat"
        if values != expected[p]:
            seen: dict[bytes, int] = {}
            for v in values:
                seen[v] = seen.get(v, 0) + 1
            dups = sorted(int(v) for v, n in seen.items() if n > 1)
            missing = sorted(set(int(v) for v in expected[p]) - {int(v) for v in seen})
            pytest.fail(f"partition {p}: {len(values)} records for {len(expected[p])} sent; "
                        f"duplicated {dups[:10]} ({len(dups)}), missing {missing[:10]} "
                        f"({len(missing)}), in order: {values == sorted(values, key=int)}")


# --- the broker going down under a producer -------------------------------------------------------

class Delivered:
    """Delivery reports, counted from whichever thread the client calls back on, and how many
    records the stream may produce so far (the saboteur moves that on), so that however the
    threads are scheduled the stream cannot run past a restart it has not had yet."""

    def __init__(self, allowed: int = COUNT) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # notified at each report
        self.count = 0
        self.errors: list[tuple[int, object]] = []
        self.offsets: dict[int, int] = {}  # record number -> offset the broker reported
        self.allowed = allowed

    def allow(self, records: int) -> None:
        self.allowed = records

    def hold(self, i: int, idle) -> None:
        """Before record ``i`` is produced: wait, calling ``idle`` (which serves the client's
        delivery reports), until the saboteur allows it."""
        deadline = time.monotonic() + STREAM_TIMEOUT
        while i >= self.allowed:
            assert time.monotonic() < deadline, f"record {i} never allowed ({self.allowed})"
            idle()

    def report(self, i: int, error: object, offset: int) -> None:
        with self.changed:
            self.count += 1
            if error is not None:
                self.errors.append((i, error))
            else:
                self.offsets[i] = offset
            self.changed.notify_all()


class AnswerEater:
    """A TCP proxy in front of the broker that can swallow the broker's answers to produces.

    While it swallows, the client's produce requests still reach the broker, which stores the
    batches and answers, but the answers never reach the client (its other requests, such as
    Metadata or InitProducerId, are answered as usual). Kill the broker then and cut
    the connections: the client holds batches that are stored but unacknowledged, and must
    retry them against the restarted broker, which has to recognise each one as a duplicate
    from the producer state it rebuilt. Without the proxy that happens only by luck of timing.
    The broker advertises the proxy's address, so every client connection goes through it.
    """

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.upstream = 0  # the broker's port, set once it has started
        self.swallowing = threading.Event()
        self.lock = threading.Lock()
        self.swallowed = threading.Condition(self.lock)  # notified at each swallowed answer
        self.sockets: set[socket.socket] = set()
        self.swallowed_produce_answers = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                broker = socket.create_connection(("127.0.0.1", self.upstream), timeout=TIMEOUT)
            except OSError:
                client.close()  # the broker is down: the client will try again
                continue
            broker.settimeout(None)
            with self.lock:
                self.sockets |= {client, broker}
            produce_requests: set[int] = set()  # correlation ids of this connection's produces
            threading.Thread(target=self._pump, args=(client, broker, produce_requests, False),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(broker, client, produce_requests, True),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, produce_requests: set[int],
              answers: bool) -> None:
        buf = b""
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                buf += data
                # Whole frames only, so that swallowing starts and ends between two answers.
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
                    end = 4 + struct.unpack_from(">i", buf)[0]
                    frame, buf = buf[:end], buf[end:]
                    if answers:
                        (correlation,) = struct.unpack_from(">i", frame, 4)
                        if self.swallowing.is_set() and correlation in produce_requests:
                            with self.swallowed:
                                self.swallowed_produce_answers += 1
                                self.swallowed.notify_all()
                            continue
                    else:
                        api_key, _, correlation = struct.unpack_from(">hhi", frame, 4)
                        if api_key == PRODUCE:
                            produce_requests.add(correlation)
                    dst.sendall(frame)
        except OSError:
            pass
        finally:
            self._close(src)
            self._close(dst)

    def _close(self, sock: socket.socket) -> None:
        with self.lock:
            self.sockets.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes the other pump, blocked in recv
        sock.close()

    def cut(self) -> None:
        """Drop every connection and stop swallowing."""
        with self.lock:
            sockets = list(self.sockets)
        for sock in sockets:
            self._close(sock)
        self.swallowing.clear()

    def close(self) -> None:
        self.listener.close()
        self.cut()


class Saboteur(threading.Thread):
    """Takes the broker down and back up each time ``delivered`` passes one of ``at``.

    Each time, answers are swallowed for a moment first, so that batches the broker stored
    are still unacknowledged when it goes down.
    """

    def __init__(self, broker: BrokerProcess, proxy: AnswerEater, delivered: Delivered,
                 at: tuple[int, ...], clean: bool) -> None:
        super().__init__(daemon=True)
        self.broker, self.proxy, self.delivered = broker, proxy, delivered
        self.at, self.clean = at, clean
        self.done: list[tuple[int, int, int]] = []  # (target, delivered, answers swallowed)
        self.failure: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            for target in self.at:
                with self.delivered.changed:
                    self.delivered.changed.wait_for(
                        lambda target=target: self.delivered.count >= target or self.stop.is_set(),
                        STREAM_TIMEOUT)
                if self.delivered.count < target:
                    return  # stopped, or the stream stalled: finish() reports it
                with self.proxy.swallowed:
                    swallowed = self.proxy.swallowed_produce_answers
                    self.proxy.swallowing.set()
                    # The stream waits at the gate, if it got there: the produces it sends now
                    # are the ones whose answers are swallowed.
                    later = [t for t in self.at if t > target]
                    self.delivered.allow(later[0] + AHEAD if later else COUNT)
                    # Until the broker has stored and answered at least one produce in vain
                    # (the client may be between requests), then a few more if they come.
                    self.proxy.swallowed.wait_for(
                        lambda before=swallowed: self.proxy.swallowed_produce_answers > before,
                        SWALLOW_WAIT)
                    self.proxy.swallowed.wait_for(
                        lambda before=swallowed:
                        self.proxy.swallowed_produce_answers >= before + SWALLOW_MORE,
                        SWALLOW_SECONDS)
                down_at = self.delivered.count
                if self.clean:
                    code = self.broker.stop()
                    assert code == 0, f"broker exited with {code}"
                else:
                    self.broker.kill()
                self.proxy.cut()
                self.broker.start()
                self.done.append((target, down_at,
                                  self.proxy.swallowed_produce_answers - swallowed))
        except BaseException as exc:  # reported by the test thread
            self.failure = exc

    def finish(self) -> None:
        self.stop.set()
        with self.delivered.changed:
            self.delivered.changed.notify_all()
        self.join(TIMEOUT * 3)
        assert not self.is_alive(), "the broker restarts did not finish"
        if self.failure is not None:
            raise self.failure
        assert [t for t, _, _ in self.done] == list(self.at), \
            f"broker restarts done: {self.done}, wanted at {self.at}"
        for _, down_at, swallowed in self.done:
            # The stream was not over, and stored batches were unacknowledged when it went down.
            assert down_at < COUNT and swallowed > 0, self.done


def pause() -> None:
    time.sleep(0.01)


def stream_confluent(bootstrap: str, topic: str, delivered: Delivered) -> None:
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 1000,
        "queue.buffering.max.messages": 2 * COUNT,
        "message.timeout.ms": DELIVERY_TIMEOUT_MS,
        "request.timeout.ms": 10_000,
        "retry.backoff.ms": 50,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        # A fatal error (e.g. the broker breaking the idempotence contract) is reported here.
        "error_cb": lambda err: err.fatal() and delivered.report(-1, err, -1),
    })

    def on_delivery(err, msg):
        delivered.report(int(msg.value()), err, msg.offset())

    def serve_reports() -> None:
        producer.poll(0.01)

    for i in range(COUNT):
        delivered.hold(i, serve_reports)
        producer.produce(topic, value=value_of(i), partition=partition_of(i),
                         on_delivery=on_delivery)
        if i % 1000 == 999:
            producer.poll(0)
    deadline = time.monotonic() + STREAM_TIMEOUT
    while len(producer) and time.monotonic() < deadline:
        producer.poll(0.1)
    assert len(producer) == 0, f"{len(producer)} records undelivered after {STREAM_TIMEOUT}s"


def stream_kafka_python(bootstrap: str, topic: str, delivered: Delivered) -> None:
    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        batch_size=16384,
        delivery_timeout_ms=DELIVERY_TIMEOUT_MS,
        request_timeout_ms=10_000,
        retry_backoff_ms=50,
        reconnect_backoff_ms=50,
        reconnect_backoff_max_ms=500,
        max_block_ms=int(STREAM_TIMEOUT * 1000),
    )
    try:
        for i in range(COUNT):
            delivered.hold(i, pause)
            future = producer.send(topic, value=value_of(i), partition=partition_of(i))
            future.add_callback(lambda meta, i=i: delivered.report(i, None, meta.offset))
            future.add_errback(lambda exc, i=i: delivered.report(i, exc, -1))
        producer.flush(STREAM_TIMEOUT)
    finally:
        producer.close(TIMEOUT)


def stream_oncelog(bootstrap: str, topic: str, delivered: Delivered) -> None:
    producer = oncelog.Producer({
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "delivery.timeout.ms": DELIVERY_TIMEOUT_MS,
        "request.timeout.ms": 10_000,
        "retry.backoff.ms": 50,
        "max.block.ms": int(STREAM_TIMEOUT * 1000),
    })
    try:
        for i in range(COUNT):
            delivered.hold(i, pause)
            producer.produce(topic, value_of(i), partition=partition_of(i),
                             on_delivery=lambda err, meta, i=i: delivered.report(
                                 i, err, meta.offset if meta else -1))
        producer.flush(STREAM_TIMEOUT)
    finally:
        producer.close(TIMEOUT)


STREAMS = {"confluent": stream_confluent, "kafka-python": stream_kafka_python,
           "oncelog": stream_oncelog}


@pytest.fixture
def proxy():
    eater = AnswerEater()
    yield eater
    eater.close()


def run_stream(start_broker, proxy: AnswerEater, client: str, restarts: tuple[int, ...],
               clean: bool) -> tuple[BrokerProcess, str]:
    broker = start_broker(**SETTINGS,
                          **{"advertised.listeners": f"PLAINTEXT://{proxy.address}"})
    proxy.upstream = broker.port
    topic = f"idem-{client}"
    create_topic(proxy.address, topic, PARTITIONS)
    delivered = Delivered(allowed=restarts[0] + AHEAD)
    saboteur = Saboteur(broker, proxy, delivered, restarts, clean)
    saboteur.start()
    try:
        STREAMS[client](proxy.address, topic, delivered)
    except BaseException:
        saboteur.stop.set()
        saboteur.join(TIMEOUT * 3)
        raise
    saboteur.finish()
    assert delivered.errors == [], f"{len(delivered.errors)} failed: {delivered.errors[:5]}"
    assert delivered.count == COUNT
    # The client retried the batches whose answers it never got; the restarted broker knew them.
    outcomes = produce_outcomes(broker, topic)
    assert outcomes.get("duplicate", 0) > 0, outcomes
    assert set(outcomes) <= {"appended", "duplicate"}, outcomes
    assert_exactly_once_in_order(proxy.address, topic, COUNT)
    # Every delivery report named the offset the record really has (a retry of a batch the
    # broker had stored is answered with that batch's offset, not a new one).
    expected_offset = {i: i // PARTITIONS for i in range(COUNT)}
    wrong = {i: o for i, o in delivered.offsets.items() if o != expected_offset[i]}
    assert not wrong, f"{len(wrong)} reports name a wrong offset, e.g. {sorted(wrong.items())[:5]}"
    # The stream crossed many segment rolls, so the restarts found producer-state snapshots.
    for p in range(PARTITIONS):
        names = os.listdir(broker.data_dir / f"{topic}-{p}")
        assert sum(n.endswith(".log") for n in names) >= 5, names
        assert any(n.endswith(".snapshot") for n in names), names
    return broker, topic


@pytest.mark.parametrize("client", sorted(STREAMS))
def test_kill_9_twice_mid_stream_loses_and_duplicates_nothing(start_broker, proxy, client):
    broker, topic = run_stream(start_broker, proxy, client, KILLS_AT, clean=False)
    # One producer id for the whole stream: no retry had to start over under a new identity.
    pids = {(h.producer_id, h.producer_epoch) for p in range(PARTITIONS)
            for h in batches_on_disk(broker, topic, p)}
    assert len(pids) == 1, pids
    # No clean shutdown to write a snapshot at the log end: the state came from the log.
    assert "producer state rebuilt from" in broker.log_text()


@pytest.mark.parametrize("client", sorted(STREAMS))
def test_clean_restart_mid_stream_loses_and_duplicates_nothing(start_broker, proxy, client):
    broker, topic = run_stream(start_broker, proxy, client, (50_000,), clean=True)
    pids = {(h.producer_id, h.producer_epoch) for p in range(PARTITIONS)
            for h in batches_on_disk(broker, topic, p)}
    assert len(pids) == 1, pids
    # The snapshot written at shutdown held everything: nothing was replayed from the log.
    _, after = broker.log_text().split("stopped cleanly")
    assert "producer state rebuilt from" not in after


# --- raw requests -------------------------------------------------------------------------------

class RawConnection:
    """One socket, one request at a time, versions chosen by the test."""

    def __init__(self, bootstrap: str) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        self.correlation = 0

    def call(self, api_key: int, version: int, body):
        self.correlation += 1
        self.sock.sendall(encode_request(api_key, version, self.correlation, "raw-test", body))
        (size,) = struct.unpack(">i", self._read(4))
        correlation, response = decode_response(api_key, version, self._read(size))
        assert correlation == self.correlation
        return response

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the broker closed the connection"
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()

    # --- the three calls these tests make -----------------------------------------------------

    def init_producer_id(self) -> tuple[int, int]:
        response = self.call(INIT_PRODUCER_ID, 4, init_req.InitProducerIdRequest(
            transactional_id=None, transaction_timeout=datetime.timedelta(milliseconds=60_000),
            producer_id=-1, producer_epoch=-1))
        assert isinstance(response, init_resp.InitProducerIdResponse)
        assert response.error_code == ErrorCode.none, response
        return response.producer_id, response.producer_epoch

    def produce(self, topic: str, partition: int, batch: bytes):
        response = self.call(PRODUCE, 9, produce_req.ProduceRequest(
            transactional_id=None, acks=-1, timeout=datetime.timedelta(milliseconds=10_000),
            topic_data=(produce_req.TopicProduceData(name=topic, partition_data=(
                produce_req.PartitionProduceData(index=partition, records=batch),)),)))
        assert isinstance(response, produce_resp.ProduceResponse)
        (topic_response,) = response.responses
        (result,) = topic_response.partition_responses
        return result

    def describe_producers(self, topic: str, partitions: tuple[int, ...]):
        response = self.call(DESCRIBE_PRODUCERS, 0, describe_req.DescribeProducersRequest(
            topics=(describe_req.TopicRequest(name=topic, partition_indexes=partitions),)))
        assert isinstance(response, describe_resp.DescribeProducersResponse)
        (topic_response,) = response.topics
        return {p.partition_index: p for p in topic_response.partitions}


def idempotent_batch(producer_id: int, first_seq: int, values: list[bytes],
                     epoch: int = 0) -> bytes:
    records = [(None, v, (), T0 + n) for n, v in enumerate(values)]
    return encode_batch(records, producer_id=producer_id, producer_epoch=epoch,
                        base_sequence=first_seq)


def read_partition(broker: BrokerProcess, topic: str, partition: int):
    """(producer id, first sequence, [values]) of every batch on disk, in order."""
    directory = Path(broker.data_dir) / f"{topic}-{partition}"
    out = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".log"):
            data = (directory / name).read_bytes()
            for pos, _ in scan_batches(data):
                header, records = decode_batch(data, pos)
                out.append((header.producer_id, header.base_sequence,
                            [r.value for r in records]))
    return out


@pytest.fixture
def raw_broker(start_broker):
    broker = start_broker(**SETTINGS)
    create_topic(broker.bootstrap, "raw", PARTITIONS)
    return broker


def test_describe_producers_with_kafka_python_admin(raw_broker):
    bootstrap = raw_broker.bootstrap
    topic = "described"
    create_topic(bootstrap, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "message.timeout.ms": 30_000})
    errors = []
    counts = {0: 25, 1: 7}  # partition 2 stays empty
    for p, n in counts.items():
        for i in range(n):
            producer.produce(topic, value=value_of(i), partition=p,
                             on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(TIMEOUT) == 0
    assert errors == []
    (pid,) = {h.producer_id for p in counts for h in batches_on_disk(raw_broker, topic, p)}
    assert pid >= 0

    admin = kafka.admin.KafkaAdminClient(bootstrap_servers=bootstrap,
                                         request_timeout_ms=int(TIMEOUT * 1000))
    try:
        described = admin.describe_producers(
            [kafka.TopicPartition(topic, p) for p in range(PARTITIONS)])
    finally:
        admin.close()
    by_partition = {tp.partition: state.active_producers for tp, state in described.items()}
    assert set(by_partition) == {0, 1, 2}
    assert by_partition[2] == []
    now = int(time.time() * 1000)
    for p, n in counts.items():
        (state,) = by_partition[p]
        assert (state.producer_id, state.producer_epoch, state.last_sequence) == (pid, 0, n - 1)
        assert now - 60_000 < state.last_timestamp <= now + 1000
        assert state.coordinator_epoch == -1
        assert state.current_transaction_start_offset == -1

    # The same answer on a raw DescribeProducers v0, and for a partition that does not exist.
    conn = RawConnection(bootstrap)
    try:
        raw = conn.describe_producers(topic, (0, 1, 2, 7))
    finally:
        conn.close()
    assert [(s.producer_id, s.producer_epoch, s.last_sequence)
            for s in raw[0].active_producers] == [(pid, 0, 24)]
    assert [(s.producer_id, s.producer_epoch, s.last_sequence)
            for s in raw[1].active_producers] == [(pid, 0, 6)]
    assert raw[2].error_code == ErrorCode.none and raw[2].active_producers == ()
    assert raw[7].error_code == ErrorCode.unknown_topic_or_partition


def test_unissued_producer_id_is_refused(raw_broker):
    conn = RawConnection(raw_broker.bootstrap)
    try:
        result = conn.produce("raw", 0, idempotent_batch(10**12, 0, [b"forged"]))
        assert result.error_code == ErrorCode.unknown_producer_id
        assert int(result.error_code) == 59
        assert result.base_offset == -1
        # Issuing an id does not make every id valid: the forged one is still refused.
        pid, epoch = conn.init_producer_id()
        assert (pid, epoch) != (10**12, 0)
        result = conn.produce("raw", 0, idempotent_batch(10**12, 0, [b"forged"]))
        assert result.error_code == ErrorCode.unknown_producer_id
    finally:
        conn.close()
    assert read_partition(raw_broker, "raw", 0) == []


def test_issued_producer_id_new_to_a_partition_starts_at_zero(raw_broker):
    conn = RawConnection(raw_broker.bootstrap)
    try:
        pid, epoch = conn.init_producer_id()
        assert epoch == 0 and pid >= 0
        other, _ = conn.init_producer_id()
        assert other != pid, "InitProducerId handed out the same id twice"

        # A producer new to a partition starts at 0 (rules.py rows 2b-2c): a first batch at
        # another sequence means an earlier one is still on its way, so it waits.
        early = conn.produce("raw", 0, idempotent_batch(pid, 42, [b"too", b"soon"]))
        assert early.error_code == ErrorCode.out_of_order_sequence_number
        first = conn.produce("raw", 0, idempotent_batch(pid, 0, [b"a", b"b", b"c"]))
        assert (first.error_code, first.base_offset) == (ErrorCode.none, 0)
        elsewhere = conn.produce("raw", 1, idempotent_batch(pid, 0, [b"x"]))
        assert (elsewhere.error_code, elsewhere.base_offset) == (ErrorCode.none, 0)

        # From there on its sequences count: the next batch, a retry, a gap, an overlap.
        nxt = conn.produce("raw", 0, idempotent_batch(pid, 3, [b"d", b"e"]))
        assert (nxt.error_code, nxt.base_offset) == (ErrorCode.none, 3)
        retry = conn.produce("raw", 0, idempotent_batch(pid, 0, [b"a", b"b", b"c"]))
        assert (retry.error_code, retry.base_offset) == (ErrorCode.none, 0)
        gap = conn.produce("raw", 0, idempotent_batch(pid, 6, [b"lost?"]))
        assert gap.error_code == ErrorCode.out_of_order_sequence_number
        straddle = conn.produce("raw", 0, idempotent_batch(pid, 4, [b"e", b"f"]))
        assert straddle.error_code == ErrorCode.out_of_order_sequence_number

        described = conn.describe_producers("raw", (0, 1, 2))
        assert [(s.producer_id, s.producer_epoch, s.last_sequence)
                for s in described[0].active_producers] == [(pid, 0, 4)]
        assert [(s.producer_id, s.producer_epoch, s.last_sequence)
                for s in described[1].active_producers] == [(pid, 0, 0)]
        assert described[2].active_producers == ()
    finally:
        conn.close()

    # The broker crashes: the state it rebuilds from the log continues where the log ends.
    raw_broker.restart(clean=False)
    conn = RawConnection(raw_broker.bootstrap)
    try:
        again = conn.produce("raw", 0, idempotent_batch(pid, 3, [b"d", b"e"]))
        assert (again.error_code, again.base_offset) == (ErrorCode.none, 3)
        on = conn.produce("raw", 0, idempotent_batch(pid, 5, [b"f"]))
        assert (on.error_code, on.base_offset) == (ErrorCode.none, 5)
        described = conn.describe_producers("raw", (0, 1))
        assert [(s.producer_id, s.producer_epoch, s.last_sequence, s.last_timestamp)
                for s in described[0].active_producers] == [(pid, 0, 5, T0)]
        assert [(s.producer_id, s.producer_epoch, s.last_sequence)
                for s in described[1].active_producers] == [(pid, 0, 0)]
        fresh, _ = conn.init_producer_id()
        assert fresh not in (pid, other), "a restarted broker reissued a producer id"
    finally:
        conn.close()
    assert read_partition(raw_broker, "raw", 0) == [
        (pid, 0, [b"a", b"b", b"c"]), (pid, 3, [b"d", b"e"]), (pid, 5, [b"f"])]
    assert read_partition(raw_broker, "raw", 1) == [(pid, 0, [b"x"])]
