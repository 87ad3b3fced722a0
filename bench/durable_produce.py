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
        [--src DIR] [--json PATH]
    make bench ARGS="--only durable_produce"

Many producers (``--producers K``, default 8; 0 skips it): K confluent-kafka producers
(plain, then idempotent) at once, each in its own thread writing 1 KiB values in 16 KiB
batches to its own partition of one topic (K partitions on one disk), against the same bare
loop (one writer, the same batch size) and against K bare loops at once, one file each: what
the disk gives K concurrent writers that fdatasync every batch (ext4 commits concurrent
fdatasyncs in shared journal transactions). One producer waits for each fsync in turn; K of
them give the broker K partitions' fsyncs to run at once, each round covering what its
partition's connections wrote meanwhile (issue 26: many producers with ``acks=all`` and
``flush.messages=1``). The clients' CPU is reported: librdkafka's idempotent producer spins
while its one request in flight waits (docs/benchmarks.md), K of them on two CPUs.

``--src DIR`` (another checkout's root or ``src/``, its codecs built with ``setup.py
build_ext --inplace``) runs that tree's broker, and its oncelog.Producer, beside this tree's
in every repetition, the two in turn (alternating which goes first), each with its own bare
loop: an A/B of two commits in the same minutes, reported as this / --src (median and
paired). oncelog.Producer always runs in a child interpreter of the tree under test.
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import sys
import time
from pathlib import Path

from _support import (
    OncelogBroker,
    add_json_argument,
    cpu_seconds_probe,
    filesystem_of,
    machine,
    median,
    produce_all,
    python_in_tree,
    source_tree,
    write_json,
)

VALUE_SIZE = 1024
SEED = 20261124
PAYLOAD = random.Random(SEED).randbytes(VALUE_SIZE)
SCENARIOS = {"default": None, "16KiB": 16384}  # batch.size: the client's default, or this
CLIENTS = ("confluent", "oncelog")
RUN_TIMEOUT = 300.0
START_TIMEOUT = 120.0  # a broker of either tree; a loaded machine took over 30 s to start one
GOAL = 0.8


def produce(client: str, bootstrap: str, topic: str, n: int, batch_size: int | None,
            src: Path) -> float:
    """Seconds to produce ``n`` values with ``client`` and have every one acknowledged
    (oncelog.Producer as the package in ``src`` has it)."""
    if client == "oncelog":
        out = python_in_tree(src, _PRODUCE_ONCELOG, bootstrap, topic, str(n),
                             str(batch_size or 0), str(SEED), str(VALUE_SIZE),
                             str(RUN_TIMEOUT), timeout=RUN_TIMEOUT + 60)
        return float(out.split()[-1])
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


# A child interpreter's run of oncelog.Producer, so that --src measures that tree's client
# too (the seconds on its last line). argv: bootstrap topic n batch.size (0: the client's
# default) seed value-size timeout.
_PRODUCE_ONCELOG = """
import random, sys, time
import oncelog
bootstrap, topic, n, batch_size, seed, size, timeout = sys.argv[1:]
payload = random.Random(int(seed)).randbytes(int(size))
extra = {"batch.size": int(batch_size)} if int(batch_size) else {}
with oncelog.Producer({"bootstrap.servers": bootstrap, "acks": "all", **extra}) as producer:
    producer.produce(topic, payload, partition=0).result(30)
    start = time.perf_counter()
    for _ in range(int(n)):
        producer.produce(topic, payload, partition=0)
    producer.flush(float(timeout))
    print(time.perf_counter() - start)
"""


def stored_batches(partition_dir: Path) -> tuple[int, int]:
    """(bytes in the partition's segments, batches in them), read from the files (so that a
    broker of any version can be measured: each batch starts with its base offset and its
    length)."""
    size = batches = 0
    for segment in sorted(partition_dir.glob("*.log")):
        data = segment.read_bytes()
        size += len(data)
        position = 0
        while position + 12 <= len(data):
            (length,) = struct.unpack_from(">i", data, position + 8)
            position += 12 + length
            batches += 1
    if not batches:
        raise RuntimeError("the broker stored no batches")
    return size, batches


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


def measure(client: str, name: str, batch_size: int | None, rep: int, n: int, base: Path,
            src: Path) -> dict:
    """One repetition of one tree: durable, its bare loop, and the same without fsync."""
    durable = {"log.flush.interval.messages": "1", "log.segment.bytes": str(1 << 30)}
    with OncelogBroker(durable, src=src, base_dir=base,
                       start_timeout=START_TIMEOUT) as broker:
        topic = f"durable-{name}-{rep}"
        cpu = cpu_seconds_probe(broker.pid)
        cpu_before = cpu()
        seconds = produce(client, broker.bootstrap, topic, n, batch_size, src)
        broker_cpu = cpu() - cpu_before  # the warm-up's included: the same on both trees
        size, batches = stored_batches(broker.data_dir / f"{topic}-0")
        batch_bytes = max(1, size // batches)
        bare = bare_loop(broker.data_dir, batch_bytes, batches)
    with OncelogBroker({}, src=src, base_dir=base,  # the same without fsync
                       start_timeout=START_TIMEOUT) as broker:
        plain = produce(client, broker.bootstrap, f"plain-{name}-{rep}", n, batch_size, src)
    # The bare loop wrote the same bytes in the same number of batches (the warm-up batch
    # included), so the ratio of the rates is that of the times.
    return {"oncelog_msgs_per_s": n / seconds, "bare_msgs_per_s": n / bare,
            "no_fsync_msgs_per_s": n / plain, "batch_bytes": batch_bytes, "batches": batches,
            "ratio": bare / seconds, "broker_cpu_us_per_msg": broker_cpu / n * 1e6}


def produce_many(bootstrap: str, topic: str, k: int, n_each: int, batch_size: int,
                 idempotent: bool) -> tuple[float, float]:
    """Seconds for ``k`` confluent-kafka producers, one thread each, to have ``n_each``
    values each acknowledged, producer i writing to partition i, and the CPU seconds the
    clients used meanwhile (this process)."""
    import threading

    from confluent_kafka import Producer

    errors: list[str] = []
    producers = [Producer({"bootstrap.servers": bootstrap, "acks": "all",
                           "enable.idempotence": idempotent, "batch.size": batch_size,
                           "on_delivery": lambda err, msg: err and errors.append(str(err))})
                 for _ in range(k)]
    for i, producer in enumerate(producers):  # connected, producer ids taken
        producer.produce(topic, PAYLOAD, partition=i)
        producer.flush(30)
    deadline = time.monotonic() + RUN_TIMEOUT
    failed: list[BaseException] = []

    def one(i: int) -> None:
        try:
            produce_all(producers[i], topic, PAYLOAD, n_each, deadline, partition=i)
            while len(producers[i]) and time.monotonic() < deadline:
                producers[i].flush(1)
        except BaseException as exc:  # reported below, not lost in the thread
            failed.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(k)]
    start, cpu = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RUN_TIMEOUT + 10)
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu
    left = sum(len(p) for p in producers)
    if failed or left or errors or any(t.is_alive() for t in threads):
        raise RuntimeError(f"undelivered: {left}, errors: {errors[:3]}, failed: {failed[:3]}")
    return seconds, cpu


def bare_loops(directory: Path, batch_bytes: int, batches: int, k: int) -> float:
    """Seconds for ``k`` threads, one file each, to write and fdatasync ``batches`` batches
    of ``batch_bytes`` bytes between them (each its share)."""
    import threading

    shares = [batches // k + (i < batches % k) for i in range(k)]
    sub = [directory / f"bare-{i}" for i in range(k)]
    for path in sub:
        path.mkdir(exist_ok=True)
    threads = [threading.Thread(target=bare_loop, args=(sub[i], batch_bytes, shares[i]))
               for i in range(k)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    for path in sub:
        path.rmdir()
    return seconds


MANY_BATCH = 16384


def measure_many(k: int, rep: int, n: int, base: Path, src: Path, idempotent: bool) -> dict:
    """One repetition of the many-producers part: ``n`` values in all, K producers."""
    durable = {"log.flush.interval.messages": "1", "log.segment.bytes": str(1 << 30)}
    with OncelogBroker(durable, src=src, base_dir=base,
                       start_timeout=START_TIMEOUT) as broker:
        topic = f"many-{rep}-{int(idempotent)}"
        _create(broker.bootstrap, topic, k)
        cpu = cpu_seconds_probe(broker.pid)
        cpu_before = cpu()
        seconds, client_cpu = produce_many(broker.bootstrap, topic, k, n // k, MANY_BATCH,
                                           idempotent)
        broker_cpu = cpu() - cpu_before
        size = batches = 0
        for i in range(k):
            s, b = stored_batches(broker.data_dir / f"{topic}-{i}")
            size, batches = size + s, batches + b
        batch_bytes = max(1, size // batches)
        one = bare_loop(broker.data_dir, batch_bytes, batches)
        many = bare_loops(broker.data_dir, batch_bytes, batches, k)
    sent = n // k * k
    return {"oncelog_msgs_per_s": sent / seconds, "bare_msgs_per_s": sent / one,
            "bare_k_msgs_per_s": sent / many, "batch_bytes": batch_bytes, "batches": batches,
            "ratio": one / seconds, "ratio_k": many / seconds,
            "broker_cpu_us_per_msg": broker_cpu / sent * 1e6,
            "client_cpu_share": client_cpu / seconds}


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


KEYS = ("oncelog_msgs_per_s", "bare_msgs_per_s", "no_fsync_msgs_per_s", "batch_bytes", "ratio",
        "broker_cpu_us_per_msg")


def run(args) -> dict:
    results: dict = {"machine": machine(), "messages": args.messages, "scenarios": {}}
    base = args.data_dir
    base.mkdir(parents=True, exist_ok=True)
    results["filesystem"] = filesystem_of(base)
    trees = {"this": source_tree(None)}
    if args.src:
        trees["src"] = source_tree(args.src)
        results["src"] = str(trees["src"])
    for client in args.clients:
        for name, batch_size in SCENARIOS.items():
            rows = []
            for rep in range(args.repeats):
                order = list(trees) if rep % 2 == 0 else list(reversed(trees))
                row = {}
                for tree in order:
                    row[tree] = r = measure(client, name, batch_size, rep, args.messages,
                                                base, trees[tree])
                    print(f"  {client} {name} rep {rep + 1} {tree}: durable "
                          f"{r['oncelog_msgs_per_s']:,.0f} msgs/s, bare write+fdatasync "
                          f"{r['bare_msgs_per_s']:,.0f} msgs/s ({r['batches']} batches of "
                          f"{r['batch_bytes']:,} B), ratio {r['ratio']:.2f}; without fsync "
                          f"{r['no_fsync_msgs_per_s']:,.0f} msgs/s; durable broker CPU "
                          f"{r['broker_cpu_us_per_msg']:.1f} us/msg", file=sys.stderr,
                          flush=True)
                rows.append(row)
            scenario = {"runs": rows,
                        **{key: median([r["this"][key] for r in rows]) for key in KEYS}}
            if "src" in trees:
                scenario["src"] = {key: median([r["src"][key] for r in rows]) for key in KEYS}
                scenario["paired_durable"] = median(
                    [r["this"]["oncelog_msgs_per_s"] / r["src"]["oncelog_msgs_per_s"]
                     for r in rows])
                scenario["paired_ratio"] = median(
                    [r["this"]["ratio"] / r["src"]["ratio"] for r in rows])
            results["scenarios"][f"{client} {name}"] = scenario
    if args.producers:
        results["many"] = {}
        for idempotent in (False, True):
            rows = []
            for rep in range(args.repeats):
                r = measure_many(args.producers, rep, args.messages, base, trees["this"],
                                 idempotent)
                print(f"  {args.producers} confluent producers"
                      f"{' (idempotent)' if idempotent else ''}, 16 KiB batches, rep {rep + 1}: "
                      f"durable {r['oncelog_msgs_per_s']:,.0f} msgs/s, bare write+fdatasync "
                      f"{r['bare_msgs_per_s']:,.0f} msgs/s one loop, "
                      f"{r['bare_k_msgs_per_s']:,.0f} {args.producers} loops ({r['batches']} "
                      f"batches of {r['batch_bytes']:,} B), ratio {r['ratio']:.2f} / "
                      f"{r['ratio_k']:.2f}; broker CPU {r['broker_cpu_us_per_msg']:.1f} us/msg, "
                      f"clients {r['client_cpu_share']:.0%} of a CPU", file=sys.stderr,
                      flush=True)
                rows.append(r)
            results["many"]["idempotent" if idempotent else "plain"] = {
                "producers": args.producers, "runs": rows,
                **{key: median([r[key] for r in rows]) for key in rows[0]}}
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
    for kind, many in results.get("many", {}).items():
        met = "met" if many["ratio"] >= GOAL else "MISSED"
        print(f"| {many['producers']} confluent producers ({kind}), 16 KiB, a partition each | "
              f"{many['oncelog_msgs_per_s']:,.0f} | {many['bare_msgs_per_s']:,.0f} | "
              f"{many['batch_bytes']:,.0f} B | {many['ratio']:.2f} | >= {GOAL} | {met} | "
              f"(bare, {many['producers']} loops at once: {many['bare_k_msgs_per_s']:,.0f}, "
              f"ratio {many['ratio_k']:.2f}; clients {many['client_cpu_share']:.0%} of a CPU) |")
    if "src" not in results:
        return
    print(f"\nA/B: this tree and --src {results['src']} (broker and oncelog.Producer), "
          "same repetitions, in turn")
    print("| client, batching | durable msgs/s this / --src | this / --src | paired | "
          "ratio to bare loop, this / --src | paired | without fsync msgs/s this / --src | "
          "durable broker CPU per msg, this / --src |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, row in results["scenarios"].items():
        other = row["src"]
        print(f"| {name} | {row['oncelog_msgs_per_s']:,.0f} / {other['oncelog_msgs_per_s']:,.0f}"
              f" | {row['oncelog_msgs_per_s'] / other['oncelog_msgs_per_s']:.2f} | "
              f"{row['paired_durable']:.2f} | {row['ratio']:.2f} / {other['ratio']:.2f} | "
              f"{row['paired_ratio']:.2f} | {row['no_fsync_msgs_per_s']:,.0f} / "
              f"{other['no_fsync_msgs_per_s']:,.0f} | {row['broker_cpu_us_per_msg']:.1f} / "
              f"{other['broker_cpu_us_per_msg']:.1f} us |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    parser.add_argument("--producers", type=int, default=8,
                        help="the many-producers part's K (0: skip it)")
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent.parent
                        / ".bench-data", help="where the brokers and the bare loop write")
    parser.add_argument("--src", type=Path, metavar="DIR",
                        help="another checkout (its root or src/) whose broker and "
                             "oncelog.Producer run beside this tree's, in turn")
    add_json_argument(parser)
    args, _ = parser.parse_known_args(argv)  # other modules' options are not ours
    results = run(args)
    report(results)
    write_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
