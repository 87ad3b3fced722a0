"""``format("oncelog")``: the PySpark data source (batch and streaming reads and writes).

Spark pickles the readers and writers made here on the driver and runs ``read``/``write`` in
its Python workers, so they hold options and offsets only, never a connection.
"""

from __future__ import annotations

import json
import logging
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
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from . import progress
from .offsets import (
    Cluster,
    DataLossError,
    OffsetRange,
    Offsets,
    from_json,
    rate_limit,
    split,
    to_json,
    with_retries,
)
from .options import (
    EARLIEST,
    LATEST,
    OptionError,
    ReadOptions,
    read_options,
    write_options,
)
from .schema import spark_schema
from .sink import OncelogStreamWriter, OncelogWriter, writer_options
from .source_options import ByTimestamp

log = logging.getLogger(__name__)


class RangePartition(InputPartition):
    """One Spark task's share: an offset range of one partition."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)
        self.range = rng


def _partitions(ranges: Sequence[OffsetRange], opts: ReadOptions) -> list[InputPartition]:
    return [RangePartition(r) for r in split(ranges, opts.min_partitions,
                                             opts.max_records_per_partition)]


class _ReadsRanges:
    """The part both readers share: a task reads its offset range (see ``columns``)."""

    options: ReadOptions

    def read(self, partition: InputPartition) -> Iterator:
        opts = self.options
        if not isinstance(partition, RangePartition) and partition.value is None:
            return iter(())  # nothing to read: Spark still runs one task, with no range
        assert isinstance(partition, RangePartition), partition
        # Here, in a task: the planners on the driver unpickle this module without pyarrow.
        from .columns import read_range

        return read_range(opts.bootstrap, partition.range, opts.include_headers,
                          opts.fail_on_data_loss, opts.poll_timeout_ms, opts.read_committed,
                          opts.security)


class OncelogReader(_ReadsRanges, DataSourceReader):
    """``spark.read.format("oncelog")``: offsets fixed when the query is planned ("latest" is
    the high watermark, or with read_committed the last stable offset)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        opts = self.options

        def plan():
            with Cluster(opts) as cluster:
                tps = cluster.partitions(must_exist=True)
                marks = cluster.watermarks(tps)
                return (marks, cluster.resolve(opts.starting, tps, marks, EARLIEST),
                        cluster.resolve(opts.ending, tps, marks, LATEST))

        marks, starts, ends = with_retries(opts, "planning the read", plan)
        ranges = []
        for tp, start in starts.items():
            low, high = marks[tp]
            end = ends[tp]
            if start > end:
                name = opts.starting.option if isinstance(opts.starting, ByTimestamp) \
                    else "startingOffsets"
                raise OptionError(name, f"{tp[0]}-{tp[1]} would start at {start}, after its "
                                        f"end at {end}")
            if end > high:
                ends = "its last stable offset is" if opts.read_committed else "ends at"
                raise OptionError("endingOffsets", f"{tp[0]}-{tp[1]} {ends} {high}, before "
                                                   f"offset {end}")
            if start < low:
                if opts.fail_on_data_loss:
                    raise DataLossError(f"{tp[0]}-{tp[1]} starts at {low}, after offset {start}")
                start = low
            ranges.append(OffsetRange(tp[0], tp[1], start, end))
        return _partitions(ranges, opts)


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
        self._admission = None if options.min_offsets_per_trigger is None else \
            progress.Admission(options.min_offsets_per_trigger, options.max_trigger_delay_ms)
        self._reported: Offsets | None = None  # the latest offsets the last trigger saw
        self.group = progress.group_id(options)

    def _latest(self) -> tuple[Offsets, dict]:
        def look():
            with Cluster(self.options) as cluster:
                return cluster.watermarks(cluster.partitions(must_exist=False))

        marks = with_retries(self.options, "looking up the latest offsets", look)
        return {tp: high for tp, (_, high) in marks.items()}, marks

    def initialOffset(self) -> dict:
        def look():
            with Cluster(self.options) as cluster:
                tps = cluster.partitions(must_exist=False)
                marks = cluster.watermarks(tps)
                return to_json(cluster.resolve(self.options.starting, tps, marks, EARLIEST))

        return with_retries(self.options, "looking up the starting offsets", look)

    def reportLatestOffset(self) -> dict | None:
        """The partitions' ends the last trigger saw: Spark shows them as the source's
        latestOffset in each micro-batch's progress, beside its endOffset."""
        return None if self._reported is None else to_json(self._reported)

    def getDefaultReadLimit(self) -> ReadLimit:
        """maxOffsetsPerTrigger as ReadMaxRows; minOffsetsPerTrigger alone as ReadMinRows
        (Spark's Python API has neither a composite limit nor a delay in ReadMinRows: the
        minimum and maxTriggerDelay are applied in latestOffset, whatever limit comes)."""
        opts = self.options
        if opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(opts.max_offsets_per_trigger)
        if opts.min_offsets_per_trigger is not None:
            return ReadMinRows(opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._latest()[0]

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json(start)
        latest, marks = self._latest()
        self._reported = dict(latest)
        if self._until is not None:
            latest = {tp: min(high, self._until.get(tp, marks[tp][0]))
                      for tp, high in latest.items()}
        # A partition new since ``start`` begins at its earliest offset.
        begin = {tp: begin.get(tp, marks[tp][0]) for tp in latest}
        end = {tp: max(high, begin[tp]) for tp, high in latest.items()}
        if self._admission is not None and self._until is None and \
                not isinstance(limit, ReadAllAvailable) and \
                self._admission.hold(begin, end):
            end = dict(begin)  # too few new offsets, and maxTriggerDelay not yet passed
        elif isinstance(limit, ReadMaxRows):
            end = rate_limit(begin, end, limit.max_rows)
        self._log_lag(end, marks)
        # Keep partitions that went away at the offset reached, so the checkpoint still says
        # where they were (partitions() reports their loss).
        for tp, offset in from_json(start).items():
            end.setdefault(tp, offset)
        return to_json(end)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, finish = from_json(start), from_json(end)
        opts = self.options

        def look():
            with Cluster(opts) as cluster:
                return cluster.watermarks(finish)

        marks = with_retries(opts, "planning the micro-batch", look)
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
        return _partitions(ranges, opts)

    def _log_lag(self, end: Offsets, marks: dict) -> None:
        """Spark's Kafka source's lag metrics of the micro-batch about to run (logged: the
        Python source API has no way into the progress's metrics)."""
        if not log.isEnabledFor(logging.INFO) or self._reported is None:
            return
        try:
            sizes = progress.sizes(self.options, marks)
        except Exception as exc:  # the metrics are for watching; never fail a trigger
            log.info("bytes behind unknown: %s", exc)
            sizes = {}
        metrics = progress.behind(end, self._reported, sizes)
        if metrics:
            log.info("micro-batch to %s: %s", json.dumps(to_json(end)), json.dumps(metrics))

    def commit(self, end: dict) -> None:
        """A micro-batch is done: its end offsets go to the query's consumer group, so that
        ``oncelog groups describe`` shows the query's lag (only for watching: the checkpoint
        is where the query resumes)."""
        progress.commit(self.options, self.group, from_json(end))


class OncelogDataSource(DataSource):
    """``format("oncelog")``: read and write topics of oncelog or any Kafka-compatible broker.

    Read options (as Spark's Kafka source): ``bootstrap.servers`` (or
    ``kafka.bootstrap.servers``), one of ``subscribe``, ``subscribePattern``, ``assign``;
    ``startingOffsets``, ``endingOffsets``, ``maxOffsetsPerTrigger``, ``minPartitions``,
    ``includeHeaders``, ``failOnDataLoss``, ``kafkaConsumer.pollTimeoutMs``,
    ``isolation.level`` (``read_uncommitted``, the default, or ``read_committed``: only
    committed transactions' records, and never past the last stable offset); the rest of
    Spark's Kafka source options (source_options.py): ``startingTimestamp``,
    ``startingOffsetsByTimestamp``, ``startingOffsetsByTimestampStrategy``,
    ``endingTimestamp``, ``endingOffsetsByTimestamp``, ``minOffsetsPerTrigger``,
    ``maxTriggerDelay``, ``maxRecordsPerPartition``, ``groupIdPrefix``, ``kafka.group.id``,
    ``fetchOffset.numRetries``, ``fetchOffset.retryIntervalMs``. Write options
    (sink.py): ``bootstrap.servers``, ``topic``, ``guarantee``, ``transactionalIdPrefix``, and
    producer settings (``linger.ms``, ``batch.size``, ``compression.type``, ``client.id``).
    """

    @classmethod
    def name(cls) -> str:
        return "oncelog"

    def schema(self) -> StructType:
        """The read schema; also for a SQL view or table made to be written to (its options
        a sink's, e.g. a topic and no subscribe), whose rows INSERT INTO names by column."""
        try:
            opts = read_options(self.options, streaming=None)
        except OptionError:
            try:
                write_options(self.options)
            except OptionError:
                pass
            else:
                return spark_schema(False)
            raise
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
