"""``Audit``, the pure core: batch headers (and, for ``--by``, keys or values) in, in log
order per partition; ``finish()`` makes the report. No I/O but the repeat finder's bucket
files."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..protocol.record_batch import BatchHeader
from ..protocol.sequences import HALF, SEQUENCE_SPACE
from .repeats import RepeatFinder
from .report import AuditReport, EpochReport, PartitionReport, ProducerReport
from .sequences import PACKED, EpochSeen, ProducerSeen, expand


class Audit:
    """Accumulates what the batches of a topic say; ``finish()`` makes the report."""

    def __init__(self, topic: str = "", by: Iterable[str] = (), expected_records: int = 0,
                 directory: str | None = None, examples: int = 5) -> None:
        self.topic = topic
        self.partitions: dict[int, PartitionReport] = {}
        self._producers: dict[int, bytes | ProducerSeen] = {}  # partition << 64 | producer id
        self._plain: dict[int, int] = {}  # partition -> records without a producer id
        self.finders: dict[str, RepeatFinder] = {}
        try:
            for name in dict.fromkeys(by):
                self.finders[name] = RepeatFinder(name, expected_records, directory, examples)
        except BaseException:
            self.close()
            raise

    def partition(self, partition: int) -> PartitionReport:
        report = self.partitions.get(partition)
        if report is None:
            report = self.partitions[partition] = PartitionReport(partition)
        return report

    def add_batch(self, partition: int, header: BatchHeader, records: Iterable = ()) -> None:
        """One batch of ``partition``, in log order; ``records`` (objects with ``offset``,
        ``key`` and ``value``, such as ``records.Record``) matter only when looking for
        repeated keys or values."""
        self.add_header(partition, header)
        if self.finders:
            records = list(records)
            offsets = [r.offset for r in records]
            for name, finder in self.finders.items():
                finder.add(partition, offsets, [getattr(r, name) for r in records])

    def add_header(self, partition: int, header: BatchHeader) -> None:
        """One data batch's header (control batches never come here: the batch walk in
        ``protocol.batches`` withholds them)."""
        part = self.partition(partition)
        part.batches += 1
        n = header.records_count
        part.records += n
        pid = header.producer_id
        if pid < 0:
            self._plain[partition] = self._plain.get(partition, 0) + n
            return
        key = partition << 64 | pid
        state = self._producers.get(key)
        seq = header.base_sequence
        span = header.last_offset_delta + 1
        if type(state) is bytes:
            epoch_no, first, last, records, batches = PACKED.unpack(state)
            if epoch_no == header.producer_epoch and seq == (last + 1) % SEQUENCE_SPACE:
                self._producers[key] = PACKED.pack(epoch_no, first, last + span, records + n,
                                                    batches + 1)
                return
            producer = self._producers[key] = expand(state)
        elif state is None:
            if seq >= 0:
                self._producers[key] = PACKED.pack(header.producer_epoch, seq,
                                                    seq + span - 1, n, 1)
                return
            producer = self._producers[key] = ProducerSeen()
        else:
            producer = state
        producer.records += n
        if seq < 0:
            producer.unsequenced += n
            return
        epoch_no = header.producer_epoch
        if epoch_no < producer.max_epoch:
            producer.epoch_regressions += n
        else:
            producer.max_epoch = epoch_no
        epoch = producer.epochs.get(epoch_no)
        if epoch is None:
            epoch = producer.epochs[epoch_no] = EpochSeen()
        # A batch spans base_sequence .. base_sequence + last_offset_delta (compaction may have
        # removed records inside it, never its sequence range). Unwrap the 31-bit sequence
        # relative to the highest sequence seen so far: the nearer of the two directions.
        seen = epoch.seen
        if not seen.starts:
            first = header.base_sequence
            below = 0
            epoch.first_sequence = first
        else:
            high = seen.high
            delta = (header.base_sequence - high - 1) % SEQUENCE_SPACE
            if delta >= HALF:
                delta -= SEQUENCE_SPACE
            first = high + 1 + delta
            below = max(0, min(first + span - 1, high) - first + 1)
        overlap = seen.add(first, first + span - 1)
        epoch.duplicates += overlap
        epoch.regressions += below - overlap
        epoch.records += n
        epoch.batches += 1
        epoch.last_sequence = seen.high % SEQUENCE_SPACE

    def add_values(self, name: str, partition: int, offsets: Sequence[int],
                   datas: Sequence[bytes | None]) -> None:
        """Offsets and keys (``name="key"``) or values of records of ``partition``."""
        self.finders[name].add(partition, offsets, datas)

    def finish(self) -> AuditReport:
        producers = []
        for key, state in sorted(self._producers.items()):
            partition, pid = key >> 64, key & ((1 << 64) - 1)
            if type(state) is bytes:
                state = expand(state)
            row = ProducerReport(partition, pid, state.records, unsequenced=state.unsequenced,
                                 regressions=state.epoch_regressions)
            for number, e in sorted(state.epochs.items()):
                report = EpochReport(number, e.records, e.batches, e.first_sequence,
                                     e.last_sequence, e.duplicates, e.seen.holes,
                                     e.seen.missing, e.regressions)
                row.epochs.append(report)
                row.duplicates += report.duplicates
                row.gaps += report.gaps
                row.missing += report.missing
                row.regressions += report.regressions
            producers.append(row)
        for partition, records in self._plain.items():
            producers.append(ProducerReport(partition, None, records))
        producers.sort(key=lambda r: (r.partition, r.producer_id is not None,
                                      r.producer_id or 0))
        repeats = []
        finders, self.finders = self.finders, {}
        try:
            for finder in finders.values():
                repeats.append(finder.finish())
        finally:
            for finder in finders.values():
                finder.close()
        return AuditReport(self.topic, [self.partitions[p] for p in sorted(self.partitions)],
                           producers, repeats)

    def close(self) -> None:
        for finder in self.finders.values():
            finder.close()
        self.finders = {}

