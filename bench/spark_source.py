"""format("oncelog") on Spark against Parquet files holding the same rows: rows per second.

    .venv/bin/python bench/spark_source.py [--rows 100000] [--repeats 3] [--partitions 2]
                                           [--skip-writes] [--json PATH]

Spark local[2]; one oncelog broker on 127.0.0.1 with a fresh temporary log.dirs; values of
1 KiB, 16-byte keys, no compression. Every run forces every row and column through Spark with
the ``noop`` sink, so nothing is pruned or skipped:

* read:  ``spark.read.format("oncelog")`` of the whole topic, and ``spark.read.parquet`` of the
  same rows (written once from the topic, same columns); and, as the floor of any Python data
  source, ``arrow_floor``: a Python data source with the same schema, partitions and Arrow
  batches, each column built with one copy in the task and nothing fetched or decoded
  (what Spark itself spends taking Arrow batches from Python workers);
* write: the same DataFrame (key, value; cached in memory first, so its source costs neither
  side anything) written with ``df.write.format("oncelog")`` to a new topic each run (one
  idempotent producer per Spark task), and with ``df.write.parquet`` to a new directory.

Each measurement runs once as a warm-up (Spark starts its Python workers, the JVM compiles)
before the runs that count. Printed: median rows/s of each and the ratios oncelog / Parquet
and oncelog / arrow_floor, measured in this run; and for each read the CPU seconds per query
of the Spark JVM, of its Python workers and of the broker (the sum of their threads'
on-CPU time, which a loaded machine does not inflate as it does wall-clock time). The goal
(issue 15) is read >= 1.0x Parquet; arrow_floor / Parquet says how much of that any Python
data source can reach.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _support import (
    OncelogBroker,
    add_json_argument,
    cpu_seconds_probe,
    machine,
    median,
    write_json,
)
from confluent_kafka import Producer

import oncelog

VALUE_BYTES = 1024
ROWS_PER_BATCH = 10_000  # as the oncelog source hands Spark


def register_floor(spark) -> None:
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from oncelog.spark.columns import arrow_schema
    from oncelog.spark.schema import spark_schema

    class FloorReader(DataSourceReader):
        def __init__(self, rows: int, partitions: int) -> None:
            self.rows, self.parts = rows, partitions

        def partitions(self):
            return [InputPartition(p) for p in range(self.parts)]

        def read(self, partition):
            rows = self.rows // self.parts
            schema = arrow_schema(False)
            value, key = b"v" * VALUE_BYTES, b"k" * 16
            for start in range(0, rows, ROWS_PER_BATCH):
                n = min(ROWS_PER_BATCH, rows - start)

                def binary(item: bytes, n: int = n) -> pa.Array:
                    offsets = pa.array(range(0, (n + 1) * len(item), len(item)),
                                       pa.int32()).buffers()[1]
                    return pa.Array.from_buffers(pa.binary(), n, [None, offsets,
                                                                  pa.py_buffer(item * n)])

                def fixed(kind: pa.DataType, width: int, n: int = n) -> pa.Array:
                    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(
                        bytes(width * n))])

                yield pa.RecordBatch.from_arrays([
                    binary(key), binary(value), pa.repeat(pa.scalar("bench"), n),
                    pa.repeat(pa.scalar(partition.value, pa.int32()), n),
                    fixed(pa.int64(), 8), fixed(schema.field("timestamp").type, 8),
                    fixed(pa.int32(), 4), fixed(pa.int64(), 8), fixed(pa.int16(), 2),
                    fixed(pa.int32(), 4)], schema=schema)

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "arrow_floor"

        def schema(self):
            return spark_schema(False)

        def reader(self, schema):
            return FloorReader(int(self.options["rows"]), int(self.options["partitions"]))

    spark.dataSource.register(Floor)


def load_topic(bootstrap: str, topic: str, rows: int, partitions: int) -> None:
    with oncelog.Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(topic, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20, "batch.size": 1 << 20})
    value = os.urandom(VALUE_BYTES // 2).hex().encode()
    for i in range(rows):
        while True:
            try:
                producer.produce(topic, value=value, key=b"key-%012d" % i,
                                 partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0


def session(tmp: str):
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    spark = (SparkSession.builder.master("local[2]").appName("oncelog-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.memory", "4g")
             .config("spark.local.dir", tmp)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _descendants(root: int) -> list[int]:
    """The processes below ``root`` (Spark's Python daemon and the workers it forked)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    # the command name may hold spaces: the parent id follows its ")"
                    parents[int(entry)] = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        children = [p for p, parent in parents.items() if parent == pid]
        found += children
        todo += children
    return found


class CpuMeter:
    """CPU seconds the Spark JVM, its Python workers and the broker spend on an action."""

    def __init__(self, jvm: int, broker: int) -> None:
        self.jvm, self.broker = jvm, broker

    def _sample(self) -> dict[str, float | dict[int, float]]:
        workers = {}
        for pid in _descendants(self.jvm):
            try:
                workers[pid] = cpu_seconds_probe(pid)()
            except OSError:  # gone meanwhile
                pass
        return {"jvm": cpu_seconds_probe(self.jvm)(), "workers": workers,
                "broker": cpu_seconds_probe(self.broker)()}

    def measure(self, action) -> tuple[float, dict[str, float]]:
        """(wall seconds, CPU seconds of "jvm", "workers" and "broker") of ``action()``."""
        before = self._sample()
        seconds = timed(action)
        after = self._sample()
        return seconds, {
            "jvm": after["jvm"] - before["jvm"], "broker": after["broker"] - before["broker"],
            "workers": sum(cpu - before["workers"].get(pid, 0.0)
                           for pid, cpu in after["workers"].items())}


def run(rows: int, repeats: int, partitions: int, skip_writes: bool = False) -> dict:
    tmp = tempfile.mkdtemp(prefix="oncelog-bench-spark-")
    try:
        # Two-phase commit allowed: format("oncelog") writes exactly once by default.
        with OncelogBroker({"transaction.two.phase.commit.enable": "true"}) as broker:
            load_topic(broker.bootstrap, "bench", rows, partitions)
            spark = session(tmp)
            try:
                source = (spark.read.format("oncelog")
                          .option("bootstrap.servers", broker.bootstrap)
                          .option("subscribe", "bench").load())
                parquet = str(Path(tmp) / "bench.parquet")
                source.write.parquet(parquet)
                assert spark.read.parquet(parquet).count() == rows
                to_write = spark.read.parquet(parquet).select("key", "value").cache()
                assert to_write.count() == rows

                register_floor(spark)
                floor = (spark.read.format("arrow_floor").option("rows", str(rows))
                         .option("partitions", str(partitions)).load())
                assert floor.count() == rows
                meter = CpuMeter(spark.sparkContext._gateway.proc.pid, broker.pid)
                reads = {
                    "read_oncelog": lambda: source.write.format("noop").mode("overwrite").save(),
                    "read_parquet": lambda: spark.read.parquet(parquet).write.format("noop")
                    .mode("overwrite").save(),
                    "read_arrow_floor": lambda: floor.write.format("noop").mode("overwrite")
                    .save()}
                cpu: dict[str, dict[str, list[float]]] = {}
                times: dict[str, list[float]] = {k: [] for k in
                                                 ("read_oncelog", "read_parquet",
                                                  "read_arrow_floor", "write_oncelog",
                                                  "write_parquet")}
                for rep in range(-1, repeats):  # -1: warm-up (Python workers, JIT), not kept
                    if rep == 0:
                        times = {k: [] for k in times}
                        cpu = {k: {"jvm": [], "workers": [], "broker": []} for k in reads}
                    for name, action in reads.items():
                        seconds, used = meter.measure(action)
                        times[name].append(seconds)
                        for part, value in used.items():
                            cpu.setdefault(name, {}).setdefault(part, []).append(value)
                    if skip_writes:
                        print(f"  {'warm-up' if rep < 0 else f'#{rep + 1}'}: " + ", ".join(
                            f"{k} {rows / times[k][-1]:,.0f} rows/s" for k in reads),
                            flush=True)
                        continue
                    topic = f"bench-out-{rep + 1}"
                    with oncelog.Admin({"bootstrap.servers": broker.bootstrap}) as admin:
                        admin.create_topic(topic, partitions)
                    times["write_oncelog"].append(timed(
                        lambda topic=topic: to_write.write.format("oncelog").mode("append")
                        .option("bootstrap.servers", broker.bootstrap).option("topic", topic)
                        .save()))
                    out = str(Path(tmp) / f"out-{rep + 1}.parquet")
                    times["write_parquet"].append(timed(lambda out=out: to_write.write.parquet(
                        out)))
                    shutil.rmtree(out)
                    with oncelog.Admin({"bootstrap.servers": broker.bootstrap}) as admin:
                        admin.delete_topic(topic)
                    print(f"  {'warm-up' if rep < 0 else f'#{rep + 1}'}: " + ", ".join(
                        f"{k} {rows / v[-1]:,.0f} rows/s" for k, v in times.items()), flush=True)
                written = (spark.read.format("oncelog")
                           .option("bootstrap.servers", broker.bootstrap)
                           .option("subscribe", "bench").load().count())
                assert written == rows
            finally:
                spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rates = {k: rows / median(v) for k, v in times.items() if v}
    return {"rows": rows, "repeats": repeats, "partitions": partitions,
            "value_bytes": VALUE_BYTES, "machine": machine(), "rows_per_second": rates,
            "read_ratio": rates["read_oncelog"] / rates["read_parquet"],
            "floor_ratio": rates["read_arrow_floor"] / rates["read_parquet"],
            "read_to_floor": rates["read_oncelog"] / rates["read_arrow_floor"],
            "write_ratio": (rates["write_oncelog"] / rates["write_parquet"]
                            if not skip_writes else None),
            "cpu_seconds_per_query": {k: {part: median(v) for part, v in parts.items()}
                                      for k, parts in cpu.items()},
            "cpu_seconds": cpu, "seconds": {k: v for k, v in times.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=2, help="topic partitions")
    add_json_argument(parser, "write every result here as JSON")
    parser.add_argument("--skip-writes", action="store_true", help="measure the reads only")
    args, _ = parser.parse_known_args(argv)
    result = run(args.rows, args.repeats, args.partitions, args.skip_writes)
    rates = result["rows_per_second"]
    print(f"spark_source: {args.rows:,} rows of {VALUE_BYTES} B values, {args.partitions} "
          f"partitions, Spark local[2], median of {args.repeats}")
    print(f"  read : oncelog {rates['read_oncelog']:>10,.0f} rows/s, Parquet "
          f"{rates['read_parquet']:>10,.0f} rows/s, oncelog / Parquet = "
          f"{result['read_ratio']:.3f}")
    print(f"  floor: arrow_floor {rates['read_arrow_floor']:>10,.0f} rows/s: floor / Parquet = "
          f"{result['floor_ratio']:.3f}, oncelog / floor = {result['read_to_floor']:.3f}")
    for name, parts in result["cpu_seconds_per_query"].items():
        print(f"  CPU s per query, {name[5:]:<11}: JVM {parts['jvm']:.3f}, Python workers "
              f"{parts['workers']:.3f}, broker {parts['broker']:.3f}")
    if not args.skip_writes:
        print(f"  write: oncelog {rates['write_oncelog']:>10,.0f} rows/s, Parquet "
              f"{rates['write_parquet']:>10,.0f} rows/s, oncelog / Parquet = "
              f"{result['write_ratio']:.3f}")
    write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
