"""``oncelog audit``: check a topic for duplicates, gaps and reordering, on any Kafka broker.

Two parts:

* ``Audit``, a pure core. Feed it ``add_batch(partition, header, records)`` in log order, one
  partition after another or interleaved, then call ``finish()`` for an ``AuditReport``.
* ``TopicReader`` / ``audit_topic``, a client that reads a topic with the standard Kafka APIs
  only (Metadata for the leader of each partition, ListOffsets, Fetch), so the audit runs
  against Kafka, Redpanda or any other Kafka-compatible broker as well as against oncelog.

What the sequence audit checks, per partition, producer id and epoch (the idempotent
producer's record sequence numbers; the sequence of a record is its batch's base sequence plus
its offset delta, wrapping from 2^31-1 to 0):

* duplicate: a sequence stored twice (the same producer id, epoch and sequence);
* gap: a hole in the sequences of an epoch at the end of the audit (``missing`` counts the
  sequences in the holes); a hole that a later batch fills is reported as a regression instead;
* regression: a batch whose new sequences lie below ones stored before it (out of order), and
  every batch of an epoch older than one already seen for its producer id on the partition
  (a fenced producer that got through).

A new epoch resets expectations: KIP-360 bumps the epoch and restarts sequences at 0. The first
batch seen of an epoch may start anywhere (retention may have deleted the start, and a producer
whose state expired continues where it was). Per epoch the audit keeps the sorted disjoint
ranges of the sequences seen: an idempotent stream is one range, so memory stays tiny however
long the stream; each hole costs 16 bytes. A producer id whose batches on a partition so far
form one run in one epoch (nearly all) is kept packed, about 150 bytes; memory therefore grows
with the number of producer ids and of holes, not with the number of records.

The sequence audit cannot see a duplicate that a producer wrote under a new epoch (as Kafka
stores it in the seed's figure 5) or that a non-idempotent producer, or an application that
sent a record twice, wrote: ``by=("value",)`` / ``("key",)`` finds records whose value (key)
occurs more than once in the topic. Null keys and values are not counted. It does not hold the
values: each record contributes an 8-byte BLAKE2b hash and its location to one of up to 256
bucket files in a temporary directory (16 bytes a record on disk: 160 MB for 10^7 records), and
``finish()`` reads one bucket at a time (about 100 bytes a record of the bucket: 4 MB at 10^7
records, growing linearly past 8.4 million). Two different values share a hash with
probability about n^2 / 2^65 (below 10^-5 for 10^7 distinct values); the examples reported are
read back from the broker and compared byte for byte, so a collision would show as
``same: false`` in an example.

Control batches (transaction markers) are skipped; records of aborted transactions are read
like any other (the audit reads uncommitted), so a transactional producer's aborted and retried
records show up under ``by``.
"""

from __future__ import annotations

import heapq
import os
import struct
import sys
import tempfile
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from hashlib import blake2b

from kio.schema.errors import ErrorCode

from .client import calls
from .client.admin import Admin
from .client.connection import BrokerConnection, KafkaError
from .protocol.record_batch import (
    CURRENT_MAGIC,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    BatchHeader,
    crc_of,
    read_header,
)
from .protocol.records import decode_batch, decode_record_fields

SEQUENCE_SPACE = 1 << 31
_HALF = 1 << 30
FIELDS = ("key", "value")
NO_LOCATION = (1 << 64) - 1
_PARTITION_SHIFT = 48  # a record's location: partition << 48 | offset, in 64 bits


# --- sequences ---------------------------------------------------------------------------------

class SeenSequences:
    """Sorted, disjoint, non-adjacent ranges [start, end] of (unwrapped) sequence numbers."""

    __slots__ = ("count", "ends", "starts")

    def __init__(self) -> None:
        self.starts = array("q")
        self.ends = array("q")
        self.count = 0

    def add(self, first: int, last: int) -> int:
        """Mark first..last seen; return how many of them were seen already."""
        starts, ends = self.starts, self.ends
        n = len(ends)
        if n and first == ends[-1] + 1:  # the usual case: the next batch of the stream
            ends[-1] = last
            self.count += last - first + 1
            return 0
        if not n or first > ends[-1] + 1:
            starts.append(first)
            ends.append(last)
            self.count += last - first + 1
            return 0
        hi = bisect_right(starts, last)  # ranges before hi start at or before `last`
        lo = bisect_left(ends, first)  # ranges from lo end at or after `first`
        overlap = 0
        for k in range(lo, hi):
            overlap += min(last, ends[k]) - max(first, starts[k]) + 1
        if lo > 0 and ends[lo - 1] == first - 1:
            lo -= 1
        if hi < n and starts[hi] == last + 1:
            hi += 1
        new_start = min(first, starts[lo]) if lo < hi else first
        new_end = max(last, ends[hi - 1]) if lo < hi else last
        starts[lo:hi] = array("q", (new_start,))
        ends[lo:hi] = array("q", (new_end,))
        self.count += last - first + 1 - overlap
        return overlap

    @property
    def holes(self) -> int:
        return max(0, len(self.starts) - 1)

    @property
    def missing(self) -> int:
        if not self.starts:
            return 0
        return self.ends[-1] - self.starts[0] + 1 - self.count

    @property
    def high(self) -> int:
        return self.ends[-1]


class _Epoch:
    __slots__ = ("batches", "duplicates", "first_sequence", "last_sequence", "records",
                 "regressions", "seen")

    def __init__(self) -> None:
        self.seen = SeenSequences()
        self.records = 0
        self.batches = 0
        self.duplicates = 0
        self.regressions = 0
        self.first_sequence = -1
        self.last_sequence = -1


# A producer id on a partition whose batches so far are one epoch and one run of sequences,
# each batch following the one before (nearly all of them): epoch, first and last (unwrapped)
# sequence, records, batches, packed in 72 bytes, not the 700 of a _Producer. Anything else
# turns it into a _Producer.
_SIMPLE = struct.Struct("<hqqqq")


class _Producer:
    __slots__ = ("epoch_regressions", "epochs", "max_epoch", "records", "unsequenced")

    def __init__(self) -> None:
        self.epochs: dict[int, _Epoch] = {}
        self.max_epoch = -1
        self.records = 0
        self.unsequenced = 0  # records with a producer id but no sequence
        self.epoch_regressions = 0  # records under an epoch older than one seen before


# --- repeated keys and values ------------------------------------------------------------------

_LOC = struct.Struct("=Q")
_FLUSH_BYTES = 1 << 16  # a bucket's buffer is written out from this size
_FLUSH_RECORDS = 1 << 14  # checked every this many records
MAX_LOCATIONS = 5  # locations kept per repeated value, for the examples
# Bucket files: enough that each holds about BUCKET_RECORDS records (finish() holds one bucket
# at a time, about 100 bytes a record), up to MAX_BUCKETS; past 8.4 million records the
# buckets grow instead (10 million records: about 4 MB at a time).
BUCKET_RECORDS = 32_768
MAX_BUCKETS = 256


@dataclass
class RepeatExample:
    count: int  # how many records carry this value
    locations: list[tuple[int, int]]  # (partition, offset) of the first MAX_LOCATIONS of them
    data: bytes | None = None  # the value, read back from the broker (None: not read)
    same: bool | None = None  # whether every listed location holds the same bytes


@dataclass
class RepeatReport:
    field: str
    records: int  # records hashed (non-null)
    nulls: int
    repeated: int  # distinct values occurring more than once
    extra: int  # records beyond the first of each value: what a clean topic would not hold
    by_partition: dict[int, int]  # extra records per partition (counted where the copy is)
    examples: list[RepeatExample]


class RepeatFinder:
    """Counts repeated values of one field with bounded memory (see the module docstring)."""

    def __init__(self, field_name: str, expected_records: int = 0, directory: str | None = None,
                 examples: int = 5) -> None:
        if field_name not in FIELDS:
            raise ValueError(f"can only look for repeated {' or '.join(FIELDS)}")
        self.field = field_name
        self.examples = examples
        buckets = 1
        while buckets < MAX_BUCKETS and buckets * BUCKET_RECORDS < expected_records:
            buckets *= 2
        self._shift = 8 - (buckets.bit_length() - 1)  # bucket = first digest byte >> shift
        self._dir = tempfile.TemporaryDirectory(prefix=f"oncelog-audit-{field_name}-",
                                                dir=directory)
        self._paths = [os.path.join(self._dir.name, f"{i:03d}") for i in range(buckets)]
        self._buffers = [bytearray() for _ in range(buckets)]
        self.records = 0
        self.nulls = 0
        self._pending = 0  # records hashed since the buffers were last looked at

    def add(self, partition: int, offsets: Sequence[int],
            datas: Sequence[bytes | None]) -> None:
        """Records of one partition, in log order: their offsets and keys (or values)."""
        buffers, shift = self._buffers, self._shift
        pack = _LOC.pack
        base = partition << _PARTITION_SHIFT
        if not (0 <= partition < (1 << 16) and offsets and 0 <= min(offsets)
                and max(offsets) < (1 << _PARTITION_SHIFT)):
            base, offsets = 0, [NO_LOCATION] * len(offsets)  # cannot pack: no examples
        nulls = 0
        for offset, data in zip(offsets, datas, strict=True):
            if data is None:
                nulls += 1
                continue
            digest = blake2b(data, digest_size=8).digest()
            buf = buffers[digest[0] >> shift]
            buf += digest
            buf += pack(base | offset)
        hashed = len(datas) - nulls
        self.records += hashed
        self.nulls += nulls
        self._pending += hashed
        if self._pending >= _FLUSH_RECORDS:
            self._pending = 0
            for index, buf in enumerate(buffers):
                if len(buf) >= _FLUSH_BYTES:
                    self._write(index)

    def _write(self, index: int) -> None:
        # Opened for each write: no file handles held (256 buckets per field would exceed
        # some systems' default limit of open files).
        buf = self._buffers[index]
        with open(self._paths[index], "ab") as f:
            f.write(buf)
        buf.clear()

    def finish(self) -> RepeatReport:
        for index in range(len(self._buffers)):
            self._write(index)
        self._buffers = []
        repeated = extra = 0
        by_partition: dict[int, int] = {}
        best: list[tuple[int, int, list[int]]] = []  # (second location, count, locations)
        try:
            for path in self._paths:
                entries = array("Q")
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        entries.frombytes(f.read())
                    os.unlink(path)
                hashes = entries[0::2]
                if len(set(hashes)) == len(hashes):
                    continue
                locations = entries[1::2]
                del entries
                first: dict[int, int] = {}
                groups: dict[int, list[int]] = {}  # hash -> [count, location, location, ...]
                for i, h in enumerate(hashes):
                    j = first.get(h)
                    if j is None:
                        first[h] = i
                        continue
                    loc = locations[i]
                    if loc != NO_LOCATION:
                        p = loc >> _PARTITION_SHIFT
                        by_partition[p] = by_partition.get(p, 0) + 1
                    group = groups.get(h)
                    if group is None:
                        groups[h] = [2, locations[j], loc]
                    else:
                        group[0] += 1
                        if len(group) <= MAX_LOCATIONS:
                            group.append(loc)
                del first
                repeated += len(groups)
                for group in groups.values():
                    extra += group[0] - 1
                best = heapq.nsmallest(self.examples, best + [
                    (g[2], g[0], g[1:]) for g in groups.values()])
        finally:
            self._dir.cleanup()
        examples = [RepeatExample(count, [_unpack_location(loc) for loc in locs
                                          if loc != NO_LOCATION])
                    for _, count, locs in best]
        return RepeatReport(self.field, self.records, self.nulls, repeated, extra,
                            dict(sorted(by_partition.items())), examples)

    def close(self) -> None:
        self._buffers = []
        self._dir.cleanup()


def _unpack_location(loc: int) -> tuple[int, int]:
    return loc >> _PARTITION_SHIFT, loc & ((1 << _PARTITION_SHIFT) - 1)


# --- the report --------------------------------------------------------------------------------

@dataclass
class EpochReport:
    epoch: int
    records: int
    batches: int
    first_sequence: int
    last_sequence: int
    duplicates: int
    gaps: int
    missing: int
    regressions: int


@dataclass
class ProducerReport:
    partition: int
    producer_id: int | None  # None: records written without a producer id (not idempotent)
    records: int
    duplicates: int = 0
    gaps: int = 0
    missing: int = 0
    regressions: int = 0
    unsequenced: int = 0
    epochs: list[EpochReport] = field(default_factory=list)

    @property
    def problems(self) -> int:
        return self.duplicates + self.gaps + self.regressions


@dataclass
class PartitionReport:
    partition: int
    start_offset: int = -1  # the range read: [start_offset, end_offset)
    end_offset: int = -1
    records: int = 0
    batches: int = 0
    corrupt_batches: int = 0  # CRC mismatch: skipped
    skipped_offsets: int = 0  # deleted by retention while the audit read
    complete: bool = True  # False: the reader could not get to end_offset


@dataclass
class AuditReport:
    topic: str
    partitions: list[PartitionReport]
    producers: list[ProducerReport]
    repeats: list[RepeatReport]
    seconds: float = 0.0

    @property
    def totals(self) -> dict[str, int]:
        return {
            "records": sum(p.records for p in self.partitions),
            "batches": sum(p.batches for p in self.partitions),
            "producers": len({p.producer_id for p in self.producers
                              if p.producer_id is not None}),
            "duplicates": sum(p.duplicates for p in self.producers),
            "gaps": sum(p.gaps for p in self.producers),
            "missing": sum(p.missing for p in self.producers),
            "regressions": sum(p.regressions for p in self.producers),
            "corrupt_batches": sum(p.corrupt_batches for p in self.partitions),
            "incomplete_partitions": sum(not p.complete for p in self.partitions),
            **{f"repeated_{r.field}s": r.repeated for r in self.repeats},
            **{f"extra_{r.field}_records": r.extra for r in self.repeats},
        }

    @property
    def problems(self) -> list[str]:
        t = self.totals
        found = []
        if t["duplicates"]:
            found.append(_count(t["duplicates"], "duplicate sequence"))
        if t["gaps"]:
            found.append(f"{_count(t['gaps'], 'gap')} ({_count(t['missing'], 'missing sequence')})")
        if t["regressions"]:
            found.append(_count(t["regressions"], "regressed sequence"))
        for r in self.repeats:
            if r.extra:
                found.append(f"{_count(r.repeated, r.field)} repeated "
                             f"({_count(r.extra, 'extra record')})")
        if t["corrupt_batches"]:
            found.append(_count(t["corrupt_batches"], "corrupt batch", "corrupt batches"))
        if t["incomplete_partitions"]:
            found.append(_count(t["incomplete_partitions"], "partition") + " not read to the end")
        return found

    @property
    def clean(self) -> bool:
        return not self.problems

    @property
    def verdict(self) -> str:
        t = self.totals
        read = (f"{_count(t['records'], 'record')} in "
                f"{_count(len(self.partitions), 'partition')}, "
                f"{_count(t['producers'], 'producer id')}")
        if self.clean:
            checked = "duplicate, gap or regression" + (
                "".join(f", repeated {r.field}" for r in self.repeats))
            return f"CLEAN: {read}; no {checked}"
        return f"NOT CLEAN: {read}; " + ", ".join(self.problems)

    def to_json(self) -> dict:
        repeats = []
        for r in self.repeats:
            d = asdict(r)
            d["by_partition"] = {str(k): v for k, v in r.by_partition.items()}
            for example in d["examples"]:
                data = example.pop("data")
                example["data"] = None if data is None else data.decode("utf-8", "replace")
                example["data_hex"] = None if data is None else data.hex()
                example["locations"] = [{"partition": p, "offset": o}
                                        for p, o in example["locations"]]
            repeats.append(d)
        return {
            "topic": self.topic,
            "clean": self.clean,
            "verdict": self.verdict,
            "problems": self.problems,
            "totals": self.totals,
            "partitions": [asdict(p) for p in self.partitions],
            "producers": [asdict(p) for p in self.producers],
            "repeats": repeats,
            "seconds": round(self.seconds, 3),
        }


def _count(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n:,} {singular if n == 1 else plural or singular + 's'}"


# --- the core ----------------------------------------------------------------------------------

class Audit:
    """Accumulates what the batches of a topic say; ``finish()`` makes the report."""

    def __init__(self, topic: str = "", by: Iterable[str] = (), expected_records: int = 0,
                 directory: str | None = None, examples: int = 5) -> None:
        self.topic = topic
        self.partitions: dict[int, PartitionReport] = {}
        self._producers: dict[int, bytes | _Producer] = {}  # partition << 64 | producer id
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
        if header.is_control:
            return
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
            epoch_no, first, last, records, batches = _SIMPLE.unpack(state)
            if epoch_no == header.producer_epoch and seq == (last + 1) % SEQUENCE_SPACE:
                self._producers[key] = _SIMPLE.pack(epoch_no, first, last + span, records + n,
                                                    batches + 1)
                return
            producer = self._producers[key] = _expand(state)
        elif state is None:
            if seq >= 0:
                self._producers[key] = _SIMPLE.pack(header.producer_epoch, seq,
                                                    seq + span - 1, n, 1)
                return
            producer = self._producers[key] = _Producer()
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
            epoch = producer.epochs[epoch_no] = _Epoch()
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
            if delta >= _HALF:
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
                state = _expand(state)
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


def _expand(packed: bytes) -> _Producer:
    epoch_no, first, last, records, batches = _SIMPLE.unpack(packed)
    producer = _Producer()
    producer.max_epoch = epoch_no
    producer.records = records
    epoch = producer.epochs[epoch_no] = _Epoch()
    epoch.seen.add(first, last)
    epoch.records, epoch.batches = records, batches
    epoch.first_sequence = first % SEQUENCE_SPACE
    epoch.last_sequence = last % SEQUENCE_SPACE
    return producer


# --- reading records fast ----------------------------------------------------------------------

def record_fields(header: BatchHeader, buf: bytes, pos: int, want_key: bool,
                  want_value: bool) -> tuple[list[int], list, list]:
    """Offsets, keys and values of the records of the batch at ``pos`` (the keys or values
    list stays empty unless wanted): the hot loop of ``--by``, on the one-pass decoder."""
    _, fields = decode_record_fields(buf, pos)
    base = header.base_offset
    offsets = [base + f[0] for f in fields]
    keys = [f[2] for f in fields] if want_key else []
    values = [f[3] for f in fields] if want_value else []
    return offsets, keys, values


# --- the client --------------------------------------------------------------------------------

RETRIABLE = frozenset({
    ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available,
    ErrorCode.unknown_topic_or_partition, ErrorCode.fenced_leader_epoch,
    ErrorCode.unknown_leader_epoch, ErrorCode.network_exception, ErrorCode.request_timed_out,
    ErrorCode.kafka_storage_error, ErrorCode.offset_not_available,
    ErrorCode.replica_not_available,
})


class AuditError(Exception):
    """The topic cannot be audited as asked (unknown topic or partition, old format)."""


class TopicReader:
    """Reads partitions of one topic from their leaders, with the standard Kafka APIs."""

    def __init__(self, bootstrap: str, topic: str, timeout: float = 30.0,
                 max_bytes: int = 8 << 20, attempts: int = 8) -> None:
        self.topic = topic
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.attempts = attempts
        self._admin_config = {"bootstrap.servers": bootstrap,
                              "request.timeout.ms": str(int(timeout * 1000)),
                              "client.id": "oncelog-audit"}
        self.admin = Admin(self._admin_config)
        self._conns: dict[int, BrokerConnection] = {}
        self.brokers: dict[int, tuple[str, int]] = {}
        self.leaders: dict[int, int] = {}
        try:
            self.refresh()
        except KafkaError as exc:
            self.close()
            if exc.error == ErrorCode.unknown_topic_or_partition:
                raise AuditError(f"topic {topic!r} does not exist") from None
            raise
        except BaseException:
            self.close()
            raise

    def refresh(self) -> None:
        try:
            info = self.admin.metadata([self.topic])
        except KafkaError as exc:
            if exc.error not in (ErrorCode.network_exception, ErrorCode.request_timed_out):
                raise
            self.admin.close()  # the bootstrap broker dropped us: connect again, once
            self.admin = Admin(self._admin_config)
            info = self.admin.metadata([self.topic])
        self.brokers = info.brokers
        self.leaders = {p.index: p.leader for p in info.topics[self.topic].partitions}

    @property
    def partitions(self) -> list[int]:
        return sorted(self.leaders)

    def _conn(self, partition: int) -> BrokerConnection:
        leader = self.leaders.get(partition, -1)
        if leader < 0 or leader not in self.brokers:
            raise KafkaError(ErrorCode.leader_not_available,
                             f"no leader for {self.topic}-{partition}")
        conn = self._conns.get(leader)
        if conn is None:
            host, port = self.brokers[leader]
            conn = self._conns[leader] = BrokerConnection(host, port, "oncelog-audit",
                                                          self.timeout)
        return conn

    def _on_leader(self, partition: int, call: Callable[[BrokerConnection], object]):
        """``call`` on the partition's leader; on a leadership or network error, look the
        leader up again and retry, with backoff, at most ``attempts`` times."""
        for attempt in range(self.attempts):
            try:
                return call(self._conn(partition))
            except KafkaError as exc:
                if exc.error not in RETRIABLE or attempt == self.attempts - 1:
                    raise
                leader = self.leaders.get(partition, -1)
                conn = self._conns.pop(leader, None)
                if conn is not None:
                    conn.close()
                time.sleep(min(2.0, 0.1 * 2 ** attempt))
                self.refresh()
        raise AssertionError("unreachable")

    def offsets(self, partition: int) -> tuple[int, int]:
        """The partition's (log start offset, high watermark)."""
        start = self._on_leader(partition, lambda c: calls.list_offset(
            c, self.topic, partition, calls.EARLIEST))
        end = self._on_leader(partition, lambda c: calls.list_offset(
            c, self.topic, partition, calls.LATEST))
        return start, end

    def ranges(self, partitions: Iterable[int] | None = None) -> dict[int, tuple[int, int]]:
        """(log start offset, high watermark) of each of ``partitions`` (default: all)."""
        indexes = self.partitions if partitions is None else list(dict.fromkeys(partitions))
        unknown = [p for p in indexes if p not in self.leaders]
        if unknown:
            raise AuditError(f"topic {self.topic!r} has no partition "
                             f"{', '.join(map(str, unknown))} (it has {len(self.leaders)})")
        return {p: self.offsets(p) for p in indexes}

    def fetch(self, partition: int, offset: int, max_bytes: int) -> calls.FetchResult:
        return self._on_leader(partition, lambda c: calls.fetch(
            c, self.topic, partition, offset, max_wait_ms=100, max_bytes=max_bytes))

    def batches(self, partition: int, report: PartitionReport,
                empty_limit: int = 5) -> Iterator[tuple[BatchHeader, bytes, int]]:
        """(header, buffer, position) of each batch from report.start_offset up to
        report.end_offset; CRC mismatches are counted in ``report`` and skipped."""
        position, end = report.start_offset, report.end_offset
        max_bytes = self.max_bytes
        empty = 0
        while position < end:
            try:
                result = self.fetch(partition, position, max_bytes)
            except KafkaError as exc:
                if exc.error != ErrorCode.offset_out_of_range:
                    raise
                start, _ = self.offsets(partition)  # retention deleted it while we read
                if start <= position:
                    raise
                report.skipped_offsets += start - position
                position = start
                continue
            buf = result.records
            total = len(buf)
            pos = 0
            progressed = False
            while total - pos >= HEADER_SIZE:
                header = read_header(buf, pos)
                size = header.size
                if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + size > total:
                    break
                if buf[pos + MAGIC_OFFSET] != CURRENT_MAGIC:
                    raise AuditError(f"{self.topic}-{partition} holds message format "
                                     f"v{buf[pos + MAGIC_OFFSET]} at offset "
                                     f"{header.base_offset}; only v2 batches carry sequences")
                if header.base_offset >= end:
                    return
                if header.last_offset >= position:
                    if crc_of(buf, pos, size) != header.crc:
                        report.corrupt_batches += 1
                    else:
                        yield header, buf, pos
                    position = header.last_offset + 1
                    progressed = True
                pos += size
            if progressed:
                empty = 0
                continue
            if total:  # one batch larger than max_bytes (brokers before KIP-74 do this)
                if max_bytes >= 1 << 30:
                    raise AuditError(f"a batch of {self.topic}-{partition} at offset "
                                     f"{position} does not fit in 1 GiB")
                max_bytes *= 2
                continue
            empty += 1
            if empty >= empty_limit:
                report.complete = False
                return

    def record_at(self, partition: int, offset: int):
        """The record at ``offset`` (``records.Record``), or None if it is gone."""
        try:
            result = self.fetch(partition, offset, 1 << 20)
        except KafkaError:
            return None
        buf = result.records
        pos = 0
        while len(buf) - pos >= HEADER_SIZE:
            header = read_header(buf, pos)
            if pos + header.size > len(buf) or header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
                return None
            if header.base_offset <= offset <= header.last_offset and not header.is_control:
                for record in decode_batch(buf, pos)[1]:
                    if record.offset == offset:
                        return record
                return None
            pos += header.size
        return None

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        self.admin.close()

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    with TopicReader(bootstrap, topic, timeout, max_bytes) as reader:
        ranges = reader.ranges(partitions)
        indexes = list(ranges)
        expected = sum(end - start for start, end in ranges.values())
        audit = Audit(topic, by, expected, directory, examples)
        try:
            want_key, want_value = "key" in by, "value" in by
            done = batches = 0
            for p in indexes:
                report = audit.partition(p)
                report.start_offset, report.end_offset = ranges[p]
                for header, buf, pos in reader.batches(p, report):
                    audit.add_header(p, header)
                    if by and not header.is_control:
                        offsets, keys, values = record_fields(header, buf, pos, want_key,
                                                              want_value)
                        if want_key:
                            audit.add_values("key", p, offsets, keys)
                        if want_value:
                            audit.add_values("value", p, offsets, values)
                    done += header.records_count
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


# --- human output ------------------------------------------------------------------------------

def _shorten(data: bytes | None, limit: int = 60) -> str:
    if data is None:
        return "(not read)"
    text = repr(data)[2:-1]
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _epochs(row: ProducerReport) -> str:
    numbers = [e.epoch for e in row.epochs]
    if not numbers:
        return "-"
    if len(numbers) <= 3:
        return ",".join(map(str, numbers))
    return f"{numbers[0]}..{numbers[-1]} ({len(numbers)})"


def _table(rows: list[tuple[str, ...]], left: int, out) -> None:
    """Columns padded to their widest cell: the first ``left`` flush left, the rest right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i < left else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip(),
              file=out)


def format_report(report: AuditReport, out=None, max_rows: int = 100) -> None:
    out = out or sys.stdout
    print(f"topic {report.topic}: {_count(len(report.partitions), 'partition')} read", file=out)
    rows = [("PARTITION", "OFFSETS", "RECORDS", "BATCHES", "NOTES")]
    for p in report.partitions:
        notes = []
        if p.corrupt_batches:
            notes.append(f"{p.corrupt_batches} corrupt batches skipped")
        if p.skipped_offsets:
            notes.append(f"{p.skipped_offsets} offsets deleted while reading")
        if not p.complete:
            notes.append("not read to the end")
        rows.append((str(p.partition), f"{p.start_offset}..{p.end_offset}", str(p.records),
                     str(p.batches), "; ".join(notes)))
    _table(rows, 2, out)
    print(file=out)
    rows = [("PARTITION", "PRODUCER_ID", "EPOCHS", "RECORDS", "DUPLICATES", "GAPS", "MISSING",
             "REGRESSIONS")]
    shown = report.producers
    if len(shown) > max_rows:  # many producer ids: the ones with problems first
        shown = [r for r in shown if r.problems][:max_rows]
        shown += [r for r in report.producers if not r.problems][:max_rows - len(shown)]
        shown.sort(key=lambda r: (r.partition, r.producer_id is not None, r.producer_id or 0))
    for row in shown:
        if row.producer_id is None:
            rows.append((str(row.partition), "none", "-", str(row.records), "-", "-", "-", "-"))
        else:
            rows.append((str(row.partition), str(row.producer_id), _epochs(row),
                         str(row.records), str(row.duplicates), str(row.gaps), str(row.missing),
                         str(row.regressions)))
    t = report.totals
    rows.append(("TOTAL", str(t["producers"]), "", str(t["records"]), str(t["duplicates"]),
                 str(t["gaps"]), str(t["missing"]), str(t["regressions"])))
    _table(rows, 3, out)
    if len(shown) < len(report.producers):
        print(f"({len(report.producers) - len(shown):,} rows without problems not shown; "
              "--json lists every one)", file=out)
    for repeat in report.repeats:
        print(file=out)
        print(f"by {repeat.field}: {_count(repeat.records, 'record')} with a {repeat.field} "
              f"({repeat.nulls:,} null); {_count(repeat.repeated, repeat.field)} occurring more "
              f"than once, {_count(repeat.extra, 'extra record')}", file=out)
        if repeat.by_partition:
            print("  extra records per partition (the copies read last): " + ", ".join(
                f"{p}: {n}" for p, n in repeat.by_partition.items()), file=out)
        for example in repeat.examples:
            where = ", ".join(f"{p}:{o}" for p, o in example.locations)
            more = "" if example.count <= len(example.locations) else ", ..."
            same = "" if example.same is not False else " (hash collision: the bytes differ)"
            print(f"  {_shorten(example.data)!s}  x{example.count} at {where}{more}{same}",
                  file=out)
    print(file=out)
    print(report.verdict, file=out)
