"""What log compaction keeps: every decision of the cleaner, and nothing else.

This file does no I/O and knows nothing of segments on disk, producers' state machines or the
event loop: batches (bytes) and facts about the log come in, decisions and rewritten batches
go out. log/cleaning.py reads and writes the files; broker/partition.py supplies the producer
facts. That split is what lets tests/log/test_compaction.py drive it against a model.

Theory of operation, as Kafka's LogCleaner does it:

* The log is split at the *first dirty offset* (remembered in a checkpoint after each clean):
  below it, the clean section was compacted before; from it up to the *first uncleanable
  offset*, the dirty section has not been. The first uncleanable offset is the active
  segment's base (never cleaned: appends go there), or earlier, the first segment holding a
  record younger than ``min.compaction.lag.ms``.
* A log is due when its dirty bytes are at least ``min.cleanable.dirty.ratio`` of clean +
  dirty bytes, or when a dirty record waited longer than ``max.compaction.lag.ms``, or when a
  tombstone's delete horizon (below) passed.
* The *offset map*: for each key in the dirty section, the offset of its latest record. It is
  bounded (``log.cleaner.dedupe.buffer.size``); when full, the clean covers only what the map
  covers and the rest waits for the next clean.
* Every batch from the log start up to the map's end is rewritten keeping a record when no
  later record of its key is in the map (its offset is at or after the map's), when it has a
  key (Kafka's cleaner drops keyless records of a compacted log: no later value can replace
  them, and a compacted topic refuses them on produce), and, for a tombstone (a null value),
  while its batch's delete horizon has not passed.
* Delete horizon (KIP-534): the first clean that keeps a tombstone stamps its batch with
  ``now + delete.retention.ms`` (attribute bit 6; the horizon takes the first-timestamp
  field and record timestamps are re-based on it, so every record's timestamp is unchanged).
  A clean after the horizon drops the tombstones. A consumer reading from the start within
  ``delete.retention.ms`` of a deletion therefore sees the tombstone.
* A rewritten batch keeps its base offset, last offset delta, producer id, epoch and base
  sequence, so offsets never move and the producer's sequence range stays readable; only its
  records, record count, first timestamp, max timestamp (CreateTime) and CRC change. A batch
  left without records is dropped, except the last batch of each producer the partition
  still remembers: it stays, empty if need be, so that producer state rebuilt from the log
  knows each producer's epoch and last sequence (Kafka keeps the same batch).
* Transactions, as Kafka's LogCleaner (CleanedTransactionMetadata), in ``TxnCleaning``: the
  cleaner never goes past the last stable offset (no undecided data is cleaned). The
  aborted transactions of the range come from the aborted transaction indexes; a batch of
  an aborted transaction is removed whole (kept empty only as its producer's last batch),
  and never enters the offset map (it must not hide an older value). Committed
  transactional data is compacted as any other. A marker stays while data of its
  transaction was met in this clean; once none was, it is stamped with a delete horizon
  (``delete.retention.ms``, as a tombstone) and goes at the first clean after it, so a
  consumer reading within that time still sees the transaction end. An ABORT marker that
  stays keeps its entry in the cleaned segment's aborted transaction index.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import cramjam
import crc32c

from ..protocol import records as codec_module
from ..protocol.control import Marker, read_marker
from ..protocol.record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    pack_header,
)
from ..protocol.records import NONE, compress, decompress
from ..protocol.varint import read_varint, varint_bytes
from .txn_index import AbortedTxn

DELETE_HORIZON_BIT = 0x40  # attributes bit 6 (KIP-534): the first timestamp is the horizon
NO_TIMESTAMP = -1
LONG_MAX = (1 << 63) - 1
# What one key costs the offset map in this process: the key's bytes plus a bytes object, an
# int and a dict slot (Kafka's map counts 24 bytes: an MD5 of the key and an offset).
MAP_ENTRY_OVERHEAD = 100


# --- configuration -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """A compacted log's cleaning settings (topic config, else the broker's log.cleaner.*)."""

    delete_retention_ms: int = 86_400_000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX


# --- what is cleanable -------------------------------------------------------------------

class SegmentSummary(NamedTuple):
    """What the planner needs of a segment. ``largest_timestamp`` is its max record
    timestamp, or its file's modification time when it has none (Kafka's largestTimestamp);
    ``first_batch_timestamp`` the max timestamp of its first batch, -1 when empty."""

    base_offset: int
    next_offset: int
    size: int
    largest_timestamp: int
    first_batch_timestamp: int


@dataclass(frozen=True, slots=True)
class Cleanable:
    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    dirty_bytes: int
    overdue: bool  # a dirty record waited longer than max.compaction.lag.ms
    horizon_passed: bool  # a tombstone's delete horizon passed

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0

    def due(self, config: CompactionConfig) -> bool:
        if self.horizon_passed:
            return True
        return self.dirty_bytes > 0 and (
            self.overdue or self.dirty_ratio >= config.min_cleanable_dirty_ratio)


def cleanable(segments: Sequence[SegmentSummary], first_dirty: int, now_ms: int,
              config: CompactionConfig, next_horizon_ms: int = LONG_MAX,
              last_stable_offset: int = LONG_MAX) -> Cleanable:
    """Where the dirty section is and whether the log is due, from its segments (the last
    one is the active segment). ``first_dirty`` is the checkpoint (or the log start);
    ``next_horizon_ms`` the earliest delete horizon the cleaner knows to be pending."""
    active = segments[-1]
    log_start = segments[0].base_offset
    if not log_start <= first_dirty <= active.base_offset:
        first_dirty = log_start  # the checkpoint is from before a deletion or a truncation
    # No open transaction's data is cleaned; a single node has no high watermark below the
    # log end.
    first_uncleanable = max(first_dirty, min(active.base_offset, last_stable_offset))
    if config.min_compaction_lag_ms > 0:
        for segment in segments[:-1]:
            if segment.next_offset > first_dirty and \
                    segment.largest_timestamp > now_ms - config.min_compaction_lag_ms:
                first_uncleanable = min(first_uncleanable,
                                        max(first_dirty, segment.base_offset))
                break
    clean_bytes = dirty_bytes = 0
    earliest_dirty = LONG_MAX
    for segment in segments[:-1]:
        if segment.base_offset >= first_uncleanable:
            break
        # Nothing is dirty when the dirty section is empty (an open transaction begins at
        # the checkpoint): a segment holding both is not, or it would be rewritten for ever.
        if segment.next_offset <= first_dirty or first_dirty == first_uncleanable:
            clean_bytes += segment.size
        else:
            dirty_bytes += segment.size
            if segment.first_batch_timestamp >= 0:
                earliest_dirty = min(earliest_dirty, segment.first_batch_timestamp)
    overdue = (config.max_compaction_lag_ms < LONG_MAX and earliest_dirty < LONG_MAX
               and now_ms - earliest_dirty > config.max_compaction_lag_ms)
    return Cleanable(first_dirty, first_uncleanable, clean_bytes, dirty_bytes, overdue,
                     now_ms >= next_horizon_ms and len(segments) > 1)


def joins_group(cleaned_bytes: int, segment: SegmentSummary, group_base: int,
                max_bytes: int, max_offset_span: int) -> bool:
    """Whether ``segment`` is cleaned into the same new segment as the ones before it, whose
    cleaned bytes so far are ``cleaned_bytes``: while the result stays within ``max_bytes``
    (segment.bytes) even if nothing of ``segment`` goes, and its offsets within the span the
    indexes hold. Kafka groups by the sizes before cleaning; by the cleaned size, segments
    emptied by a clean go into the next one instead of staying as empty files."""
    return (cleaned_bytes + segment.size <= max_bytes
            and segment.next_offset - 1 - group_base <= max_offset_span)


# --- records -----------------------------------------------------------------------------

class RecordSpan(NamedTuple):
    """One record of an uncompressed payload: where it lies and what the cleaner reads."""

    start: int  # its length varint
    end: int
    body: int  # its attributes byte, right after the length
    rest: int  # after its timestamp delta: offset delta, key, value, headers
    ts_delta: int
    offset_delta: int
    key: bytes | None
    tombstone: bool


class BadRecords(ValueError):
    """A payload that does not parse as its header says."""


def record_spans(payload: bytes | memoryview, count: int) -> list[RecordSpan]:
    """The first ``count`` records of an uncompressed payload (a v2 record: length varint,
    attributes byte, timestamp delta, offset delta, key, value, headers)."""
    spans = []
    pos = 0
    total = len(payload)
    try:
        for _ in range(count):
            length, body = read_varint(payload, pos)
            end = body + length
            if length < 0 or end > total:
                raise BadRecords(f"record at byte {pos} runs past the payload")
            ts_delta, p = read_varint(payload, body + 1)
            rest = p
            offset_delta, p = read_varint(payload, p)
            key_length, p = read_varint(payload, p)
            key = None
            if key_length >= 0:
                key = bytes(payload[p:p + key_length])
                p += key_length
            value_length, p = read_varint(payload, p)
            if p > end:
                raise BadRecords(f"record at byte {pos} is longer than it says")
            spans.append(RecordSpan(pos, end, body, rest, ts_delta, offset_delta, key,
                                    value_length < 0))
            pos = end
    except (IndexError, ValueError) as exc:
        raise BadRecords(str(exc)) from None
    return spans


# What the cleaner decides a record's fate by: (offset delta, key, whether it is a tombstone).
# A plain tuple: one is made per record, and a NamedTuple costs three times as much.
RecordFact = tuple[int, bytes | None, bool]


def batch_payload(batch: bytes | memoryview, header: BatchHeader) -> bytes | memoryview:
    """The uncompressed records of a whole batch."""
    view = memoryview(batch)[HEADER_SIZE:header.size]
    codec = header.attributes & COMPRESSION_MASK
    try:
        return view if codec == NONE else decompress(codec, view)
    except (ValueError, cramjam.DecompressionError) as exc:
        raise BadRecords(f"the records do not decompress: {exc}") from None


def record_facts(payload: bytes | memoryview, count: int) -> list[RecordFact]:
    """Each record's offset delta, key and whether it is a tombstone: through the compiled
    codec when it is there (twenty times faster than parsing here), else ``record_spans``.
    Spans are needed only for a batch that keeps some of its records."""
    compiled = codec_module.compiled
    if compiled is None:
        return [(s.offset_delta, s.key, s.tombstone) for s in record_spans(payload, count)]
    try:
        fields = compiled.decode_records(payload, count)
    except ValueError as exc:
        raise BadRecords(str(exc)) from None
    return [(delta, key, value is None) for delta, _, key, value, _ in fields]


# --- the offset map ----------------------------------------------------------------------

class OffsetMap:
    """Key -> offset of its latest record, over the dirty section from ``start`` up to
    ``end`` (exclusive: a batch boundary). Bounded by ``capacity`` bytes (estimated)."""

    def __init__(self, start: int, capacity: int) -> None:
        self.start = self.end = start
        self.capacity = capacity
        self.used = 0
        self._latest: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._latest)

    def latest(self, key: bytes) -> int:
        return self._latest.get(key, -1)

    def add(self, header: BatchHeader, facts: Sequence[RecordFact]) -> bool:
        """Take a batch's keys; False (nothing taken) when they would not fit and the map
        holds something already: the map then ends before this batch."""
        if header.base_offset < self.end:
            raise ValueError(f"batch at {header.base_offset} is before the map's end "
                             f"{self.end}")
        latest = self._latest
        if not counts_for_keys(header):
            self.end = header.last_offset + 1
            return True
        growth = sum(len(key) + MAP_ENTRY_OVERHEAD for _, key, _ in facts
                     if key is not None and key not in latest)
        if latest and self.used + growth > self.capacity:
            return False
        base = header.base_offset
        for delta, key, _ in facts:
            if key is not None:
                latest[key] = base + delta
        self.used += growth
        self.end = header.last_offset + 1
        return True


def counts_for_keys(header: BatchHeader) -> bool:
    # Control batches carry no data (an aborted transaction's data does not count either:
    # the caller gives no facts for it, see TxnCleaning).
    return not header.is_control


# --- transactions ------------------------------------------------------------------------

class _Aborted:
    __slots__ = ("entry", "seen")

    def __init__(self, entry: AbortedTxn) -> None:
        self.entry = entry
        self.seen = False  # data of it was met in this clean


@dataclass
class TxnCleaning:
    """What one pass over the log (the offset map's, or the rewrite's) knows of transactions:
    fed every batch in offset order, it says which data batches are aborted and which
    markers may go. ``aborted``: the aborted transactions with data in the pass's range."""

    aborted: Sequence[AbortedTxn]
    kept_entries: list[AbortedTxn] = field(default_factory=list)  # of ABORT markers kept
    _pending: deque = field(init=False)
    _aborted_now: dict[int, _Aborted] = field(init=False, default_factory=dict)
    _committed_now: set[int] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self._pending = deque(sorted(self.aborted, key=lambda e: e.first_offset))

    def _begin_up_to(self, offset: int) -> None:
        pending = self._pending
        while pending and pending[0].first_offset <= offset:
            entry = pending.popleft()
            self._aborted_now[entry.producer_id] = _Aborted(entry)

    def on_data(self, header: BatchHeader) -> bool:
        """True when the batch belongs to an aborted transaction."""
        self._begin_up_to(header.last_offset)
        if not header.is_transactional:
            return False
        aborted = self._aborted_now.get(header.producer_id)
        if aborted is not None:
            aborted.seen = True
            return True
        self._committed_now.add(header.producer_id)
        return False

    def on_marker(self, header: BatchHeader, marker: Marker | None) -> bool:
        """True when the marker may go (once its delete horizon passed): no data of its
        transaction was met in this pass. ``marker`` None: an emptied control batch."""
        self._begin_up_to(header.last_offset)
        if marker is None:
            return True
        pid = header.producer_id
        if marker.commit:
            if pid in self._committed_now:
                self._committed_now.discard(pid)
                return False
            return True
        aborted = self._aborted_now.pop(pid, None)
        if aborted is not None and aborted.seen:
            self.kept_entries.append(aborted.entry)
            return False
        return True


def marker_of(batch: bytes | memoryview, header: BatchHeader) -> Marker | None:
    try:
        return read_marker(batch) if header.records_count else None
    except (ValueError, IndexError, cramjam.DecompressionError) as exc:
        raise BadRecords(f"the control record does not parse: {exc}") from None


# --- rewriting a batch -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Rules:
    """What one clean goes by besides the offset map."""

    now_ms: int
    delete_retention_ms: int
    # producer id -> last offset of its last batch, for every producer the partition still
    # remembers: that batch stays, empty if need be.
    producer_last_offsets: Mapping[int, int]


class Outcome(NamedTuple):
    data: bytes | memoryview | None  # the batch to write (the same bytes when unchanged)
    removed: int  # records removed
    pending_horizon: int  # the delete horizon of tombstones kept, LONG_MAX when none


def delete_horizon(header: BatchHeader) -> int | None:
    return header.base_timestamp if header.attributes & DELETE_HORIZON_BIT else None


def clean_batch(batch: bytes | memoryview, header: BatchHeader, offsets: OffsetMap,
                rules: Rules, txns: TxnCleaning | None = None) -> Outcome:
    """The batch as the clean leaves it: unchanged, rewritten, or gone (data None).
    ``txns`` sees every batch of the pass, in order."""
    txns = txns if txns is not None else TxnCleaning(())
    keep_empty = rules.producer_last_offsets.get(header.producer_id) == header.last_offset \
        if header.has_producer_id else False
    if header.is_control:
        return _marker_rule(batch, header, rules, txns, keep_empty)
    if txns.on_data(header):  # an aborted transaction's: all of it goes
        if keep_empty and header.records_count:
            return Outcome(_rewrite(header, b"", [], None), header.records_count, LONG_MAX)
        return Outcome(batch if keep_empty else None, header.records_count, LONG_MAX)
    if header.records_count == 0:
        return Outcome(batch if keep_empty else None, 0, LONG_MAX)
    payload = batch_payload(batch, header)
    facts = record_facts(payload, header.records_count)
    horizon = delete_horizon(header)
    horizon_passed = horizon is not None and rules.now_ms >= horizon
    base = header.base_offset
    kept = []
    tombstones_kept = False
    latest = offsets.latest
    for i, (delta, key, tombstone) in enumerate(facts):
        if key is None:
            continue
        if latest(key) > base + delta:
            continue  # a later record of its key is in the map
        if tombstone:
            if horizon_passed:
                continue
            tombstones_kept = True
        kept.append(i)
    if tombstones_kept and horizon is None:
        horizon = min(rules.now_ms + rules.delete_retention_ms, LONG_MAX)
        new_horizon = True
    else:
        new_horizon = False
    pending = horizon if tombstones_kept and horizon is not None else LONG_MAX
    removed = len(facts) - len(kept)
    if not removed and not new_horizon:
        return Outcome(batch, 0, pending)
    if not kept and not keep_empty:
        return Outcome(None, removed, LONG_MAX)
    spans = record_spans(payload, header.records_count)
    return Outcome(_rewrite(header, payload, [spans[i] for i in kept],
                            horizon if tombstones_kept else None), removed, pending)


def _marker_rule(batch: bytes | memoryview, header: BatchHeader, rules: Rules,
                 txns: TxnCleaning, keep_empty: bool) -> Outcome:
    """A marker stays while data of its transaction is left; then it gets a delete horizon,
    and goes at the first clean after the horizon (Kafka's rules)."""
    may_go = txns.on_marker(header, marker_of(batch, header))
    if header.records_count == 0:  # emptied before: nothing left to tell a reader
        return Outcome(batch if keep_empty else None, 0, LONG_MAX)
    if not may_go:
        return Outcome(batch, 0, LONG_MAX)
    horizon = delete_horizon(header)
    if horizon is None:
        horizon = min(rules.now_ms + rules.delete_retention_ms, LONG_MAX)
        payload = batch_payload(batch, header)
        stamped = _rewrite(header, payload, record_spans(payload, header.records_count),
                           horizon)
        return Outcome(stamped, 0, horizon)
    if rules.now_ms >= horizon:
        return Outcome(None, header.records_count, LONG_MAX)
    return Outcome(batch, 0, horizon)


def _rewrite(header: BatchHeader, payload: bytes | memoryview, kept: list[RecordSpan],
             horizon: int | None) -> bytes:
    """A batch holding only the ``kept`` records, with the same offsets and producer fields.

    Timestamps: a record's is the batch's first timestamp plus its delta, so when the first
    timestamp changes (the first record went, or a delete horizon takes the field) every
    delta is re-based and each record keeps its timestamp.
    """
    old_base_ts = header.base_timestamp
    timestamps = [old_base_ts + s.ts_delta for s in kept]
    codec = header.attributes & COMPRESSION_MASK
    attributes = header.attributes & ~DELETE_HORIZON_BIT
    if not kept:
        # Kafka's empty batch: no records, no payload, no first timestamp; its max
        # timestamp is the one it had.
        attributes &= ~COMPRESSION_MASK
        return _batch(header, attributes, NO_TIMESTAMP, header.max_timestamp, 0, b"")
    if horizon is not None:
        attributes |= DELETE_HORIZON_BIT
        new_base_ts = horizon
    else:
        new_base_ts = timestamps[0]
    view = memoryview(payload)
    if new_base_ts == old_base_ts:
        body = b"".join(view[s.start:s.end] for s in kept)
    else:
        body = b"".join(_retimed(view, s, old_base_ts + s.ts_delta - new_base_ts)
                        for s in kept)
    if header.attributes & TIMESTAMP_TYPE_BIT:
        max_timestamp = header.max_timestamp  # LogAppendTime: the broker's stamp stays
    else:
        max_timestamp = max(timestamps)
    data = body if codec == NONE else compress(codec, body)
    return _batch(header, attributes, new_base_ts, max_timestamp, len(kept), data)


def _retimed(view: memoryview, span: RecordSpan, ts_delta: int) -> bytes:
    """The record with another timestamp delta: its attributes byte, the new delta, then
    its remaining bytes as they were, behind the new length."""
    inner = b"".join((view[span.body:span.body + 1], varint_bytes(ts_delta),
                      view[span.rest:span.end]))
    return varint_bytes(len(inner)) + inner


def _batch(header: BatchHeader, attributes: int, base_timestamp: int, max_timestamp: int,
           count: int, data: bytes) -> bytes:
    new = header._replace(batch_length=HEADER_SIZE - LOG_OVERHEAD + len(data), crc=0,
                          attributes=attributes, base_timestamp=base_timestamp,
                          max_timestamp=max_timestamp, records_count=count)
    unsigned = pack_header(new)
    crc = crc32c.crc32c(data, crc32c.crc32c(unsigned[ATTRIBUTES_OFFSET:]))
    return pack_header(new._replace(crc=crc)) + data
