"""df.write / writeStream .format("oncelog") against real brokers (which allow two-phase commit,
as exactly-once writes need): what Spark wrote is read back with oncelog.Consumer and audited;
a Spark task retry (local[2,3]) shows what at-least-once writes store. Exactly-once under
failures: test_spark_write_exactly_once.py."""

from __future__ import annotations

import collections

import pytest
from support.spark_read_helpers import TIMEOUT, create, produce

from oncelog import Consumer, TopicPartition
from oncelog.audit import audit_topic


@pytest.fixture
def broker(start_broker):
    return start_broker(transaction_two_phase_commit_enable="true")


def read_back(bootstrap: str, topic: str, partitions: int) -> list:
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        return list(c)


def writer(df, bootstrap: str, **options):
    write = df.write.format("oncelog").mode("append").option("kafka.bootstrap.servers",
                                                             bootstrap)
    for key, value in options.items():
        write = write.option(key, value)
    return write


def test_batch_write_every_column(spark, broker):
    create(broker.bootstrap, "left", 3)
    create(broker.bootstrap, "right", 1)
    df = spark.range(0, 400, numPartitions=2).selectExpr(
        "cast(id as string) as value",
        "if(id % 4 = 0, null, cast(concat('k', id % 10) as binary)) as key",
        "if(id % 2 = 0, 'left', 'right') as topic",
        "if(id % 2 = 0, cast(id % 3 as int), null) as partition",
        "array(named_struct('key', 'n', 'value', cast(cast(id as string) as binary))) "
        "as headers",
        "id * 2 as ignored")
    writer(df, broker.bootstrap, **{"kafka.linger.ms": "1"}).save()

    left = read_back(broker.bootstrap, "left", 3)
    right = read_back(broker.bootstrap, "right", 1)
    assert sorted(int(r.value) for r in left) == list(range(0, 400, 2))
    assert sorted(int(r.value) for r in right) == list(range(1, 400, 2))
    for r in left + right:
        i = int(r.value)
        assert r.key == (None if i % 4 == 0 else b"k%d" % (i % 10))
        assert r.headers == (("n", r.value),)
    assert all(r.partition == int(r.value) % 3 for r in left)
    # Two tasks, two idempotent producers, each with gap-free sequences.
    assert {r.producer_id for r in left + right} == {r.producer_id for r in left}
    assert len({r.producer_id for r in left}) == 2 and all(r.sequence >= 0 for r in left)
    for topic in ("left", "right"):
        report = audit_topic(broker.bootstrap, topic, by=("value",))
        assert report.clean, report.problems


def test_stream_from_one_topic_to_another_across_a_restart(spark, broker, tmp_path):
    create(broker.bootstrap, "raw", 2)
    produce(broker.bootstrap, "raw", [(i % 2, None, b"r%d" % i, None, None) for i in range(60)])
    checkpoint = tmp_path / "checkpoint"

    def run() -> None:
        query = (spark.readStream.format("oncelog").option("bootstrap.servers", broker.bootstrap)
                 .option("subscribe", "raw").option("startingOffsets", "earliest")
                 .option("maxOffsetsPerTrigger", "25").load()
                 .selectExpr("upper(cast(value as string)) as value", "key")
                 .writeStream.format("oncelog").option("bootstrap.servers", broker.bootstrap)
                 .option("topic", "cooked").option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(TIMEOUT), "the stream did not finish in time"
        finally:
            query.stop()
        assert query.exception() is None, query.exception()

    run()
    produce(broker.bootstrap, "raw", [(0, None, b"r%d" % i, None, None) for i in range(60, 70)])
    run()
    cooked = read_back(broker.bootstrap, "cooked", 1)
    assert sorted(r.value for r in cooked) == sorted(b"R%d" % i for i in range(70))
    report = audit_topic(broker.bootstrap, "cooked", by=("value",))
    assert report.clean, report.problems


def test_a_retried_task_writes_its_rows_again(broker, _spark_sessions):
    """local[2,3]: Spark runs a failed task up to three times. The first attempt of the one
    task fails at its last row, after 99 rows were produced (and, when the task gives up, are
    delivered: nothing can take them back); the second attempt writes all 100 again with a new
    producer. Each producer's sequences are clean; the values show 99 extra records: what
    option("guarantee", "at-least-once") gives."""
    # Kept running after the test: tests/conftest.py runs the local[2,3] tests after the
    # other Spark tests, so that a worker starts this session once and never local[2] again.
    spark = _spark_sessions.spark_session("local[2,3]")
    create(broker.bootstrap, "retried", 2)
    # Row 99 names partition 7 (which does not exist) on the first attempt only.
    spark.udf.register("bad_on_first_attempt", lambda i: 7 if i == 99 and
                       __import__("pyspark").TaskContext.get().attemptNumber() == 0
                       else int(i % 2), "int")
    df = spark.range(0, 100, numPartitions=1).selectExpr(
        "cast(id as string) as value", "bad_on_first_attempt(id) as partition")
    writer(df, broker.bootstrap, topic="retried", guarantee="at-least-once").save()

    records = read_back(broker.bootstrap, "retried", 2)
    copies = collections.Counter(r.value for r in records)
    assert len(records) == 199
    assert {v for v, n in copies.items() if n == 2} == {b"%d" % i for i in range(99)}
    assert copies[b"99"] == 1
    assert len({r.producer_id for r in records}) == 2
    report = audit_topic(broker.bootstrap, "retried", by=("value",))
    assert report.totals["duplicates"] == 0 and report.totals["gaps"] == 0
    assert report.problems == ["99 values repeated (99 extra records)"]


@pytest.mark.parametrize(("columns", "options", "message"), [
    ("cast(id as string) as key", {"topic": "t"}, "option value: the DataFrame needs a value"),
    ("id as value", {"topic": "t"}, "option value: column value must be binary or string, not "
                                    "bigint"),
    ("cast(id as string) as value", {}, "option topic: name the topic to write to"),
    ("cast(id as string) as value", {"topic": "t", "kafka.linger.ms": "soon"},
     "option linger.ms: 'soon' is not an integer"),
    ("cast(id as string) as value", {"topic": "t", "kafka.transactional.id": "x"},
     "option kafka.transactional.id: the oncelog sink sets the transactional settings"),
    ("cast(id as string) as value, 'x' as headers", {"topic": "t"},
     "option headers: column headers must be an array of struct<key: string, value: binary>"),
])
def test_bad_write_options_are_refused_naming_the_option(spark, broker, columns, options,
                                                         message):
    with pytest.raises(Exception, match=r"format\(\"oncelog\"\)") as failed:
        writer(spark.range(3).selectExpr(*columns.split(", ")), broker.bootstrap,
               **options).save()
    assert message in str(failed.value)


def test_overwrite_and_a_missing_partition_fail_clearly(spark, broker):
    create(broker.bootstrap, "two", 2)
    df = spark.range(3).selectExpr("cast(id as string) as value", "5 as partition")
    with pytest.raises(Exception, match="overwrite is not possible: a topic is an append-only"):
        writer(df, broker.bootstrap, topic="two").mode("overwrite").save()
    with pytest.raises(Exception, match=r"two has partitions 0\.\.1, not 5"):
        writer(df, broker.bootstrap, topic="two").save()



def count_by_key(spark, bootstrap: str, source: str, sink: str, checkpoint: str, mode: str):
    """A stream counting ``source``'s keys into ``sink`` in output mode ``mode``, started."""
    return (spark.readStream.format("oncelog").option("bootstrap.servers", bootstrap)
            .option("subscribe", source).option("startingOffsets", "earliest").load()
            .groupBy("key").count()
            .selectExpr("key", "cast(cast(count as string) as binary) as value")
            .writeStream.format("oncelog").option("bootstrap.servers", bootstrap)
            .option("topic", sink).option("checkpointLocation", checkpoint)
            .outputMode(mode).trigger(availableNow=True).start())


def test_stream_in_complete_mode_appends_the_result_table(spark, broker, tmp_path):
    create(broker.bootstrap, "votes", 1)
    produce(broker.bootstrap, "votes", [(0, b"abc"[i % 3:i % 3 + 1], b"1", None, None)
                                        for i in range(30)])
    query = count_by_key(spark, broker.bootstrap, "votes", "tally", str(tmp_path / "cp"),
                         "complete")
    try:
        assert query.awaitTermination(TIMEOUT), "the stream did not finish in time"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    assert sorted((r.key, r.value) for r in read_back(broker.bootstrap, "tally", 1)) == \
        [(b"a", b"10"), (b"b", b"10"), (b"c", b"10")]


def test_stream_in_update_mode_is_refused_by_spark(spark, broker, tmp_path):
    """Spark (4.3) lets a Python data source's stream write in append or complete mode only:
    its write builder for Python sources cannot take updates as appends. The query fails at
    its first micro-batch, naming the source and the mode, and writes nothing."""
    create(broker.bootstrap, "changes", 1)
    create(broker.bootstrap, "updated", 1)
    produce(broker.bootstrap, "changes", [(0, b"a", b"1", None, None)])
    query = count_by_key(spark, broker.bootstrap, "changes", "updated", str(tmp_path / "cp"),
                         "update")
    try:
        with pytest.raises(Exception, match="oncelog does not support Update mode"):
            query.awaitTermination(TIMEOUT)
    finally:
        query.stop()
    assert read_back(broker.bootstrap, "updated", 1) == []
