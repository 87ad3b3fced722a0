"""Spark's Kafka source options on format("oncelog") with real Spark (the shared local[2]
session) and one real broker for the module: positions by time (ListOffsets by timestamp,
Spark's precedence and no-match strategies), maxRecordsPerPartition, minOffsetsPerTrigger /
maxTriggerDelay admission, and a stream a user can watch (progress, its consumer group's
lag); and the limit of Spark's Python source API: no custom metrics in the progress."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from support.brokers import BrokerProcess
from support.spark_read_helpers import TIMEOUT, create, produce

import oncelog

T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("kafka-source") / "data").start()
    yield broker.bootstrap
    assert broker.stop() == 0, broker.log_text()
    assert "Traceback" not in broker.log_text(), broker.log_text()


def read(spark, bootstrap: str, **options):
    reader = spark.read.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def stamps(df) -> list[int]:
    return sorted(int(r.value) for r in df.select("value").collect())


def test_positions_by_time_and_records_per_spark_partition(spark, bootstrap):
    create(bootstrap, "times", 2)
    # Record i at T0 + 10 i in partition i % 2: value i.
    produce(bootstrap, "times", [(i % 2, None, b"%d" % i, None, T0 + 10 * i)
                                 for i in range(100)])
    t = "times"
    # startingTimestamp > startingOffsetsByTimestamp > startingOffsets, as in Spark; an end
    # by time is exclusive (the first offset at or after it).
    df = read(spark, bootstrap, subscribe=t, startingTimestamp=str(T0 + 300),
              startingOffsetsByTimestamp=f'{{"{t}": {{"0": {T0}, "1": {T0}}}}}',
              startingOffsets="earliest", endingTimestamp=str(T0 + 705))
    assert stamps(df) == list(range(30, 71))
    df = read(spark, bootstrap, subscribe=t, startingOffsets="earliest",
              startingOffsetsByTimestamp=f'{{"{t}": {{"0": {T0 + 500}, "1": {T0 + 10}}}}}',
              endingOffsetsByTimestamp=f'{{"{t}": {{"0": {T0 + 600}, "1": {T0 + 99_999}}}}}')
    assert stamps(df) == [i for i in range(100)
                          if (i % 2 == 0 and 50 <= i < 60) or (i % 2 == 1 and i >= 1)]
    # No record that late: an error naming the partition (the default strategy), or with
    # startingOffsetsByTimestampStrategy=latest the partition's latest offset.
    with pytest.raises(Exception, match=r"option startingTimestamp: no offset matched from "
                                        r"request of topic-partition times-[01] and "
                                        rf"timestamp {T0 + 5000}"):
        read(spark, bootstrap, subscribe=t, startingTimestamp=str(T0 + 5000)).collect()
    assert read(spark, bootstrap, subscribe=t, startingTimestamp=str(T0 + 5000),
                startingOffsetsByTimestampStrategy="latest").count() == 0
    with pytest.raises(Exception, match=r"option startingOffsetsByTimestamp: names no "
                                        r"timestamp for times-1"):
        read(spark, bootstrap, subscribe=t,
             startingOffsetsByTimestamp=f'{{"{t}": {{"0": {T0}}}}}').collect()

    # maxRecordsPerPartition: 50 offsets a partition, at most 8 a Spark task -> 7 tasks each.
    df = read(spark, bootstrap, subscribe=t, maxRecordsPerPartition="8")
    assert df.rdd.getNumPartitions() == 14 and stamps(df) == list(range(100))
    df = read(spark, bootstrap, subscribe=t, maxRecordsPerPartition="25", minPartitions="6")
    assert df.rdd.getNumPartitions() >= 6


def flow(spark, bootstrap: str, checkpoint, delay: str):
    return (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", "flow").option("startingOffsets", "earliest")
            .option("minOffsetsPerTrigger", "50").option("maxTriggerDelay", delay)
            .option("kafka.group.id", "flow-watch").load()
            .selectExpr("cast(value as string) as value")
            .writeStream.format("memory").queryName("flow_rows").outputMode("append")
            .option("checkpointLocation", str(checkpoint)).start())


def test_admission_and_a_stream_a_user_can_watch(spark, bootstrap, tmp_path):
    create(bootstrap, "flow", 2)
    produce(bootstrap, "flow", [(i % 2, None, b"%d" % i, None, None) for i in range(30)])
    query = flow(spark, bootstrap, tmp_path / "checkpoint", "1h")
    try:
        def rows() -> int:
            return spark.table("flow_rows").count()

        query.processAllAvailable()  # a query's first trigger always runs
        assert rows() == 30
        produce(bootstrap, "flow", [(i % 2, None, b"%d" % i, None, None) for i in range(30, 60)])
        query.processAllAvailable()  # 30 new offsets < minOffsetsPerTrigger: no micro-batch
        assert rows() == 30
        produce(bootstrap, "flow", [(i % 2, None, b"%d" % i, None, None)
                                    for i in range(60, 90)])
        query.processAllAvailable()  # 60 >= 50: one micro-batch with all of them
        assert rows() == 90
        batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
        assert [p["numInputRows"] for p in batches] == [30, 60]

        # The progress shows each partition's end (latestOffset) beside the micro-batch's
        # endOffset: here equal, the broker's high watermarks; the source's metrics stay
        # empty (the limit: Spark's Python source API cannot report custom metrics, where
        # Spark's Kafka source reports min/max/avgOffsetsBehindLatest).
        source = batches[-1]["sources"][0]
        assert json.loads(source["endOffset"]) == json.loads(source["latestOffset"]) == \
            {"flow": {"0": 45, "1": 45}}
        assert source["metrics"] == {}

        # The query's group holds the end of each micro-batch Spark has moved past (Spark
        # commits a batch's offsets to its source as it starts the next): batch 0's here.
        with oncelog.Admin({"bootstrap.servers": bootstrap}) as admin:
            committed = {(tp.topic, tp.partition): o.offset
                         for tp, o in admin.list_group_offsets("flow-watch").items()}
        assert committed == {("flow", 0): 15, ("flow", 1): 15}
        described = subprocess.run(
            [sys.executable, "-m", "oncelog", "groups", "describe", "--bootstrap-server",
             bootstrap, "--group", "flow-watch"], capture_output=True, text=True,
            timeout=TIMEOUT, check=True).stdout
        lags = [line.split()[:6] for line in described.splitlines()
                if line.startswith("flow-watch")]
        assert lags == [["flow-watch", "flow", "0", "15", "45", "30"],
                        ["flow-watch", "flow", "1", "15", "45", "30"]]
    finally:
        query.stop()
    assert query.exception() is None

    # maxTriggerDelay: a query with a 1 s delay (its first trigger reads the 90 there); then
    # 10 new offsets, fewer than the minimum (which held 30 back above for as long as it was
    # asked), run once the delay has passed.
    query = flow(spark, bootstrap, tmp_path / "checkpoint-delay", "1s")
    try:
        query.processAllAvailable()
        produce(bootstrap, "flow", [(i % 2, None, b"%d" % i, None, None)
                                    for i in range(90, 100)])
        deadline = time.monotonic() + TIMEOUT
        while not [p for p in query.recentProgress if p["numInputRows"] == 10]:
            assert time.monotonic() < deadline, query.recentProgress
            assert query.exception() is None, query.exception()
            query.awaitTermination(0.2)  # bounded wait for the next trigger's progress
    finally:
        query.stop()
    assert query.exception() is None
