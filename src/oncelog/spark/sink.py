"""Writing a DataFrame to oncelog: ``df.write.format("oncelog")`` and
``writeStream.format("oncelog")``.

By default (``guarantee`` exactly-once) each Spark task writes its rows in a transaction of
its own and prepares it; the driver's ``commit()`` commits them all, its ``abort()`` aborts
them all, and a stream's micro-batch is committed together with its batch id, so a batch
that Spark runs again after a crash is not written twice. spark/two_phase.py holds the
transactional ids, the decisions and who aborts what. The broker must allow two-phase commit
(``transaction.two.phase.commit.enable``).

With ``guarantee`` at-least-once each task writes with its own idempotent producer, so a
network retry inside a task never stores a record twice; but a task that fails after some
of its records were stored is run again from its first row by a new producer, and a
speculative copy of a task writes its rows too: their records are then stored twice (under
different producer ids, so ``oncelog audit --by value`` finds them).

Columns, as Spark's Kafka sink: ``value`` (binary or string, required), ``key`` (binary or
string), ``topic`` (string; the ``topic`` option wins), ``partition`` (int; otherwise the
producer's partitioner: murmur2 of the key, sticky for keyless records) and ``headers``
(array of struct<key: string, value: binary>). Other columns are ignored.

Spark refuses ``save()`` without a mode for Python data sources (its default, ErrorIfExists,
is a table's notion): write with ``.mode("append")``; overwrite is refused (a topic is an
append-only log), except for a stream in complete mode, which appends the whole result table
at each trigger as Spark's Kafka sink does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from ..client.producer.producer import Producer
from . import two_phase
from .options import EXACTLY_ONCE, OptionError, WriteOptions, write_options

if TYPE_CHECKING:
    import pyarrow as pa

FLUSH_TIMEOUT = 300.0  # seconds a task waits for its last records to be acknowledged
# The local property Spark sets to the micro-batch a stream's tasks run for.
STREAM_BATCH_ID = "streaming.sql.batchId"


@dataclass
class WriteReport(WriterCommitMessage):
    """What one task wrote: the count and topics; at-least-once, the producer identity that
    wrote them; exactly-once, its transactional id and prepared transaction ("id:epoch"),
    which the driver commits."""

    records: int = 0
    producer: dict[str, Any] = field(default_factory=dict)  # Producer.checkpoint()
    run: str | None = None
    transactional_id: str | None = None
    prepared: str | None = None
    topics: list[str] = field(default_factory=list)
    prefix: str | None = None  # exactly-once: the transactional id prefix the task used
    query: str | None = None  # a stream's: its query's id


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


def _array(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    names = [n.lower() for n in batch.schema.names]
    return batch.column(names.index(name)) if name in names else None


def _column(batch: pa.RecordBatch, name: str) -> list | None:
    array = _array(batch, name)
    return None if array is None else array.to_pylist()


def _binary_layout(array: pa.Array) -> tuple | None:
    """A binary or string column as Producer.append_columns takes it (None: another
    type, such as large_binary, which takes the row by row path)."""
    # pyarrow only here, in the tasks: the driver's planners (create, write, commit) unpickle
    # this module without it.
    import pyarrow as pa

    if array.type not in (pa.binary(), pa.string()):
        return None
    validity, offsets, data = array.buffers()
    return validity, offsets, b"" if data is None else data, array.offset


def _int_layout(array: pa.Array) -> tuple | None:
    import pyarrow as pa

    if array.type != pa.int32():
        try:
            array = array.cast(pa.int32())  # Spark's short and long partition columns
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None  # out of range: the row by row path names the row's partition
    validity, values = array.buffers()
    return validity, values, array.offset


def _produce_columns(producer: Producer, topic: str, batch: pa.RecordBatch) -> bool:
    """Produce a batch of a topic option without headers column by column: its rows go
    into the open batches in C, and only a row that opens a batch (one in a batch's worth)
    takes produce(). False, producing nothing, when its columns are not for this path."""
    values, keys, partitions = (_array(batch, name) for name in ("value", "key", "partition"))
    assert values is not None
    value_column = _binary_layout(values)
    key_column = None if keys is None else _binary_layout(keys)
    partition_column = None if partitions is None else _int_layout(partitions)
    if value_column is None or (keys is not None and key_column is None) or \
            (partitions is not None and partition_column is None):
        return False
    row, rows = 0, batch.num_rows
    while row < rows:
        row = producer.append_columns(topic, row, rows, value_column, key_column,
                                      partition_column)
        if row < rows:
            producer.produce(topic, values[row].as_py(),
                             None if keys is None else keys[row].as_py(),
                             None if partitions is None else partitions[row].as_py())
            row += 1
    return True


def _produce_rows(producer: Producer, options: WriteOptions,
                  batches: Iterator[pa.RecordBatch], report: WriteReport) -> None:
    topics: set[str] = set()
    for batch in batches:
        n = batch.num_rows
        if options.topic and "headers" not in (name.lower() for name in batch.schema.names) \
                and _produce_columns(producer, options.topic, batch):
            report.records += n
            topics.add(options.topic)
            continue
        values = _column(batch, "value")
        assert values is not None
        keys = _column(batch, "key") or [None] * n
        topic_column = [options.topic] * n if options.topic else _column(batch, "topic")
        assert topic_column is not None
        partitions = _column(batch, "partition") or [None] * n
        headers = _column(batch, "headers") or [None] * n
        for i in range(n):
            topic = topic_column[i]
            if topic is None:
                raise ValueError(f"row {report.records + 1} of this task has no topic "
                                 "(null in the topic column, and no topic option)")
            head = headers[i]
            producer.produce(topic, values[i], keys[i], partitions[i],
                             None if head is None else [(h["key"], h["value"])
                                                        for h in head])
            report.records += 1
        topics.update(topic_column if not options.topic else (options.topic,))
    report.topics = sorted(topics)


def write_rows(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> WriteReport:
    """At-least-once: produce every row of ``batches`` and wait for all of them to be
    acknowledged."""
    producer = Producer(options.producer)
    report = WriteReport()
    try:
        _produce_rows(producer, options, batches, report)
        report.producer = producer.checkpoint(FLUSH_TIMEOUT)
    finally:
        # Records produced before a failure are still delivered: nothing can take them back.
        producer.close(FLUSH_TIMEOUT)
    return report


def write_prepared(options: WriteOptions, run: str, batches: Iterator[pa.RecordBatch],
                   streaming: bool = False) -> WriteReport:
    """Exactly-once: produce every row in this task attempt's transaction and prepare it
    (the driver commits it); a failure aborts it. A stream's task names the prefix after
    its query's id when no prefix was given."""
    context = TaskContext.get()
    assert context is not None, "write_prepared runs in a Spark task"
    query = context.getLocalProperty(two_phase.QUERY_ID) if streaming else None
    prefix = options.transactional_id_prefix
    if prefix is None:
        if not query:
            raise RuntimeError(f"this task does not see its streaming query's id (Spark's "
                               f"local property {two_phase.QUERY_ID}): write with "
                               'option("transactionalIdPrefix", ...) naming this query')
        prefix = two_phase.stream_prefix(query)
    transactional_id = two_phase.task_transactional_id(
        prefix, run, context.partitionId(), context.taskAttemptId())
    report = WriteReport(run=run, transactional_id=transactional_id, prefix=prefix,
                         query=query)

    def produce(producer: Producer) -> int:
        _produce_rows(producer, options, batches, report)
        return report.records

    report.prepared = two_phase.run_task(options, prefix, run, transactional_id, produce)
    return report


@dataclass
class _Tasks:
    """What the tasks' messages say, for the driver's commit() and abort()."""

    run: str | None = None
    prefix: str | None = None
    query: str | None = None
    winners: dict[str, str] = field(default_factory=dict)  # transactional id -> prepared
    topics: set[str] = field(default_factory=set)


def _tasks(messages: list[WriterCommitMessage | None]) -> _Tasks:
    """The run the tasks wrote in, under which prefix, their prepared transactions and the
    topics written."""
    tasks = _Tasks()
    for message in messages:
        if not isinstance(message, WriteReport) or not message.transactional_id:
            continue
        tasks.run, tasks.prefix = message.run, message.prefix
        tasks.query = message.query
        if message.prepared and message.records:
            tasks.winners[message.transactional_id] = message.prepared
            tasks.topics.update(message.topics)
    return tasks


class _WritesRows:
    """The part both writers share: each task produces its rows; exactly-once, the run id
    chosen here, on the driver, names the tasks' transactions."""

    streaming = False

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.exactly_once = options.guarantee == EXACTLY_ONCE
        self.run = two_phase.new_run()

    def write(self, iterator: Iterator) -> WriteReport:
        if self.exactly_once:
            return write_prepared(self.options, self.run, iterator, self.streaming)
        return write_rows(self.options, iterator)


class OncelogWriter(_WritesRows, DataSourceArrowWriter):
    """``df.write.format("oncelog")``. Spark pickles it to the tasks and to the process that
    commits. At-least-once, ``commit`` has nothing to do and ``abort`` cannot take back what
    finished tasks wrote."""

    def __init__(self, options: WriteOptions) -> None:
        super().__init__(options)
        if self.exactly_once:
            # Before any task: fails naming the broker setting when 2PC is refused, and ends
            # what an earlier run of a given prefix left open.
            two_phase.recover(options)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.exactly_once:
            tasks = _tasks(messages)
            two_phase.commit_run(self.options, self.run, tasks.winners, tasks.topics)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.exactly_once:
            two_phase.abort_run(self.options, self.run)


class OncelogStreamWriter(_WritesRows, DataSourceStreamArrowWriter):
    """``writeStream.format("oncelog")``, per micro-batch. Spark makes one on the driver for
    the tasks, and one anew in the process that commits: only the tasks' messages (which
    name their run, prefix and query) reach ``commit``."""

    streaming = True

    def __init__(self, options: WriteOptions) -> None:
        super().__init__(options)
        if self.exactly_once:
            two_phase.check(options)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.exactly_once:
            tasks = _tasks(messages)
            prefix = tasks.prefix or self.options.transactional_id_prefix
            if prefix is None:
                return  # no task wrote: nothing to decide, the next batch ends leftovers
            two_phase.commit_micro_batch(self.options, prefix, tasks.query, tasks.run,
                                         batchId, tasks.winners, tasks.topics)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.exactly_once:
            tasks = _tasks(messages)
            prefix = tasks.prefix or self.options.transactional_id_prefix
            if tasks.run is not None and prefix is not None:
                two_phase.abort_run(self.options, tasks.run, prefix)
            elif prefix is not None:
                two_phase.recover(self.options, prefix)


def writer_options(options, schema: StructType, overwrite: bool,
                   streaming: bool = False) -> WriteOptions:
    """The checked options of a write, on the driver, before any task runs."""
    # A stream in complete mode asks to overwrite: each trigger appends the whole result
    # table, as Spark's Kafka sink does. A batch write cannot replace a log.
    if overwrite and not streaming:
        raise OptionError("mode", 'overwrite is not possible: a topic is an append-only log; '
                                  'write with .mode("append")')
    opts = write_options(options, streaming)
    check_schema(schema, opts)
    return opts
