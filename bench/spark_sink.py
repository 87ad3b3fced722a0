"""df.write.format("oncelog") exactly-once against at-least-once and against Parquet: rows per
second of the same DataFrame, measured side by side in one run.

    .venv/bin/python bench/spark_sink.py [--rows 100000] [--repeats 3] [--partitions 2]

Spark local[2]; one oncelog broker on 127.0.0.1 (two-phase commit allowed) with a fresh
temporary log.dirs; values of 1 KiB, 16-byte keys, no compression. The DataFrame (key, value;
``--partitions`` Spark partitions) is cached in memory first, so its source costs no side
anything. Each repetition writes it:

* exactly-once (the default ``guarantee``): each task in a prepared transaction, the driver's
  commit (its decision, then every task's transaction committed) included in the time;
* at-least-once (``option("guarantee", "at-least-once")``): each task with an idempotent
  producer;
* ``df.write.parquet`` to a new directory;
* ``arrow_floor``: a Python data source whose ``DataSourceArrowWriter`` takes every Arrow
  batch Spark hands it and does nothing with it (its commit too): what any Python data
  source writer pays before doing anything (Spark's rows to Arrow, to the Python worker,
  the commit messages), the floor under both oncelog writes.

The oncelog writes go to a new topic each (``--partitions`` partitions). One warm-up round
first (Python workers, the JIT). Printed: median rows/s and CPU seconds (of this process
tree: the JVM, Spark's Python workers, the broker) of each, the share of the CPUs other
processes took meanwhile, exactly-once / at-least-once (goal >= 0.8), exactly-once / Parquet
(goal >= 1.0), and arrow_floor / Parquet: how much of that goal any Python data source
writer can reach.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _support import LoadMeter, OncelogBroker, add_json_argument, machine, median, write_json
from spark_source import VALUE_BYTES, session

import oncelog

KINDS = ("exactly_once", "at_least_once", "parquet", "arrow_floor")


def tree_cpu_seconds(with_this: bool = True) -> float:
    """CPU seconds (user + system, reaped children included) of this process (unless not
    ``with_this``) and every process below it: Spark's JVM, its Python workers and the
    broker. On a shared machine the wall-clock rates move with others' load; this much
    less."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        parents[int(entry)] = int(fields[1])
        ticks[int(entry)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    ours = {os.getpid()}
    grew = True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in ours} - ours
        grew = bool(below)
        ours |= below
    if not with_this:
        ours.discard(os.getpid())
    return sum(ticks[pid] for pid in ours if pid in ticks) / os.sysconf("SC_CLK_TCK")


def timed(action) -> tuple[float, float]:
    """Wall-clock and process-tree CPU seconds of ``action()``."""
    cpu, started = tree_cpu_seconds(), time.perf_counter()
    action()
    return time.perf_counter() - started, tree_cpu_seconds() - cpu


def register_floor(spark) -> None:
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class FloorWriter(DataSourceArrowWriter):
        def write(self, iterator):
            rows = 0
            for batch in iterator:
                rows += batch.num_rows
            return WriterCommitMessage()

        def commit(self, messages) -> None:
            pass

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "arrow_floor"

        def writer(self, schema, overwrite):
            return FloorWriter()

    spark.dataSource.register(Floor)


def run(rows: int, repeats: int, partitions: int) -> dict:
    tmp = tempfile.mkdtemp(prefix="oncelog-bench-sink-")
    try:
        with OncelogBroker({"transaction.two.phase.commit.enable": "true"}) as broker:
            spark = session(tmp)
            try:
                value = os.urandom(VALUE_BYTES // 2).hex()
                to_write = (spark.range(0, rows, numPartitions=partitions)
                            .selectExpr("cast(format_string('key-%012d', id) as binary) as key",
                                        f"cast('{value}' as binary) as value").cache())
                assert to_write.count() == rows
                register_floor(spark)
                times: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
                for rep in range(-1, repeats):  # -1: warm-up, not kept
                    if rep == 0:
                        times = {k: [] for k in KINDS}
                        load = LoadMeter(lambda: tree_cpu_seconds(with_this=False))
                    for guarantee, kind in (("exactly-once", "exactly_once"),
                                            ("at-least-once", "at_least_once")):
                        topic = f"out-{kind}-{rep + 1}"
                        with oncelog.Admin({"bootstrap.servers": broker.bootstrap}) as admin:
                            admin.create_topic(topic, partitions)
                        times[kind].append(timed(
                            lambda topic=topic, guarantee=guarantee:
                            to_write.write.format("oncelog").mode("append")
                            .option("bootstrap.servers", broker.bootstrap)
                            .option("topic", topic).option("guarantee", guarantee)
                            .option("transactionalIdPrefix", f"bench-{topic}").save()))
                    out = str(Path(tmp) / f"out-{rep + 1}.parquet")
                    times["parquet"].append(timed(lambda out=out: to_write.write.parquet(out)))
                    shutil.rmtree(out)
                    times["arrow_floor"].append(timed(
                        lambda: to_write.write.format("arrow_floor").mode("append").save()))
                    print(f"  {'warm-up' if rep < 0 else f'#{rep + 1}'}: " + ", ".join(
                        f"{k} {rows / v[-1][0]:,.0f} rows/s ({v[-1][1]:.2f} CPU s)"
                        for k, v in times.items()), flush=True)
                others = load.others_share()
                written = (spark.read.format("oncelog")
                           .option("bootstrap.servers", broker.bootstrap)
                           .option("subscribe", f"out-exactly_once-{repeats}").load().count())
                assert written == rows
            finally:
                spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rates = {k: rows / median([wall for wall, _ in v]) for k, v in times.items()}
    cpu = {k: median([cpu for _, cpu in v]) for k, v in times.items()}
    return {"rows": rows, "repeats": repeats, "partitions": partitions,
            "value_bytes": VALUE_BYTES, "machine": machine(), "rows_per_second": rates,
            "cpu_seconds": cpu, "others_cpu_share": others,
            "load_average": os.getloadavg(),
            "exactly_once_vs_at_least_once": rates["exactly_once"] / rates["at_least_once"],
            "exactly_once_vs_parquet": rates["exactly_once"] / rates["parquet"],
            "at_least_once_vs_parquet": rates["at_least_once"] / rates["parquet"],
            "floor_vs_parquet": rates["arrow_floor"] / rates["parquet"],
            "exactly_once_vs_floor": rates["exactly_once"] / rates["arrow_floor"],
            "seconds": times}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=2, help="tasks and topic partitions")
    add_json_argument(parser, "write every result here as JSON")
    args, _ = parser.parse_known_args(argv)
    result = run(args.rows, args.repeats, args.partitions)
    rates = result["rows_per_second"]
    print(f"spark_sink: {args.rows:,} rows of {VALUE_BYTES} B values, {args.partitions} "
          f"partitions, Spark local[2], median of {args.repeats}")
    print(f"  exactly-once {rates['exactly_once']:>10,.0f} rows/s, at-least-once "
          f"{rates['at_least_once']:>10,.0f} rows/s, Parquet {rates['parquet']:>10,.0f} rows/s")
    print(f"  exactly-once / at-least-once = {result['exactly_once_vs_at_least_once']:.3f} "
          f"(goal >= 0.8), exactly-once / Parquet = {result['exactly_once_vs_parquet']:.3f} "
          "(goal >= 1.0)")
    print(f"  floor: arrow_floor {rates['arrow_floor']:>10,.0f} rows/s: floor / Parquet = "
          f"{result['floor_vs_parquet']:.3f}, exactly-once / floor = "
          f"{result['exactly_once_vs_floor']:.3f}, at-least-once / Parquet = "
          f"{result['at_least_once_vs_parquet']:.3f}")
    cpu = result["cpu_seconds"]
    print("  CPU seconds per write (this process tree: JVM, Python workers, broker): " +
          ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()) +
          f"; other processes used {result['others_cpu_share']:.0%} of the CPUs meanwhile, "
          f"load average {' '.join(f'{x:.2f}' for x in result['load_average'])}")
    write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
