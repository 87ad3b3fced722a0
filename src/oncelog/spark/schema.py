"""The rows ``format("oncelog")`` reads, as Spark's Kafka source has them plus the producer id,
epoch and sequence number of each record. Apart from spark/columns.py, which builds them in
Arrow: Spark asks for the schema in a planner process of its own on the driver, which then
has no need of pyarrow (0.2-0.3 s of CPU to import, in every such process).
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

_HEADER = StructType([StructField("key", StringType()), StructField("value", BinaryType())])


def spark_schema(include_headers: bool) -> StructType:
    fields = [
        StructField("key", BinaryType()), StructField("value", BinaryType()),
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(_HEADER)))
    fields += [StructField("producerId", LongType()), StructField("producerEpoch", ShortType()),
               StructField("sequence", IntegerType())]
    return StructType(fields)
