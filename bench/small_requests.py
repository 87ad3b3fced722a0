"""The broker's CPU per small request, for two source trees in one run (issue 26).

Round trips a consumer makes one at a time (confluent-kafka): a synchronous OffsetCommit
(``commit(asynchronous=False)``) and an OffsetFetch (``committed()``), the two the
consumer-group table of issue 26 names. The broker's on-CPU time (its threads' schedstat) over
``--calls`` of each, divided by the calls, is the figure: it holds up on a busy machine
far better than a rate does. The trees take turns, in alternating order, ``--repeats``
times, each with a fresh broker; medians (and min..max) are printed.

Then, in process: the cost of encoding typical small answers with kio's writer and with
protocol/fast_writer.py (best of 5 x 5,000), the part of a request fast_writer changed.

    .venv/bin/python bench/small_requests.py [--src /tmp/zc-base/src] [--calls 2000 --repeats 4]
"""

from __future__ import annotations

import argparse
import datetime
import io
import sys
import timeit
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


def _answers() -> dict[str, object]:
    from kio.schema.errors import ErrorCode

    from oncelog.protocol.schema import build, response_module

    zero = datetime.timedelta(0)
    commit = response_module(8, 8)
    fetch_offsets = response_module(9, 7)
    fetch = response_module(1, 12)
    beat = response_module(12, 4)
    partition = build(fetch.PartitionData, partition_index=0, error_code=ErrorCode.none,
                      high_watermark=100, last_stable_offset=100, log_start_offset=0,
                      aborted_transactions=(), preferred_read_replica=-1, records=b"x" * 500)
    return {
        "OffsetCommit v8": build(commit.OffsetCommitResponse, throttle_time=zero, topics=(
            build(commit.OffsetCommitResponseTopic, name="small", partitions=(
                build(commit.OffsetCommitResponsePartition, partition_index=0,
                      error_code=ErrorCode.none),)),)),
        "OffsetFetch v7": build(fetch_offsets.OffsetFetchResponse, throttle_time=zero,
                                error_code=ErrorCode.none, topics=(
            build(fetch_offsets.OffsetFetchResponseTopic, name="small", partitions=(
                build(fetch_offsets.OffsetFetchResponsePartition, partition_index=0,
                      committed_offset=5, committed_leader_epoch=-1, metadata="",
                      error_code=ErrorCode.none),)),)),
        "Heartbeat v4": build(beat.HeartbeatResponse, throttle_time=zero,
                              error_code=ErrorCode.none),
        "Fetch v12, 500 B": build(fetch.FetchResponse, throttle_time=zero,
                                  error_code=ErrorCode.none, session_id=0, responses=(
            build(fetch.FetchableTopicResponse, topic="small", partitions=(partition,)),)),
    }


def encode_costs() -> None:
    from kio.serial import entity_writer

    from oncelog.protocol.fast_writer import writer

    print("\nencoding an answer's body, in process (best of 5 x 5,000):")
    for name, body in _answers().items():
        costs = []
        for write in (entity_writer(type(body)), writer(type(body))):
            def once(write=write, body=body) -> None:
                write(io.BytesIO(), body)
            costs.append(min(timeit.repeat(once, number=5000, repeat=5)) / 5000 * 1e6)
        print(f"  {name:17} kio {costs[0]:5.1f} us, fast_writer {costs[1]:5.1f} us "
              f"({costs[1] / costs[0]:.2f})")


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
    encode_costs()
    return 0


if __name__ == "__main__":
    sys.exit(main())
