"""oncelog's own clients next to confluent-kafka, kafka-python and aiokafka (issue 5), one run.

    .venv/bin/python bench/clients.py [--messages N] [--consume-messages N] [--repeats R]
    make bench ARGS="--only clients --repeats 5"

One oncelog broker (started here, 127.0.0.1, a temporary log.dirs, default settings) serves
every client. For values of 100 bytes and of 1 KiB (fixed incompressible payloads):

* produce: ``--messages`` records to partition 0 of a fresh one-partition topic, acks=all,
  idempotent (oncelog.Producer and oncelog.AIOProducer by default; ``enable.idempotence=True``
  for confluent-kafka; ``enable_idempotence=True`` for kafka-python and aiokafka), timed from
  the first send to the end of the flush that confirms the last. One untimed record before it
  connects, fetches metadata and the producer id. Afterwards the partition must hold exactly
  the records sent, and DescribeProducers must show one producer whose last sequence is the
  last record's: proof that the run was idempotent and nothing was lost or doubled.
* consume: the first ``--consume-messages`` records of a topic filled beforehand, read with
  ``assign`` (no consumer group, nothing committed): oncelog.Consumer.poll, confluent
  ``Consumer.consume``, kafka-python ``KafkaConsumer.poll``, aiokafka ``getmany``, 500 records
  per call at most. Each consumer first reads one batch untimed (connections, first fetch),
  seeks back to offset 0, then is timed until it has seen every offset in order and touched
  every value.

Batching is the same for every producer by default (``--batching same``): ``linger.ms=5`` and
16 KiB batches, which are oncelog's and Java's defaults. ``--batching native`` leaves every
client at its own defaults instead (librdkafka: linger 5 ms, 1 MB batches; kafka-python and
aiokafka: linger 0). Both asyncio clients run on uvloop (oncelog.Producer's sender thread uses
it too). The clients take turns within each repetition, starting one later each time, so drift
of the machine hits them alike; medians are reported, and for each ratio oncelog / other the
median of the per-repetition ratios. Every run also reports the client process's CPU per
message (user + system, all its threads, librdkafka's included) and the kernel's part of it
("sys"), the broker's CPU share, and the share of the CPUs other processes took meanwhile: the
machine may be shared.

``--what produce`` or ``--what consume`` runs one side only; ``--set KEY=VALUE`` gives
oncelog's producers extra config (e.g. ``batch.size=65536``) for an A/B against the same
run's other clients.

With ``--profile DIR``, py-spy (``.venv/bin/pip install py-spy``) then samples this process
while oncelog.Producer produces and while oncelog.Consumer polls, for each value size;
speedscope files and collapsed stacks go to DIR and the hot spots are printed, split by
thread (the caller's thread and the producer's sender thread).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _support import (
    LoadMeter,
    OncelogBroker,
    add_json_argument,
    add_quiet_arguments,
    machine,
    median,
    wait_if_asked,
    write_json,
)
from produce_consume import _client_logger, _hot_spots, _py_spy, _read_collapsed, cpu_probe

SIZES = {"100B": 100, "1KiB": 1024}
PRODUCERS = ("oncelog", "oncelog-aio", "confluent", "kafka-python", "aiokafka")
CONSUMERS = ("oncelog", "confluent", "kafka-python", "aiokafka")
LABELS = {"oncelog": "oncelog.Producer", "oncelog-aio": "oncelog.AIOProducer",
          "confluent": "confluent-kafka", "kafka-python": "kafka-python", "aiokafka": "aiokafka"}
OURS = ("oncelog", "oncelog-aio")
# oncelog / other must reach these (issue 5).
TARGETS = {"confluent": 0.5, "kafka-python": 2.0, "aiokafka": 2.0}
DEFAULT_MESSAGES = 50_000
DEFAULT_CONSUME_MESSAGES = 100_000
DEFAULT_REPEATS = 5
MAX_RECORDS = 500  # records per poll/consume/getmany call, for every consumer
RUN_TIMEOUT = 120.0  # seconds for any one run, set-up included
CALL_TIMEOUT = 30.0
CHECK_EVERY = 4095  # the produce loops look at the clock once per 4096 records
PROFILE_RATE = 200


class BenchError(RuntimeError):
    pass


def payload(size: int) -> bytes:
    """Fixed, incompressible bytes: the same on every run."""
    return random.Random(20241105 + size).randbytes(size)


# --- measuring one run -----------------------------------------------------------------------


@dataclass
class Run:
    client: str
    messages: int
    value_bytes: int
    seconds: float = 0.0
    client_cpu: float = 0.0  # CPU seconds of this process (all threads) in the timed window
    client_sys: float = 0.0  # the part of client_cpu spent in the kernel
    broker_cpu: float = 0.0  # CPU seconds of the broker in the timed window
    others: float = 0.0      # share of all CPUs other processes used in the timed window

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.messages * self.value_bytes / self.seconds / 1e6


@dataclass
class Window:
    """The timed part of a run: wall clock, our CPU, the broker's CPU, everybody else's."""

    broker_cpu: Callable[[], float]
    run: Run
    _start: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    _load: LoadMeter | None = field(default=None, repr=False)

    def start(self) -> None:
        self._load = LoadMeter(self.broker_cpu)
        ours = resource.getrusage(resource.RUSAGE_SELF)  # microseconds, unlike os.times()
        self._start = (time.perf_counter(), ours.ru_utime, ours.ru_stime, self.broker_cpu())

    def stop(self) -> None:
        wall = time.perf_counter()
        ours, broker = resource.getrusage(resource.RUSAGE_SELF), self.broker_cpu()
        assert self._load is not None
        self.run.seconds = wall - self._start[0]
        self.run.client_sys = ours.ru_stime - self._start[2]
        self.run.client_cpu = ours.ru_utime - self._start[1] + self.run.client_sys
        self.run.broker_cpu = broker - self._start[3]
        self.run.others = self._load.others_share()


def _check_deadline(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise BenchError(f"{what}: not done within {RUN_TIMEOUT:.0f} s")


def _left(deadline: float) -> float:
    return max(0.1, deadline - time.monotonic())


def _run_async(coro: Coroutine[Any, Any, None]) -> None:
    """On uvloop (as oncelog.Producer's sender thread), bounded by RUN_TIMEOUT."""
    try:
        import uvloop
        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(asyncio.wait_for(coro, RUN_TIMEOUT))


# --- producers -------------------------------------------------------------------------------
# Each: connect and send one record untimed, then window.start(), n records, flush,
# window.stop(). Every loop does the same cheap clock check once per 4096 records.

def _producer_config(client: str, args: argparse.Namespace) -> dict[str, Any]:
    """The producer settings a client gets beyond acks and idempotence: the batching, and
    ``--set`` for oncelog's producers."""
    extra = _batching(client, args.batching == "native")
    if client in OURS:
        extra.update(args.set)
    return extra


def _batching(client: str, native: bool) -> dict[str, Any]:
    if native:
        return {}
    return {"oncelog": {"linger.ms": 5, "batch.size": 16_384},
            "oncelog-aio": {"linger.ms": 5, "batch.size": 16_384},
            "confluent": {"linger.ms": 5, "batch.size": 16_384},
            "kafka-python": {"linger_ms": 5, "batch_size": 16_384},
            "aiokafka": {"linger_ms": 5, "max_batch_size": 16_384}}[client]


def produce_oncelog(bootstrap: str, topic: str, value: bytes, n: int, window: Window,
                    extra: dict[str, Any]) -> None:
    import oncelog

    deadline = time.monotonic() + RUN_TIMEOUT
    producer = oncelog.Producer({"bootstrap.servers": bootstrap, "acks": "all", **extra})
    try:
        producer.produce(topic, value, partition=0).result(CALL_TIMEOUT)
        produce = producer.produce
        window.start()
        for i in range(n):
            produce(topic, value, partition=0)
            if not i & CHECK_EVERY:
                _check_deadline(deadline, "oncelog.Producer")
        producer.flush(_left(deadline))
        window.stop()
    finally:
        producer.close(CALL_TIMEOUT)


def produce_oncelog_aio(bootstrap: str, topic: str, value: bytes, n: int, window: Window,
                        extra: dict[str, Any]) -> None:
    import oncelog

    async def run() -> None:
        deadline = time.monotonic() + RUN_TIMEOUT
        producer = oncelog.AIOProducer({"bootstrap.servers": bootstrap, "acks": "all", **extra})
        await producer.start()
        try:
            await (await producer.send(topic, value, partition=0))
            send = producer.send
            window.start()
            for i in range(n):
                await send(topic, value, partition=0)
                if not i & CHECK_EVERY:
                    _check_deadline(deadline, "oncelog.AIOProducer")
            await producer.flush()
            window.stop()
        finally:
            await producer.stop()

    _run_async(run())


def produce_confluent(bootstrap: str, topic: str, value: bytes, n: int, window: Window,
                      extra: dict[str, Any]) -> None:
    from confluent_kafka import Producer

    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    deadline = time.monotonic() + RUN_TIMEOUT
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "delivery.report.only.error": True,
                         "on_delivery": on_delivery, "logger": _client_logger(), **extra})

    def flush() -> None:
        while len(producer) > 0:
            _check_deadline(deadline, "confluent-kafka flush")
            producer.flush(1.0)

    producer.produce(topic, value, partition=0)
    flush()
    produce, poll = producer.produce, producer.poll
    window.start()
    for i in range(n):
        while True:
            try:
                produce(topic, value, partition=0)
                break
            except BufferError:  # librdkafka's queue is full: serve delivery reports
                poll(0.001)
                _check_deadline(deadline, "confluent-kafka")
        if not i & CHECK_EVERY:
            poll(0)
            _check_deadline(deadline, "confluent-kafka")
    flush()
    window.stop()
    if errors:
        raise BenchError(f"confluent-kafka: {len(errors)} deliveries failed: {errors[0]}")


def produce_kafka_python(bootstrap: str, topic: str, value: bytes, n: int, window: Window,
                         extra: dict[str, Any]) -> None:
    from kafka import KafkaProducer

    deadline = time.monotonic() + RUN_TIMEOUT
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                             max_block_ms=int(CALL_TIMEOUT * 1000), **extra)
    try:
        producer.send(topic, value, partition=0).get(CALL_TIMEOUT)
        send = producer.send
        window.start()
        for i in range(n):
            last = send(topic, value, partition=0)
            if not i & CHECK_EVERY:
                _check_deadline(deadline, "kafka-python")
        producer.flush(_left(deadline))
        window.stop()
        last.get(0)  # raises if the last record failed; the checks afterwards cover the rest
    finally:
        producer.close(CALL_TIMEOUT)


def produce_aiokafka(bootstrap: str, topic: str, value: bytes, n: int, window: Window,
                     extra: dict[str, Any]) -> None:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        deadline = time.monotonic() + RUN_TIMEOUT
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                    enable_idempotence=True, **extra)
        await producer.start()
        try:
            await (await producer.send(topic, value, partition=0))
            send = producer.send
            window.start()
            for i in range(n):
                last = await send(topic, value, partition=0)
                if not i & CHECK_EVERY:
                    _check_deadline(deadline, "aiokafka")
            await producer.flush()
            window.stop()
            await last  # raises if the last record failed
        finally:
            await producer.stop()

    _run_async(run())


PRODUCE: dict[str, Callable[..., None]] = {
    "oncelog": produce_oncelog, "oncelog-aio": produce_oncelog_aio,
    "confluent": produce_confluent, "kafka-python": produce_kafka_python,
    "aiokafka": produce_aiokafka,
}


# --- consumers -------------------------------------------------------------------------------
# Each: assign partition 0, read one batch untimed, seek to 0, window.start(), read offsets
# 0..n-1 in order (anything else, e.g. prefetched before the seek, is skipped), window.stop().
# Returns the value bytes seen.

def consume_oncelog(bootstrap: str, topic: str, n: int, window: Window) -> int:
    import oncelog

    deadline = time.monotonic() + RUN_TIMEOUT
    consumer = oncelog.Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    try:
        tp = oncelog.TopicPartition(topic, 0)
        consumer.assign([tp], {tp: 0})
        while not consumer.poll(1.0, MAX_RECORDS):
            _check_deadline(deadline, "oncelog.Consumer warm-up")
        consumer.seek(tp, 0)
        poll = consumer.poll
        expected = nbytes = 0
        window.start()
        while expected < n:
            for record in poll(1.0, MAX_RECORDS):
                if record.offset == expected:
                    nbytes += len(record.value)
                    expected += 1
            _check_deadline(deadline, "oncelog.Consumer")
        window.stop()
    finally:
        consumer.close()
    return nbytes


def consume_confluent(bootstrap: str, topic: str, n: int, window: Window) -> int:
    from confluent_kafka import Consumer, TopicPartition

    deadline = time.monotonic() + RUN_TIMEOUT
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "oncelog-bench-clients",
                         "enable.auto.commit": False, "enable.auto.offset.store": False,
                         "auto.offset.reset": "earliest", "logger": _client_logger()})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        while not consumer.consume(num_messages=MAX_RECORDS, timeout=1.0):
            _check_deadline(deadline, "confluent-kafka warm-up")
        consumer.seek(TopicPartition(topic, 0, 0))
        consume = consumer.consume
        expected = nbytes = 0
        window.start()
        while expected < n:
            # consume() waits for num_messages or the timeout: never ask for more than is left
            for msg in consume(num_messages=min(MAX_RECORDS, n - expected), timeout=1.0):
                if msg.error() is not None:
                    raise BenchError(f"confluent-kafka consume: {msg.error()}")
                if msg.offset() == expected:
                    nbytes += len(msg.value())
                    expected += 1
            _check_deadline(deadline, "confluent-kafka consumer")
        window.stop()
    finally:
        consumer.close()
    return nbytes


def consume_kafka_python(bootstrap: str, topic: str, n: int, window: Window) -> int:
    from kafka import KafkaConsumer, TopicPartition

    deadline = time.monotonic() + RUN_TIMEOUT
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        while not consumer.poll(timeout_ms=1000, max_records=MAX_RECORDS):
            _check_deadline(deadline, "kafka-python warm-up")
        consumer.seek(tp, 0)
        poll = consumer.poll
        expected = nbytes = 0
        window.start()
        while expected < n:
            for records in poll(timeout_ms=1000, max_records=MAX_RECORDS).values():
                for record in records:
                    if record.offset == expected:
                        nbytes += len(record.value)
                        expected += 1
            _check_deadline(deadline, "kafka-python consumer")
        window.stop()
    finally:
        consumer.close()
    return nbytes


def consume_aiokafka(bootstrap: str, topic: str, n: int, window: Window) -> int:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    seen = 0

    async def run() -> None:
        nonlocal seen
        deadline = time.monotonic() + RUN_TIMEOUT
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                    enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            while not await consumer.getmany(timeout_ms=1000, max_records=MAX_RECORDS):
                _check_deadline(deadline, "aiokafka warm-up")
            consumer.seek(tp, 0)
            getmany = consumer.getmany
            expected = nbytes = 0
            window.start()
            while expected < n:
                for records in (await getmany(timeout_ms=1000,
                                              max_records=MAX_RECORDS)).values():
                    for record in records:
                        if record.offset == expected:
                            nbytes += len(record.value)
                            expected += 1
                _check_deadline(deadline, "aiokafka consumer")
            window.stop()
            seen = nbytes
        finally:
            await consumer.stop()

    _run_async(run())
    return seen


CONSUME: dict[str, Callable[[str, str, int, Window], int]] = {
    "oncelog": consume_oncelog, "confluent": consume_confluent,
    "kafka-python": consume_kafka_python, "aiokafka": consume_aiokafka,
}


# --- topics ----------------------------------------------------------------------------------

class Topics:
    """Creating, checking and deleting the benchmark's topics, with oncelog.Admin."""

    def __init__(self, bootstrap: str) -> None:
        import oncelog

        self.admin = oncelog.Admin({"bootstrap.servers": bootstrap,
                                    "request.timeout.ms": str(int(CALL_TIMEOUT * 1000))})

    def close(self) -> None:
        self.admin.close()

    def create(self, topic: str) -> None:
        self.admin.create_topic(topic, 1, 1)

    def delete(self, topic: str) -> None:
        """Free the disk between runs: dirty pages piling up would slow the later runs."""
        self.admin.delete_topic(topic)

    def high_watermark(self, topic: str) -> int:
        from oncelog.client.network import calls

        return calls.list_offset(self.admin.conn, topic, 0, calls.LATEST)

    def check_produced(self, topic: str, records: int, client: str) -> None:
        """Exactly ``records`` records, from one idempotent producer, sequences 0..records-1."""
        high = self.high_watermark(topic)
        if high != records:
            raise BenchError(f"{client}: {topic} holds {high} records, expected {records}")
        producers = self.admin.describe_producers(topic, [0]).get(0, [])
        if [p.last_sequence for p in producers] != [records - 1]:
            raise BenchError(f"{client}: {topic} was not written by one idempotent producer "
                             f"with sequences 0..{records - 1}: {producers}")


def fill(bootstrap: str, topics: Topics, topic: str, value: bytes, n: int) -> None:
    """The consume runs' source: exactly ``n`` records at offsets 0..n-1 (confluent-kafka,
    large batches: quick)."""
    from confluent_kafka import Producer

    topics.create(topic)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20,
                         "logger": _client_logger()})
    deadline = time.monotonic() + RUN_TIMEOUT
    for _ in range(n):
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
                _check_deadline(deadline, f"filling {topic}")
    while len(producer) > 0:
        _check_deadline(deadline, f"filling {topic}")
        producer.flush(1.0)
    if topics.high_watermark(topic) != n:
        raise BenchError(f"filling {topic}: {topics.high_watermark(topic)} records, not {n}")


# --- the comparison --------------------------------------------------------------------------

def _rotated(names: list[str], rep: int) -> list[str]:
    k = rep % len(names) if names else 0
    return names[k:] + names[:k]


def _label(what: str, client: str) -> str:
    return "oncelog.Consumer" if what.startswith("consume") and client == "oncelog" \
        else LABELS[client]


def _print_run(what: str, run: Run, rep: int) -> None:
    print(f"  {what:14} {_label(what, run.client):20} #{rep + 1}: {run.msgs_per_s:10,.0f} msgs/s "
          f"{run.mb_per_s:6.1f} MB/s  client CPU {run.client_cpu / run.messages * 1e6:5.1f} "
          f"us/msg  broker {run.broker_cpu / run.seconds:4.0%}  others {run.others:4.0%}",
          flush=True)


def run_comparison(args: argparse.Namespace, broker: OncelogBroker) -> dict:
    bootstrap = broker.bootstrap
    broker_cpu = cpu_probe(broker.pid)
    topics = Topics(bootstrap)
    producers = [c for c in PRODUCERS if c in args.clients and "produce" in args.what]
    consumers = [c for c in CONSUMERS if c in args.clients and "consume" in args.what]
    runs: dict[str, dict[str, dict[str, list[Run]]]] = {"produce": {}, "consume": {}}
    try:
        for size_name in args.sizes:
            value = payload(SIZES[size_name])
            if consumers:
                fill(bootstrap, topics, f"source-{size_name}", value, args.consume_messages)
            for client in producers:  # an untimed round: imports, first connections
                warm = f"warm-{size_name}-{client}"
                topics.create(warm)
                PRODUCE[client](bootstrap, warm, value, 1000, Window(broker_cpu, Run(
                    client, 1000, len(value))), _producer_config(client, args))
                topics.delete(warm)
            runs["produce"][size_name] = {c: [] for c in producers}
            runs["consume"][size_name] = {c: [] for c in consumers}
            for rep in range(args.repeats):
                for client in _rotated(producers, rep):
                    topic = f"produce-{size_name}-{client}-{rep}"
                    topics.create(topic)
                    run = Run(client, args.messages, len(value))
                    gc.collect()
                    PRODUCE[client](bootstrap, topic, value, args.messages,
                                    Window(broker_cpu, run),
                                    _producer_config(client, args))
                    topics.check_produced(topic, args.messages + 1, client)
                    topics.delete(topic)
                    runs["produce"][size_name][client].append(run)
                    _print_run(f"produce {size_name}", run, rep)
                for client in _rotated(consumers, rep):
                    run = Run(client, args.consume_messages, len(value))
                    gc.collect()
                    nbytes = CONSUME[client](bootstrap, f"source-{size_name}",
                                             args.consume_messages, Window(broker_cpu, run))
                    if nbytes != args.consume_messages * len(value):
                        raise BenchError(f"{client} read {nbytes} value bytes, expected "
                                         f"{args.consume_messages * len(value)}")
                    runs["consume"][size_name][client].append(run)
                    _print_run(f"consume {size_name}", run, rep)
            if consumers:
                topics.delete(f"source-{size_name}")
    finally:
        topics.close()
    return runs


def summarize(runs: dict[str, dict[str, dict[str, list[Run]]]]) -> dict:
    out: dict = {}
    for what, by_size in runs.items():
        for size_name, by_client in by_size.items():
            if not by_client:
                continue
            table = {}
            for client, client_runs in by_client.items():
                table[client] = {
                    "msgs_per_s": median([r.msgs_per_s for r in client_runs]),
                    "mb_per_s": median([r.mb_per_s for r in client_runs]),
                    "min_msgs_per_s": min(r.msgs_per_s for r in client_runs),
                    "max_msgs_per_s": max(r.msgs_per_s for r in client_runs),
                    "client_cpu_us_per_msg": median(
                        [r.client_cpu / r.messages * 1e6 for r in client_runs]),
                    "client_sys_share": median(
                        [r.client_sys / r.client_cpu if r.client_cpu else 0.0
                         for r in client_runs]),
                    "broker_cpu_share": median([r.broker_cpu / r.seconds for r in client_runs]),
                    "others": median([r.others for r in client_runs]),
                    "runs": [asdict(r) for r in client_runs],
                }
            ratios = {}
            for ours in (c for c in OURS if c in by_client):
                for other in (c for c in TARGETS if c in by_client):
                    paired = [a.msgs_per_s / b.msgs_per_s
                              for a, b in zip(by_client[ours], by_client[other], strict=True)]
                    ratios[f"{ours}/{other}"] = {
                        "paired": median(paired),
                        "of_medians": table[ours]["msgs_per_s"] / table[other]["msgs_per_s"],
                        "target": TARGETS[other],
                    }
            out.setdefault(what, {})[size_name] = {"clients": table, "ratios": ratios}
    return out


def report(results: dict) -> None:
    print()
    print(f"clients: {results['messages']:,} records per produce run, "
          f"{results['consume_messages']:,} per consume run, median of {results['repeats']} "
          f"repetitions; acks=all, idempotent, 1 partition; batching: {results['batching']}")
    print(f"machine: {results['machine']}")
    print(f"load average (1, 5, 15 min): before {results['loadavg_before']}, "
          f"after {results['loadavg_after']}; other processes used "
          f"{results['other_load']:.0%} of the CPUs during the run")
    header = (f"{'':16} {'client':20} {'msgs/s':>10} {'MB/s':>6} {'min..max msgs/s':>21} "
              f"{'us CPU/msg':>10} {'sys':>4} {'broker':>6} {'others':>6}")
    print(header)
    print("-" * len(header))
    for what, by_size in results["summary"].items():
        for size_name, summary in by_size.items():
            for client, row in summary["clients"].items():
                print(f"{what + ' ' + size_name:16} {_label(what, client):20} "
                      f"{row['msgs_per_s']:10,.0f} {row['mb_per_s']:6.1f} "
                      f"{row['min_msgs_per_s']:10,.0f}..{row['max_msgs_per_s']:<9,.0f} "
                      f"{row['client_cpu_us_per_msg']:10.1f} {row['client_sys_share']:4.0%} "
                      f"{row['broker_cpu_share']:6.0%} {row['others']:6.0%}")
    print()
    print("ratios oncelog / other: median of the per-repetition ratios (ratio of the medians)")
    for what, by_size in results["summary"].items():
        for size_name, summary in by_size.items():
            for key, ratio in summary["ratios"].items():
                ours, other = key.split("/")
                label = _label(what, ours)
                verdict = "ok" if ratio["paired"] >= ratio["target"] else "MISS"
                print(f"  {what + ' ' + size_name:16} {label:20} / {LABELS[other]:16} "
                      f"{ratio['paired']:6.2f} ({ratio['of_medians']:5.2f})  "
                      f"target >= {ratio['target']}: {verdict}")


# --- profiling -------------------------------------------------------------------------------

def _thread_of(frames: list[str]) -> str:
    """py-spy --threads puts 'thread (0x...)' or the thread's name first."""
    first = frames[0]
    if "oncelog-producer-sender" in first:
        return "sender thread"
    return "caller thread"


def profile(args: argparse.Namespace, broker: OncelogBroker, out_dir: Path) -> dict:
    """py-spy on this process while oncelog.Producer produces / oncelog.Consumer polls."""
    py_spy = _py_spy()
    if py_spy is None:
        raise BenchError("py-spy is not installed: .venv/bin/pip install py-spy")
    out_dir.mkdir(parents=True, exist_ok=True)
    topics = Topics(broker.bootstrap)
    broker_cpu = cpu_probe(broker.pid)
    profiles: dict = {}
    try:
        for size_name in args.sizes:
            value = payload(SIZES[size_name])
            fill(broker.bootstrap, topics, f"profile-source-{size_name}", value,
                 args.consume_messages)
            for what in ("produce", "consume"):
                name = f"{what}-{size_name}"
                raw, speedscope = out_dir / f"{name}.txt", out_dir / f"{name}.speedscope.json"
                samplers = [
                    subprocess.Popen([py_spy, "record", "--pid", str(os.getpid()), "--threads",
                                      "--nonblocking", "--rate", str(PROFILE_RATE),
                                      "--format", fmt, "--output", str(path)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                    for fmt, path in (("raw", raw), ("speedscope", speedscope))]
                runs: list[Run] = []
                try:
                    time.sleep(1.0)  # let py-spy attach
                    for sampler in samplers:
                        if sampler.poll() is not None:
                            assert sampler.stderr is not None
                            raise BenchError(f"py-spy failed: {sampler.stderr.read().decode()}")
                    start = time.monotonic()
                    while not runs or time.monotonic() - start < args.profile_seconds:
                        if what == "produce":
                            run = Run("oncelog", args.messages, len(value))
                            topic = f"profile-{name}-{len(runs)}"
                            topics.create(topic)
                            produce_oncelog(broker.bootstrap, topic, value, args.messages,
                                            Window(broker_cpu, run),
                                            _producer_config("oncelog", args))
                            topics.delete(topic)
                        else:
                            run = Run("oncelog", args.consume_messages, len(value))
                            consume_oncelog(broker.bootstrap, f"profile-source-{size_name}",
                                            args.consume_messages, Window(broker_cpu, run))
                        runs.append(run)
                finally:
                    for sampler in samplers:
                        if sampler.poll() is None:
                            sampler.send_signal(signal.SIGINT)  # py-spy writes on SIGINT
                    for sampler in samplers:
                        try:
                            sampler.wait(60)
                        except subprocess.TimeoutExpired:
                            sampler.kill()
                            sampler.wait(10)
                profiles[name] = _profile_summary(raw, speedscope, runs)
            topics.delete(f"profile-source-{size_name}")
    finally:
        topics.close()
    return profiles


# Frames of the harness, not of the client: topic set-up and clean-up between runs.
_HARNESS = ("Topics.", "fill ")
_LINE = re.compile(r":\d+\)$")


def _profile_summary(raw: Path, speedscope: Path, runs: list[Run]) -> dict:
    stacks = _read_collapsed(raw)
    kept = [(frames, count) for frames, count in stacks
            if not any(f.startswith(_HARNESS) for f in frames)]
    by_thread: dict[str, list[tuple[list[str], int]]] = {}
    for frames, count in kept:
        # Per function, not per line: py-spy records lines (kept in the files, for speedscope).
        functions = [_LINE.sub(")", f) for f in frames[1:] or frames]
        by_thread.setdefault(_thread_of(frames), []).append((functions, count))
    total = sum(count for _, count in kept)
    threads = Counter({name: sum(c for _, c in s) for name, s in by_thread.items()})
    return {
        "raw": str(raw), "speedscope": str(speedscope), "samples": total,
        "msgs_per_s": median([r.msgs_per_s for r in runs]),
        "client_cpu_us_per_msg": median([r.client_cpu / r.messages * 1e6 for r in runs]),
        "threads": {name: {"share": count / total if total else 0.0,
                           **_hot_spots(by_thread[name], top=12)}
                    for name, count in threads.most_common()},
    }


def report_profile(profiles: dict) -> None:
    for name, prof in profiles.items():
        print()
        print(f"profile {name} (py-spy --threads --nonblocking, {prof['samples']:,} busy "
              f"samples; {prof['msgs_per_s']:,.0f} msgs/s, {prof['client_cpu_us_per_msg']:.1f} "
              f"us CPU/msg while sampled)")
        print(f"  speedscope: {prof['speedscope']}; collapsed stacks: {prof['raw']}")
        for thread, spots in prof["threads"].items():
            print(f"  {thread}: {spots['share']:.0%} of the busy samples")
            for title, key in (("self time", "self"), ("inclusive", "inclusive")):
                print(f"    {title} (share of this thread's samples):")
                for func, share in spots[key]:
                    print(f"      {share:6.1%}  {func}")


# --- main ------------------------------------------------------------------------------------

def _loadavg() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=DEFAULT_MESSAGES,
                        help="records per produce run (default %(default)s)")
    parser.add_argument("--consume-messages", type=int, default=DEFAULT_CONSUME_MESSAGES,
                        help="records per consume run (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help="repetitions; medians are reported (default %(default)s)")
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES),
                        help="value sizes (default: all)")
    parser.add_argument("--clients", nargs="+", choices=PRODUCERS, default=list(PRODUCERS),
                        help="clients to run (default: all; oncelog-aio is produce only)")
    parser.add_argument("--what", nargs="+", choices=("produce", "consume"),
                        default=["produce", "consume"], help="default: both")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra config for oncelog.Producer and AIOProducer, e.g. "
                             "batch.size=65536 (repeatable)")
    parser.add_argument("--batching", choices=("same", "native"), default="same",
                        help="same: linger.ms=5 and 16 KiB batches for every producer; "
                             "native: each client's own defaults (default %(default)s)")
    parser.add_argument("--profile", metavar="DIR", type=Path,
                        help="then profile oncelog.Producer and oncelog.Consumer with py-spy")
    parser.add_argument("--profile-only", action="store_true",
                        help="skip the comparison (needs --profile)")
    parser.add_argument("--profile-seconds", type=float, default=8.0,
                        help="length of each profiled load (default %(default)s)")
    add_quiet_arguments(parser, repeats=False)
    parser.add_argument("--data-dir", type=Path,
                        help="where the broker's temporary log.dirs is made")
    add_json_argument(parser)
    args, _ = parser.parse_known_args(argv)  # run_all.py may pass other modules' options
    if min(args.messages, args.consume_messages, args.repeats) < 1:
        parser.error("--messages, --consume-messages and --repeats must be positive")
    try:
        args.set = dict(item.split("=", 1) for item in args.set)
    except ValueError:
        parser.error("--set takes KEY=VALUE")
    if args.profile_only and not args.profile:
        parser.error("--profile-only needs --profile DIR")
    wait_if_asked(args)
    started = time.monotonic()
    results: dict = {"machine": machine(), "messages": args.messages,
                     "consume_messages": args.consume_messages, "repeats": args.repeats,
                     "batching": ("linger.ms=5, 16 KiB batches for every producer"
                                  if args.batching == "same" else "each client's defaults")
                     + "".join(f"; oncelog {k}={v}" for k, v in args.set.items()),
                     "loadavg_before": _loadavg()}
    meter = LoadMeter()
    with OncelogBroker(base_dir=args.data_dir) as broker:
        print(f"oncelog broker at {broker.bootstrap} (pid {broker.pid}); "
              f"load average {results['loadavg_before']}", flush=True)
        if not args.profile_only:
            results["summary"] = summarize(run_comparison(args, broker))
            results["loadavg_after"] = _loadavg()
        if args.profile:
            results["profile"] = profile(args, broker, args.profile)
        if "Traceback" in broker.log_text():
            print(f"warning: the broker logged a traceback:\n{broker.log_text()}",
                  file=sys.stderr)
    results["other_load"] = meter.others_share()
    if not args.profile_only:
        report(results)
    report_profile(results.get("profile", {}))
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    write_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
