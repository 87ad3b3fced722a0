"""Auditing a topic on a broker: read it through the topic reader, feed ``Audit``, then read
back the examples of repeated values."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from ..client.topic_reader import TOPIC_GONE, Lost, TopicReader, UnknownTopicOrPartition
from ..protocol.batches import Batch, CorruptBatch, UnsupportedFormat
from .core import Audit
from .report import AuditReport, PartitionReport


class AuditError(Exception):
    """The topic cannot be audited as asked (unknown topic or partition, old format)."""


def open_reader(bootstrap: str, topic: str, timeout: float = 30.0,
                max_bytes: int = 8 << 20) -> TopicReader:
    try:
        return TopicReader(bootstrap, topic, timeout, max_bytes, client_id="oncelog-audit")
    except UnknownTopicOrPartition as exc:
        raise AuditError(exc.detail) from None


def topic_ranges(reader: TopicReader, partitions: Iterable[int] | None
                 ) -> dict[int, tuple[int, int]]:
    """(log start, high watermark) of each partition audited (all, or ``partitions``)."""
    try:
        return reader.ranges(partitions)
    except UnknownTopicOrPartition as exc:
        raise AuditError(exc.detail) from None


def read_partition(reader: TopicReader, report: PartitionReport) -> Iterator[Batch]:
    """The batches of ``report``'s partition from report.start_offset to report.end_offset;
    batches failing their CRC and offsets deleted meanwhile are skipped and counted there."""
    def lost(loss: Lost) -> None:
        if loss.reason == TOPIC_GONE:
            report.complete = False
        else:
            report.skipped_offsets += loss.end - loss.first

    read = reader.read(report.partition, report.start_offset, report.end_offset,
                       skip_corrupt=True, on_loss=lost)
    try:
        yield from read
    except UnsupportedFormat as exc:
        raise AuditError(f"{exc}; only v2 batches carry sequences") from None
    finally:
        report.corrupt_batches += read.corrupt_batches


def record_fields(batch: Batch, want_key: bool, want_value: bool
                  ) -> tuple[list[int], list, list]:
    """Offsets, keys and values of the records of ``batch`` (the keys or values list stays
    empty unless wanted): the hot loop of ``--by``, on the one-pass decoder."""
    fields = batch.record_fields()
    base = batch.header.base_offset
    offsets = [base + f[0] for f in fields]
    keys = [f[2] for f in fields] if want_key else []
    values = [f[3] for f in fields] if want_value else []
    return offsets, keys, values


def audit_topic(bootstrap: str, topic: str, by: Iterable[str] = (),
                partitions: Iterable[int] | None = None, examples: int = 5,
                directory: str | None = None, max_bytes: int = 8 << 20,
                timeout: float = 30.0,
                progress: Callable[[int, int], None] | None = None) -> AuditReport:
    """Read ``topic`` (all partitions, or ``partitions``) from its log start to the high
    watermark at the start of the audit, and audit it. ``progress(records, expected)`` is
    called every few thousand batches."""
    started = time.monotonic()
    by = tuple(dict.fromkeys(by))
    with open_reader(bootstrap, topic, timeout, max_bytes) as reader:
        ranges = topic_ranges(reader, partitions)
        expected = sum(end - start for start, end in ranges.values())
        audit = Audit(topic, by, expected, directory, examples)
        try:
            want_key, want_value = "key" in by, "value" in by
            done = batches = 0
            for p, (start, end) in ranges.items():
                report = audit.partition(p)
                report.start_offset, report.end_offset = start, end
                for batch in read_partition(reader, report):
                    audit.add_header(p, batch.header)
                    if by:
                        try:
                            offsets, keys, values = record_fields(batch, want_key, want_value)
                        except CorruptBatch:  # its CRC holds, its records do not parse
                            report.corrupt_batches += 1
                            offsets = keys = values = []
                        if want_key:
                            audit.add_values("key", p, offsets, keys)
                        if want_value:
                            audit.add_values("value", p, offsets, values)
                    done += batch.header.records_count
                    batches += 1
                    if progress is not None and batches % 2000 == 0:
                        progress(done, expected)
            result = audit.finish()
        finally:
            audit.close()
        for repeat in result.repeats:
            for example in repeat.examples:
                datas = []
                for partition, offset in example.locations:
                    record = reader.record_at(partition, offset)
                    datas.append(None if record is None else getattr(record, repeat.field))
                known = [d for d in datas if d is not None]
                example.data = known[0] if known else None
                example.same = (len(known) == len(datas) and len(set(known)) == 1) if known \
                    else None
    result.seconds = time.monotonic() - started
    return result
