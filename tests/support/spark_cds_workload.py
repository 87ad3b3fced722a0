"""The work a driver does while tests/support/spark_cds.py records the classes it loads: the
kinds the tests do (SQL with generated code and a shuffle, a Python UDF, Python data sources
in a batch and in a stream, Arrow writers like oncelog's sink), so that their classes are in
the archive. Nothing here is asserted: a class it misses is loaded from its jar as before."""

from __future__ import annotations

import tempfile


def _sources():
    """A Python data source of every kind oncelog's uses, made in a function so that Spark
    pickles it by value to its Python workers."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )

    class Reader(DataSourceReader):
        def partitions(self):
            return [InputPartition(0), InputPartition(1)]

        def read(self, partition):
            for i in range(3):
                yield (b"k", b"%d" % (partition.value * 3 + i))

    class StreamReader(DataSourceStreamReader):
        def initialOffset(self):
            return {"at": 0}

        def latestOffset(self):
            return {"at": 2}

        def partitions(self, start, end):
            return [InputPartition(i) for i in range(start["at"], end["at"])]

        def read(self, partition):
            yield (b"k", b"%d" % partition.value)

    class Writer(DataSourceArrowWriter):
        def write(self, batches):
            for _ in batches:
                pass
            return WriterCommitMessage()

        def commit(self, messages):
            pass

        def abort(self, messages):
            pass

    class StreamWriter(DataSourceStreamArrowWriter):
        def write(self, batches):
            for _ in batches:
                pass
            return WriterCommitMessage()

        def commit(self, messages, batch_id):
            pass

        def abort(self, messages, batch_id):
            pass

    class Source(DataSource):
        @classmethod
        def name(cls):
            return "cds_warmup"

        def schema(self):
            return "key binary, value binary"

        def reader(self, schema):
            return Reader()

        def streamReader(self, schema):
            return StreamReader()

        def writer(self, schema, overwrite):
            return Writer()

        def streamWriter(self, schema, overwrite):
            return StreamWriter()

    return Source


def run(spark) -> None:
    """Each kind of work in turn; one that fails (a Python worker that did not connect back in
    time on a loaded machine) is left: the classes loaded until then are archived all the
    same."""
    for step in (_sql, _udf, _batch, _stream):
        try:
            step(spark)
        except Exception as exc:  # any failure costs only classes
            print(f"cds workload: {step.__name__} failed: {exc}", flush=True)


def _sql(spark) -> None:
    spark.range(100, numPartitions=2).selectExpr("id % 7 as k", "cast(id as string) as v") \
        .groupBy("k").count().collect()


def _udf(spark) -> None:
    spark.udf.register("twice", lambda i: i * 2, "long")
    spark.range(10, numPartitions=2).selectExpr("twice(id)").collect()


def _batch(spark) -> None:
    spark.dataSource.register(_sources())
    df = spark.read.format("cds_warmup").load()
    df.collect()
    df.write.format("cds_warmup").mode("append").save()


def _stream(spark) -> None:
    spark.dataSource.register(_sources())
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (spark.readStream.format("cds_warmup").load().writeStream
                 .format("cds_warmup").option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(120)
        finally:
            query.stop()
