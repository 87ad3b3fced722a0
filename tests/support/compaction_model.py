"""A compacted log on a MemoryDisk next to a model of what compaction may and must keep: for
tests/log/test_compaction.py (the cleaner against the model) and test_compaction_crash.py (the
same after a crash at every step of a clean).

The model is the list of everything appended (each record's offset, key, value, timestamp,
its batch and producer) and the time of the last clean. Reading the log from the start, it
allows exactly:

* records as appended, at their offsets (never renumbered, never altered), in order;
* every key's latest record, unless it is a tombstone at least delete.retention.ms older
  than a clean (a tombstone goes only after a clean past its delete horizon, which the first
  clean keeping it set delete.retention.ms ahead);
* a record superseded by a later one of its key only while that later one is younger than
  min.compaction.lag.ms at every clean so far (or a tombstone expired as above);
* each producer's last batch, with its offsets and base sequence (its records may be gone);
* batches only where batches were appended (a batch keeps its base and last offset).

After a clean, below the cleaner's checkpoint, no key appears twice and no tombstone is left
whose batch's delete horizon had passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from oncelog.log import cleaning
from oncelog.log.compaction import DELETE_HORIZON_BIT, CompactionConfig
from oncelog.log.log import Log, LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.protocol.batches import RecordSetWalk
from oncelog.protocol.record_batch import assign_offsets, split_batches
from oncelog.protocol.records import decode_batch, encode_batch

T0 = 1_700_000_000_000
DIRECTORY = "/data/c-0"


@dataclass(frozen=True)
class Appended:
    offset: int
    key: bytes
    value: bytes | None
    timestamp: int


@dataclass(frozen=True)
class AppendedBatch:
    base_offset: int
    last_offset: int
    producer_id: int
    base_sequence: int


@dataclass
class Model:
    config: CompactionConfig
    records: list[Appended] = field(default_factory=list)
    batches: list[AppendedBatch] = field(default_factory=list)
    last_clean_ms: int | None = None
    sequences: dict[int, int] = field(default_factory=dict)  # producer id -> next sequence

    def latest(self) -> dict[bytes, Appended]:
        found: dict[bytes, Appended] = {}
        for record in self.records:
            found[record.key] = record
        return found

    def producer_last_offsets(self) -> dict[int, int]:
        found = {}
        for batch in self.batches:
            if batch.producer_id >= 0:
                found[batch.producer_id] = batch.last_offset
        return found

    def check(self, log: Log) -> tuple[list, list]:
        """Read ``log`` from the start and check it against what the model allows."""
        headers, records = read_all(log)
        assert log.log_end_offset == len(self.records)
        assert log.log_start_offset == 0
        appended_batches = {(b.base_offset, b.last_offset) for b in self.batches}
        previous = -1
        for header in headers:
            assert (header.base_offset, header.last_offset) in appended_batches, header
            assert header.base_offset > previous
            previous = header.last_offset
        seen = set()
        last = -1
        for offset, key, value, timestamp in records:
            assert offset > last, "offsets must rise"
            last = offset
            expected = self.records[offset]
            assert (key, value, timestamp) == (expected.key, expected.value,
                                               expected.timestamp), (offset, key, value)
            seen.add(offset)
        latest = self.latest()
        retention = self.config.delete_retention_ms
        for key, record in latest.items():
            if record.offset in seen:
                continue
            assert record.value is None, f"latest value of {key!r} at {record.offset} lost"
            assert self.last_clean_ms is not None and \
                self.last_clean_ms - record.timestamp >= retention, \
                f"tombstone of {key!r} at {record.offset} removed too early"
        for record in self.records:
            if record.offset in seen or latest[record.key] is record:
                continue
            assert self.last_clean_ms is not None, f"{record} removed without a clean"
            if record.value is None and self.last_clean_ms - record.timestamp >= retention:
                continue  # an expired tombstone may go, superseded or not
            if self.config.min_compaction_lag_ms > 0:
                later = [r for r in self.records[record.offset + 1:] if r.key == record.key]
                assert any(r.timestamp <= self.last_clean_ms - self.config.min_compaction_lag_ms
                           for r in later), f"{record} removed within min.compaction.lag.ms"
        by_range = {(h.base_offset, h.last_offset): h for h in headers}
        for pid, last_offset in self.producer_last_offsets().items():
            batch = next(b for b in reversed(self.batches) if b.producer_id == pid)
            header = by_range.get((batch.base_offset, last_offset))
            assert header is not None, f"producer {pid}'s last batch is gone"
            assert (header.producer_id, header.base_sequence) == (pid, batch.base_sequence)
        return headers, records

    def check_cleaned(self, log: Log, now_ms: int) -> None:
        """What a clean at ``now_ms`` must have done below its checkpoint."""
        checkpoint = log.first_dirty_offset
        assert checkpoint is not None
        headers, records = read_all(log)
        keys = [key for offset, key, _, _ in records if offset < checkpoint]
        assert len(keys) == len(set(keys)), "a key twice in the cleaned section"
        for header, batch_records in zip(headers, split_by_batch(headers, records),
                                         strict=True):
            if header.base_offset >= checkpoint:
                break
            if any(value is None for _, _, value, _ in batch_records):
                assert header.attributes & DELETE_HORIZON_BIT
                # past its horizon only if this very clean set it (delete.retention.ms 0):
                # the first clean keeping a tombstone never removes it
                assert header.base_timestamp > now_ms or header.base_timestamp == \
                    now_ms + self.config.delete_retention_ms, "a tombstone past its horizon"


def read_all(log: Log) -> tuple[list, list]:
    """Every batch header, and every record as (offset, key, value, timestamp)."""
    headers, records = [], []
    offset = 0
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20).records
        if not data:
            break
        pos = 0
        while pos < len(data):
            header, batch = decode_batch(data, pos)
            if header.last_offset >= offset:
                headers.append(header)
                records += [(r.offset, r.key, r.value, r.timestamp) for r in batch
                            if r.offset >= offset]
            pos += header.size
            offset = max(offset, header.last_offset + 1)
    return headers, records


def split_by_batch(headers, records) -> list[list]:
    result = []
    i = 0
    for header in headers:
        mine = []
        while i < len(records) and records[i][0] <= header.last_offset:
            mine.append(records[i])
            i += 1
        result.append(mine)
    return result


class Harness:
    """A compacted log on a MemoryDisk with a clock, appended to as the partition does."""

    def __init__(self, config: CompactionConfig, segment_bytes: int = 600,
                 disk: MemoryDisk | None = None) -> None:
        self.disk = disk or MemoryDisk()
        self.disk.makedirs("/data")
        self.log_config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=100,
                                    compaction=config)
        self.model = Model(config)
        self.clock = T0
        self.log = Log(DIRECTORY, self.log_config, self.disk)

    def append(self, records: list[tuple[bytes, bytes | None]], producer_id: int = -1,
               compression: int = 0) -> None:
        model = self.model
        sequence = model.sequences.get(producer_id, 0) if producer_id >= 0 else -1
        batch = encode_batch([(k, v, (), self.clock) for k, v in records], compression,
                             producer_id=producer_id, producer_epoch=0 if producer_id >= 0
                             else -1, base_sequence=sequence)
        headers = split_batches(batch, 1 << 30)
        if self.log.should_roll(headers, self.clock):
            self.log.roll()
        headers, parts = assign_offsets(batch, headers, self.log.log_end_offset, 0)
        self.log.append(parts, headers)
        base = headers[0].base_offset
        for i, (key, value) in enumerate(records):
            model.records.append(Appended(base + i, key, value, self.clock))
        model.batches.append(AppendedBatch(base, headers[0].last_offset, producer_id,
                                           sequence))
        if producer_id >= 0:
            model.sequences[producer_id] = sequence + len(records)

    def roll(self) -> None:
        if self.log.active.size:
            self.log.roll()

    def clean(self, map_capacity: int = 1 << 20) -> cleaning.CleanResult | None:
        result = cleaning.run(self.clean_steps(map_capacity))
        if result is not None:
            self.model.last_clean_ms = self.clock
        return result

    def clean_steps(self, map_capacity: int = 1 << 20):
        return cleaning.clean(self.log, self.model.producer_last_offsets(), self.clock,
                              map_capacity)

    def reopen(self, clean_shutdown: bool) -> None:
        if clean_shutdown:
            self.log.close()
        else:
            self.log.abandon()
            self.disk.crash()
        self.log = Log(DIRECTORY, self.log_config, self.disk)


def committed_view(partition) -> list[tuple[int, bytes | None, bytes | None]]:
    """What a read_committed consumer reads of ``partition`` from its log start, a Fetch at
    a time with the aborted transactions each Fetch answer names: (offset, key, value)."""
    plog = partition.log
    offset, end = plog.log_start_offset, partition.last_stable_offset
    seen: list = []
    while offset < end:
        data = plog.read(offset, 1 << 20).records
        if not data:
            break
        aborted = [(a.producer_id, a.first_offset)
                   for a in partition.aborted_transactions(offset, end)]
        walk = RecordSetWalk(data, offset, end, aborted=aborted)
        for batch in walk:
            base = batch.header.base_offset
            seen += [(base + delta, key, value)
                     for delta, _, key, value, _ in batch.record_fields()
                     if base + delta >= offset]
        assert walk.position > offset
        offset = walk.position
    return seen


def latest_committed(partition) -> dict[bytes, bytes]:
    """Each key's latest value as a read_committed consumer sees it (tombstones: absent)."""
    found: dict = {}
    for _, key, value in committed_view(partition):
        found[key] = value
    return {key: value for key, value in found.items() if value is not None}
