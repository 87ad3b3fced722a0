"""Writing a DataFrame to oncelog: each Spark task writes its rows with its own idempotent
``oncelog.Producer``, so a network retry inside a task never stores a record twice.

What this does not give yet: a Spark task that fails after some of its records were stored
is run again from its first row by a new producer, and a speculative copy of a task writes
its rows too; their records are then stored twice (under different producer ids, so
``oncelog audit --by value`` finds them and the sequence audit does not). The same holds for
a streaming micro-batch that Spark runs again after a crash between writing and committing.
Exactly-once across task attempts needs transactions, which oncelog does not have yet.

Columns, as Spark's Kafka sink: ``value`` (binary or string, required), ``key`` (binary or
string), ``topic`` (string; the ``topic`` option wins), ``partition`` (int; otherwise the
producer's partitioner: murmur2 of the key, sticky for keyless records) and ``headers``
(array of struct<key: string, value: binary>). Other columns are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from ..client.producer import Producer
from .options import OptionError, WriteOptions

FLUSH_TIMEOUT = 300.0  # seconds a task waits for its last records to be acknowledged


@dataclass
class WriteReport(WriterCommitMessage):
    """What one task wrote: the count, and the producer identity that wrote it."""

    records: int = 0
    producer: dict[str, Any] = field(default_factory=dict)  # Producer.checkpoint()


def check_schema(schema: StructType, options: WriteOptions) -> None:
    """Refuse, on the driver, a DataFrame the sink cannot write (naming the column)."""
    types = {f.name.lower(): f.dataType for f in schema.fields}
    text = (BinaryType, StringType)
    if "value" not in types:
        raise OptionError("value", "the DataFrame needs a value column (binary or string); "
                                   f"it has {', '.join(schema.fieldNames()) or 'none'}")
    for name in ("value", "key"):
        if name in types and not isinstance(types[name], text):
            raise OptionError(name, f"column {name} must be binary or string, not "
                                    f"{types[name].simpleString()}")
    if "topic" in types and not isinstance(types["topic"], StringType):
        raise OptionError("topic", f"column topic must be a string, not "
                                   f"{types['topic'].simpleString()}")
    if options.topic is None and "topic" not in types:
        raise OptionError("topic", "name the topic to write to: option topic, or a topic "
                                   "column")
    if "partition" in types and not isinstance(types["partition"],
                                               (IntegerType, LongType, ShortType)):
        raise OptionError("partition", f"column partition must be an integer, not "
                                       f"{types['partition'].simpleString()}")
    if "headers" in types:
        headers = types["headers"]
        element = headers.elementType if isinstance(headers, ArrayType) else None
        names = {f.name: f.dataType for f in element.fields} \
            if isinstance(element, StructType) else {}
        if set(names) != {"key", "value"} or not isinstance(names["key"], StringType) or \
                not isinstance(names["value"], text):
            raise OptionError("headers", "column headers must be an array of "
                                         "struct<key: string, value: binary>, not "
                                         f"{headers.simpleString()}")


def _column(batch: pa.RecordBatch, name: str) -> list | None:
    names = [n.lower() for n in batch.schema.names]
    return batch.column(names.index(name)).to_pylist() if name in names else None


def write_rows(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> WriteReport:
    """Produce every row of ``batches`` and wait for all of them to be acknowledged."""
    producer = Producer(options.producer)
    report = WriteReport()
    try:
        for batch in batches:
            n = batch.num_rows
            values = _column(batch, "value")
            assert values is not None
            keys = _column(batch, "key") or [None] * n
            topics = [options.topic] * n if options.topic else _column(batch, "topic")
            partitions = _column(batch, "partition") or [None] * n
            headers = _column(batch, "headers") or [None] * n
            for i in range(n):
                topic = topics[i]
                if topic is None:
                    raise ValueError(f"row {report.records + 1} of this task has no topic "
                                     "(null in the topic column, and no topic option)")
                head = headers[i]
                producer.produce(topic, values[i], keys[i], partitions[i],
                                 None if head is None else [(h["key"], h["value"])
                                                            for h in head])
                report.records += 1
        report.producer = producer.checkpoint(FLUSH_TIMEOUT)
    finally:
        # Records produced before a failure are still delivered: nothing can take them back.
        producer.close(FLUSH_TIMEOUT)
    return report
