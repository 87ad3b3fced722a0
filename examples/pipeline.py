"""An end-to-end pipeline on oncelog and Spark, exactly once through failures: ``make demo``
(or ``python examples/pipeline.py``).

1. Generate click events into the topic ``clicks`` with oncelog's idempotent producer.
2. A batch job copies ``clicks`` into ``clicks-by-page`` (keyed by page) with
   ``df.write.format("oncelog")``: exactly-once, each task in a transaction the driver
   commits. One task fails once in the middle of its rows; Spark runs it again.
3. A Structured Streaming job (a driver process of its own) copies ``clicks-by-page`` into
   ``page-views``, a few thousand events per micro-batch. Its driver is killed (kill -9)
   right after the sink committed micro-batch 1 and before Spark checkpointed it; started
   again from its checkpoint, it runs micro-batch 1 again, which the sink recognises as
   committed, and carries on.
4. ``oncelog audit --spark``'s job checks ``clicks``, ``clicks-by-page`` and ``page-views``
   (no duplicate, gap or reordering; no aborted record visible to read_committed readers, no
   transaction left open or torn; with ``--by value``, no value committed twice); a
   read_committed reader checks that both outputs hold
   every click exactly once, and the clicks per page are compared with the events
   generated.

It starts its own broker on 127.0.0.1 (an ephemeral port, a temporary directory, two-phase
commit allowed) unless given ``--bootstrap-server``. ``--master`` picks Spark's master
(default local[*,2]: up to two attempts per task).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import oncelog
from oncelog.audit import format_report
from oncelog.broker.announce import wait_for_port
from oncelog.spark.audit import audit_topic_on_spark, local_session

PAGES = ["/", "/pricing", "/docs", "/blog", "/signup", "/login", "/about", "/careers"]
START_TIMEOUT = 30.0


def start_broker(data_dir: str) -> tuple[subprocess.Popen, str]:
    """``oncelog broker`` on 127.0.0.1, port chosen by the system; returns it and its address."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "oncelog", "broker", "--set", "listeners=PLAINTEXT://127.0.0.1:0",
         "--set", f"log.dirs={data_dir}", "--set", "num.partitions=4",
         "--set", "transaction.two.phase.commit.enable=true"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    port = wait_for_port(proc, START_TIMEOUT)
    if port is not None:
        return proc, f"127.0.0.1:{port}"
    proc.kill()
    raise SystemExit("the broker did not start")


def generate(bootstrap: str, n: int, seed: int) -> collections.Counter:
    """``n`` click events (JSON) keyed by user; returns the clicks per page sent."""
    rng = random.Random(seed)
    sent: collections.Counter = collections.Counter()
    with oncelog.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as producer:
        for i in range(n):
            page = rng.choice(PAGES)
            user = f"user-{rng.randrange(500)}"
            # The id makes every event's bytes unique: a value twice is a repeat.
            event = {"id": i, "user": user, "page": page, "ms": rng.randrange(50, 5000)}
            producer.produce("clicks", json.dumps(event).encode(), key=user.encode())
            sent[page] += 1
        producer.flush()
    print(f"  produced {n:,} events into clicks")
    return sent


def copy_by_page(spark, bootstrap: str) -> None:
    """The batch job: clicks -> clicks-by-page, keyed by page; the task of partition 1
    fails once after half its rows (Spark retries it: master local[*,2])."""

    def fail_once(value: bytes, row: int) -> bytes:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context.partitionId() == 1 and context.attemptNumber() == 0 and row == 2000:
            raise RuntimeError("a task fails once, in the middle of its rows")
        return value

    spark.udf.register("fail_once", fail_once, "binary")
    clicks = (spark.read.format("oncelog").option("bootstrap.servers", bootstrap)
              .option("subscribe", "clicks").load())
    (clicks.selectExpr("cast(get_json_object(cast(value as string), '$.page') as binary) "
                       "as key", "fail_once(value, cast(offset as int)) as value")
     .write.format("oncelog").mode("append")  # Spark's default mode is refused: append
     .option("bootstrap.servers", bootstrap).option("topic", "clicks-by-page").save())
    print("  written exactly once, though one task failed halfway and ran again")


def _crashing_oncelog(held: Path, after_batch: int):
    """``format("oncelog")`` whose stream commit, once the sink committed ``after_batch``,
    tells the demo to kill this driver (by creating ``held``) and waits for it."""
    from oncelog.spark.source import OncelogDataSource

    class Crashing(OncelogDataSource):
        @classmethod
        def name(cls) -> str:
            return "oncelog_crashing"

        def streamWriter(self, schema, overwrite):
            writer = super().streamWriter(schema, overwrite)
            real = writer.commit

            def commit(messages, batch_id: int) -> None:
                real(messages, batch_id)
                if batch_id == after_batch:
                    held.touch()
                    time.sleep(600)

            writer.commit = commit
            return writer

    return Crashing


def stream_job(bootstrap: str, checkpoint: str, held: str | None, master: str) -> None:
    """The streaming job, in a driver process of its own: clicks-by-page -> page-views."""
    spark = local_session(master, "oncelog demo stream")
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    fmt = "oncelog"
    if held is not None:
        spark.dataSource.register(_crashing_oncelog(Path(held), 1))
        fmt = "oncelog_crashing"
    query = (spark.readStream.format("oncelog").option("bootstrap.servers", bootstrap)
             .option("subscribe", "clicks-by-page").option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", 4000).load()
             .selectExpr("key", "value")
             .writeStream.format(fmt).option("bootstrap.servers", bootstrap)
             .option("topic", "page-views").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"the streaming job failed: {query.exception()}")
    for progress in query.recentProgress:
        if progress["numInputRows"]:
            print(f"  micro-batch {progress['batchId']}: {progress['numInputRows']:,} events")
    spark.stop()


def run_stream(bootstrap: str, checkpoint: str, master: str, tmp: str) -> None:
    """The streaming job's driver killed after the sink's commit of micro-batch 1, then
    started again."""
    held = Path(tmp) / "held"
    command = [sys.executable, __file__, "--stream-job", "--bootstrap-server", bootstrap,
               "--checkpoint", checkpoint, "--master", master]
    driver = subprocess.Popen([*command, "--hold", str(held)], start_new_session=True)
    deadline = time.monotonic() + 600
    while not held.exists() and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if driver.poll() is None:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and Spark's JVM
        driver.wait()
        print("  driver killed (-9) after the sink committed micro-batch 1, before Spark's "
              "checkpoint; started again:")
    if subprocess.run(command).returncode != 0:
        raise SystemExit("the streaming job failed")


def committed_values(bootstrap: str, topic: str) -> collections.Counter:
    """Every value a read_committed reader finds in ``topic``, with its count."""
    with oncelog.Admin({"bootstrap.servers": bootstrap}) as admin:
        partitions = len(admin.metadata([topic]).topics[topic].partitions)
    with oncelog.Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                           "isolation.level": "read_committed"}) as consumer:
        consumer.assign([oncelog.TopicPartition(topic, p) for p in range(partitions)])
        return collections.Counter(record.value for record in consumer)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-server", help="use this broker instead of starting one")
    parser.add_argument("--master", default="local[*,2]",
                        help="Spark master (default local[*,2]: two attempts per task)")
    parser.add_argument("--events", type=int, default=20_000, help="events generated")
    parser.add_argument("--stream-job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--hold", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stream_job:
        stream_job(args.bootstrap_server, args.checkpoint, args.hold, args.master)
        return 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="oncelog-demo-") as tmp:
        broker = None
        bootstrap = args.bootstrap_server
        if bootstrap is None:
            broker, bootstrap = start_broker(str(Path(tmp) / "data"))
            print(f"broker on {bootstrap}")
        try:
            with oncelog.Admin({"bootstrap.servers": bootstrap}) as admin:
                for topic in ("clicks", "clicks-by-page", "page-views"):
                    if topic not in admin.metadata().topics:
                        admin.create_topic(topic, 4)
            spark = local_session(args.master, "oncelog demo")
            print("1. generating events")
            sent = generate(bootstrap, args.events, seed=1)
            print("2. the batch job: clicks -> clicks-by-page, a task failing once")
            copy_by_page(spark, bootstrap)
            print("3. the streaming job: clicks-by-page -> page-views, its driver killed once")
            run_stream(bootstrap, str(Path(tmp) / "checkpoint"), args.master, tmp)
            print("4. the audit of clicks --by value, on Spark")
            report = audit_topic_on_spark(spark, bootstrap, "clicks", by=("value",))
            format_report(report)
            outputs = {}
            for topic in ("clicks-by-page", "page-views"):
                # --by value counts what read_committed gets: a failed attempt's aborted
                # rows are not repeats, a row committed twice would be.
                print(f"  the audit of {topic} --by value, on Spark")
                outputs[topic] = audit_topic_on_spark(spark, bootstrap, topic, by=("value",))
                format_report(outputs[topic])
            spark.stop()
            clicks = committed_values(bootstrap, "clicks")
            once = True
            for topic in ("clicks-by-page", "page-views"):
                found = committed_values(bootstrap, topic)
                missing, extra = clicks - found, found - clicks
                once = once and not missing and not extra
                print(f"  {topic}: {sum(found.values()):,} records (read_committed), "
                      f"{sum(missing.values())} missing, {sum(extra.values())} extra")
            views: collections.Counter = collections.Counter(
                json.loads(value)["page"] for value in committed_values(bootstrap, "page-views")
                .elements())
            for page in PAGES:
                print(f"  {page:10} sent {sent[page]:6,}  in page-views {views[page]:6,}")
        finally:
            if broker is not None:
                broker.terminate()
                broker.wait(START_TIMEOUT)
    ok = report.clean and all(r.clean for r in outputs.values()) and once and views == sent
    print(f"{'OK' if ok else 'MISMATCH'}: {sum(sent.values()):,} events, each exactly once, "
          f"{time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
