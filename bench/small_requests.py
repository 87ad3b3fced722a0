"""The broker's CPU per small request, for two source trees in one run (issue 26).

Round trips a consumer makes one at a time (confluent-kafka): a synchronous OffsetCommit
(``commit(asynchronous=False)``) and an OffsetFetch (``committed()``), the two the
consumer-group table of issue 26 names. The broker's on-CPU time (its threads' schedstat) over
``--calls`` of each, divided by the calls, is the figure: it holds up on a busy machine
far better than a rate does. The trees take turns, in alternating order, ``--repeats``
times, each with a fresh broker; medians (and min..max) are printed.

    .venv/bin/python bench/small_requests.py [--src /tmp/zc-base/src] [--calls 2000 --repeats 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _support import REPO, OncelogBroker, cpu_seconds_probe, median
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT = 30.0
KINDS = ("OffsetCommit", "OffsetFetch")


def measure(src: Path, calls: int) -> dict[str, float]:
    """Broker CPU microseconds per round trip of each kind, for the tree at ``src``."""
    found = {}
    with OncelogBroker({"group.initial.rebalance.delay.ms": "0"}, src=src) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("small", 1, 1)])["small"].result(TIMEOUT)
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "small",
                             "enable.auto.commit": False})
        tp = TopicPartition("small", 0)
        try:
            consumer.assign([TopicPartition("small", 0, 0)])
            runs = {
                "OffsetCommit": lambda i: consumer.commit(
                    offsets=[TopicPartition("small", 0, i)], asynchronous=False),
                "OffsetFetch": lambda i: consumer.committed([tp], TIMEOUT),
            }
            cpu = cpu_seconds_probe(broker.pid)
            for kind in KINDS:
                call = runs[kind]
                for i in range(200):  # warm: the topic, the coordinator, the code paths
                    call(i)
                before = cpu()
                for i in range(calls):
                    call(i)
                found[kind] = 1e6 * (cpu() - before) / calls
        finally:
            consumer.close()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, help="another tree's src/ to compare with")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=4)
    args, _ = parser.parse_known_args(argv)  # run_all.py may pass other modules' options
    trees = {"this": REPO / "src"}
    if args.src is not None:
        trees["other"] = args.src
    found: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(args.repeats):
        for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
            found[name].append(measure(trees[name], args.calls))
            print(f"  {name:5} #{r + 1}: " + ", ".join(
                f"{k} {v:5.0f} us" for k, v in found[name][-1].items()), flush=True)
    print(f"\nbroker CPU per round trip, median of {args.repeats} (min..max):")
    for kind in KINDS:
        line = f"  {kind:13}"
        for name in trees:
            values = [run[kind] for run in found[name]]
            line += f"  {name} {median(values):5.0f} us ({min(values):.0f}..{max(values):.0f})"
        if "other" in trees:
            ratio = median([r[kind] for r in found["this"]]) / \
                median([r[kind] for r in found["other"]])
            line += f"  this/other {ratio:.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
