"""Produce and consume throughput of oncelog against librdkafka's mock cluster, in one run.

Both are driven by the same confluent-kafka client with the same settings, 1 KiB values,
``acks=all``, one partition (partition 0 of an auto-created topic):

* produce, librdkafka's default batching (``linger.ms=5``, ``batch.size`` 1 MB);
* produce, 16 KiB batches (``batch.size=16384``);
* consume with ``assign()`` from offset 0, no consumer group offsets committed;
* produce latency against oncelog (delivery report time minus ``produce()`` time) with a
  producer paced at half of oncelog's measured default-batching peak; the mock is measured at
  the same absolute rate for reference.

Each throughput measurement is repeated (``--repeats``) and the median reported; oncelog and
the mock take turns within each repetition, in alternating order, so that drift of the machine
hits both alike, and the median of those back-to-back pairs' ratios is printed next to the
ratio of the medians. oncelog's broker CPU (from /proc) is reported for each run: near 100%
means the broker is the bottleneck. The CPU other processes used during each run is measured
too; runs above ``--max-other-load`` are left out of the medians (see docs/benchmarks.md).

The mock cluster keeps only the last 5 MiB of each partition in memory, so the consume
benchmark reads a topic of ``--consume-pass`` messages (about 4 MiB) again and again, seeking
back to offset 0 after each pass, until ``--consume-messages`` (default 4 x ``--messages``)
messages have been read; the same against both.

With ``--profile DIR`` the broker is then sampled with py-spy (``record --nonblocking``) under
each produce load, and the hot spots are printed (flame graphs in DIR).

    .venv/bin/python bench/produce_consume.py [--messages N] [--repeats R] [--profile DIR]
    make bench ARGS="--only produce_consume --messages 100000 --profile /tmp/oncelog-profile"
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from _support import (
    REPO,
    LoadMeter,
    MockCluster,
    OncelogBroker,
    add_json_argument,
    add_quiet_arguments,
    filesystem_of,
    machine,
    median,
    other_load,
    percentile,
    wait_if_asked,
    write_json,
)

VALUE_SIZE = 1024
# Fixed payload from a fixed seed: incompressible and identical on every run.
PAYLOAD = random.Random(20240917).randbytes(VALUE_SIZE)
DEFAULT_MESSAGES = 200_000
DEFAULT_REPEATS = 9
LATENCY_SAMPLE = 8  # every 8th message of the paced run is timed
PROFILE_RATE = 250  # py-spy samples per second
# The harness's own requests between profiled runs: a new topic per run (auto-created by
# Metadata) and its deletion afterwards.
EXCLUDED_FRAMES = ("handle_delete_topics ", "handle_metadata ")
CONSUME_PASS = 4_000  # 4000 x ~1.1 KB stays under the mock's 5 MiB per-partition log
RUN_TIMEOUT = 180.0
PRODUCE_CONF = {"acks": "all"}  # everything else is librdkafka's default
SCENARIOS = {
    "default": {},  # librdkafka 2.x: linger.ms=5, batch.size=1000000, batch.num.messages=10000
    "16KiB": {"batch.size": 16384},
}


@dataclass
class Throughput:
    messages: int
    seconds: float
    broker_cpu: float | None = None  # CPU seconds the oncelog broker used meanwhile
    others: float = 0.0  # share of all CPUs that other processes used meanwhile
    # CPU seconds of this process meanwhile: the client's threads (and, against the mock,
    # the mock cluster's own, which runs inside the client)
    client_cpu: float | None = None

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.messages * VALUE_SIZE / self.seconds / 1e6


class BenchError(RuntimeError):
    pass


Probe = Callable[[], float] | None


def cpu_probe(pid: int) -> Callable[[], float]:
    """CPU seconds (user + system) process ``pid`` has used so far, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    path = f"/proc/{pid}/stat"

    def probe() -> float:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    return probe


def _client_logger():
    """A logger for the clients: librdkafka's notices go to stderr, not mixed in the tables."""
    import logging

    logger = logging.getLogger("oncelog.bench.client")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("client: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        logger.propagate = False
    return logger


def _producer(bootstrap: str, extra: dict):
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, **PRODUCE_CONF, **extra,
                     "logger": _client_logger()})


def _warm_up(producer, topic: str, deadline: float) -> None:
    """One message: creates the topic, connects, learns metadata. Not timed."""
    producer.produce(topic, PAYLOAD, partition=0)
    _flush(producer, deadline)


def _flush(producer, deadline: float) -> None:
    while len(producer) > 0:
        if time.monotonic() > deadline:
            raise BenchError(f"{len(producer)} messages still undelivered at the deadline")
        producer.flush(min(1.0, max(0.01, deadline - time.monotonic())))


def produce_throughput(bootstrap: str, topic: str, n: int, extra: dict,
                       probe: Probe = None) -> Throughput:
    errors: list[str] = []

    def on_error(err, msg) -> None:
        if err is not None:
            errors.append(str(err))

    producer = _producer(bootstrap, {**extra, "delivery.report.only.error": True,
                                     "on_delivery": on_error})
    deadline = time.monotonic() + RUN_TIMEOUT
    _warm_up(producer, topic, deadline)
    produce, poll = producer.produce, producer.poll
    cpu = probe() if probe else None
    client = time.process_time()
    start = time.perf_counter()
    for i in range(n):
        while True:
            try:
                produce(topic, PAYLOAD, partition=0)
                break
            except BufferError:  # the local queue is full: wait for deliveries
                poll(0.001)
                if time.monotonic() > deadline:
                    raise BenchError("producer queue stayed full until the deadline") from None
        if i % 10_000 == 0:
            poll(0)
    _flush(producer, deadline)
    seconds = time.perf_counter() - start
    cpu = probe() - cpu if probe else None
    client = time.process_time() - client
    poll(0)
    if errors:
        raise BenchError(f"{len(errors)} deliveries failed, first: {errors[0]}")
    _check_delivered(bootstrap, topic, n + 1)
    return Throughput(n, seconds, cpu, client_cpu=client)


def fill_topic(bootstrap: str, topic: str, n: int) -> None:
    """The consume benchmark's source: exactly ``n`` messages at offsets 0..n-1."""
    errors: list[str] = []

    def on_error(err, msg) -> None:
        if err is not None:
            errors.append(str(err))

    producer = _producer(bootstrap, {"delivery.report.only.error": True, "on_delivery": on_error})
    deadline = time.monotonic() + RUN_TIMEOUT
    for _ in range(n):
        producer.produce(topic, PAYLOAD, partition=0)
    _flush(producer, deadline)
    producer.poll(0)
    if errors:
        raise BenchError(f"filling {topic}: {len(errors)} deliveries failed: {errors[0]}")


def consume_throughput(bootstrap: str, topic: str, per_pass: int, n: int,
                       probe: Probe = None) -> Throughput:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "oncelog-bench",  # required by the client; nothing is committed
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "fetch.wait.max.ms": 1,  # each pass reaches the end of the log: do not long-poll there
        "logger": _client_logger(),
    })
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        if (low, high) != (0, per_pass):
            raise BenchError(f"{topic} holds offsets {low}..{high}, expected 0..{per_pass}")
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + RUN_TIMEOUT
        passes = max(1, math.ceil(n / per_pass))
        _read_pass(consumer, topic, per_pass, deadline)  # warm-up: connections, first fetch
        cpu = probe() if probe else None
        client = time.process_time()
        start = time.perf_counter()
        nbytes = 0
        for _ in range(passes):
            nbytes += _read_pass(consumer, topic, per_pass, deadline)
        seconds = time.perf_counter() - start
        cpu = probe() - cpu if probe else None
        client = time.process_time() - client
    finally:
        consumer.close()
    if nbytes != passes * per_pass * VALUE_SIZE:
        raise BenchError(f"read {nbytes} value bytes, expected {passes * per_pass * VALUE_SIZE}")
    return Throughput(passes * per_pass, seconds, cpu, client_cpu=client)


def _read_pass(consumer, topic: str, per_pass: int, deadline: float) -> int:
    """Read offsets 0..per_pass-1 in order, then seek back to 0; returns the value bytes."""
    from confluent_kafka import TopicPartition

    expected = 0
    nbytes = 0
    while expected < per_pass:
        if time.monotonic() > deadline:
            raise BenchError(f"consumer stuck at offset {expected} of {topic}")
        # consume() returns when it has num_messages or at the timeout: never ask for more
        # than the pass still holds.
        for msg in consumer.consume(num_messages=min(1000, per_pass - expected), timeout=0.5):
            if msg.error() is not None:
                raise BenchError(f"consume {topic}: {msg.error()}")
            if msg.offset() != expected:
                continue  # prefetched before the seek; librdkafka should drop these anyway
            nbytes += len(msg.value())
            expected += 1
    consumer.seek(TopicPartition(topic, 0, 0))
    return nbytes


def paced_latency(bootstrap: str, topic: str, rate: float, n: int) -> dict:
    """Produce ``n`` messages at ``rate``/s; delivery-report time minus produce() time.

    Every LATENCY_SAMPLE-th message carries a delivery callback (the others none), so that the
    load generator's own Python work does not hold the rate back; the topic's high watermark
    is checked afterwards to prove that all of them were delivered.
    """
    latencies: list[float] = []
    errors: list[str] = []

    def on_delivery(sent_at: float, err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            latencies.append(time.perf_counter() - sent_at)

    producer = _producer(bootstrap, {})
    deadline = time.monotonic() + RUN_TIMEOUT
    _warm_up(producer, topic, deadline)
    produce, poll, clock, partial = producer.produce, producer.poll, time.perf_counter, \
        functools.partial
    start = clock()
    sent = 0
    while sent < n:
        due = min(n, int((clock() - start) * rate) + 1)
        try:
            while sent < due:
                if sent % LATENCY_SAMPLE == 0:
                    produce(topic, PAYLOAD, partition=0, on_delivery=partial(on_delivery, clock()))
                else:
                    produce(topic, PAYLOAD, partition=0)
                sent += 1
        except BufferError:  # the rate is more than the broker takes: wait for deliveries
            poll(0.001)
        if time.monotonic() > deadline:
            raise BenchError("paced producer did not finish before the deadline")
        wait = start + sent / rate - clock()
        poll(min(max(wait, 0.001), 0.1) if wait > 0 else 0)
    sending = clock() - start
    _flush(producer, deadline)
    poll(0)
    if errors:
        raise BenchError(f"{len(errors)} deliveries failed, first: {errors[0]}")
    _check_delivered(bootstrap, topic, n + 1)
    latencies.sort()
    return {"rate": rate, "achieved_rate": n / sending, "messages": n,
            "samples": len(latencies),
            "p50_ms": percentile(latencies, 0.50) * 1e3,
            "p99_ms": percentile(latencies, 0.99) * 1e3,
            "max_ms": latencies[-1] * 1e3}


def _check_delivered(bootstrap: str, topic: str, expected: int) -> None:
    """The partition's high watermark must be exactly the number of messages produced."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "oncelog-bench",
                         "logger": _client_logger()})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    if high != expected:
        raise BenchError(f"{topic} has a high watermark of {high}, expected {expected}")


def _delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Free oncelog's disk between repetitions (the mock trims its logs by itself)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": _client_logger()})
    for topic, future in admin.delete_topics(topics, operation_timeout=10).items():
        try:
            future.result(timeout=15)
        except Exception as exc:
            print(f"warning: deleting {topic}: {exc}", file=sys.stderr)


# --- profiling ---------------------------------------------------------------------------


def _py_spy() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


def profile_broker(args, out_dir: Path) -> dict:
    """Sample the broker with py-spy while it takes each produce load, one broker per load.

    py-spy runs with ``--nonblocking`` (it never stops the broker) and without ``--idle``, so
    the shares below are shares of the broker's busy time. The broker is warmed up before
    py-spy attaches, so one-time imports and schema loading are not in the profile.
    """
    py_spy = _py_spy()
    if py_spy is None:
        raise BenchError("py-spy is not installed: .venv/bin/pip install py-spy")
    out_dir.mkdir(parents=True, exist_ok=True)
    profiles = {}
    for scenario, extra in SCENARIOS.items():
        raw = out_dir / f"profile-{scenario}.txt"
        svg = out_dir / f"profile-{scenario}.svg"
        with OncelogBroker(src=args.src, base_dir=args.data_dir) as broker:
            produce_throughput(broker.bootstrap, "warm-up", max(1000, args.messages // 4), extra)
            probe = cpu_probe(broker.pid)
            samplers = [
                subprocess.Popen([py_spy, "record", "--pid", str(broker.pid), "--nonblocking",
                                  "--rate", str(PROFILE_RATE), "--nolineno", "--format", fmt,
                                  "--output", str(path)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                for fmt, path in (("raw", raw), ("flamegraph", svg))
            ]
            try:
                time.sleep(1.0)  # let py-spy attach
                for sampler in samplers:
                    if sampler.poll() is not None:
                        raise BenchError(f"py-spy failed: {sampler.stderr.read().decode()}")
                runs = []
                load = LoadMeter(functools.partial(
                    _cpu_sum, [probe] + [cpu_probe(sampler.pid) for sampler in samplers]))
                cpu = probe()
                start = time.perf_counter()
                while not runs or time.perf_counter() - start < args.profile_seconds:
                    # As in the comparison, each run's topic is deleted after it so that dirty
                    # pages do not pile up; the deletion's samples are left out below.
                    runs.append(produce_throughput(broker.bootstrap, f"profile-{len(runs)}",
                                                   args.messages, extra))
                    _delete_topics(broker.bootstrap, [f"profile-{len(runs) - 1}"])
                loaded = time.perf_counter() - start
                cpu = probe() - cpu
                others = load.others_share()
            finally:
                for sampler in samplers:
                    if sampler.poll() is None:
                        sampler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
                for sampler in samplers:
                    try:
                        sampler.wait(60)
                    except subprocess.TimeoutExpired:
                        sampler.kill()
                        sampler.wait(10)
        stacks = _read_collapsed(raw)
        produce_stacks = [(frames, count) for frames, count in stacks
                          if not any(f.startswith(EXCLUDED_FRAMES) for f in frames)]
        total = sum(count for _, count in stacks)
        profiles[scenario] = {
            "raw": str(raw), "svg": str(svg), "seconds_under_load": loaded,
            "broker_cpu_share": cpu / loaded, "sample_rate": PROFILE_RATE, "others": others,
            "throughput_msgs_per_s": median([r.msgs_per_s for r in runs]),
            "excluded_share": 1 - sum(c for _, c in produce_stacks) / total if total else 0.0,
            **_hot_spots(produce_stacks),
        }
    return profiles


def _cpu_sum(probes: list[Callable[[], float]]) -> float:
    return sum(probe() for probe in probes)


def _read_collapsed(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def _short(frame: str) -> str:
    """'func (/long/path/site-packages/pkg/mod.py)' -> 'func (pkg/mod.py)'."""
    func, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for marker in ("site-packages/", "/src/", "/lib/python3"):
        if marker in where:
            where = where.split(marker, 1)[1]
            if marker == "/lib/python3":
                where = "stdlib " + where.split("/", 1)[-1]
            break
    return f"{func} ({where})" if where else func


def _scaffolding(stacks: list[tuple[list[str], int]]) -> set[str]:
    """The frames every busy sample runs under (interpreter entry, CLI, the event loop).

    Walks down from the root while one frame holds at least 95% of the samples of its
    parent. Stacks that do not start at the common root (``--nonblocking`` can tear a
    stack) are ignored here.
    """
    roots: Counter[str] = Counter()
    for frames, count in stacks:
        roots[frames[0]] += count
    if not roots:
        return set()
    root = roots.most_common(1)[0][0]
    whole = [(frames, count) for frames, count in stacks if frames[0] == root]
    chain: set[str] = set()
    depth = 0
    while True:
        at_depth: Counter[str] = Counter()
        for frames, count in whole:
            if len(frames) > depth:
                at_depth[frames[depth]] += count
        if not at_depth:
            return chain
        name, count = at_depth.most_common(1)[0]
        if count < 0.95 * sum(c for _, c in whole):  # self time of the parent counts too
            return chain
        chain.add(name)
        whole = [(frames, c) for frames, c in whole if len(frames) > depth
                 and frames[depth] == name]
        depth += 1


def _hot_spots(stacks: list[tuple[list[str], int]], top: int = 15) -> dict:
    total = sum(count for _, count in stacks)
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    files: Counter[str] = Counter()
    for frames, count in stacks:
        names = [_short(f) for f in frames]
        own[names[-1]] += count
        files[names[-1].partition(" (")[2].rstrip(")") or names[-1]] += count
        for name in set(names):
            inclusive[name] += count
    share = (lambda c: c / total) if total else (lambda c: 0.0)
    scaffolding = _scaffolding([([_short(f) for f in frames], count) for frames, count in stacks])
    return {
        "samples": total,
        "self": [(name, share(c)) for name, c in own.most_common(top)],
        "inclusive": [(name, share(c)) for name, c in inclusive.most_common()
                      if name not in scaffolding][:top],
        "self_by_file": [(name, share(c)) for name, c in files.most_common(top)],
    }


# --- the run -------------------------------------------------------------------------------


def run(args) -> dict:
    results: dict = {"machine": machine(), "messages": args.messages,
                     "max_other_load": args.max_other_load,
                     "consume_messages": args.consume_messages, "repeats": args.repeats,
                     "value_bytes": VALUE_SIZE, "produce": {}, "consume": {}}
    results["other_load_before"] = other_load()
    meter = LoadMeter()
    with OncelogBroker(src=args.src, base_dir=args.data_dir) as oncelog, MockCluster() as mock:
        results["source"] = source_description(oncelog)
        results["log_dirs"] = f"{oncelog.data_dir} ({filesystem_of(oncelog.data_dir.parent)})"
        targets = {"oncelog": oncelog.bootstrap, "mock": mock.bootstrap}
        broker_cpu = cpu_probe(oncelog.pid)
        probes = {"oncelog": broker_cpu, "mock": None}

        def measured(run, *run_args) -> Throughput:
            load = LoadMeter(broker_cpu)
            result = run(*run_args)
            result.others = load.others_share()
            return result
        print(f"oncelog at {oncelog.bootstrap} (pid {oncelog.pid}), "
              f"mock cluster at {mock.bootstrap}", flush=True)

        for scenario, extra in SCENARIOS.items():
            for name, bootstrap in targets.items():  # untimed warm-up round
                produce_throughput(bootstrap, f"warm-up-{scenario}", max(1000, args.messages // 4),
                                   extra)
                if name == "oncelog":
                    _delete_topics(bootstrap, [f"warm-up-{scenario}"])
            runs: dict[str, list[Throughput]] = {name: [] for name in targets}
            for rep in range(args.repeats):
                for name, bootstrap in _order(targets, rep):
                    topic = f"produce-{scenario}-{rep}"
                    result = measured(produce_throughput, bootstrap, topic, args.messages, extra,
                                      probes[name])
                    runs[name].append(result)
                    _progress(f"produce {scenario}", name, rep, result)
                    if name == "oncelog":
                        _delete_topics(bootstrap, [topic])
            results["produce"][scenario] = _summary(runs, args.max_other_load)

        runs = {name: [] for name in targets}
        for bootstrap in targets.values():
            fill_topic(bootstrap, "consume-source", args.consume_pass)
        for rep in range(args.repeats):
            for name, bootstrap in _order(targets, rep):
                result = measured(consume_throughput, bootstrap, "consume-source",
                                  args.consume_pass, args.consume_messages, probes[name])
                runs[name].append(result)
                _progress("consume", name, rep, result)
        results["consume"] = _summary(runs, args.max_other_load)

        peak = results["produce"]["default"]["oncelog"]["msgs_per_s"]
        rate = peak / 2
        count = max(1000, min(args.messages, int(rate * args.latency_seconds)))
        results["latency"] = {}
        for name, bootstrap in targets.items():
            load = LoadMeter(broker_cpu)
            results["latency"][name] = lat = paced_latency(bootstrap, f"latency-{name}", rate,
                                                           count)
            lat["others"] = load.others_share()
            print(f"  latency at {rate:,.0f} msgs/s {name:7}: p50 {lat['p50_ms']:.2f} ms "
                  f"p99 {lat['p99_ms']:.2f} ms", flush=True)
        if "Traceback" in oncelog.log_text():
            print(f"warning: the oncelog broker logged a traceback:\n{oncelog.log_text()}",
                  file=sys.stderr)

    results["other_load"] = meter.others_share()  # the broker is reaped: its CPU is counted
    if args.profile:
        results["profile"] = profile_broker(args, Path(args.profile))
    return results


def source_description(broker: OncelogBroker) -> str:
    """Which oncelog was measured: its package directory and, for the repo, the git commit."""
    where = broker.package_dir()
    if Path(where).resolve().parent != (REPO / "src").resolve():
        return where
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return where
    return f"{where} at git {head or '?'}" + (" + uncommitted changes in src/" if dirty else "")


def _order(targets: dict[str, str], rep: int) -> list[tuple[str, str]]:
    """oncelog first in even repetitions, the mock first in odd ones: drift hits both."""
    items = list(targets.items())
    return items if rep % 2 == 0 else items[::-1]


def _progress(what: str, name: str, rep: int, result: Throughput) -> None:
    cpu = ""
    if result.broker_cpu is not None:
        cpu = f"  broker CPU {result.broker_cpu / result.seconds:4.0%}"
    if result.client_cpu is not None:
        cpu += f"  client{'' if result.broker_cpu is not None else '+mock'} CPU " \
               f"{result.client_cpu / result.seconds:4.0%}"
    print(f"  {what:15} {name:7} #{rep + 1}: {result.msgs_per_s:10,.0f} msgs/s "
          f"{result.mb_per_s:7.1f} MB/s{cpu}  (others {result.others:.0%})", flush=True)


def _summary(runs: dict[str, list[Throughput]], max_other_load: float) -> dict:
    """Medians per target, over the runs during which other processes stayed under
    ``max_other_load`` of the CPUs when there are at least 3 such pairs, else over all."""
    pairs = list(zip(runs["oncelog"], runs["mock"], strict=True))
    quiet = [(a, b) for a, b in pairs if max(a.others, b.others) <= max_other_load]
    used = quiet if len(quiet) >= 3 else pairs
    out: dict = {"pairs_used": len(used), "pairs": len(pairs), "only_quiet": used is quiet}
    for i, name in enumerate(("oncelog", "mock")):
        results = [pair[i] for pair in used]
        rates = [r.msgs_per_s for r in results]
        out[name] = {"msgs_per_s": median(rates),
                     "mb_per_s": median([r.mb_per_s for r in results]),
                     "min_msgs_per_s": min(rates), "max_msgs_per_s": max(rates),
                     "runs": [asdict(r) for r in runs[name]]}
        cpu = [r.broker_cpu / r.seconds for r in results if r.broker_cpu is not None]
        if cpu:
            out[name]["broker_cpu_share"] = median(cpu)
            out[name]["broker_cpu_us_per_msg"] = median(
                [r.broker_cpu / r.messages * 1e6 for r in results])
        client = [r.client_cpu / r.seconds for r in results if r.client_cpu is not None]
        if client:  # a share of one CPU; against the mock, the mock's own threads included
            out[name]["client_cpu_share"] = median(client)
    out["ratio"] = out["oncelog"]["msgs_per_s"] / out["mock"]["msgs_per_s"]
    # oncelog and the mock run back to back in each repetition: the median of the per-pair
    # ratios is less sensitive to slow drift of the machine than the ratio of the medians.
    out["paired_ratio"] = median([a.msgs_per_s / b.msgs_per_s for a, b in used])
    return out


TARGETS = {"produce, default batching": 0.8, "produce, 16 KiB batches": 0.5,
           "consume, assign() from 0": 0.8}


def _rows(results: dict) -> list[tuple[str, dict, float]]:
    labels = list(TARGETS)
    summaries = [results["produce"]["default"], results["produce"]["16KiB"], results["consume"]]
    return [(label, summary, TARGETS[label]) for label, summary in zip(labels, summaries,
                                                                      strict=True)]


def _report_comparison(results: dict) -> None:
    print()
    print(f"produce_consume: {results['value_bytes']} B values, acks=all, 1 partition; "
          f"{results['messages']:,} messages per produce run, "
          f"{results['consume_messages']:,} per consume run; median of {results['repeats']}")
    print(f"machine: {results['machine']}")
    print(f"oncelog: {results['source']}; log.dirs {results['log_dirs']}")
    others = results["other_load"]
    print(f"other processes used {others:.0%} of the CPUs during the run "
          f"({results['other_load_before']:.0%} just before)")
    summaries = [summary for _, summary, _ in _rows(results)]
    if all(s["only_quiet"] for s in summaries):
        print(f"medians over the runs during which other processes used at most "
              f"{results['max_other_load']:.0%} of the CPUs: "
              + ", ".join(f"{s['pairs_used']} of {s['pairs']}" for s in summaries))
    else:
        print(f"WARNING: fewer than 3 quiet pairs (other processes at most "
              f"{results['max_other_load']:.0%} of the CPUs) in some benchmark: the medians "
              f"include runs on a busy machine and are not trustworthy")
    header = (f"{'benchmark':26} {'oncelog msgs/s':>14} {'MB/s':>6} {'mock msgs/s':>12} "
              f"{'MB/s':>6} {'ratio':>6} {'paired':>6}  target")
    print(header)
    print("-" * len(header))
    for label, summary, target in _rows(results):
        on, mock = summary["oncelog"], summary["mock"]
        verdict = "ok" if summary["ratio"] >= target else "MISS"
        print(f"{label:26} {on['msgs_per_s']:14,.0f} {on['mb_per_s']:6.0f} "
              f"{mock['msgs_per_s']:12,.0f} {mock['mb_per_s']:6.0f} {summary['ratio']:6.2f} "
              f"{summary['paired_ratio']:6.2f}  >= {target} {verdict}")
    print()
    print(f"{'spread (min..max msgs/s)':26} {'oncelog':>19} {'mock':>19}   oncelog broker CPU")
    for label, summary, _ in _rows(results):
        on, mock = summary["oncelog"], summary["mock"]
        print(f"{label:26} {on['min_msgs_per_s']:9,.0f}..{on['max_msgs_per_s']:<9,.0f} "
              f"{mock['min_msgs_per_s']:9,.0f}..{mock['max_msgs_per_s']:<9,.0f} "
              f"{on['broker_cpu_share']:5.0%} busy, {on['broker_cpu_us_per_msg']:.1f} us/msg"
              + _idle(on))
    print()
    for name, lat in results["latency"].items():
        print(f"produce latency, {name:7} paced at {lat['rate']:,.0f} msgs/s "
              f"(half of oncelog's default-batching peak; achieved {lat['achieved_rate']:,.0f}): "
              f"p50 {lat['p50_ms']:.2f} ms  p99 {lat['p99_ms']:.2f} ms  "
              f"max {lat['max_ms']:.2f} ms  ({lat['samples']:,} of {lat['messages']:,} "
              f"messages timed; others {lat['others']:.0%})")


def _idle(on: dict) -> str:
    """What a second broker process could use at most (issue 26, "both cores"): the share
    of the machine's CPUs neither the broker nor the client used during oncelog's runs."""
    if "client_cpu_share" not in on:
        return ""
    used = on["broker_cpu_share"] + on["client_cpu_share"]
    cpus = os.cpu_count() or 1
    return (f"; client {on['client_cpu_share']:.0%}; of {cpus} CPUs "
            f"{max(0.0, 1 - used / cpus):.0%} left idle")


def report(results: dict) -> None:
    if "produce" in results:
        _report_comparison(results)
    else:
        print(f"\nmachine: {results['machine']}\noncelog: {results['source']}")
    for scenario, prof in results.get("profile", {}).items():
        print()
        print(f"broker profile, produce with {scenario} batching (py-spy --nonblocking, "
              f"{prof['samples']:,} busy samples over {prof['seconds_under_load']:.1f} s; broker "
              f"CPU {prof['broker_cpu_share']:.0%}; {prof['throughput_msgs_per_s']:,.0f} msgs/s "
              f"while sampled; other processes {prof['others']:.0%} of the CPUs)")
        print(f"  flame graph: {prof['svg']}; collapsed stacks: {prof['raw']}; "
              f"{prof['excluded_share']:.1%} of the samples (Metadata creating and DeleteTopics "
              f"deleting each run's topic) are left out below")
        for title, key in (("self time (leaf Python frame; C calls count for their caller)",
                            "self"),
                           ("inclusive time", "inclusive"),
                           ("self time by file", "self_by_file")):
            print(f"  {title}:")
            for name, share in prof[key]:
                print(f"    {share:6.1%}  {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=DEFAULT_MESSAGES,
                        help="messages per measurement (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help="repetitions per measurement; the median is reported")
    parser.add_argument("--consume-pass", type=int, default=CONSUME_PASS,
                        help="size of the topic the consume benchmark re-reads")
    parser.add_argument("--consume-messages", type=int,
                        help="messages read per consume measurement (default 4 x --messages)")
    parser.add_argument("--latency-seconds", type=float, default=5.0,
                        help="length of the paced latency run (at most --messages messages)")
    parser.add_argument("--profile", metavar="DIR",
                        help="also sample the broker with py-spy under each produce load; "
                             "writes DIR/profile-*.svg and DIR/profile-*.txt")
    parser.add_argument("--profile-seconds", type=float, default=10.0,
                        help="length of each profiled load (default %(default)s)")
    parser.add_argument("--profile-only", action="store_true",
                        help="skip the comparison, only profile (needs --profile)")
    add_quiet_arguments(parser)
    parser.add_argument("--data-dir", type=Path,
                        help="where the broker's temporary log.dirs is made (default: the "
                             "system temp dir); e.g. /dev/shm to take the disk out")
    parser.add_argument("--src", type=Path,
                        help="run the broker from this source tree (default: the repo's src/), "
                             "e.g. a `git archive` snapshot of another commit")
    add_json_argument(parser)
    args, _ = parser.parse_known_args(argv)  # run_all.py may pass other modules' options
    if args.messages < 1 or args.repeats < 1 or args.consume_pass < 1:
        parser.error("--messages, --repeats and --consume-pass must be positive")
    if args.consume_pass * (VALUE_SIZE + 100) > 5 * 1024 * 1024:
        parser.error("--consume-pass must fit the mock's 5 MiB partition log")
    if args.consume_messages is None:
        args.consume_messages = 4 * args.messages
    if args.profile_only and not args.profile:
        parser.error("--profile-only needs --profile DIR")
    wait_if_asked(args)
    started = time.monotonic()
    if args.profile_only:
        with OncelogBroker(src=args.src, base_dir=args.data_dir) as broker:
            source = source_description(broker)
        results = {"machine": machine(), "source": source, "messages": args.messages,
                   "profile": profile_broker(args, Path(args.profile))}
    else:
        results = run(args)
    report(results)
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    write_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
