"""Which offsets a read covers: topics and partitions, start and end per partition, and how
they are cut into Spark tasks. Runs on the driver.

Offsets are ``{(topic, partition): offset}`` in here; a stream's checkpoint holds them as Spark's
Kafka source does, ``{"topic": {"0": offset, ...}}`` (``to_json`` / ``from_json``). A range is
``[start, end)``. Offsets need not be contiguous (transaction markers take offsets no record
has), so a range may hold fewer records than ``end - start``; that is never data loss.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from kio.schema.errors import ErrorCode

from ..client.admin.admin import Admin
from ..client.network.connection import KafkaError
from ..client.topic_partition import TopicPartition
from ..client.topic_reader import TopicReader
from .options import EARLIEST, LATEST, OptionError, ReadOptions
from .source_options import ByTimestamp

log = logging.getLogger(__name__)

Offsets = dict[TopicPartition, int]


T = TypeVar("T")


def with_retries(options: ReadOptions, what: str, call: Callable[[], T]) -> T:
    """``call`` (a driver's lookup of partitions or offsets), tried fetchOffset.numRetries
    times in all, fetchOffset.retryIntervalMs apart, as Spark's Kafka source retries its
    offset fetches; a broker error or a lost connection is tried again, a bad option or
    data loss is not."""
    for attempt in range(1, options.fetch_retries + 1):
        try:
            return call()
        except (KafkaError, OSError) as exc:
            if attempt == options.fetch_retries:
                raise
            log.warning("%s failed (attempt %d of %d, fetchOffset.numRetries): %s; trying "
                        "again in %d ms", what, attempt, options.fetch_retries, exc,
                        options.fetch_retry_interval_ms)
            time.sleep(options.fetch_retry_interval_ms / 1000)
    raise AssertionError("fetchOffset.numRetries is at least 1")


class DataLossError(RuntimeError):
    """Records a query was to read are gone (failOnDataLoss=true)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message}. Records may have been deleted by retention, or the topic "
                         "deleted or re-created; set failOnDataLoss=false to skip what is lost "
                         "and carry on")


@dataclass(frozen=True, slots=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int  # exclusive

    @property
    def size(self) -> int:
        return self.end - self.start


def to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = offset
    return result


def from_json(offsets: dict[str, dict[str, int]]) -> Offsets:
    return {(topic, int(p)): int(o) for topic, parts in offsets.items() for p, o in parts.items()}


def _cut(r: OffsetRange, parts: int) -> list[OffsetRange]:
    bounds = [r.start + r.size * i // parts for i in range(parts + 1)]
    return [OffsetRange(r.topic, r.partition, a, b) for a, b in itertools.pairwise(bounds)]


def split(ranges: Iterable[OffsetRange], min_partitions: int | None,
          max_records: int | None = None) -> list[OffsetRange]:
    """The non-empty ranges, cut as Spark's Kafka source cuts them: first each into parts of
    at most ``max_records`` offsets (maxRecordsPerPartition), then, if that makes fewer than
    ``min_partitions``, big ones again so there are at least that many (each range gets
    parts in proportion to its share of all offsets)."""
    ranges = [r for r in ranges if r.size > 0]
    if max_records:
        ranges = [part for r in ranges for part in _cut(r, -(-r.size // max_records))]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    result = []
    for r in ranges:
        result += _cut(r, max(1, min(r.size, round(r.size / total * min_partitions))))
    return result


def rate_limit(start: Offsets, latest: Offsets, max_offsets: int) -> Offsets:
    """End offsets at most ``max_offsets`` past ``start`` in all, shared among the partitions in
    proportion to what each has waiting (largest remainders first, then partition order, so
    the same inputs always give the same ends and a partition with data always moves on)."""
    waiting = {tp: max(0, latest[tp] - start.get(tp, latest[tp])) for tp in latest}
    total = sum(waiting.values())
    if total <= max_offsets:
        return dict(latest)
    shares = {tp: n * max_offsets // total for tp, n in waiting.items()}
    left = max_offsets - sum(shares.values())
    by_remainder = sorted((tp for tp, n in waiting.items() if shares[tp] < n),
                          key=lambda tp: (-(waiting[tp] * max_offsets % total), tp))
    for tp in by_remainder[:left]:
        shares[tp] += 1
    return {tp: start.get(tp, latest[tp]) + shares[tp] for tp in latest}


class Cluster:
    """The driver's view of the topics a query reads (metadata and watermarks)."""

    def __init__(self, options: ReadOptions, timeout: float = 30.0) -> None:
        self.options = options
        self.timeout = timeout
        self._readers: dict[str, TopicReader] = {}

    def partitions(self, must_exist: bool) -> list[TopicPartition]:
        """The topic-partitions read now. A batch read (``must_exist``) insists that every
        subscribed topic and assigned partition exists; a stream waits for them to appear."""
        opts = self.options
        with Admin(opts.client(**{"client.id": "oncelog-spark",
                                  "request.timeout.ms": str(int(self.timeout * 1000))})) as admin:
            if opts.pattern is not None:
                topics = {name: info for name, info in admin.metadata().topics.items()
                          if re.fullmatch(opts.pattern, name)}
            else:
                topics = {}
                for name in opts.subscribe or opts.assign:
                    try:
                        topics.update(admin.metadata([name]).topics)
                    except KafkaError as exc:
                        if exc.error != ErrorCode.unknown_topic_or_partition:
                            raise
                        if must_exist:
                            option = "subscribe" if opts.subscribe else "assign"
                            raise OptionError(option, f"topic {name!r} does not exist") \
                                from None
        result = []
        for name, info in sorted(topics.items()):
            indexes = [p.index for p in info.partitions]
            if opts.assign:
                missing = sorted(set(opts.assign[name]) - set(indexes))
                if missing and must_exist:
                    raise OptionError("assign", f"topic {name!r} has no partition {missing[0]} "
                                                f"(it has {len(indexes)})")
                indexes = [p for p in opts.assign[name] if p in indexes]
            result += [(name, p) for p in indexes]
        return result

    def _reader(self, topic: str) -> TopicReader:
        reader = self._readers.get(topic)
        if reader is None:
            reader = self._readers[topic] = TopicReader(self.options.bootstrap, topic,
                                                        self.timeout,
                                                        client_id="oncelog-spark",
                                                        security=self.options.security)
        return reader

    def watermarks(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        """(log start offset, high watermark) of each partition (read_committed: the last
        stable offset for the high watermark); a partition whose topic has gone is left
        out."""
        result = {}
        for topic, partition in tps:
            try:
                reader = self._reader(topic)
                low, high = reader.offsets(partition)
                if self.options.read_committed:
                    high = reader.last_stable_offset(partition)
                result[(topic, partition)] = low, high
            except KafkaError as exc:  # UnknownTopicOrPartition: the topic was deleted
                if exc.error != ErrorCode.unknown_topic_or_partition:
                    raise
        return result

    def resolve(self, spec: str | dict | ByTimestamp, tps: list[TopicPartition],
                marks: dict[TopicPartition, tuple[int, int]], default: int) -> Offsets:
        """Offsets from startingOffsets/endingOffsets: earliest, latest, or per-partition JSON
        (partitions it does not name get ``default``, EARLIEST or LATEST); or by time."""
        if isinstance(spec, ByTimestamp):
            return self.by_timestamp(spec, [tp for tp in tps if tp in marks], marks)
        result = {}
        for tp in tps:
            if tp not in marks:
                continue
            if isinstance(spec, str):
                wanted = EARLIEST if spec == "earliest" else LATEST
            else:
                wanted = spec.get(tp[0], {}).get(tp[1], default)
            low, high = marks[tp]
            result[tp] = low if wanted == EARLIEST else high if wanted == LATEST else wanted
        return result

    def by_timestamp(self, spec: ByTimestamp, tps: list[TopicPartition],
                     marks: dict[TopicPartition, tuple[int, int]]) -> Offsets:
        """ListOffsets by timestamp for each partition: the first offset at or after the
        time; none (no record that late): the latest offset, or an error naming the
        partition (startingOffsetsByTimestampStrategy error, the default)."""
        wanted = {}
        for tp in tps:
            ts = spec.wanted(tp)
            if ts is None:
                raise OptionError(spec.option, f"names no timestamp for {tp[0]}-{tp[1]}: give "
                                               "one for every partition read, as Spark's "
                                               "Kafka source needs")
            wanted[tp] = ts
        with Admin(self.options.client(**{
                "client.id": "oncelog-spark",
                "request.timeout.ms": str(int(self.timeout * 1000))})) as admin:
            found = admin.list_offsets(wanted, self.options.read_committed)
        result = {}
        for tp, ts in wanted.items():
            offset = found[tp]
            if isinstance(offset, KafkaError):
                raise offset
            if offset < 0:
                if not spec.latest_if_none:
                    raise OptionError(spec.option, f"no offset matched from request of "
                                                   f"topic-partition {tp[0]}-{tp[1]} and "
                                                   f"timestamp {ts} (no record that late); "
                                                   "startingOffsetsByTimestampStrategy=latest "
                                                   "starts such a partition at its latest "
                                                   "offset")
                offset = marks[tp][1]
            # Past the last stable offset (read_committed): where its next record will be.
            result[tp] = min(max(offset, marks[tp][0]), marks[tp][1])
        return result

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
