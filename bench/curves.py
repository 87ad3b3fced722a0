"""The curves users plan capacity with: oncelog's throughput as one thing grows, next to
librdkafka's mock cluster where the mock can run, with the broker's RSS at every point.

    .venv/bin/python bench/curves.py [--quick] [--out docs/curves] [--json PATH]
    .venv/bin/python bench/curves.py --plot-only docs/curves/curves.json
    make bench ARGS="--only curves"            # the full curves, about 7 minutes
    make bench ARGS="--only curves --quick"    # 2 minutes, into a temp dir (not docs/)

* ``size``: produce throughput against record size (100 B .. 1 MiB), one confluent-kafka
  producer, librdkafka's default batching, one partition;
* ``partitions``: the same producer spreading 1 KiB records round robin over 1 .. 10,000
  partitions of one topic;
* ``connections``: 1 .. 1,000 connections each sending 16 KiB produce requests (16 records
  of 1 KiB) one at a time, written by a light raw client (asyncio, the request encoded once
  with oncelog's protocol code) because a librdkafka client per connection cannot be run a
  thousand times on two CPUs;
* ``producers``: 1 .. 100,000 idempotent producers, each an InitProducerId and then one
  idempotent Produce (sequence 0) of one 100 B record with the producer id it was given, over
  4 connections with 32 requests in flight each: the same raw client (the Produce is encoded
  once and each producer's id, epoch and CRC patched into it). Throughput is producers set
  up per second;
* ``latency``: p50/p99 produce latency against the offered load, a confluent-kafka producer
  paced at fractions of oncelog's peak measured just before (``produce_consume``'s paced
  run; the mock at the same absolute rates).

Each point of the throughput curves runs for a fixed time (``--seconds``) rather than a fixed
count, so the run time is bounded whatever the machine does; the delivered count is checked
against the partition's high watermark where there is one partition. Each curve gets a fresh
broker; the RSS column is the broker's VmRSS after the point, so it includes what earlier
points of the same curve left behind (the producer-state curve counts every producer so far).
The mock runs inside this process, so its memory cannot be told apart and is not drawn.

Everything is on 127.0.0.1 and every wait has a deadline. Every point is printed as a
Markdown table too; the SVGs go to ``--out`` (default docs/curves; a --quick run's to a temp
dir, so that it does not replace the documented curves).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import random
import struct
import sys
import tempfile
import time
from pathlib import Path

import crc32c
from _curves_plot import plot_all, tables
from _support import (
    REPO,
    LoadMeter,
    MockCluster,
    OncelogBroker,
    add_quiet_arguments,
    cpu_seconds_probe,
    machine,
    wait_if_asked,
)
from produce_consume import (
    BenchError,
    _check_delivered,
    _client_logger,
    _delete_topics,
    _flush,
    paced_latency,
    produce_throughput,
)

from oncelog.protocol import api_versions as apis
from oncelog.protocol.messages import encode_request
from oncelog.protocol.records import encode_batch
from oncelog.protocol.schema import build, request_module

CURVES = ("size", "partitions", "connections", "producers", "latency")
FULL = {
    "size": (100, 1024, 10 * 1024, 100 * 1024, 1024 * 1024),
    "partitions": (1, 4, 10, 100, 1000, 10_000),
    "connections": (1, 10, 100, 1000),
    "producers": (1, 10, 100, 1000, 10_000, 100_000),
    "latency": (0.1, 0.25, 0.5, 0.75, 0.9),  # of oncelog's measured peak
}
QUICK = {
    "size": (100, 10 * 1024, 1024 * 1024),
    "partitions": (1, 10, 100),
    "connections": (1, 100),
    "producers": (1, 1000),
    "latency": (0.25, 0.75),
}
SECONDS = {"full": 3.0, "quick": 1.0}
# The shared machine has taken 30 s to start a broker; a benchmark of curves should still run.
BROKER_START_TIMEOUT = 90.0
POINT_TIMEOUT = 120.0  # seconds: a point that takes longer is stuck
PRODUCER_BUDGET = 60.0  # seconds one producers point may take before it stops issuing
RAW_CONNECTIONS = 4  # of the producers curve
RAW_DEPTH = 32  # requests in flight per connection, producers curve
CONN_RECORDS = 16  # 1 KiB records per produce request, connections curve
SEED = 20240917
DOCS_OUT = REPO / "docs" / "curves"
QUICK_OUT = Path(tempfile.gettempdir()) / "oncelog-curves-quick"
NOW_MS = 1_700_000_000_000
# The same protocol versions against both: the mock answers Produce 0..10 and
# InitProducerId 0..4, oncelog more; v7 and v1 are the last before flexible encodings.
PRODUCE_VERSION = 7
INIT_PID_VERSION = 1
_INIT_CORRELATION, _PRODUCE_CORRELATION = 1, 2
# Where a record batch keeps what the producers curve patches (Kafka's v2 batch layout).
_BATCH_CRC, _BATCH_CRC_FROM, _BATCH_PID = 17, 21, 43
# A bounded local queue: produce() blocks once this much waits for the broker, so the run
# measures what the broker takes rather than ending in a long flush of a backlog.
QUEUE_BOUND = {"queue.buffering.max.messages": 20_000, "queue.buffering.max.kbytes": 65_536}
# A 1 MiB record needs more than Kafka's default 1,048,588-byte batch limit; a user who
# sends such records raises it too.
BIG_RECORDS = {"message.max.bytes": str(2 << 20)}
CLIENT_BIG_RECORDS = {"message.max.bytes": 4 << 20}


def payload(size: int) -> bytes:
    return random.Random(SEED).randbytes(size)  # incompressible, the same on every run


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise BenchError(f"no VmRSS for {pid}")


# --- a producer that runs for a fixed time ----------------------------------------------------

def produce_for(bootstrap: str, topic: str, value: bytes, seconds: float, partitions: int,
                extra: dict, before: int = 0) -> tuple[int, float]:
    """Produce ``value`` round robin over partitions 0..partitions-1 for ``seconds``, then
    flush; (records delivered, seconds from the first produce() to the end of flush()).
    ``before``: records partition 0 already held."""
    from confluent_kafka import Producer

    errors: list[str] = []

    def on_error(err, msg) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **QUEUE_BOUND, **extra,
                         "delivery.report.only.error": True, "on_delivery": on_error,
                         "logger": _client_logger()})
    deadline = time.monotonic() + POINT_TIMEOUT
    producer.produce(topic, value, partition=0)  # connects, learns metadata; not timed
    _flush(producer, deadline)
    produce, poll, clock = producer.produce, producer.poll, time.perf_counter
    start = clock()
    stop = start + seconds
    sent = 0
    while clock() < stop:
        try:
            produce(topic, value, partition=sent % partitions)
            sent += 1
        except BufferError:  # the local queue is full: wait for deliveries
            poll(0.001)
        if sent % 1000 == 0:
            poll(0)
    _flush(producer, deadline)
    elapsed = clock() - start
    poll(0)
    if errors:
        raise BenchError(f"{topic}: {len(errors)} deliveries failed, first: {errors[0]}")
    if partitions == 1:
        _check_delivered(bootstrap, topic, before + sent + 1)
    return sent, elapsed


def first_writes(bootstrap: str, topic: str, partitions: int, budget: float) -> tuple[int, float]:
    """One record into each partition 0..partitions-1, stopping after ``budget`` seconds;
    (partitions written, seconds). oncelog opens a partition's log on its first write."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "queue.buffering.max.messages": 1000, "logger": _client_logger()})
    value = payload(1024)
    start = time.perf_counter()
    sent = 0
    while sent < partitions and time.perf_counter() - start < budget:
        try:
            producer.produce(topic, value, partition=sent)
            sent += 1
        except BufferError:
            producer.poll(0.01)
    producer.flush(max(1.0, budget - (time.perf_counter() - start)))
    return sent - len(producer), time.perf_counter() - start


def create_topic(bootstrap: str, topic: str, partitions: int) -> float:
    """Seconds CreateTopics took (oncelog only: the mock has no CreateTopics)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": _client_logger()})
    start = time.perf_counter()
    for future in admin.create_topics([NewTopic(topic, partitions, 1)],
                                      operation_timeout=60).values():
        future.result(timeout=POINT_TIMEOUT)
    return time.perf_counter() - start


def auto_created_partitions(bootstrap: str, topic: str) -> int:
    """Partitions a topic gets when a produce creates it (the mock's only way to a topic)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "logger": _client_logger()})
    producer.produce(topic, b"x", partition=0)
    _flush(producer, time.monotonic() + POINT_TIMEOUT)
    return len(producer.list_topics(topic, timeout=10).topics[topic].partitions)


# --- a light raw client: many connections, requests encoded once ----------------------------

class _Pipe(asyncio.Protocol):
    """One connection: keeps up to ``depth`` requests of its job in flight; Kafka answers a
    connection's requests in order, each frame goes to the job."""

    def __init__(self, job, depth: int) -> None:
        self.job, self.depth = job, depth
        self.buf = bytearray()
        self.in_flight = 0
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def fill(self) -> None:
        while self.in_flight < self.depth:
            request = self.job.next_request()
            if request is None:
                break
            self.transport.write(request)
            self.in_flight += 1
        if self.in_flight == 0 and not self.done.done():
            self.done.set_result(None)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        while len(buf) - pos >= 4:
            size = int.from_bytes(buf[pos:pos + 4], "big")
            if len(buf) - pos - 4 < size:
                break
            self.job.answer(bytes(buf[pos + 4:pos + 4 + size]))
            pos += 4 + size
            self.in_flight -= 1
        del buf[:pos]
        self.fill()

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"connection lost: {exc}"))


async def _drive(bootstrap: str, jobs: list, depth: int, timeout: float) -> float:
    """Connect one pipe per job, then start them all at once; seconds until all are done."""
    loop = asyncio.get_running_loop()
    host, port = bootstrap.rsplit(":", 1)
    pipes = []
    try:
        for job in jobs:
            _, pipe = await asyncio.wait_for(loop.create_connection(
                lambda job=job: _Pipe(job, depth), host, int(port)), 30)
            pipes.append(pipe)
        start = time.perf_counter()
        for job in jobs:
            job.start = start
        for pipe in pipes:
            pipe.fill()
        await asyncio.wait_for(asyncio.gather(*(p.done for p in pipes)), timeout)
        return time.perf_counter() - start
    finally:
        for pipe in pipes:
            pipe.transport.close()


def produce_request(topic: str, batch: bytes, correlation_id: int) -> bytes:
    mod = request_module(apis.PRODUCE, PRODUCE_VERSION)
    body = build(mod.ProduceRequest, transactional_id=None, acks=-1,
                 timeout=datetime.timedelta(seconds=30), topic_data=(build(
                     mod.TopicProduceData, name=topic, partition_data=(build(
                         mod.PartitionProduceData, index=0, records=batch),)),))
    return encode_request(apis.PRODUCE, PRODUCE_VERSION, correlation_id, "oncelog-curves", body)


def init_pid_request() -> bytes:
    mod = request_module(apis.INIT_PRODUCER_ID, INIT_PID_VERSION)
    body = build(mod.InitProducerIdRequest, transactional_id=None,
                 transaction_timeout=datetime.timedelta(milliseconds=60_000))
    return encode_request(apis.INIT_PRODUCER_ID, INIT_PID_VERSION, _INIT_CORRELATION,
                          "oncelog-curves", body)


def _produce_error(frame: bytes, topic: str) -> int:
    # Produce v7 answer: correlation id, [topic: name, [partition: index, error_code, ...]].
    return struct.unpack_from(">h", frame, 4 + 4 + 2 + len(topic.encode()) + 4 + 4)[0]


class _Repeat:
    """The connections curve's job: the same produce request until the time is up."""

    def __init__(self, request: bytes, topic: str, seconds: float) -> None:
        self.request, self.topic, self.seconds = request, topic, seconds
        self.start = float("inf")
        self.acked = 0
        self.errors: dict[int, int] = {}

    def next_request(self) -> bytes | None:
        return self.request if time.perf_counter() - self.start < self.seconds else None

    def answer(self, frame: bytes) -> None:
        error = _produce_error(frame, self.topic)
        if error:
            self.errors[error] = self.errors.get(error, 0) + 1
        else:
            self.acked += 1


class _Producers:
    """The producers curve's job: ``count`` idempotent producers, each InitProducerId then
    one Produce with the id and epoch it was given, sequence 0."""

    def __init__(self, count: int, template: bytes, batch_at: int, topic: str,
                 budget: float) -> None:
        self.to_init, self.template, self.batch_at = count, template, batch_at
        self.topic, self.budget = topic, budget
        self.init = init_pid_request()
        self.ready: list[bytes] = []
        self.start = float("inf")
        self.acked = 0
        self.errors: dict[str, int] = {}

    def next_request(self) -> bytes | None:
        if self.ready:
            return self.ready.pop()
        if self.to_init and time.perf_counter() - self.start < self.budget:
            self.to_init -= 1
            return self.init
        return None

    def answer(self, frame: bytes) -> None:
        (correlation,) = struct.unpack_from(">i", frame, 0)
        if correlation == _INIT_CORRELATION:
            # InitProducerId v1: correlation id, throttle, error_code, producer_id, epoch.
            error, pid, epoch = struct.unpack_from(">hqh", frame, 8)
            if error:
                self.errors[f"InitProducerId {error}"] = self.errors.get(
                    f"InitProducerId {error}", 0) + 1
                return
            request = bytearray(self.template)
            at = self.batch_at
            struct.pack_into(">qh", request, at + _BATCH_PID, pid, epoch)
            struct.pack_into(">I", request, at + _BATCH_CRC,
                             crc32c.crc32c(memoryview(request)[at + _BATCH_CRC_FROM:]))
            self.ready.append(bytes(request))
            return
        error = _produce_error(frame, self.topic)
        if error:
            self.errors[f"Produce {error}"] = self.errors.get(f"Produce {error}", 0) + 1
        else:
            self.acked += 1


def run_jobs(bootstrap: str, jobs: list, depth: int) -> float:
    return asyncio.run(_drive(bootstrap, jobs, depth, POINT_TIMEOUT))


# --- the curves -----------------------------------------------------------------------------

class Curves:
    def __init__(self, args) -> None:
        self.args = args
        self.points = QUICK if args.quick else FULL
        self.seconds = args.seconds or SECONDS["quick" if args.quick else "full"]
        self.first_write_budget = 20.0 if args.quick else 60.0
        self.mock: MockCluster | None = None
        self.topic_no = 0
        self.live: set[int] = set()  # the running broker's pid, for the load meter
        self.findings: list[str] = []

    def brokers_cpu(self) -> float:
        total = 0.0
        for pid in list(self.live):
            try:
                total += cpu_seconds_probe(pid)()
            except OSError:  # exited meanwhile: counted with the reaped children
                pass
        return total

    def topic(self, prefix: str) -> str:
        self.topic_no += 1
        return f"{prefix}-{self.topic_no}"

    @contextlib.contextmanager
    def broker(self, settings: dict | None = None):
        broker = OncelogBroker(settings, base_dir=self.args.data_dir,
                               start_timeout=BROKER_START_TIMEOUT)
        try:
            with broker:
                self.live.add(broker.pid)
                try:
                    yield broker
                finally:
                    self.live.discard(broker.pid)
        except RuntimeError as exc:
            if "did not stop" not in str(exc):
                raise
            # Killed after STOP_TIMEOUT: a finding for the report, not a reason to lose the
            # points already measured.
            self.findings.append(str(exc))
            print(f"warning: {exc}", file=sys.stderr, flush=True)

    def size(self) -> dict:
        rows = []
        with self.broker(BIG_RECORDS) as broker:
            for size in self.points["size"]:
                value = payload(size)
                row: dict = {"x": size}
                for name, bootstrap in (("oncelog", broker.bootstrap),
                                        ("mock", self.mock.bootstrap)):
                    topic = self.topic(f"size-{size}")
                    sent, elapsed = produce_for(bootstrap, topic, value, self.seconds, 1,
                                                CLIENT_BIG_RECORDS)
                    row[name] = sent * size / elapsed / 1e6
                    row[f"{name}_msgs_s"] = sent / elapsed
                    if name == "oncelog":
                        row["rss_mib"] = rss_mib(broker.pid)
                        _delete_topics(bootstrap, [topic])  # frees the disk for the next
                rows.append(row)
                self.progress("size", row)
        return {"title": "Produce throughput against record size (one partition)",
                "x_label": "record value size (bytes)", "y_label": "MB/s of values",
                "note": f"One confluent-kafka producer, acks=all, librdkafka's default "
                        f"batching, local queue at most 20,000 records / 64 MiB, "
                        f"{self.seconds:g} s of produce() per point, then flush; broker "
                        f"message.max.bytes = 2 MiB (1 MiB records need it).",
                "columns": {"x": "value bytes", "oncelog": "oncelog MB/s",
                            "mock": "mock MB/s", "oncelog_msgs_s": "oncelog msgs/s",
                            "mock_msgs_s": "mock msgs/s", "rss_mib": "broker RSS MiB"},
                "rows": rows}

    def partitions(self) -> dict:
        value = payload(1024)
        mock_partitions = auto_created_partitions(self.mock.bootstrap,
                                                  self.topic("partitions-mock"))
        rows = []
        with self.broker() as broker:
            for count in self.points["partitions"]:
                row: dict = {"x": count}
                topic = self.topic(f"partitions-{count}")
                row["create_s"] = create_topic(broker.bootstrap, topic, count)
                written, row["first_write_s"] = first_writes(broker.bootstrap, topic, count,
                                                             self.first_write_budget)
                row["first_written"] = written
                if written == count:
                    sent, elapsed = produce_for(broker.bootstrap, topic, value, self.seconds,
                                                count, {}, before=1)
                    row["oncelog"] = sent * 1024 / elapsed / 1e6
                    row["oncelog_records"] = sent
                    row["oncelog_s"] = elapsed
                else:  # the backlog of first writes would be measured, not the steady rate
                    row["oncelog"] = None
                row["rss_mib"] = rss_mib(broker.pid)
                if count <= mock_partitions:
                    sent, elapsed = produce_for(self.mock.bootstrap,
                                                self.topic("partitions-mock"), value,
                                                self.seconds, count, {})
                    row["mock"] = sent * 1024 / elapsed / 1e6
                else:
                    row["mock"] = None
                rows.append(row)
                self.progress("partitions", row)
        return {"title": "Produce throughput against partitions of one topic",
                "x_label": "partitions (1 KiB records round robin)",
                "y_label": "MB/s of values",
                "note": f"One confluent-kafka producer, acks=all, default batching, local "
                        f"queue at most 20,000 records, {self.seconds:g} s of produce() per "
                        f"point, then flush, after a first pass writing one record to each "
                        f"partition (timed apart, at most {self.first_write_budget:g} s; no "
                        f"steady point when it did not finish). The mock has no CreateTopics: its "
                        f"auto-created topics have {mock_partitions} partitions, so it is "
                        f"drawn up to {mock_partitions}.",
                "columns": {"x": "partitions", "create_s": "CreateTopics s",
                            "first_write_s": "first write to each partition s",
                            "first_written": "partitions written first",
                            "oncelog": "oncelog MB/s", "oncelog_records": "oncelog records",
                            "oncelog_s": "oncelog s (to the end of flush)",
                            "mock": "mock MB/s", "rss_mib": "broker RSS MiB"},
                "rows": rows}

    def connections(self) -> dict:
        batch = encode_batch([(None, payload(1024), (), NOW_MS)] * CONN_RECORDS)
        rows = []
        with self.broker() as broker:
            for count in self.points["connections"]:
                row: dict = {"x": count}
                for name, bootstrap in (("oncelog", broker.bootstrap),
                                        ("mock", self.mock.bootstrap)):
                    topic = self.topic(f"connections-{count}")
                    auto_created_partitions(bootstrap, topic)  # one record at offset 0
                    request = produce_request(topic, batch, _PRODUCE_CORRELATION)
                    jobs = [_Repeat(request, topic, self.seconds) for _ in range(count)]
                    elapsed = run_jobs(bootstrap, jobs, 1)
                    acked = sum(job.acked for job in jobs)
                    errors = sum(sum(job.errors.values()) for job in jobs)
                    if errors:
                        raise BenchError(f"{name}, {count} connections: {errors} produce "
                                         f"errors, {jobs[0].errors}")
                    _check_delivered(bootstrap, topic, 1 + acked * CONN_RECORDS)
                    row[name] = acked * CONN_RECORDS * 1024 / elapsed / 1e6
                    row[f"{name}_requests_s"] = acked / elapsed
                    if name == "oncelog":
                        row["rss_mib"] = rss_mib(broker.pid)
                        _delete_topics(bootstrap, [topic])
                rows.append(row)
                self.progress("connections", row)
        return {"title": "Produce throughput against client connections",
                "x_label": "connections, one 16 KiB produce request in flight each",
                "y_label": "MB/s of values",
                "note": f"A raw asyncio client (requests encoded once with oncelog's protocol "
                        f"code): each connection sends Produce v{PRODUCE_VERSION}, acks=all, "
                        f"one batch of {CONN_RECORDS} x 1 KiB records, the next when the "
                        f"answer is in; {self.seconds:g} s per point, after all connected.",
                "columns": {"x": "connections", "oncelog": "oncelog MB/s",
                            "mock": "mock MB/s", "oncelog_requests_s": "oncelog requests/s",
                            "mock_requests_s": "mock requests/s",
                            "rss_mib": "broker RSS MiB"},
                "rows": rows}

    def producers(self) -> dict:
        value = payload(100)
        batch = encode_batch([(None, value, (), NOW_MS)], producer_id=0, producer_epoch=0,
                             base_sequence=0)
        rows = []
        with self.broker() as broker:
            for count in self.points["producers"]:
                row: dict = {"x": count}
                for name, bootstrap in (("oncelog", broker.bootstrap),
                                        ("mock", self.mock.bootstrap)):
                    topic = self.topic(f"producers-{count}")
                    auto_created_partitions(bootstrap, topic)
                    template = produce_request(topic, batch, _PRODUCE_CORRELATION)
                    at = len(template) - len(batch)  # the records are the request's last field
                    conns = min(RAW_CONNECTIONS, count)
                    jobs = [_Producers(count // conns + (i < count % conns), template, at,
                                       topic, PRODUCER_BUDGET) for i in range(conns)]
                    elapsed = run_jobs(bootstrap, jobs, RAW_DEPTH)
                    acked = sum(job.acked for job in jobs)
                    errors: dict[str, int] = {}
                    for job in jobs:
                        for key, n in job.errors.items():
                            errors[key] = errors.get(key, 0) + n
                    _check_delivered(bootstrap, topic, 1 + acked)
                    row[name] = acked / elapsed
                    row[f"{name}_done"] = acked
                    if errors:
                        row[f"{name}_errors"] = ", ".join(f"{k}: {n}" for k, n in errors.items())
                    if name == "oncelog":
                        row["rss_mib"] = rss_mib(broker.pid)
                rows.append(row)
                self.progress("producers", row)
        return {"title": "Idempotent producers set up per second against producers",
                "x_label": "idempotent producers (each InitProducerId + one Produce)",
                "y_label": "producers per second",
                "note": f"A raw asyncio client, {RAW_CONNECTIONS} connections x {RAW_DEPTH} "
                        f"requests in flight: InitProducerId v{INIT_PID_VERSION}, then "
                        f"Produce v{PRODUCE_VERSION} of one 100 B record with that id, "
                        f"sequence 0, all into one partition; a point stops issuing after "
                        f"{PRODUCER_BUDGET:g} s ('done' < producers). RSS is cumulative: "
                        f"every earlier point's producers are still held.",
                "columns": {"x": "producers", "oncelog": "oncelog producers/s",
                            "mock": "mock producers/s", "oncelog_done": "oncelog done",
                            "mock_done": "mock done", "rss_mib": "broker RSS MiB"},
                "rows": rows}

    def latency(self) -> dict:
        rows = []
        with self.broker() as broker:
            peak = produce_throughput(broker.bootstrap, self.topic("latency-peak"),
                                      20_000 if self.args.quick else 100_000, {}).msgs_per_s
            for share in self.points["latency"]:
                rate = share * peak
                n = max(100, int(rate * self.seconds))
                row: dict = {"x": rate, "share_of_peak": share}
                for name, bootstrap in (("oncelog", broker.bootstrap),
                                        ("mock", self.mock.bootstrap)):
                    result = paced_latency(bootstrap, self.topic(f"latency-{share}"), rate, n)
                    row[f"{name}_p50"] = result["p50_ms"]
                    row[f"{name}_p99"] = result["p99_ms"]
                    row[f"{name}_achieved"] = result["achieved_rate"]
                    if name == "oncelog":
                        row["rss_mib"] = rss_mib(broker.pid)
                rows.append(row)
                self.progress("latency", row)
        return {"kind": "latency", "x_scale": "linear", "y_scale": "log",
                "title": "Produce latency against offered load (1 KiB records)",
                "x_label": "offered load (messages/s)", "y_label": "latency (ms)",
                "note": f"confluent-kafka, acks=all, default batching (linger.ms=5), paced at "
                        f"shares of oncelog's peak measured first ({peak:,.0f} msgs/s); "
                        f"every 8th message timed, {self.seconds:g} s per point; the mock at "
                        f"the same rates.",
                "columns": {"x": "offered msgs/s", "share_of_peak": "share of peak",
                            "oncelog_p50": "oncelog p50 ms", "oncelog_p99": "oncelog p99 ms",
                            "oncelog_achieved": "oncelog achieved msgs/s",
                            "mock_p50": "mock p50 ms", "mock_p99": "mock p99 ms",
                            "mock_achieved": "mock achieved msgs/s",
                            "rss_mib": "broker RSS MiB"},
                "rows": rows}

    def progress(self, curve: str, row: dict) -> None:
        shown = ", ".join(f"{k}={v:,.4g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in row.items())
        print(f"  {curve}: {shown}", flush=True)


def run(args) -> dict:
    wanted = [c.strip() for c in args.parts.split(",") if c.strip()]
    curves = Curves(args)
    results: dict = {"curves": {}}
    started = time.monotonic()
    meter = LoadMeter(curves.brokers_cpu)
    with MockCluster() as mock:
        curves.mock = mock
        for name in wanted:
            began = time.monotonic()
            curve_meter = LoadMeter(curves.brokers_cpu)
            results["curves"][name] = getattr(curves, name)()
            if curves.findings:
                results["curves"][name]["note"] += " The broker " + "; ".join(
                    f.removeprefix("oncelog broker ") for f in curves.findings) + "."
                curves.findings.clear()
            results["curves"][name]["others_share"] = curve_meter.others_share()
            print(f"{name}: {time.monotonic() - began:.0f} s, other processes used "
                  f"{results['curves'][name]['others_share']:.0%} of the CPUs", flush=True)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results["meta"] = {
        "machine": machine(), "mode": "quick" if args.quick else "full",
        "seconds_per_point": curves.seconds, "wall_seconds": time.monotonic() - started,
        "others_share": meter.others_share(), "load_average": _loadavg(),
        "stamp": f"{stamp}, {'quick' if args.quick else 'full'} run; other processes used "
                 f"{meter.others_share():.0%} of the CPUs meanwhile",
    }
    return results


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer points, 1 s each (about 2 minutes)")
    parser.add_argument("--seconds", type=float, help="seconds per throughput point")
    parser.add_argument("--parts", default=",".join(CURVES),
                        help=f"comma-separated, of {', '.join(CURVES)}")
    parser.add_argument("--out", type=Path,
                        help=f"where the SVGs and curves.json go (default {DOCS_OUT}; with "
                             f"--quick {QUICK_OUT}, so that a quick run does not replace the "
                             f"documented curves)")
    parser.add_argument("--plot-only", metavar="JSON", type=Path,
                        help="redraw the SVGs and tables from a results file; measure nothing")
    parser.add_argument("--data-dir", type=Path,
                        help="where the brokers' temporary log.dirs are made")
    add_quiet_arguments(parser, repeats=False)
    args, _ = parser.parse_known_args(argv)  # run_all.py may pass other modules' options
    unknown = set(args.parts.split(",")) - set(CURVES)
    if unknown:
        parser.error(f"unknown curves: {', '.join(sorted(unknown))}")
    if args.out is None:
        args.out = QUICK_OUT if args.quick else DOCS_OUT
    if args.plot_only:
        results = json.loads(args.plot_only.read_text())
    else:
        wait_if_asked(args)
        results = run(args)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "curves.json").write_text(json.dumps(results, indent=1) + "\n")
    for path in plot_all(results, args.out):
        print(f"wrote {path}")
    print()
    print(tables(results))
    meta = results["meta"]
    print(f"{meta['stamp']}; load average at the end {meta['load_average']}; "
          f"{meta['wall_seconds']:.0f} s; {meta['machine']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
