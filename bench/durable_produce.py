"""Durable produce: oncelog with ``log.flush.interval.messages=1`` against the disk's own limit.

With that setting every batch is on disk before it is acknowledged. The limit to compare with
is what the same disk gives a bare loop that writes batches of the same size to a file and
fdatasyncs after each one, with nothing else in between: that loop is measured in the same
run, in the same directory, with the batch size the broker actually stored (its segment bytes
over its batch count). oncelog's broker fsyncs in a worker thread and commits every batch
written before an fsync started with that fsync (group commit), so the ratio can exceed 1.

Both batching modes of produce_consume: the client's default (librdkafka: up to 1 MB per
batch) and 16 KiB batches, 1 KiB values, ``acks=all``, idempotent producers: confluent-kafka
(librdkafka keeps about one request in flight with idempotence, so each waits for its own
fsync) and oncelog.Producer (five in flight, so one fsync can cover several). The same
producer against a broker without fsync is measured too: the broker's ceiling for it.

    .venv/bin/python bench/durable_produce.py [--messages N] [--repeats R] [--data-dir D]
    make bench ARGS="--only durable_produce"
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import urllib.request
from pathlib import Path

from _support import (
    OncelogBroker,
    add_json_argument,
    filesystem_of,
    machine,
    median,
    produce_all,
    write_json,
)

VALUE_SIZE = 1024
PAYLOAD = random.Random(20261124).randbytes(VALUE_SIZE)
SCENARIOS = {"default": None, "16KiB": 16384}  # batch.size: the client's default, or this
CLIENTS = ("confluent", "oncelog")
RUN_TIMEOUT = 300.0
GOAL = 0.8


def produce(client: str, bootstrap: str, topic: str, n: int, batch_size: int | None) -> float:
    """Seconds to produce ``n`` values with ``client`` and have every one acknowledged."""
    if client == "oncelog":
        return _produce_oncelog(bootstrap, topic, n, batch_size)
    from confluent_kafka import Producer

    errors: list[str] = []
    extra = {} if batch_size is None else {"batch.size": batch_size}
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, **extra,
                         "on_delivery": lambda err, msg: err and errors.append(str(err))})
    producer.produce(topic, PAYLOAD, partition=0)  # creates the topic, connects
    producer.flush(30)
    deadline = time.monotonic() + RUN_TIMEOUT
    start = time.perf_counter()
    produce_all(producer, topic, PAYLOAD, n, deadline)
    while len(producer) and time.monotonic() < deadline:
        producer.flush(1)
    seconds = time.perf_counter() - start
    if len(producer) or errors:
        raise RuntimeError(f"undelivered: {len(producer)}, errors: {errors[:3]}")
    return seconds


def _produce_oncelog(bootstrap: str, topic: str, n: int, batch_size: int | None) -> float:
    import oncelog

    extra = {} if batch_size is None else {"batch.size": batch_size}
    with oncelog.Producer({"bootstrap.servers": bootstrap, "acks": "all", **extra}) as producer:
        producer.produce(topic, PAYLOAD, partition=0).result(30)
        start = time.perf_counter()
        for _ in range(n):
            producer.produce(topic, PAYLOAD, partition=0)
        producer.flush(RUN_TIMEOUT)
        return time.perf_counter() - start


def stored_batches(broker: OncelogBroker, topic: str) -> tuple[int, int]:
    """(bytes in the partition's segments, batches appended) as the broker counts them."""
    directory = broker.data_dir / f"{topic}-0"
    size = sum(p.stat().st_size for p in directory.glob("*.log"))
    with urllib.request.urlopen(broker.metrics_url, timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("oncelog_produce_batches_total") and f'topic="{topic}"' in line \
                    and 'outcome="appended"' in line:
                return size, int(line.rsplit(" ", 1)[1])
    raise RuntimeError("the broker counted no appended batches")


def bare_loop(directory: Path, batch_bytes: int, batches: int) -> float:
    """Seconds for ``batches`` writes of ``batch_bytes`` bytes, each followed by fdatasync."""
    path = directory / "bare-loop.log"
    data = random.Random(1).randbytes(batch_bytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(batches):
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fdatasync(fd)
        return time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)


def run(args) -> dict:
    results: dict = {"machine": machine(), "messages": args.messages, "scenarios": {}}
    base = args.data_dir
    base.mkdir(parents=True, exist_ok=True)
    results["filesystem"] = filesystem_of(base)
    durable = {"log.flush.interval.messages": "1", "log.segment.bytes": str(1 << 30),
               "metrics.listener": "127.0.0.1:0"}
    for client in args.clients:
        for name, batch_size in SCENARIOS.items():
            rows = []
            for rep in range(args.repeats):
                with OncelogBroker(durable, base_dir=base) as broker:
                    topic = f"durable-{name}-{rep}"
                    seconds = produce(client, broker.bootstrap, topic, args.messages,
                                      batch_size)
                    size, batches = stored_batches(broker, topic)
                    batch_bytes = max(1, size // batches)
                    bare = bare_loop(broker.data_dir, batch_bytes, batches)
                with OncelogBroker({}, base_dir=base) as broker:  # the same without fsync
                    plain = produce(client, broker.bootstrap, f"plain-{name}-{rep}",
                                    args.messages, batch_size)
                # The bare loop wrote the same bytes in the same number of batches (the
                # warm-up batch included), so the ratio of the rates is that of the times.
                row = {"oncelog_msgs_per_s": args.messages / seconds,
                       "bare_msgs_per_s": args.messages / bare,
                       "no_fsync_msgs_per_s": args.messages / plain,
                       "batch_bytes": batch_bytes, "batches": batches, "ratio": bare / seconds}
                rows.append(row)
                print(f"  {client} {name} rep {rep + 1}: durable "
                      f"{row['oncelog_msgs_per_s']:,.0f} msgs/s, bare write+fdatasync "
                      f"{row['bare_msgs_per_s']:,.0f} msgs/s ({batches} batches of "
                      f"{batch_bytes:,} B), ratio {row['ratio']:.2f}; without fsync "
                      f"{row['no_fsync_msgs_per_s']:,.0f} msgs/s", file=sys.stderr, flush=True)
            results["scenarios"][f"{client} {name}"] = {
                "runs": rows,
                **{key: median([r[key] for r in rows])
                   for key in ("oncelog_msgs_per_s", "bare_msgs_per_s", "no_fsync_msgs_per_s",
                               "batch_bytes", "ratio")},
            }
    return results


def report(results: dict) -> None:
    print(f"machine: {results['machine']}")
    print(f"disk: {results['filesystem']}; {results['messages']:,} values of {VALUE_SIZE} B "
          "per run, medians")
    print("| client, batching | durable msgs/s | bare write+fdatasync msgs/s | batch | ratio | "
          "target | | without fsync msgs/s |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for name, row in results["scenarios"].items():
        met = "met" if row["ratio"] >= GOAL else "MISSED"
        print(f"| {name} | {row['oncelog_msgs_per_s']:,.0f} | {row['bare_msgs_per_s']:,.0f} | "
              f"{row['batch_bytes']:,.0f} B | {row['ratio']:.2f} | >= {GOAL} | {met} | "
              f"{row['no_fsync_msgs_per_s']:,.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent.parent
                        / ".bench-data", help="where the brokers and the bare loop write")
    add_json_argument(parser)
    args, _ = parser.parse_known_args(argv)  # other modules' options are not ours
    results = run(args)
    report(results)
    write_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
