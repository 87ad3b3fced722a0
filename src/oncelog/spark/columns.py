"""Records of an offset range as Arrow record batches with the schema of Spark's Kafka source,
plus the producer id, epoch and sequence number of each record. Runs in Spark's Python
workers: one call of ``read_range`` per task.

A task reads its whole range or fails (see ``client.topic_reader``): records deleted before
they were read are data loss (an error, or with failOnDataLoss=false skipped with a warning in
the worker's log); a read that makes no progress for kafkaConsumer.pollTimeoutMs is an error.
Offsets without records (transaction markers, compaction) are neither.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import cramjam
import pyarrow as pa

from ..client.topic_reader import (
    TOPIC_GONE,
    Lost,
    ReadTimeout,
    TopicReader,
    UnknownTopicOrPartition,
)
from ..protocol import records as codec
from ..protocol.batches import Batch, CorruptBatch, RecordSetError
from ..protocol.record_batch import TIMESTAMP_TYPE_BIT
from ..protocol.sequences import record_sequence
from .offsets import DataLossError, OffsetRange

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 10_000  # Arrow batch handed to Spark: at most this many rows ...
BYTES_PER_BATCH = 16 << 20  # ... or about this many bytes of keys and values

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_ARROW_HEADERS = pa.list_(pa.field("element", pa.struct([("key", pa.string()),
                                                         ("value", pa.binary())])))


def arrow_schema(include_headers: bool) -> pa.Schema:
    """What Spark expects of ``schema.spark_schema`` batches, exactly (it refuses others)."""
    fields = [("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
              ("partition", pa.int32()), ("offset", pa.int64()),
              ("timestamp", _TIMESTAMP), ("timestampType", pa.int32())]
    if include_headers:
        fields.append(("headers", _ARROW_HEADERS))
    fields += [("producerId", pa.int64()), ("producerEpoch", pa.int16()),
               ("sequence", pa.int32())]
    return pa.schema(fields)


class PyRecordColumns:
    """Column lists for the records of one partition, turned into Arrow batches: the Python
    twin of ``ArrowColumns`` (where the compiled codec was not built; the tests hold the two
    to the same batches)."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self.topic, self.partition = topic, partition
        self.include_headers = include_headers
        self.schema = arrow_schema(include_headers)
        self._clear()

    def _clear(self) -> None:
        self.keys: list = []
        self.values: list = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.types: list[int] = []
        self.headers: list = []
        self.pids: list[int] = []
        self.epochs: list[int] = []
        self.sequences: list[int] = []
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.offsets)

    def add_batch(self, batch: Batch) -> None:
        """The records of ``batch`` that the read wants."""
        header = batch.header
        records = batch.record_fields()
        log_append = bool(header.attributes & TIMESTAMP_TYPE_BIT)
        base, base_ts, base_seq = header.base_offset, header.base_timestamp, \
            header.base_sequence
        keys, values, offsets, timestamps = self.keys, self.values, self.offsets, \
            self.timestamps
        for delta, ts_delta, key, value, headers in records:
            keys.append(key)
            values.append(value)
            offsets.append(base + delta)
            timestamps.append((header.max_timestamp if log_append else base_ts + ts_delta)
                              * 1000)
            if self.include_headers:
                self.headers.append(headers)
            self.sequences.append(record_sequence(base_seq, delta))
            self.bytes += len(value or b"") + len(key or b"")
        added = len(offsets) - len(self.pids)
        self.types += [int(log_append)] * added
        self.pids += [header.producer_id] * added
        self.epochs += [header.producer_epoch] * added

    def take(self) -> pa.RecordBatch:
        n = len(self)
        columns = [
            pa.array(self.keys, pa.binary()), pa.array(self.values, pa.binary()),
            *_topic_partition(self.topic, self.partition, n),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, _TIMESTAMP),
            pa.array(self.types, pa.int32()),
        ]
        if self.include_headers:
            columns.append(pa.array(self.headers, _ARROW_HEADERS))
        columns += [pa.array(self.pids, pa.int64()), pa.array(self.epochs, pa.int16()),
                    pa.array(self.sequences, pa.int32())]
        self._clear()
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def _topic_partition(topic: str, partition: int, n: int) -> list[pa.Array]:
    return [pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n)]


_NO_END = (1 << 63) - 1


class ArrowColumns:
    """The records of one partition straight into Arrow buffers by the compiled codec
    (``_records.ArrowColumns``): a key or value is copied once, from the fetched batch into
    its column; no Python object per record. The buffers come from Arrow's memory pool,
    which gives back the memory of the chunks Spark has sent on without faulting it in
    again."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self.topic, self.partition = topic, partition
        self.include_headers = include_headers
        self.schema = arrow_schema(include_headers)
        self._columns = codec.compiled.ArrowColumns(include_headers, pa.allocate_buffer)

    def __len__(self) -> int:
        return self._columns.rows

    @property
    def bytes(self) -> int:
        return self._columns.bytes

    def add_batch(self, batch: Batch) -> None:
        """The records of ``batch`` that the read wants."""
        h = batch.header
        try:
            self._columns.add(batch.payload(), h.records_count, batch.first,
                              _NO_END if batch.end is None else batch.end, h.base_offset,
                              h.base_timestamp, bool(h.attributes & TIMESTAMP_TYPE_BIT),
                              h.max_timestamp, h.producer_id, h.producer_epoch,
                              h.base_sequence)
        except (ValueError, cramjam.DecompressionError) as exc:
            raise CorruptBatch(f"batch at offset {h.base_offset}: {exc}", h.base_offset) \
                from None

    def take(self) -> pa.RecordBatch:
        n, buffers, sizes, (key_nulls, value_nulls, hvalue_nulls, headers) = \
            self._columns.take()
        b = [buf.slice(0, size) for buf, size in zip(buffers, sizes, strict=True)]

        def fixed(kind: pa.DataType, data: pa.Buffer) -> pa.Array:
            return pa.Array.from_buffers(kind, n, [None, data], 0)

        columns = [
            pa.Array.from_buffers(pa.binary(), n, b[0:3], key_nulls),
            pa.Array.from_buffers(pa.binary(), n, b[3:6], value_nulls),
            *_topic_partition(self.topic, self.partition, n),
            fixed(pa.int64(), b[6]), fixed(_TIMESTAMP, b[7]), fixed(pa.int32(), b[8]),
        ]
        if self.include_headers:
            columns.append(_headers(n, headers, b[12:18], hvalue_nulls))
        columns += [fixed(pa.int64(), b[9]), fixed(pa.int16(), b[10]), fixed(pa.int32(), b[11])]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def _headers(rows: int, count: int, b: list[pa.Buffer], value_nulls: int) -> pa.Array:
    names = pa.Array.from_buffers(pa.string(), count, [None, b[1], b[2]], 0)
    try:
        names.validate(full=True)
    except pa.ArrowInvalid:  # not UTF-8: as the Python decoder reads it, with U+FFFD
        names = pa.array([name.decode("utf-8", "replace")
                          for name in names.view(pa.binary()).to_pylist()], pa.string())
    values = pa.Array.from_buffers(pa.binary(), count, [b[3], b[4], b[5]], value_nulls)
    pairs = pa.StructArray.from_arrays([names, values], fields=list(_ARROW_HEADERS.value_type))
    offsets = pa.Array.from_buffers(pa.int32(), rows + 1, [None, b[0]], 0)
    return pa.ListArray.from_arrays(offsets, pairs, type=_ARROW_HEADERS)


def record_columns(topic: str, partition: int, include_headers: bool
                   ) -> ArrowColumns | PyRecordColumns:
    """The column builder: the compiled one when it was built."""
    cls = ArrowColumns if codec.compiled is not None else PyRecordColumns
    return cls(topic, partition, include_headers)


def read_range(bootstrap: str, rng: OffsetRange, include_headers: bool,
               fail_on_data_loss: bool, poll_timeout_ms: int, read_committed: bool = False,
               security: dict[str, str] | None = None) -> Iterator[pa.RecordBatch]:
    """The records of ``rng``, in offset order, as Arrow batches: all of them, or an error.
    ``read_committed``: without the records of aborted transactions (the range ends at or
    before the last stable offset the driver saw, which only moves on)."""
    columns = record_columns(rng.topic, rng.partition, include_headers)

    def lost(loss: Lost) -> None:
        what = loss.describe(rng.topic)
        if fail_on_data_loss:
            raise DataLossError(what)
        log.warning("%s; skipped (failOnDataLoss=false)", what)

    timeout = poll_timeout_ms / 1000
    try:
        reader = TopicReader(bootstrap, rng.topic, min(30.0, timeout),
                             client_id="oncelog-spark", security=security)
    except UnknownTopicOrPartition:
        lost(Lost(rng.partition, rng.start, rng.end, TOPIC_GONE))
        return
    with reader:
        try:
            for batch in reader.read(rng.partition, rng.start, rng.end, poll_timeout=timeout,
                                     on_loss=lost, isolation_level=int(read_committed)):
                try:
                    columns.add_batch(batch)
                except RecordSetError as exc:  # records that do not parse
                    raise type(exc)(f"{rng.topic}-{rng.partition}: {exc}", exc.offset) from None
                if len(columns) >= ROWS_PER_BATCH or columns.bytes >= BYTES_PER_BATCH:
                    yield columns.take()
        except ReadTimeout as exc:
            raise ReadTimeout(f"{exc.detail} (format(\"oncelog\") option "
                              f"kafkaConsumer.pollTimeoutMs is {poll_timeout_ms})") from None
    if len(columns):
        yield columns.take()
