"""The broker's CPU per MiB a consumer reads, for two source trees in one run (issue 26).

Throughput ratios swing with whatever else the machine runs; the CPU time the broker spends
per byte it serves does not (much). Each tree's broker gets the same topic (``--mib`` MiB of
1 KiB values in one partition, written once), then confluent-kafka reads it from offset 0 to
the end ``--reads`` times (``assign()``, librdkafka's default fetch sizes); the broker's
on-CPU time over the reads (its threads' schedstat) divided by the MiB read is the figure.
The trees take turns, in alternating order, ``--repeats`` times; medians are printed.

    .venv/bin/python bench/fetch_cpu.py [--src /tmp/zc-base/src] [--mib 64 --reads 3 --repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _support import REPO, OncelogBroker, cpu_seconds_probe, median
from confluent_kafka import Consumer, Producer, TopicPartition

VALUE = 1024
TIMEOUT = 120.0


def _fill(bootstrap: str, mib: int) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    count = mib * (1 << 20) // VALUE
    for i in range(count):
        while True:
            try:
                producer.produce("fetch-cpu", b"%-1024d" % i, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(TIMEOUT) == 0
    return count


def _read_all(bootstrap: str, count: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fetch-cpu",
                         "enable.auto.commit": False, "fetch.queue.backoff.ms": 10})
    consumer.assign([TopicPartition("fetch-cpu", 0, 0)])
    seen = 0
    deadline = time.monotonic() + TIMEOUT
    try:
        while seen < count:
            assert time.monotonic() < deadline, f"read {seen} of {count}"
            seen += sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
    finally:
        consumer.close()


def measure(src: Path, mib: int, reads: int) -> tuple[float, float]:
    """(broker CPU ms per MiB read, MiB/s) for the tree at ``src``."""
    with OncelogBroker(src=src) as broker:
        count = _fill(broker.bootstrap, mib)
        _read_all(broker.bootstrap, count)  # warm: page cache, connections, imports
        cpu = cpu_seconds_probe(broker.pid)
        before, start = cpu(), time.monotonic()
        for _ in range(reads):
            _read_all(broker.bootstrap, count)
        spent, wall = cpu() - before, time.monotonic() - start
    read = mib * reads
    return 1000 * spent / read, read / wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, help="another tree's src/ to compare with")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--reads", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args, _ = parser.parse_known_args(argv)  # run_all.py may pass other modules' options
    trees = {"this": REPO / "src"}
    if args.src is not None:
        trees["other"] = args.src
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for r in range(args.repeats):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for name in order:
            found[name].append(measure(trees[name], args.mib, args.reads))
            cpu, rate = found[name][-1]
            print(f"  {name:5} #{r + 1}: broker {cpu:6.2f} ms CPU per MiB, {rate:6.1f} MiB/s",
                  flush=True)
    print(f"\n{args.mib} MiB x {args.reads} reads, median of {args.repeats}:")
    for name, src in trees.items():
        cpus = [c for c, _ in found[name]]
        rates = [r for _, r in found[name]]
        print(f"  {name:5} {src!s:40} {median(cpus):6.2f} ms CPU/MiB "
              f"({min(cpus):.2f}..{max(cpus):.2f}), {median(rates):6.1f} MiB/s")
    if "other" in found:
        ratio = median([c for c, _ in found["this"]]) / median([c for c, _ in found["other"]])
        print(f"  this / other broker CPU per MiB: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
