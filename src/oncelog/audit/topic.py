"""Auditing a topic on a broker: read it through the topic reader, feed ``Audit``, then read
back the examples of repeated values."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from ..client.topic_reader import TOPIC_GONE, Lost, TopicReader, UnknownTopicOrPartition
from ..protocol.batches import Batch, CorruptBatch, UnsupportedFormat
from ..protocol.control import Marker, read_marker
from .core import Audit
from .repeats import RepeatReport
from .report import AuditReport, PartitionReport
from .transactions import TransactionAudit


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


def snapshot(reader: TopicReader, partitions: Iterable[int] | None
             ) -> tuple[dict[int, tuple[int, int]], dict[int, int]]:
    """``topic_ranges`` and each partition's last stable offset, taken before its high
    watermark (see ``transactions``: what is open below the high watermark read cannot be
    stable by then)."""
    wanted = reader.partitions if partitions is None else sorted(set(partitions))
    if any(p not in reader.leaders for p in wanted):
        topic_ranges(reader, wanted)  # raises, naming them
    stable = {p: reader.last_stable_offset(p) for p in wanted}
    return topic_ranges(reader, wanted), stable


def read_partition(reader: TopicReader, report: PartitionReport,
                   controls: bool = False) -> Iterator[Batch]:
    """The batches of ``report``'s partition from report.start_offset to report.end_offset
    (with ``controls``, the control batches too); batches failing their CRC and offsets
    deleted meanwhile are skipped and counted there."""
    def lost(loss: Lost) -> None:
        if loss.reason == TOPIC_GONE:
            report.complete = False
        else:
            report.skipped_offsets += loss.end - loss.first

    read = reader.read(report.partition, report.start_offset, report.end_offset,
                       skip_corrupt=True, on_loss=lost, controls=controls)
    try:
        yield from read
    except UnsupportedFormat as exc:
        raise AuditError(f"{exc}; only v2 batches carry sequences") from None
    finally:
        report.corrupt_batches += read.corrupt_batches


def marker_of(batch: Batch, report: PartitionReport) -> Marker | None:
    """The marker of a control batch (None: none); one that does not parse is counted as a
    corrupt batch."""
    try:
        return read_marker(batch.buf, batch.pos)
    except (ValueError, IndexError):
        report.corrupt_batches += 1
        return None


def read_committed(reader: TopicReader, partition: int, start: int, end: int,
                   lost: list[tuple[int, int]]) -> Iterator[Batch]:
    """The batches a read_committed reader gets of [start, end) (``end`` at most the last
    stable offset); offsets [first, end) deleted before they were read go to ``lost``."""
    if start < end:
        yield from reader.read(partition, start, end, skip_corrupt=True, isolation_level=1,
                               on_loss=lambda loss: lost.append((loss.first, loss.end)))


def read_back_examples(reader: TopicReader, repeats: Iterable[RepeatReport]) -> None:
    """Fill in each example's bytes, read back from the broker, and whether they agree."""
    for repeat in repeats:
        for example in repeat.examples:
            datas = []
            for partition, offset in example.locations:
                record = reader.record_at(partition, offset)
                datas.append(None if record is None else getattr(record, repeat.field))
            known = [d for d in datas if d is not None]
            example.data = known[0] if known else None
            example.same = (len(known) == len(datas) and len(set(known)) == 1) if known \
                else None


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


def fields_of(batch: Batch, report: PartitionReport, want_key: bool, want_value: bool
              ) -> tuple[list[int], list, list]:
    """``record_fields``; a batch whose CRC holds but whose records do not parse is counted
    as corrupt and gives none."""
    try:
        return record_fields(batch, want_key, want_value)
    except CorruptBatch:
        report.corrupt_batches += 1
        return [], [], []


def add_fields(audit: Audit, partition: int, batch: Batch, report: PartitionReport,
               want_key: bool, want_value: bool) -> None:
    """``--by``: a batch's keys or values to the repeat finders. Only what a read_committed
    reader gets counts: a transactional batch comes here from the read_committed read, so
    aborted records (a retried transaction's first try) and open ones are not repeats."""
    offsets, keys, values = fields_of(batch, report, want_key, want_value)
    if want_key:
        audit.add_values("key", partition, offsets, keys)
    if want_value:
        audit.add_values("value", partition, offsets, values)


def audit_topic(bootstrap: str, topic: str, by: Iterable[str] = (),
                partitions: Iterable[int] | None = None, examples: int = 5,
                directory: str | None = None, max_bytes: int = 8 << 20,
                timeout: float = 30.0,
                progress: Callable[[int, int], None] | None = None) -> AuditReport:
    """Read ``topic`` (all partitions, or ``partitions``) from its log start to the high
    watermark at the start of the audit, and audit it; a partition holding transactions is
    read again as read_committed, up to its last stable offset. ``progress(records,
    expected)`` is called every few thousand batches."""
    started = time.monotonic()
    by = tuple(dict.fromkeys(by))
    with open_reader(bootstrap, topic, timeout, max_bytes) as reader:
        ranges, stable = snapshot(reader, partitions)
        expected = sum(end - start for start, end in ranges.values())
        audit = Audit(topic, by, expected, directory, examples)
        txns = TransactionAudit()
        try:
            want_key, want_value = "key" in by, "value" in by
            done = batches = 0
            for p, (start, end) in ranges.items():
                report = audit.partition(p)
                report.start_offset, report.end_offset = start, end
                for batch in read_partition(reader, report, controls=True):
                    if batch.header.is_control:
                        txns.add_batch(p, batch.header, marker_of(batch, report))
                        continue
                    audit.add_header(p, batch.header)
                    txns.add_batch(p, batch.header)
                    if by and not batch.header.is_transactional:
                        add_fields(audit, p, batch, report, want_key, want_value)
                    done += batch.header.records_count
                    batches += 1
                    if progress is not None and batches % 2000 == 0:
                        progress(done, expected)
                if txns.has(p):
                    committed_end = min(stable[p], end)
                    lost: list[tuple[int, int]] = []
                    for batch in read_committed(reader, p, start, committed_end, lost):
                        txns.add_visible(p, batch.header)
                        if by and batch.header.is_transactional:
                            add_fields(audit, p, batch, report, want_key, want_value)
                    for first, gone in lost:
                        txns.add_lost(p, first, gone)
                    txns.finish_partition(p, committed_end)
            result = audit.finish()
            result.transactions = txns.finish()
        finally:
            audit.close()
        read_back_examples(reader, result.repeats)
    result.seconds = time.monotonic() - started
    return result
