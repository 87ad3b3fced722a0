"""Transactions: what a commit every 100 ms costs a producer, what read_committed costs a
reader, and how the last stable offset follows open transactions, on one oncelog broker.

    .venv/bin/python bench/transactions.py [--repeats 5]
        [--parts produce,produce-oncelog,consume,open]
        [--messages 300000] [--producers 1,4,16] [--open-seconds 5] [--json PATH]
    make bench ARGS="--only transactions"

Every client is confluent-kafka but in ``produce-oncelog``; records are 100 bytes, topics
have 4 partitions (``open``: one). The two runs of each ratio take turns within every
repetition, in alternating order; medians, and the median of the per-repetition ratios
("paired"). The CPU other processes used during each run is reported.

* produce: one producer sends ``--messages`` records round-robin over the partitions,
  idempotent (``enable.idempotence=true``) against transactional (``transactional.id``,
  a ``commit_transaction()`` every 100 ms and at the end); each run's time includes the
  final flush or commit, not the set-up (one record is written and flushed, or committed,
  before the clock starts). Records per second (goal: transactional >= 0.9x idempotent).
* produce-oncelog: the same with oncelog.Producer on both sides.
* consume: ``--messages`` records written by a transactional producer committing every
  100 ms (so markers sit among the data) are read from offset 0 with ``assign()``, with
  ``isolation.level=read_committed`` against ``read_uncommitted``; records per second over the
  last 80% of the records, as bench/groups.py measures (goal: read_committed >= 0.95x).
* open (report): N transactional producers (``--producers``) write to one partition at
  once, each committing every 100 ms at its own phase, so up to N transactions are open in
  the partition at any time, for ``--open-seconds``. Reported: committed records per second,
  and the high watermark minus the last stable offset (ListOffsets with isolation level 0
  and 1) sampled every 20 ms: how far behind the LSO is, in records.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from _support import (
    LoadMeter,
    OncelogBroker,
    add_json_argument,
    add_parts_argument,
    cpu_seconds_probe,
    machine,
    median,
    write_json,
)

PARTS = ("produce", "produce-oncelog", "consume", "open")
RUN_TIMEOUT = 300.0
PARTITIONS = 4
COMMIT_EVERY = 0.1  # seconds
VALUE = b"v" * 100
PRODUCE_GOAL = 0.9
CONSUME_GOAL = 0.95
CONSUME_CONF = {"fetch.queue.backoff.ms": 10}  # see bench/groups.py


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(RUN_TIMEOUT)


def _send(producer, topic: str, partition: int) -> None:
    while True:
        try:
            producer.produce(topic, VALUE, partition=partition)
            return
        except BufferError:
            producer.poll(0.005)


def produce_run(bootstrap: str, topic: str, messages: int, transactional: str | None,
                client: str = "confluent") -> float:
    """Records per second of one producer; a commit every COMMIT_EVERY when transactional."""
    if client == "oncelog":
        from oncelog import Producer
    else:
        from confluent_kafka import Producer

    conf = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    if transactional:
        conf["transactional.id"] = transactional
    producer = Producer(conf)
    try:
        return _timed_produce(producer, topic, messages, transactional)
    finally:
        if client == "oncelog":
            producer.close(RUN_TIMEOUT)


def _timed_produce(producer, topic: str, messages: int, transactional: str | None) -> float:
    # Connected, producer id in hand and one record written before the clock starts.
    if transactional:
        producer.init_transactions(RUN_TIMEOUT)
        producer.begin_transaction()
        _send(producer, topic, 0)
        producer.commit_transaction(RUN_TIMEOUT)
    else:
        _send(producer, topic, 0)
        producer.flush(RUN_TIMEOUT)
    start = time.perf_counter()
    if transactional:
        producer.begin_transaction()
    due = start + COMMIT_EVERY
    for i in range(messages):
        _send(producer, topic, i % PARTITIONS)
        if transactional and i % 256 == 0 and time.perf_counter() >= due:
            producer.commit_transaction(RUN_TIMEOUT)
            producer.begin_transaction()
            due = time.perf_counter() + COMMIT_EVERY
    if transactional:
        producer.commit_transaction(RUN_TIMEOUT)
    elif producer.flush(RUN_TIMEOUT):  # confluent: records left; oncelog raises instead
        raise RuntimeError("records not delivered")
    return messages / (time.perf_counter() - start)


def consume_run(bootstrap: str, topic: str, messages: int, isolation: str) -> float:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         **CONSUME_CONF})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seen, mark, steady, at = 0, messages // 5, None, 0
        deadline = time.monotonic() + RUN_TIMEOUT
        while seen < messages:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{isolation}: read {seen} of {messages}")
            good = sum(1 for m in consumer.consume(1000, 0.5) if m.error() is None)
            if steady is None and seen + good > mark:
                steady, at = time.perf_counter(), seen + good
            seen += good
        return (messages - at) / (time.perf_counter() - steady)
    finally:
        consumer.close()


def paired(reps: list[dict], a: str, b: str) -> dict:
    return {"a": median([r[a] for r in reps]), "b": median([r[b] for r in reps]),
            "ratio": median([r[a] for r in reps]) / median([r[b] for r in reps]),
            "paired": median([r[a] / r[b] for r in reps]),
            "other_load": median([r["other_load"] for r in reps])}


def alternate(args, runs: dict, name: str, show) -> list[dict]:
    reps = []
    order = list(runs)
    for rep in range(args.repeats):
        row: dict = {}
        meter = LoadMeter(args.probe)
        for key in (order if rep % 2 == 0 else order[::-1]):
            row[key] = runs[key](rep)
        row["other_load"] = meter.others_share()
        print(f"{name} {rep}: " + ", ".join(f"{k} {show(row[k])}" for k in order)
              + f" (others {row['other_load']:.0%})", file=sys.stderr, flush=True)
        reps.append(row)
    return reps


def run_produce(args, bootstrap: str, client: str = "confluent") -> dict:
    topic = f"produce-{client}"
    create_topic(bootstrap, topic, PARTITIONS)
    produce_run(bootstrap, topic, args.messages // 10, f"warm-up-{client}", client)
    runs = {"transactional": lambda rep: produce_run(bootstrap, topic, args.messages,
                                                     f"bench-{client}-{rep}", client),
            "idempotent": lambda rep: produce_run(bootstrap, topic, args.messages, None,
                                                  client)}
    reps = alternate(args, runs, f"produce ({client})", lambda v: f"{v:,.0f}/s")
    return {"runs": reps, **paired(reps, "transactional", "idempotent")}


def run_consume(args, bootstrap: str) -> dict:
    create_topic(bootstrap, "consume", PARTITIONS)
    produce_run(bootstrap, "consume", args.messages, "fill")
    consume_run(bootstrap, "consume", args.messages, "read_committed")  # warm-up
    runs = {iso: (lambda rep, iso=iso: consume_run(bootstrap, "consume", args.messages, iso))
            for iso in ("read_committed", "read_uncommitted")}
    reps = alternate(args, runs, "consume", lambda v: f"{v:,.0f}/s")
    return {"runs": reps, **paired(reps, "read_committed", "read_uncommitted")}


def open_run(bootstrap: str, topic: str, producers: int, seconds: float) -> dict:
    """``producers`` transactional producers on partition 0 of ``topic`` at once."""
    from confluent_kafka import Producer

    from oncelog.client.admin.admin import Admin
    from oncelog.client.network import calls

    stop = threading.Event()
    committed = [0] * producers
    errors: list[BaseException] = []

    def write(index: int) -> None:
        try:
            p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                          "transactional.id": f"open-{producers}-{index}"})
            p.init_transactions(RUN_TIMEOUT)
            time.sleep(COMMIT_EVERY * index / producers)  # each at its own phase
            while not stop.is_set():
                p.begin_transaction()
                sent, due = 0, time.perf_counter() + COMMIT_EVERY
                while time.perf_counter() < due:
                    _send(p, topic, 0)
                    sent += 1
                    if sent % 64 == 0:
                        p.poll(0)
                p.commit_transaction(RUN_TIMEOUT)
                committed[index] += sent
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,), daemon=True) for i in range(producers)]
    lags = []
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        for t in threads:
            t.start()
        time.sleep(1.0)  # all initialised and writing
        start, first = time.perf_counter(), sum(committed)
        while time.perf_counter() - start < seconds and not errors:
            tp = (topic, 0)
            hw = admin.list_offsets({tp: calls.LATEST})[tp]
            lso = admin.list_offsets({tp: calls.LATEST}, read_committed=True)[tp]
            lags.append(hw - lso)
            time.sleep(0.02)
        elapsed, done = time.perf_counter() - start, sum(committed) - first
    stop.set()
    for t in threads:
        t.join(RUN_TIMEOUT)
    if errors:
        raise RuntimeError(f"a transactional producer failed: {errors[0]!r}")
    lags.sort()
    return {"producers": producers, "committed_per_s": done / elapsed,
            "lag_median": median(lags), "lag_p99": lags[int(0.99 * (len(lags) - 1))],
            "lag_max": lags[-1], "samples": len(lags)}


def run_open(args, bootstrap: str) -> list[dict]:
    results = []
    for n in args.producer_counts:
        topic = f"open-{n}"
        create_topic(bootstrap, topic, 1)
        row = open_run(bootstrap, topic, n, args.open_seconds)
        print(f"open {n}: {row['committed_per_s']:,.0f} committed/s, HW - LSO median "
              f"{row['lag_median']:,.0f} p99 {row['lag_p99']:,} max {row['lag_max']:,}",
              file=sys.stderr, flush=True)
        results.append(row)
    return results


def report(results: dict, args) -> None:
    print(f"machine: {results['machine']}")
    for part, label in (("produce", "confluent-kafka"), ("produce-oncelog", "oncelog.Producer")):
        if part not in results:
            continue
        r = results[part]
        verdict = "met" if r["paired"] >= PRODUCE_GOAL else "MISSED"
        print(f"produce {args.messages:,} x 100 B, 4 partitions, one {label} "
              f"({args.repeats} repetitions, others {r['other_load']:.0%}):")
        print(f"  transactional, commit every 100 ms  {r['a']:>12,.0f} records/s")
        print(f"  idempotent                          {r['b']:>12,.0f} records/s")
        print(f"  ratio {r['ratio']:.3f}, paired {r['paired']:.3f} (goal >= {PRODUCE_GOAL}: "
              f"{verdict})")
    if "consume" in results:
        r = results["consume"]
        verdict = "met" if r["paired"] >= CONSUME_GOAL else "MISSED"
        print(f"consume {args.messages:,} x 100 B (transactional, committed every 100 ms), "
              f"assign() from 0 (others {r['other_load']:.0%}):")
        print(f"  read_committed    {r['a']:>12,.0f} records/s (last 80%)")
        print(f"  read_uncommitted  {r['b']:>12,.0f} records/s (last 80%)")
        print(f"  ratio {r['ratio']:.3f}, paired {r['paired']:.3f} (goal >= {CONSUME_GOAL}: "
              f"{verdict})")
    if "open" in results:
        print(f"open transactions on one partition, each committing every 100 ms, "
              f"{args.open_seconds:g} s each:")
        print("  producers  committed records/s  HW-LSO median  p99  max (records)")
        for r in results["open"]:
            print(f"  {r['producers']:>9}  {r['committed_per_s']:>19,.0f}  "
                  f"{r['lag_median']:>13,.0f}  {r['lag_p99']:,}  {r['lag_max']:,}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    add_parts_argument(parser, PARTS)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--producers", default="1,4,16", metavar="N,N,...",
                        help="open: how many transactional producers at once")
    parser.add_argument("--open-seconds", type=float, default=5.0)
    add_json_argument(parser)
    args, _ = parser.parse_known_args(argv)  # other modules' options are not ours
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        parser.error(f"unknown parts: {', '.join(sorted(set(parts) - set(PARTS)))}")
    try:
        args.producer_counts = [int(n) for n in args.producers.split(",")]
    except ValueError:
        parser.error(f"--producers takes numbers such as 1,4,16, not {args.producers!r}")
    results: dict = {"machine": machine()}
    with OncelogBroker() as broker:
        args.probe = cpu_seconds_probe(broker.pid)
        if "produce" in parts:
            results["produce"] = run_produce(args, broker.bootstrap)
        if "produce-oncelog" in parts:
            results["produce-oncelog"] = run_produce(args, broker.bootstrap, "oncelog")
        if "consume" in parts:
            results["consume"] = run_consume(args, broker.bootstrap)
        if "open" in parts:
            results["open"] = run_open(args, broker.bootstrap)
    report(results, args)
    write_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
