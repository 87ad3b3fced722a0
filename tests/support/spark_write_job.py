"""A Spark driver of its own for the exactly-once write tests, run as a subprocess so that a
test can kill -9 it (its process group: the Python driver and Spark's JVM) or start Spark with
settings the shared session does not have.

    spark_write_job.py batch BOOTSTRAP TOPIC ROWS PREFIX [--hold-commit FILE] [--slow-task]
    spark_write_job.py stream BOOTSTRAP SOURCE TOPIC CHECKPOINT PER_BATCH [--hold-after N FILE]

batch: writes rows 0..ROWS-1 (value "i", key "k{i % 4}") in 2 tasks (PREFIX "-": the sink's
default prefix). ``--hold-commit``
touches FILE when the tasks are done and the driver's commit() begins, then waits (for the
kill). ``--slow-task``: speculation is on and the first attempt of partition 0 stalls for a
while after its rows, so that a speculative attempt writes the same rows at the same time.

stream: SOURCE -> TOPIC, value and key as they are, maxOffsetsPerTrigger PER_BATCH, until
what is there now is written (Trigger.AvailableNow). ``--hold-after N FILE``: once
micro-batch N is committed by the sink, touch FILE and wait (Spark has not checkpointed it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

try:  # run as a script: its neighbours in tests/support/, which _job puts on PYTHONPATH
    import sparks
    from held_sink import held_source
except ImportError:  # imported by a test (write_batch, copy_stream in the shared session)
    from support import sparks
    from support.held_sink import held_source

from oncelog.spark.source import OncelogDataSource

HOLD = 600.0  # seconds a held driver waits for its kill
# The slow attempt's stall, well past the other task's time (Python workers start slowly on
# a busy machine): a speculative attempt of the partition starts meanwhile.
STALL = 30.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("batch", "stream"))
    parser.add_argument("args", nargs="+")
    parser.add_argument("--hold-commit")
    parser.add_argument("--hold-after", nargs=2)
    parser.add_argument("--slow-task", action="store_true")
    a = parser.parse_args()
    master = "local[2]"
    session = sparks.spark_session(master) if not a.slow_task else _speculating()
    session.dataSource.register(OncelogDataSource)
    fmt = "oncelog"
    if a.hold_commit or a.hold_after:
        hold = Path(a.hold_commit or a.hold_after[1])
        after = int(a.hold_after[0]) if a.hold_after else None
        session.dataSource.register(held_source(hold, None, HOLD, after))
        fmt = "oncelog_held"
    if a.mode == "batch":
        bootstrap, topic, rows, prefix = a.args
        write_batch(session, fmt, bootstrap, topic, int(rows), prefix, a.slow_task)
    else:
        bootstrap, source, topic, checkpoint, per_batch = a.args
        copy_stream(session, fmt, bootstrap, source, topic, checkpoint, per_batch)
    sparks.stop()


def _speculating():
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ.update(sparks.JAVA_ENV)
    # Spark speculates only outside local mode, and never on the host of the slow attempt:
    # the test runs a standalone cluster whose two workers are 127.0.0.2 and 127.0.0.3.
    master = os.environ["SPARK_MASTER_URL"]
    session = (SparkSession.builder.master(master).appName("oncelog-speculation")
               .config("spark.executor.memory", "512m")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.speculation", "true")
               .config("spark.speculation.interval", "100ms")
               .config("spark.speculation.multiplier", "1.1")
               .config("spark.speculation.quantile", "0.5")
               .config("spark.speculation.minTaskRuntime", "1s")
               .config(map=sparks.worker_config())  # (the executors' PYTHONPATH with it)
               .getOrCreate())
    session.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "ERROR"))
    sparks._current.update(session=session, master=master)
    return session


def write_batch(spark, fmt: str, bootstrap: str, topic: str, rows: int, prefix: str,
           slow: bool) -> None:
    def stall(i: int) -> int:
        from pyspark import TaskContext

        context = TaskContext.get()
        if i == 0 and context.partitionId() == 0 and context.attemptNumber() == 0:
            time.sleep(STALL)
        return i

    spark.udf.register("stall", stall, "long")
    df = spark.range(0, rows, numPartitions=2).selectExpr(
        "cast(id as string) as value", "concat('k', cast(id % 4 as string)) as key",
        "stall(id) as ignored" if slow else "id as ignored")
    write = df.write.format(fmt).mode("append").option("bootstrap.servers", bootstrap) \
        .option("topic", topic)
    if prefix != "-":
        write = write.option("transactionalIdPrefix", prefix)
    write.save()


def copy_stream(spark, fmt: str, bootstrap: str, source: str, topic: str, checkpoint: str,
            per_batch: str) -> None:
    query = (spark.readStream.format("oncelog").option("bootstrap.servers", bootstrap)
             .option("subscribe", source).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", per_batch).load()
             .selectExpr("key", "value")
             .writeStream.format(fmt).option("bootstrap.servers", bootstrap)
             .option("topic", topic).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    try:
        if not query.awaitTermination(600):
            raise RuntimeError("the stream did not finish in time")
    finally:
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"the stream failed: {query.exception()}")


if __name__ == "__main__":
    main()
