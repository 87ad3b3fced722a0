"""A newcomer's first write: the README's Spark examples against a broker started with its
defaults (what ``make run`` starts: no ``--set`` but the data directory and the test ports),
exactly once, with nothing but the example's own options."""

from __future__ import annotations

from support.spark_read_helpers import TIMEOUT, create, produce

from oncelog import Consumer, TopicPartition
from oncelog.audit import audit_topic


def committed(bootstrap: str, topic: str, partitions: int) -> list:
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                   "isolation.level": "read_committed"}) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        return list(c)


def test_the_readme_write_and_stream_run_exactly_once_on_a_default_broker(
        start_broker, spark, tmp_path):
    broker = start_broker()  # the broker's defaults, as `make run`
    bootstrap = broker.bootstrap
    create(bootstrap, "orders", 2)
    produce(bootstrap, "orders", [(i % 2, b"k%d" % i, b"order %d" % i, None, None)
                                  for i in range(240)])

    # The README's batch example, word for word but the address.
    df = (spark.read.format("oncelog")
          .option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", "orders")
          .option("startingOffsets", '{"orders": {"0": 100, "1": -2}}')
          .load())
    (df.selectExpr("key", "upper(cast(value as string)) as value")
       .write.format("oncelog").mode("append")
       .option("bootstrap.servers", bootstrap).option("topic", "orders-upper").save())
    upper = committed(bootstrap, "orders-upper", 1)
    expected = sorted(b"ORDER %d" % i for i in range(240) if i % 2 or i >= 200)
    assert sorted(r.value for r in upper) == expected
    assert all(r.producer_id >= 0 for r in upper)  # written in transactions

    # The README's stream example.
    query = (spark.readStream.format("oncelog")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", "orders")
             .option("startingOffsets", "earliest")
             .load()
             .selectExpr("key", "upper(cast(value as string)) as value")
             .writeStream.format("oncelog")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("topic", "orders-stream")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True)
             .start())
    try:
        assert query.awaitTermination(TIMEOUT), "the stream did not finish in time"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    streamed = committed(bootstrap, "orders-stream", 1)
    assert sorted(r.value for r in streamed) == sorted(b"ORDER %d" % i for i in range(240))
    for topic in ("orders-upper", "orders-stream"):
        report = audit_topic(bootstrap, topic, by=("value",))
        assert report.clean, report.problems
