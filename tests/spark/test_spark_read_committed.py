"""isolation.level for spark.read and spark.readStream .format("oncelog"), in the shared
local[2] Spark session, over a partition written by confluent-kafka's transactional producer
(tests/support/txn_topic.py: committed, aborted, one still-open transaction, more committed)."""

from __future__ import annotations

from support import txn_topic
from support.txn_topic import ABORTED, BEFORE_OPEN, COMMITTED, OPEN, TIMEOUT


def read(spark, bootstrap: str, level: str | None):
    reader = spark.read.format("oncelog").option("kafka.bootstrap.servers", bootstrap) \
        .option("subscribe", "txn")
    if level is not None:
        reader = reader.option("kafka.isolation.level", level)
    return reader.load()


def test_batch_read_committed_stops_at_the_last_stable_offset(spark, broker):
    txn_topic.write(broker.bootstrap, "txn")
    committed = read(spark, broker.bootstrap, "read_committed") \
        .select("value", "offset", "producerId").collect()
    assert [r.value for r in committed] == BEFORE_OPEN
    assert all(r.producerId >= 0 for r in committed)

    # All data records, never the transaction markers; the default is read_uncommitted.
    for level in ("read_uncommitted", None):
        rows = read(spark, broker.bootstrap, level).select("value").collect()
        assert sorted(r.value for r in rows) == sorted(COMMITTED + ABORTED + OPEN)


def test_stream_read_committed_waits_for_the_open_transaction(spark, broker, tmp_path):
    open_one = txn_topic.write(broker.bootstrap, "txn")

    def run() -> list[bytes]:
        query = (spark.readStream.format("oncelog").option("bootstrap.servers", broker.bootstrap)
                 .option("subscribe", "txn").option("startingOffsets", "earliest")
                 .option("isolation.level", "read_committed").load()
                 .select("value").writeStream.format("parquet")
                 .option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(TIMEOUT), "the stream did not finish in time"
        finally:
            query.stop()
        assert query.exception() is None, query.exception()
        return [r.value for r in spark.read.parquet(str(tmp_path / "out")).collect()]

    assert sorted(run()) == sorted(BEFORE_OPEN)  # up to the last stable offset only
    open_one.commit_transaction(TIMEOUT)
    # Restarted from its checkpoint: the rest, each once.
    assert sorted(run()) == sorted(COMMITTED + OPEN)
