"""spark.read / spark.readStream .format("oncelog") against real brokers, in the shared local[2]
Spark session: what comes back is compared with what oncelog.Consumer reads."""

from __future__ import annotations

import json
import time

import pytest
from support.brokers import produce_batches, wait_for_log_start
from support.spark_read_helpers import TIMEOUT, create, produce

from oncelog import Consumer, TopicPartition

T0 = 1_700_000_000_000


def values(topic_items, partition: int | None = None) -> list[bytes]:
    return [item[2] for item in topic_items if partition is None or item[0] == partition]


def consumer_rows(bootstrap: str, topic: str, partitions: int) -> list[tuple]:
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        return sorted((r.partition, r.offset, r.key, r.value, r.timestamp,
                       [(k, v) for k, v in r.headers], r.producer_id, r.producer_epoch,
                       r.sequence) for r in c)


def reader(spark, bootstrap: str, **options):
    read = spark.read.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        read = read.option(key, value)
    return read.load()


def test_batch_read_matches_the_consumer_record_for_record(spark, broker):
    create(broker.bootstrap, "orders", 2)
    items = [(i % 2, b"k%d" % i if i % 5 else None, b"v%d" % i,
              [("n", b"%d" % i), ("none", None)] if i % 3 else [], T0 + i)
             for i in range(300)]
    produce(broker.bootstrap, "orders", items[:200], **{"enable.idempotence": True})
    produce(broker.bootstrap, "orders", items[200:], **{"enable.idempotence": False,
                                                        "compression.type": "zstd"})
    df = reader(spark, broker.bootstrap, subscribe="orders", includeHeaders="true")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp",
                          "timestampType", "headers", "producerId", "producerEpoch", "sequence"]
    rows = df.collect()
    got = sorted((r.partition, r.offset, r.key, r.value,
                  int(r.timestamp.timestamp() * 1000),
                  [(h.key, h.value) for h in r.headers], r.producerId, r.producerEpoch,
                  r.sequence) for r in rows)
    assert got == consumer_rows(broker.bootstrap, "orders", 2)
    assert {r.topic for r in rows} == {"orders"} and {r.timestampType for r in rows} == {0}
    idempotent = [g for g in got if g[6] >= 0]
    assert len(idempotent) == 200 and [g[8] for g in idempotent if g[0] == 0] == \
        list(range(100))
    assert [g[6:] for g in got if g[3] == b"v250"] == [(-1, -1, -1)]

    without = reader(spark, broker.bootstrap, subscribe="orders")
    assert "headers" not in without.columns and without.count() == 300


def test_offset_ranges_assign_pattern_and_min_partitions(spark, broker):
    for topic in ("clicks-a", "clicks-b", "other"):
        create(broker.bootstrap, topic, 2)
        produce(broker.bootstrap, topic, [(i % 2, None, b"%s-%d" % (topic.encode(), i), None,
                                           T0) for i in range(100)])

    def offsets(df) -> list[tuple]:
        return sorted((r.topic, r.partition, r.offset)
                      for r in df.select("topic", "partition", "offset").collect())

    ranged = reader(spark, broker.bootstrap, subscribe="clicks-a",
                    startingOffsets=json.dumps({"clicks-a": {"0": 10, "1": -2}}),
                    endingOffsets=json.dumps({"clicks-a": {"0": 20}}))
    assert offsets(ranged) == [("clicks-a", 0, o) for o in range(10, 20)] + \
        [("clicks-a", 1, o) for o in range(50)]

    assigned = reader(spark, broker.bootstrap, assign=json.dumps({"clicks-b": [1]}),
                      endingOffsets=json.dumps({"clicks-b": {"1": 5}}))
    assert offsets(assigned) == [("clicks-b", 1, o) for o in range(5)]

    pattern = reader(spark, broker.bootstrap, subscribePattern="clicks-.*")
    assert pattern.count() == 200 and {r.topic for r in pattern.select("topic").collect()} \
        == {"clicks-a", "clicks-b"}

    split = reader(spark, broker.bootstrap, subscribe="clicks-a", minPartitions="7")
    assert split.rdd.getNumPartitions() >= 7
    assert offsets(split) == offsets(reader(spark, broker.bootstrap, subscribe="clicks-a"))


def stream(spark, bootstrap: str, out, checkpoint, **options):
    """Run a stream over ``subscribe`` with Trigger.AvailableNow into Parquet at ``out``;
    returns the progress of each micro-batch."""
    read = (spark.readStream.format("oncelog").option("bootstrap.servers", bootstrap)
            .option("startingOffsets", "earliest"))
    for key, value in options.items():
        read = read.option(key, value)
    query = (read.load().selectExpr("topic", "partition", "offset", "value")
             .writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(TIMEOUT), "the stream did not finish in time"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    return [p for p in query.recentProgress if p["numInputRows"]]


def test_stream_resumes_from_its_checkpoint_without_skipping_or_repeating(
        spark, broker, tmp_path):
    create(broker.bootstrap, "events", 2)
    produce(broker.bootstrap, "events", [(i % 2, None, b"e%d" % i, None, T0)
                                         for i in range(100)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    progress = stream(spark, broker.bootstrap, out, checkpoint, subscribe="events",
                      maxOffsetsPerTrigger="30")
    assert [p["numInputRows"] for p in progress] == [30, 30, 30, 10]
    ends = [json.loads(p["sources"][0]["endOffset"]) for p in progress]
    assert ends[-1] == {"events": {"0": 50, "1": 50}}
    assert all(sum(e["events"].values()) == n for e, n in zip(ends, (30, 60, 90, 100),
                                                               strict=True))

    # More records and a restart from the checkpoint: only the new ones are read.
    produce(broker.bootstrap, "events", [(i % 2, None, b"e%d" % i, None, T0)
                                         for i in range(100, 150)])
    progress = stream(spark, broker.bootstrap, out, checkpoint, subscribe="events")
    assert [p["numInputRows"] for p in progress] == [50]
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.value for r in rows) == sorted(b"e%d" % i for i in range(150))
    assert len({(r.partition, r.offset) for r in rows}) == 150


def test_stream_picks_up_new_topics_of_a_pattern_and_keeps_running(spark, broker, tmp_path):
    create(broker.bootstrap, "logs-1", 1)
    produce(broker.bootstrap, "logs-1", [(0, None, b"a%d" % i, None, T0) for i in range(10)])
    query = (spark.readStream.format("oncelog").option("bootstrap.servers", broker.bootstrap)
             .option("subscribePattern", "logs-.*").option("startingOffsets", "earliest").load()
             .selectExpr("topic", "cast(value as string) value")
             .writeStream.format("memory").queryName("logs")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        query.processAllAvailable()
        assert spark.table("logs").count() == 10
        create(broker.bootstrap, "logs-2", 1)  # a new topic: read from its earliest offset
        produce(broker.bootstrap, "logs-2", [(0, None, b"b%d" % i, None, T0) for i in range(5)])
        produce(broker.bootstrap, "logs-1", [(0, None, b"c%d" % i, None, T0) for i in range(5)])
        deadline = time.monotonic() + TIMEOUT
        while spark.table("logs").count() < 20 and time.monotonic() < deadline:
            query.processAllAvailable()
        got = sorted((r.topic, r.value) for r in spark.table("logs").collect())
    finally:
        query.stop()
    assert got == sorted([("logs-1", f"a{i}") for i in range(10)] +
                         [("logs-1", f"c{i}") for i in range(5)] +
                         [("logs-2", f"b{i}") for i in range(5)])


def settled_retention(broker, topic: str, retention_bytes: int) -> tuple[int, int]:
    """(log start, end) once retention by size has deleted all it will: the oldest segment
    file left is needed to stay within ``retention_bytes``, and the broker says the log
    starts where that file does."""
    tp = TopicPartition(topic, 0)
    deadline = time.monotonic() + TIMEOUT
    with Consumer({"bootstrap.servers": broker.bootstrap}) as c:
        c.assign([tp])
        while True:
            files = sorted((broker.data_dir / f"{topic}-0").glob("*.log"))
            try:
                sizes = [f.stat().st_size for f in files]
            except FileNotFoundError:  # retention deleted one since the listing
                continue
            low, high = c.watermarks(tp)
            if files and sum(sizes) - sizes[0] < retention_bytes and \
                    low == int(files[0].stem) > 0:
                return low, high
            assert time.monotonic() < deadline, f"retention did not settle: {sizes}, {low}"
            time.sleep(0.1)


def test_fail_on_data_loss(spark, start_broker, tmp_path):
    """Retention deletes records a query was about to read: an error naming failOnDataLoss,
    or (failOnDataLoss=false) the query carries on from the new log start."""
    broker = start_broker(**{"log.internal.segment.bytes": "3000",
                             "log.retention.check.interval.ms": "200"})
    create(broker.bootstrap, "short", 1, **{"retention.bytes": "6000"})
    now = int(time.time() * 1000)  # (T0 is older than the default retention of 7 days)
    produce(broker.bootstrap, "short", [(0, None, b"first", None, now)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    assert [p["numInputRows"] for p in stream(spark, broker.bootstrap, out, checkpoint,
                                               subscribe="short")] == [1]
    produce(broker.bootstrap, "short", [(0, None, b"x" * 100 + b"%d" % i, None, now)
                                        for i in range(300)],
            **{"batch.num.messages": 10, "linger.ms": 0})
    low, high = settled_retention(broker, "short", 6000)
    assert low > 1

    from_one = json.dumps({"short": {"0": 1}})
    with pytest.raises(Exception, match=r"failOnDataLoss=false") as failed:
        reader(spark, broker.bootstrap, subscribe="short", startingOffsets=from_one).collect()
    assert f"short-0 starts at {low}, after offset 1" in str(failed.value)
    kept = reader(spark, broker.bootstrap, subscribe="short", failOnDataLoss="false",
                  startingOffsets=from_one)
    assert sorted(r.offset for r in kept.select("offset").collect()) == list(range(low, high))

    with pytest.raises(Exception, match=r"failOnDataLoss=false"):
        stream(spark, broker.bootstrap, out, checkpoint, subscribe="short")
    stream(spark, broker.bootstrap, out, checkpoint, subscribe="short", failOnDataLoss="false")
    assert sorted(r.offset for r in spark.read.parquet(str(out)).collect()) == \
        [0, *range(low, high)]


@pytest.mark.parametrize(("options", "message"), [
    ({"subscribe": "t", "subscribePattern": "t.*"},
     "option subscribe: give exactly one of subscribe"),
    ({"subscibe": "t"}, "option subscibe: unknown option"),
    ({"subscribe": "t", "startingOffsets": "{\"t\": {\"0\": \"x\"}}"},
     "option startingOffsets: offset 'x' of t-0"),
    ({"subscribe": "t", "minPartitions": "0"}, "option minPartitions: must be a whole number"),
    ({"subscribe": "nosuch"}, "option subscribe: topic 'nosuch' does not exist"),
    ({"subscribe": "t", "isolation.level": "READ_COMMITTED"},
     "option isolation.level: 'READ_COMMITTED' is not an isolation level"),
])
def test_bad_read_options_are_refused_naming_the_option(spark, broker, options, message):
    create(broker.bootstrap, "t", 1)
    with pytest.raises(Exception, match=r"format\(\"oncelog\"\)") as failed:
        reader(spark, broker.bootstrap, **options).collect()
    assert message in str(failed.value)


# --- offsets without records, slow brokers, records deleted under a task --------------------

def test_markers_and_compaction_gaps_are_read_past_not_waited_for(spark, broker, tmp_path):
    """A partition ending in a transaction marker, with a compacted batch inside: every way of
    reading it gets each record once, and ranges that end on a marker or start in a gap are
    complete (not data loss, not a wait)."""
    from support.offset_gaps_helpers import gappy_partition

    from oncelog.audit import audit_topic
    from oncelog.spark.audit import audit_topic_on_spark

    held, end = gappy_partition(broker)
    df = reader(spark, broker.bootstrap, subscribe="gaps", minPartitions="4")
    assert df.rdd.getNumPartitions() == 4  # [0, 5) [5, 11) [11, 16) [16, 22)
    assert sorted(r.offset for r in df.select("offset").collect()) == held
    for start, end, expected in ((5, 9, [5, 6, 7]), (13, 19, [14]), (21, 22, [])):
        ranged = reader(spark, broker.bootstrap, subscribe="gaps",  # to a marker, in a gap
                        startingOffsets=json.dumps({"gaps": {"0": start}}),
                        endingOffsets=json.dumps({"gaps": {"0": end}}))
        assert [r.offset for r in ranged.select("offset").collect()] == expected

    progress = stream(spark, broker.bootstrap, tmp_path / "out", tmp_path / "checkpoint",
                      subscribe="gaps", maxOffsetsPerTrigger="6")
    assert json.loads(progress[-1]["sources"][0]["endOffset"]) == {"gaps": {"0": end}}
    assert sorted(r.offset for r in spark.read.parquet(str(tmp_path / "out")).collect()) \
        == held

    on_spark = audit_topic_on_spark(spark, broker.bootstrap, "gaps", min_partitions=4)
    plain = audit_topic(broker.bootstrap, "gaps")
    assert on_spark.totals["records"] == len(held) and on_spark.clean
    assert on_spark.to_json()["partitions"] == plain.to_json()["partitions"]


def test_records_deleted_after_planning_are_data_loss_in_the_task(spark, start_broker, caplog):
    """The query is planned over offsets 0..39; retention then deletes 0..19 before a task
    reads them. failOnDataLoss=true: the task fails saying so; false: the task reads 20..39
    and logs what it skipped. Never the old silent short read, nor a wait."""
    from oncelog.spark.columns import read_range
    from oncelog.spark.offsets import OffsetRange

    # Segments of two 1.1 KB batches (20 records); retention.bytes keeps two segments.
    broker = start_broker(**{"log.internal.segment.bytes": "3000",
                             "log.retention.check.interval.ms": "100"})
    create(broker.bootstrap, "deleting", 1, **{"retention.bytes": "3500"})
    produce_batches(broker.bootstrap, "deleting", 0, 4)
    strict = reader(spark, broker.bootstrap, subscribe="deleting").rdd  # planned: 0..39
    lenient = reader(spark, broker.bootstrap, subscribe="deleting",
                     failOnDataLoss="false").rdd
    produce_batches(broker.bootstrap, "deleting", 40, 2)  # a third segment: 0..19 go
    assert wait_for_log_start(broker.bootstrap, "deleting", 0) == 20

    with pytest.raises(Exception, match=r"offsets 0\.\.19 of deleting-0 were deleted "
                                        r"\(the log start moved past them\) before they were "
                                        r"read\. .*failOnDataLoss=false"):
        strict.collect()
    assert sorted(r.offset for r in lenient.collect()) == list(range(20, 40))

    # The task's warning, seen in this process (Spark's workers log to their stderr).
    with caplog.at_level("WARNING", logger="oncelog.spark.columns"):
        batches = list(read_range(broker.bootstrap, OffsetRange("deleting", 0, 5, 45), False,
                                  False, 30_000))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(20, 45))
    assert "offsets 5..19 of deleting-0 were deleted (the log start moved past them) before " \
           "they were read; skipped (failOnDataLoss=false)" in caplog.text


def test_a_slow_broker_delays_a_task_and_never_shortens_it(spark, broker):
    """Fetch answers held back, or answered without records (as by a broker whose records are
    not visible yet), by the chaos proxy: within kafkaConsumer.pollTimeoutMs of the last
    progress the task waits and returns every row; beyond it the task fails with an error
    naming the topic, partition, offsets and the option. (The old reader gave up after 5
    empty answers and returned what it had.)"""
    from oncelog.chaos.proxy import ChaosProxy
    from oncelog.chaos.rules import Action, Rule

    def fetches(first: int, last: int) -> str:
        return "fetch:" + ",".join(map(str, range(first, last + 1)))

    def offsets(df) -> list[int]:
        return sorted(r.offset for r in df.select("offset").collect())

    create(broker.bootstrap, "slow", 1)
    produce_batches(broker.bootstrap, "slow", 0, 30)
    everything = list(range(300))
    with ChaosProxy(("127.0.0.1", broker.port)) as proxy:
        proxy.add_rule(Rule.parse(Action.DELAY_RESPONSE, "fetch:1=1500"))
        assert offsets(reader(spark, proxy.bootstrap, subscribe="slow")) == everything
        proxy.add_rule(Rule.parse(Action.EMPTY_RESPONSE, fetches(1, 6)))  # counted from here
        assert offsets(reader(spark, proxy.bootstrap, subscribe="slow")) == everything
        assert [e.what for e in proxy.events if e.what != "forwarded"] == \
            ["delay-response"] + ["empty-response"] * 6

        proxy.add_rule(Rule.parse(Action.EMPTY_RESPONSE, fetches(1, 999)))
        empty = reader(spark, proxy.bootstrap, subscribe="slow",
                       **{"kafkaConsumer.pollTimeoutMs": "1500"})
        with pytest.raises(Exception, match=r"reading offsets 0\.\.299 of slow-0: no progress "
                                            r"at offset 0 in 1\.5s; the log holds offsets "
                                            r"0\.\.299 \(format\(\"oncelog\"\) option "
                                            r"kafkaConsumer\.pollTimeoutMs is 1500\)"):
            empty.collect()

    with ChaosProxy(("127.0.0.1", broker.port)) as proxy:
        proxy.add_rule(Rule.parse(Action.DELAY_RESPONSE, fetches(1, 99) + "=4000"))
        late = reader(spark, proxy.bootstrap, subscribe="slow",
                      **{"kafkaConsumer.pollTimeoutMs": "1500"})
        with pytest.raises(Exception, match=r"reading offsets 0\.\.299 of slow-0: no progress "
                                            r"at offset 0 in 1\.5s; last error: "
                                            r"REQUEST_TIMED_OUT.*kafkaConsumer\.pollTimeoutMs"):
            late.collect()
