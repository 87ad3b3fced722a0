"""An end-to-end pipeline on oncelog and Spark: ``make demo`` (or ``python examples/pipeline.py``).

1. Generate click events into the topic ``clicks`` with oncelog's idempotent producer.
2. A Structured Streaming job reads ``clicks`` with ``format("oncelog")``, counts clicks per
   page and writes each page's running count to the topic ``page-counts`` (keyed by page),
   a few thousand events per micro-batch (complete mode: each micro-batch appends every
   page's count so far), with its checkpoint on disk.
3. More events arrive; the same job is started again and carries on from its checkpoint.
4. ``oncelog audit --spark``'s job checks ``clicks``: no duplicate, gap or reordering.
5. The last count written per page is compared with the events generated.

It starts its own broker on 127.0.0.1 (an ephemeral port, a temporary directory) unless given
``--bootstrap-server``. ``--master`` picks Spark's master (default local[*]).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
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
         "--set", f"log.dirs={data_dir}", "--set", "num.partitions=4"],
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
        for _ in range(n):
            page = rng.choice(PAGES)
            user = f"user-{rng.randrange(500)}"
            event = {"user": user, "page": page, "ms": rng.randrange(50, 5000)}
            producer.produce("clicks", json.dumps(event).encode(), key=user.encode())
            sent[page] += 1
        producer.flush()
    print(f"  produced {n:,} events into clicks")
    return sent


def count_pages(spark, bootstrap: str, checkpoint: str) -> None:
    """The streaming job: clicks per page, running totals written to page-counts."""
    clicks = (spark.readStream.format("oncelog")
              .option("bootstrap.servers", bootstrap)
              .option("subscribe", "clicks")
              .option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", 8000)
              .load())
    counts = (clicks
              .selectExpr("get_json_object(cast(value as string), '$.page') as page")
              .groupBy("page").count()
              .selectExpr("cast(page as binary) as key",
                          "cast(to_json(named_struct('page', page, 'clicks', count)) as binary) "
                          "as value"))
    query = (counts.writeStream.format("oncelog")
             .option("bootstrap.servers", bootstrap)
             .option("topic", "page-counts")
             .option("checkpointLocation", checkpoint)
             .outputMode("complete")  # each trigger appends every page's count
             .trigger(availableNow=True)
             .start())
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"the streaming job failed: {query.exception()}")
    for progress in query.recentProgress:
        if progress["numInputRows"]:
            print(f"  micro-batch {progress['batchId']}: {progress['numInputRows']:,} events "
                  f"in, source now at {progress['sources'][0]['endOffset']}")


def latest_counts(spark, bootstrap: str) -> dict[str, int]:
    """The last count written for each page: the newest record per key."""
    rows = (spark.read.format("oncelog").option("bootstrap.servers", bootstrap)
            .option("subscribe", "page-counts").load()
            .selectExpr("cast(key as string) as page", "offset", "partition",
                        "cast(get_json_object(cast(value as string), '$.clicks') as long) "
                        "as clicks")
            .collect())
    newest = {}
    for row in sorted(rows, key=lambda r: (r.partition, r.offset)):
        newest[row.page] = row.clicks
    return newest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-server", help="use this broker instead of starting one")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--events", type=int, default=20_000, help="events per wave")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="oncelog-demo-") as tmp:
        broker = None
        bootstrap = args.bootstrap_server
        if bootstrap is None:
            broker, bootstrap = start_broker(str(Path(tmp) / "data"))
            print(f"broker on {bootstrap}")
        try:
            with oncelog.Admin({"bootstrap.servers": bootstrap}) as admin:
                for topic in ("clicks", "page-counts"):
                    if topic not in admin.metadata().topics:
                        admin.create_topic(topic, 4)
            spark = local_session(args.master, "oncelog demo")
            # A few state partitions, not Spark's default 200: the job's state is 8 counts.
            spark.conf.set("spark.sql.shuffle.partitions", "4")
            checkpoint = str(Path(tmp) / "checkpoint")
            print("1. generating events")
            sent = generate(bootstrap, args.events, seed=1)
            print("2. the streaming job: clicks per page -> page-counts")
            count_pages(spark, bootstrap, checkpoint)
            print("3. more events, and the same job again from its checkpoint")
            sent += generate(bootstrap, args.events // 2, seed=2)
            count_pages(spark, bootstrap, checkpoint)
            print("4. the audit of clicks, on Spark")
            report = audit_topic_on_spark(spark, bootstrap, "clicks")
            format_report(report)
            print("5. the counts in page-counts against the events sent")
            counted = latest_counts(spark, bootstrap)
            for page in PAGES:
                print(f"  {page:10} sent {sent[page]:6,}  counted {counted.get(page, 0):6,}")
            spark.stop()
        finally:
            if broker is not None:
                broker.terminate()
                broker.wait(START_TIMEOUT)
    ok = report.clean and counted == dict(sent)
    print(f"{'OK' if ok else 'MISMATCH'}: {sum(sent.values()):,} events, "
          f"{time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
