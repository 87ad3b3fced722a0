"""``format("oncelog")``: the PySpark data source (batch and streaming reads and writes).

Spark pickles the readers and writers made here on the driver and runs ``read``/``write`` in
its Python workers, so they hold options and offsets only, never a connection.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from .columns import read_range, spark_schema
from .offsets import (
    Cluster,
    DataLossError,
    OffsetRange,
    Offsets,
    from_json,
    rate_limit,
    split,
    to_json,
)
from .options import (
    EARLIEST,
    LATEST,
    OptionError,
    ReadOptions,
    read_options,
)
from .sink import OncelogStreamWriter, OncelogWriter, writer_options


class RangePartition(InputPartition):
    """One Spark task's share: an offset range of one partition."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)
        self.range = rng


def _partitions(ranges: Sequence[OffsetRange], min_partitions: int | None
                ) -> list[InputPartition]:
    return [RangePartition(r) for r in split(ranges, min_partitions)]


class _ReadsRanges:
    """The part both readers share: a task reads its offset range (see ``columns``)."""

    options: ReadOptions

    def read(self, partition: InputPartition) -> Iterator:
        opts = self.options
        assert isinstance(partition, RangePartition)
        return read_range(opts.bootstrap, partition.range, opts.include_headers,
                          opts.fail_on_data_loss, opts.poll_timeout_ms, opts.read_committed)


class OncelogReader(_ReadsRanges, DataSourceReader):
    """``spark.read.format("oncelog")``: offsets fixed when the query is planned ("latest" is
    the high watermark, or with read_committed the last stable offset)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        opts = self.options
        with Cluster(opts) as cluster:
            tps = cluster.partitions(must_exist=True)
            marks = cluster.watermarks(tps)
            starts = cluster.resolve(opts.starting, tps, marks, EARLIEST)
            ends = cluster.resolve(opts.ending, tps, marks, LATEST)
        ranges = []
        for tp, start in starts.items():
            low, high = marks[tp]
            end = ends[tp]
            if start > end:
                raise OptionError("startingOffsets", f"{tp[0]}-{tp[1]} would start at {start}, "
                                                     f"after its end at {end}")
            if end > high:
                ends = "its last stable offset is" if opts.read_committed else "ends at"
                raise OptionError("endingOffsets", f"{tp[0]}-{tp[1]} {ends} {high}, before "
                                                   f"offset {end}")
            if start < low:
                if opts.fail_on_data_loss:
                    raise DataLossError(f"{tp[0]}-{tp[1]} starts at {low}, after offset {start}")
                start = low
            ranges.append(OffsetRange(tp[0], tp[1], start, end))
        return _partitions(ranges, opts.min_partitions)


class OncelogStreamReader(_ReadsRanges, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("oncelog")``. Offsets are JSON per topic and partition, as
    Spark's Kafka source writes them; a micro-batch reads exactly [start, end) of each
    partition, so a query restarted from its checkpoint neither skips nor repeats a record of
    its input. Partitions that appear later (new topics matching subscribePattern, more
    partitions) are read from their earliest offset. With read_committed a micro-batch ends
    at the last stable offset at the latest: an open transaction holds the stream back
    until it ends, as it holds back Kafka's read_committed consumer."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._until: Offsets | None = None  # Trigger.AvailableNow: read up to here, then stop

    def _latest(self) -> tuple[Offsets, dict]:
        with Cluster(self.options) as cluster:
            marks = cluster.watermarks(cluster.partitions(must_exist=False))
        return {tp: high for tp, (_, high) in marks.items()}, marks

    def initialOffset(self) -> dict:
        with Cluster(self.options) as cluster:
            tps = cluster.partitions(must_exist=False)
            marks = cluster.watermarks(tps)
            return to_json(cluster.resolve(self.options.starting, tps, marks, EARLIEST))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._latest()[0]

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json(start)
        latest, marks = self._latest()
        if self._until is not None:
            latest = {tp: min(high, self._until.get(tp, marks[tp][0]))
                      for tp, high in latest.items()}
        # A partition new since ``start`` begins at its earliest offset.
        begin = {tp: begin.get(tp, marks[tp][0]) for tp in latest}
        end = {tp: max(high, begin[tp]) for tp, high in latest.items()}
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(begin, end, limit.max_rows)
        # Keep partitions that went away at the offset reached, so the checkpoint still says
        # where they were (partitions() reports their loss).
        for tp, offset in from_json(start).items():
            end.setdefault(tp, offset)
        return to_json(end)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, finish = from_json(start), from_json(end)
        opts = self.options
        with Cluster(opts) as cluster:
            marks = cluster.watermarks(finish)
        ranges = []
        for tp, stop in sorted(finish.items()):
            first = begin.get(tp)
            low, high = marks.get(tp, (None, None))
            if first is None:
                first = low if low is not None else stop
            if low is None:
                if first < stop and opts.fail_on_data_loss:
                    raise DataLossError(f"{tp[0]}-{tp[1]} is gone; offsets {first}..{stop} were "
                                        "to be read")
                continue
            if first < low:
                if opts.fail_on_data_loss:
                    raise DataLossError(f"{tp[0]}-{tp[1]} starts at {low}, after offset "
                                        f"{first}")
                first = min(low, stop)
            if stop > high:
                if opts.fail_on_data_loss:
                    raise DataLossError(f"{tp[0]}-{tp[1]} ends at {high}, before offset {stop}")
                stop = max(first, high)
            ranges.append(OffsetRange(tp[0], tp[1], first, stop))
        return _partitions(ranges, opts.min_partitions)

    def commit(self, end: dict) -> None:
        """Nothing to do: no consumer groups yet, the checkpoint is the only position."""


class OncelogDataSource(DataSource):
    """``format("oncelog")``: read and write topics of oncelog or any Kafka-compatible broker.

    Read options (as Spark's Kafka source): ``bootstrap.servers`` (or
    ``kafka.bootstrap.servers``), one of ``subscribe``, ``subscribePattern``, ``assign``;
    ``startingOffsets``, ``endingOffsets``, ``maxOffsetsPerTrigger``, ``minPartitions``,
    ``includeHeaders``, ``failOnDataLoss``, ``kafkaConsumer.pollTimeoutMs``,
    ``isolation.level`` (``read_uncommitted``, the default, or ``read_committed``: only
    committed transactions' records, and never past the last stable offset). Write options
    (sink.py): ``bootstrap.servers``, ``topic``, ``guarantee``, ``transactionalIdPrefix``, and
    producer settings (``linger.ms``, ``batch.size``, ``compression.type``, ``client.id``).
    """

    @classmethod
    def name(cls) -> str:
        return "oncelog"

    def schema(self) -> StructType:
        opts = read_options(self.options, streaming=None)
        return spark_schema(opts.include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return OncelogReader(read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return OncelogStreamReader(read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> OncelogWriter:
        return OncelogWriter(writer_options(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> OncelogStreamWriter:
        return OncelogStreamWriter(writer_options(self.options, schema, overwrite,
                                                  streaming=True))
