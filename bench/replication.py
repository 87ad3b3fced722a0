"""Replication (issue 23): what replication factor 3 costs, how long a failover takes, and how
long a broker holding many partitions takes to come back.

A ZooKeeper and three brokers on loopback, as ``oncelog scenario failover`` starts them
(``oncelog.cli.scenario_cluster.LocalCluster``, ``zookeeper.session.timeout.ms`` 3000).

* ``throughput``: confluent-kafka writes N records of 1 KiB (idempotent, acks=all,
  librdkafka's default batching; then the same with its plain producer, acks=all) to a
  topic with replication factor 3 and ``min.insync.replicas`` 2, and to a topic with
  replication factor 1 on the same cluster (one broker holds it: no follower fetches), in
  alternating order; the ratio rf3 / rf1 of
  each pair, in one run (issue goal: at least 0.6 on 2 cores).
* ``failover``: a producer writes a record every millisecond (acks=all) to a partition; its
  leader is killed with ``kill -9``; the time from the kill to the first acknowledgement
  after it (the new leader's), against the session timeout (goal: under it + 1 s): once for
  a leader that is not the controller (the controller elects when the dead broker's session
  expires), once for the controller itself (its session expires, another broker becomes
  controller, then elects), each R times (``--repeats``), with the brokers' side from their
  logs (when the new controller and the new leader logged taking over). Then the same with a
  controlled shutdown (SIGTERM) of the leader (goal: under 1 s).
* ``shutdown``: a producer writes a record every millisecond with acks=1 (not idempotent)
  to the partitions one broker leads, and that broker is stopped (SIGTERM): the time from
  the signal to the broker's log line saying its leaderships moved (its wait for the ISRs,
  row L1-L3, then the controller's moves), and the acks=1 latency (librdkafka's, produce to
  acknowledgement) of the records acknowledged before the signal and of those sent after it
  (row K6: answered once the ISR has them, or by the new leader) (reported).
* ``restart``: a topic of P partitions (default 1,000) with replication factor 3 (every
  broker holds P replicas), a record in each; one broker is stopped (SIGTERM) and started
  again: the time until it is registered, until it is back in every ISR, and, after a
  preferred-leader election, until it leads its preferred partitions again (reported).

    .venv/bin/python bench/replication.py [--messages N] [--repeats R] [--partitions P]
                                          [--parts throughput,failover,shutdown,restart]
                                          [--set KEY=VALUE ...] [--data-dir D] [--detail]
    make bench ARGS="--only replication"
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import statistics
import sys
import threading
import time

from _support import LoadMeter, add_parts_argument, cpu_seconds_probe, machine, produce_all

from oncelog.cli.scenario_cluster import SETTINGS, LocalCluster
from oncelog.client.admin.admin import Admin

PARTS = ("throughput", "failover", "shutdown", "restart")
PAYLOAD = random.Random(20261128).randbytes(1024)
SESSION_MS = 3000
TIMEOUT = 120.0


def _wait(condition, what: str, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise RuntimeError(f"not within {timeout:.0f}s: {what}")


def _partitions(bootstrap: str, topic: str):
    try:
        with Admin({"bootstrap.servers": bootstrap}) as admin:
            return admin.metadata([topic]).topics[topic].partitions
    except Exception:  # a broker going away answers nothing: ask again
        return ()


def _create(bootstrap: str, topic: str, partitions: int, rf: int, **configs: str) -> None:
    # a loaded machine sets up 1,000 partitions in more than the default 30 s
    with Admin({"bootstrap.servers": bootstrap,
                "request.timeout.ms": str(int(TIMEOUT * 1000))}) as admin:
        admin.create_topic(topic, partitions, rf, configs=configs or None)
    _wait(lambda: (ps := _partitions(bootstrap, topic)) and len(ps) == partitions and all(
        p.leader >= 0 and len(p.isr) == rf for p in ps), f"{topic} led, ISR full")


def _producer(bootstrap: str, **extra):
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                     **extra})


def _run_queue_wait(pid: int) -> float:
    """Seconds the broker's event-loop thread (its main thread) has waited for a CPU while
    runnable (/proc/PID/task/PID/schedstat's second field)."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


class _Detail:
    """``--detail``: where one run's time went, per 1,000 records (librdkafka's default
    batch of 1 KiB records, ~1 MB): each broker's CPU and its event loop's wait for a CPU,
    this process's CPU (the client: librdkafka's threads and the produce loop), and how many
    produce requests librdkafka had in flight to the leader (its statistics, every 100 ms)."""

    def __init__(self, cluster: LocalCluster, leader: int, stats: list[str]) -> None:
        self.pids = {b: cluster.procs[b].pid for b in cluster.ids}
        self.leader = leader
        self.stats = stats
        self.cpu = {b: cpu_seconds_probe(pid) for b, pid in self.pids.items()}
        self.client = cpu_seconds_probe(os.getpid())
        self.start = self._sample()
        stats.clear()

    def _sample(self):
        return ({b: probe() for b, probe in self.cpu.items()},
                {b: _run_queue_wait(pid) for b, pid in self.pids.items()}, self.client())

    def line(self, rf: int, messages: int, seconds: float) -> str:
        (cpu0, wait0, client0), (cpu1, wait1, client1) = self.start, self._sample()
        per = 1000 / messages * 1000  # ms per 1,000 records

        def broker(b: int) -> str:
            role = "leader" if b == self.leader else "follower"
            return (f"{role} {b} CPU {(cpu1[b] - cpu0[b]) * per:.2f} ms, waited for a CPU "
                    f"{(wait1[b] - wait0[b]) * per:.2f} ms")
        in_flight = [b["waitresp_cnt"] for s in self.stats
                     for b in json.loads(s)["brokers"].values() if b["nodeid"] == self.leader]
        flying = f"{statistics.mean(in_flight):.1f}" if in_flight else "?"
        return (f"  rf{rf} per 1,000 records: {seconds * per:.2f} ms; "
                + "; ".join(broker(b) for b in sorted(self.pids)
                            if rf == 3 or b == self.leader)
                + f"; client CPU {(client1 - client0) * per:.2f} ms; produce requests in "
                  f"flight to the leader {flying} (mean)")


def throughput(cluster: LocalCluster, messages: int, repeats: int, detail: bool = False,
               idempotent: bool = True) -> None:
    """``idempotent``: librdkafka's idempotent producer, which keeps one produce request in
    flight per partition while a batch is out (docs/benchmarks.md), else its plain one
    (acks=all too, its default max.in.flight), which pipelines."""
    bootstrap = ",".join(cluster.bootstrap(b) for b in cluster.ids)
    rates: dict[int, list[float]] = {3: [], 1: []}
    kind = "idempotent" if idempotent else "plain"
    for repeat in range(repeats):
        for rf in (3, 1) if repeat % 2 == 0 else (1, 3):
            topic = f"bench-{kind}-rf{rf}-{repeat}"
            _create(bootstrap, topic, 1, rf, **({"min.insync.replicas": "2"} if rf == 3 else {}))
            stats: list[str] = []
            producer = _producer(bootstrap, **{"enable.idempotence": idempotent},
                                 **({"statistics.interval.ms": 100,
                                     "stats_cb": stats.append} if detail else {}))
            producer.produce(topic, PAYLOAD, partition=0)
            producer.flush(TIMEOUT)
            meter = _Detail(cluster, _partitions(bootstrap, topic)[0].leader, stats) \
                if detail else None
            start = time.perf_counter()
            produce_all(producer, topic, PAYLOAD, messages, time.monotonic() + TIMEOUT)
            assert producer.flush(TIMEOUT) == 0
            took = time.perf_counter() - start
            rates[rf].append(messages / took)
            if meter is not None:
                print(meter.line(rf, messages, took), flush=True)
    ratios = [a / b for a, b in zip(rates[3], rates[1], strict=True)]
    print(f"throughput, {messages:,} x 1 KiB, acks=all, {kind}: rf3 "
          f"{statistics.median(rates[3]):,.0f} "
          f"msgs/s, rf1 {statistics.median(rates[1]):,.0f} msgs/s, ratio rf3/rf1 "
          f"{statistics.median(ratios):.2f} (pairs: {', '.join(f'{r:.2f}' for r in ratios)})",
          flush=True)


def _first_ack_after(cluster: LocalCluster, topic: str, partition: int, fault) -> float:
    """Seconds from ``fault(leader)`` to the first acknowledgement of a record produced
    after it (an answer the old leader sent just before dying does not count)."""
    bootstrap = ",".join(cluster.bootstrap(b) for b in cluster.ids)
    leader = _partitions(bootstrap, topic)[partition].leader
    acked: list[tuple[float, int]] = []  # (when, the record's CreateTime in ms)
    failed: list[str] = []
    producer = _producer(bootstrap, **{"linger.ms": 0, "message.timeout.ms": 60_000})
    stop = threading.Event()

    def report(err, _msg) -> None:
        if err is None:
            acked.append((time.time(), _msg.timestamp()[1]))
        else:
            failed.append(str(err))

    def write() -> None:
        while not stop.is_set():
            producer.produce(topic, PAYLOAD[:100], partition=partition, on_delivery=report)
            producer.poll(0.001)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    _wait(lambda: len(acked) > 100, "the producer going")
    at = time.time()
    fault(leader)
    first = _wait(lambda: next((t for t, created in acked if created >= at * 1000), None),
                  "an ack of a record produced after the fault")
    stop.set()
    writer.join(TIMEOUT)
    producer.flush(TIMEOUT)
    assert not failed, failed[:3]
    return first - at


def _logged_after(cluster: LocalCluster, pattern: str, after: float) -> float | None:
    """The first moment (time.time()) a broker logged a line matching ``pattern`` at or
    after ``after``: the brokers' side of a failover, from their own timestamps."""
    found = []
    for broker in cluster.ids:
        for line in cluster.log_text(broker).splitlines():
            if re.search(pattern, line):
                try:
                    at = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                except ValueError:
                    continue
                if at.timestamp() >= after:
                    found.append(at.timestamp())
    return min(found, default=None)


def failover(cluster: LocalCluster, repeats: int) -> None:
    bootstrap = ",".join(cluster.bootstrap(b) for b in cluster.ids)
    topic = "bench-failover"
    _create(bootstrap, topic, 3, 3, **{"min.insync.replicas": "2"})  # a leader on each
    for case in ("a broker that is not the controller", "the controller") * repeats:
        with Admin({"bootstrap.servers": bootstrap}) as admin:
            controller = admin.describe_cluster().controller_id
        led = {p.leader: p.index for p in _partitions(bootstrap, topic)}
        leader = controller if case == "the controller" else \
            next(b for b in led if b != controller)
        killed: list[float] = []

        def kill(broker: int, killed: list[float] = killed) -> None:
            killed.append(time.time())
            cluster.kill(broker)

        took = _first_ack_after(cluster, topic, led[leader], kill)
        # where the time went: ZooKeeper expiring the session, the (new) controller's
        # election, the new leader acting on it; the rest is the client finding it
        elected = _logged_after(cluster, "is now the controller", killed[0]) \
            if case == "the controller" else None
        leads = _logged_after(cluster, rf"{topic}-{led[leader]}: leader at epoch", killed[0])
        steps = "" if leads is None else (
            (f"new controller +{(elected - killed[0]) * 1000:,.0f} ms, " if elected else "")
            + f"new leader +{(leads - killed[0]) * 1000:,.0f} ms, ")
        print(f"failover, kill -9 of the leader, {case} (broker {leader}): {steps}first ack "
              f"{took * 1000:,.0f} ms after the kill (session timeout {SESSION_MS} ms; goal < "
              f"{SESSION_MS + 1000} ms)", flush=True)
        cluster.start(leader)
        _wait(lambda leader=leader: all(leader in p.isr for p in _partitions(bootstrap, topic)),
              "back in every ISR")
    led = {p.leader: p.index for p in _partitions(bootstrap, topic)}
    leader = next(iter(led))

    def stop_in_the_background(broker: int) -> None:
        threading.Thread(target=cluster.stop, args=(broker,), daemon=True).start()

    took = _first_ack_after(cluster, topic, led[leader], stop_in_the_background)
    print(f"failover, controlled shutdown (SIGTERM) of the leader (broker {leader}): first ack "
          f"{took * 1000:,.0f} ms after the signal (goal < 1000 ms)", flush=True)
    _wait(lambda: cluster.procs[leader].poll() is not None, "the broker stopped")
    cluster.start(leader)
    _wait(lambda: all(leader in p.isr for p in _partitions(bootstrap, topic)), "back in the ISR")


def shutdown(cluster: LocalCluster, repeats: int) -> None:
    bootstrap = ",".join(cluster.bootstrap(b) for b in cluster.ids)
    topic = "bench-shutdown"
    _create(bootstrap, topic, 6, 3)
    for _ in range(repeats):
        _shutdown_once(cluster, bootstrap, topic)


def _shutdown_once(cluster: LocalCluster, bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    with Admin({"bootstrap.servers": bootstrap}) as admin:
        controller = admin.describe_cluster().controller_id

    def ready() -> tuple[int, list[int]] | None:  # (): no answer, not no partition
        found = _partitions(bootstrap, topic)
        if len(found) != 6 or not all(len(p.isr) == 3 for p in found):
            return None
        leaders = sorted({p.leader for p in found} - {controller})
        return (leaders[0], [p.index for p in found if p.leader == leaders[0]]) \
            if leaders else None

    stopping, led = _wait(ready, "every ISR of three, and a leader not the controller")
    acked: list[tuple[float, float]] = []  # (CreateTime in s, latency in s)
    failed: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": 1,
                         "enable.idempotence": False, "linger.ms": 0,
                         "message.timeout.ms": 60_000})

    def report(err, msg) -> None:
        if err is None:
            acked.append((msg.timestamp()[1] / 1000, msg.latency()))
        else:
            failed.append(str(err))

    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            for p in led:
                producer.produce(topic, PAYLOAD[:100], partition=p, on_delivery=report)
            producer.poll(0.001)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    _wait(lambda: len(acked) > 500 or failed, "the producer going")
    assert not failed, failed[:3]
    at = time.time()
    threading.Thread(target=cluster.stop, args=(stopping,), daemon=True).start()
    _wait(lambda: cluster.procs[stopping].poll() is not None, "the broker stopped")
    moved = _logged_after(cluster, f"broker {stopping} leads no partition|leaderships not "
                          "all moved", at)
    _wait(lambda: any(created >= moved + 0.5 for created, _ in acked), "acks after it")
    stop.set()
    writer.join(TIMEOUT)
    producer.flush(TIMEOUT)
    assert not failed, failed[:3]

    def ms(values: list[float], q: float) -> str:
        values = sorted(values)
        return f"{values[min(len(values) - 1, int(q * len(values)))] * 1000:,.1f}"

    before = [lat for created, lat in acked if created < at]
    during = [lat for created, lat in acked if at <= created < moved]
    print(f"controlled shutdown (SIGTERM) of broker {stopping} leading {len(led)} of 6 "
          f"partitions under acks=1: leaderships moved {(moved - at) * 1000:,.0f} ms "
          f"after the signal; acks=1 latency p50/p99/max before it {ms(before, 0.5)}/"
          f"{ms(before, 0.99)}/{ms(before, 1)} ms ({len(before):,} records), sent from "
          f"the signal to the move {ms(during, 0.5) if during else '-'}/"
          f"{ms(during, 0.99) if during else '-'}/{ms(during, 1) if during else '-'} ms "
          f"({len(during):,} records)", flush=True)
    cluster.start(stopping)


def restart(cluster: LocalCluster, partitions: int) -> None:
    bootstrap = ",".join(cluster.bootstrap(b) for b in cluster.ids)
    topic = "bench-many"
    started = time.monotonic()
    _create(bootstrap, topic, partitions, 3)
    print(f"restart: {partitions:,} partitions x 3 replicas created and in sync in "
          f"{time.monotonic() - started:.1f} s", flush=True)
    producer = _producer(bootstrap)
    for p in range(partitions):
        producer.produce(topic, PAYLOAD[:100], partition=p)
        producer.poll(0)
    assert producer.flush(TIMEOUT) == 0
    broker = cluster.ids[-1]
    others = ",".join(cluster.bootstrap(b) for b in cluster.ids if b != broker)
    preferred = {p.index for p in _partitions(bootstrap, topic) if p.replicas[0] == broker}
    at = time.monotonic()
    cluster.stop(broker)
    print(f"restart: controlled shutdown of broker {broker} ({len(preferred)} of its "
          f"{partitions:,} replicas led) {time.monotonic() - at:.1f} s", flush=True)
    at = time.monotonic()
    cluster.start(broker)
    up = time.monotonic() - at
    slow = {"bootstrap.servers": others, "request.timeout.ms": str(int(TIMEOUT * 1000))}
    with Admin(slow) as admin:
        _wait(lambda: broker in admin.metadata([topic]).brokers, "registered")
        registered = time.monotonic() - at
        _wait(lambda: all(broker in p.isr for p in admin.metadata([topic]).topics[topic]
                          .partitions), "back in every ISR")
        print(f"restart: after the start, listening {up:.1f} s, registered "
              f"{registered:.1f} s, back in every ISR {time.monotonic() - at:.1f} s",
              flush=True)
        at = time.monotonic()
        admin.elect_leaders([(topic, p) for p in sorted(preferred)])
        answered = time.monotonic() - at
        _wait(lambda: all(p.leader == broker for p in admin.metadata([topic]).topics[topic]
                          .partitions if p.index in preferred), "leading its partitions again")
        print(f"restart: preferred-leader election of its {len(preferred)} partitions "
              f"answered in {answered:.1f} s, all leaders back {time.monotonic() - at:.1f} s",
              flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a broker setting more (repeatable)")
    parser.add_argument("--data-dir", help="kept afterwards, with the brokers' logs")
    parser.add_argument("--detail", action="store_true",
                        help="throughput: each run's CPU and waits per 1,000 records")
    add_parts_argument(parser, PARTS)
    args = parser.parse_args()
    parts = args.parts.split(",")
    print(machine(), flush=True)
    settings = [s for s in SETTINGS if not s.startswith("zookeeper.session.timeout.ms")]
    settings += args.set
    meter = LoadMeter()
    with LocalCluster(args.data_dir, 3, [*settings, f"zookeeper.session.timeout.ms={SESSION_MS}"]) \
            as cluster:
        if "throughput" in parts:
            for idempotent in (True, False):
                throughput(cluster, args.messages, args.repeats, args.detail, idempotent)
        if "failover" in parts:
            failover(cluster, args.repeats)
        if "shutdown" in parts:
            shutdown(cluster, args.repeats)
        if "restart" in parts:
            restart(cluster, args.partitions)
    print(f"other processes used {meter.others_share():.0%} of the CPUs meanwhile",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
