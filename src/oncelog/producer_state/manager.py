"""ProducerStateManager: one partition's memory of its producers, kept small.

Split as Kafka splits it: ``validate`` judges a batch (rules.decide) without changing
anything, the caller appends the batch to the log, then ``apply`` records it. A batch the log
did not take leaves no trace here.

Memory: each live producer is one ``bytes`` value (epoch, transaction, timestamps and the last
N batches packed with struct) in a dict keyed by producer id: about 230 bytes a producer with 5
cached batches, where Python objects would take over a kilobyte. The dict's order is recency: the
least recently active producer is evicted first when ``max_producers`` is reached and becomes
a Tombstone, as do producers idle longer than ``expiration_ms``. Tombstones are packed too and
go after ``tombstone_ms``. A producer with a transaction ongoing here is never moved out
(Kafka never expires one either): its transaction holds the last stable offset.

Transactions: ``_ongoing`` maps each producer with a transaction ongoing here to its first
offset, in the order they began, which is offset order (appends are sequential): the last
stable offset is the first of them, found without a search. ``apply_marker`` ends one and says
what the aborted transaction index must record.

The produce path's common case (a live producer's next batch, rule 7) is judged and applied on
the packed bytes: ``rules.judge_next`` gets the epoch, last sequence and whether the batch is
cached read straight from them, and ``apply`` builds the new packed entry from slices of the
old one. Everything else goes through the entry's objects and ``rules.decide``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..protocol.sequences import next_sequence, sequence_distance
from .rules import (
    NO_TXN,
    Append,
    BatchIdentity,
    CachedBatch,
    CompletedTxn,
    Decision,
    EndTxn,
    MarkerIdentity,
    ProducerStateEntry,
    Refuse,
    Tombstone,
    decide,
    decide_marker,
    decide_unsequenced,
    judge_next,
)

# epoch, start sequence, first offset of the ongoing transaction (-1: none), coordinator
# epoch, last timestamp, last append in whole seconds (a day-scale expiration needs no more).
_HEAD = struct.Struct("<hiqiqI")
_BATCH = struct.Struct("<iiq")  # first seq, last seq, last offset
_TOMBSTONE = struct.Struct("<hiiqq")  # epoch, start seq, last seq, last offset, since
# Parts of the packed entry read or written without unpacking it whole:
_EPOCH = struct.Struct("<h")  # the head's first field
_TXN_FIRST = struct.Struct("<q")  # the head's third field, at byte 6
_TXN_AT = 6
_COORDINATOR_EPOCH = struct.Struct("<i")  # the head's fourth field, at byte 14
_COORDINATOR_AT = 14
_TIMES = struct.Struct("<qI")  # the head's last two fields: last timestamp, last append (s)
_EPOCH_AND_START = _HEAD.size - _TIMES.size  # bytes of the head kept as they are
_SEQUENCES = struct.Struct("<ii")  # a cached batch's first 8 bytes: first seq, last seq


@dataclass(frozen=True, slots=True)
class StateLimits:
    batches_to_retain: int = 5
    max_producers: int = 100_000
    expiration_ms: int = 24 * 3600 * 1000
    tombstone_ms: int = 7 * 24 * 3600 * 1000
    max_tombstones: int = 1_000_000

    def __post_init__(self) -> None:
        # A packed entry holds 1 to 255 batches (a snapshot refuses anything else).
        if not 1 <= self.batches_to_retain <= 255:
            raise ValueError(f"batches_to_retain must be 1..255, not {self.batches_to_retain}")


def _pack(entry: ProducerStateEntry) -> bytes:
    return _HEAD.pack(entry.epoch, entry.start_seq, entry.txn_first_offset,
                      entry.coordinator_epoch, entry.last_timestamp,
                      entry.last_append_ms // 1000) + b"".join(
        _BATCH.pack(b.first_seq, b.last_seq, b.last_offset) for b in entry.batches)


def _may_be_cached(packed: bytes, batch: BatchIdentity) -> bool:
    """Whether one of the packed entry's cached batches is (first seq, last seq) of ``batch``.

    A match off a batch boundary counts too: it only sends the batch to the full rules.
    """
    return packed.find(_SEQUENCES.pack(batch.first_seq, batch.last_seq), _HEAD.size) >= 0


def _unpack(producer_id: int, packed: bytes) -> ProducerStateEntry:
    epoch, start_seq, txn_first, coordinator_epoch, last_ts, last_append_s = \
        _HEAD.unpack_from(packed)
    batches = [CachedBatch(*fields) for fields in _BATCH.iter_unpack(packed[_HEAD.size:])]
    return ProducerStateEntry(producer_id, epoch, start_seq, batches, last_ts,
                              last_append_s * 1000, txn_first, coordinator_epoch)


class ProducerStateManager:
    def __init__(self, limits: StateLimits | None = None) -> None:
        self.limits = limits or StateLimits()
        # Bytes of cached batches an append keeps from the packed entry it replaces.
        self._kept_bytes = (self.limits.batches_to_retain - 1) * _BATCH.size
        self._entries: dict[int, bytes] = {}  # least recently active first
        self._tombstones: dict[int, bytes] = {}  # oldest first
        # producer id -> first offset of its transaction ongoing here, in offset order
        self._ongoing: dict[int, int] = {}
        # Producer ids up to this one may have written here and been forgotten since (their
        # compact record dropped): rows 2-2c of the rules. -1 on a new partition.
        self.forgotten_up_to = -1

    def set_limits(self, limits: StateLimits) -> None:
        """New limits (a config changed): the next append keeps batches_to_retain batches,
        the next expiration uses the new times."""
        self.limits = limits
        self._kept_bytes = (limits.batches_to_retain - 1) * _BATCH.size

    # --- reading state ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tombstone_count(self) -> int:
        return len(self._tombstones)

    def entry(self, producer_id: int) -> ProducerStateEntry | None:
        packed = self._entries.get(producer_id)
        return None if packed is None else _unpack(producer_id, packed)

    def tombstone(self, producer_id: int) -> Tombstone | None:
        packed = self._tombstones.get(producer_id)
        if packed is None:
            return None
        return Tombstone(producer_id, *_TOMBSTONE.unpack(packed))

    def entries(self) -> Iterator[ProducerStateEntry]:
        """Least recently active first."""
        for producer_id, packed in list(self._entries.items()):
            yield _unpack(producer_id, packed)

    def tombstones(self) -> Iterator[Tombstone]:
        for producer_id in list(self._tombstones):
            tombstone = self.tombstone(producer_id)
            assert tombstone is not None
            yield tombstone

    # --- transactions ----------------------------------------------------------------------

    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest transaction ongoing here (None: none is)."""
        return next(iter(self._ongoing.values()), None)

    def last_stable_offset(self, high_watermark: int) -> int:
        first = self.first_unstable_offset()
        return high_watermark if first is None else min(first, high_watermark)

    def ongoing_transactions(self) -> dict[int, int]:
        """producer id -> first offset, earliest first."""
        return dict(self._ongoing)

    def in_transaction(self, producer_id: int) -> bool:
        return producer_id in self._ongoing

    # --- the produce path ------------------------------------------------------------------

    def validate(self, batch: BatchIdentity, pid_issued: Callable[[int], bool]) -> Decision:
        packed = self._entries.get(batch.producer_id)
        known: ProducerStateEntry | Tombstone | None
        if packed is not None:
            if len(packed) > _HEAD.size:
                last_seq = _SEQUENCES.unpack_from(packed, len(packed) - _BATCH.size)[1]
                going_on = judge_next(batch, _EPOCH.unpack_from(packed)[0], last_seq,
                                      _may_be_cached(packed, batch),
                                      _TXN_FIRST.unpack_from(packed, _TXN_AT)[0] != NO_TXN)
                if going_on is not None:
                    return going_on
            known = _unpack(batch.producer_id, packed)
        else:
            known = self.tombstone(batch.producer_id)
        # Only ask whether the id was issued for producers we know nothing of: a known producer
        # was necessarily issued (its batches are in this log).
        issued = known is not None or pid_issued(batch.producer_id)
        return decide(batch, known, issued, batch.producer_id <= self.forgotten_up_to)

    def validate_unsequenced(self, batch: BatchIdentity) -> Decision:
        """A batch the broker writes itself, without sequences (rules.decide_unsequenced)."""
        return decide_unsequenced(batch, self._known(batch.producer_id))

    def apply(self, decision: Append, last_offset: int, timestamp: int, now_ms: int,
              first_offset: int | None = None) -> None:
        """Record an appended batch; ``last_offset`` is the offset the log gave its last record
        (``first_offset`` its first, else worked out from the sequences)."""
        batch = decision.batch
        pid = batch.producer_id
        packed = self._entries.get(pid)
        if first_offset is None:
            first_offset = last_offset - sequence_distance(batch.first_seq, batch.last_seq)
        if batch.first_seq < 0:
            self._apply_unsequenced(decision, first_offset, timestamp, now_ms)
            return
        cached = CachedBatch(batch.first_seq, batch.last_seq, last_offset)
        if packed is None or decision.reset:
            # A new epoch keeps what the producer's markers left: the coordinator epoch, and
            # (in a replay only: the rules refuse it live, row T2) a transaction ongoing.
            txn_first, coordinator_epoch = (NO_TXN, -1) if packed is None else (
                _TXN_FIRST.unpack_from(packed, _TXN_AT)[0],
                _COORDINATOR_EPOCH.unpack_from(packed, _COORDINATOR_AT)[0])
            entry = ProducerStateEntry(pid, batch.epoch, self._start_of(decision), [cached],
                                       timestamp, now_ms, txn_first, coordinator_epoch)
        elif decision.begins_txn or len(packed) == _HEAD.size:
            entry = _unpack(pid, packed)
            entry.batches = [*entry.batches, cached][-self.limits.batches_to_retain:]
            entry.last_timestamp, entry.last_append_ms = timestamp, now_ms
        else:
            entry = None
        if entry is not None:
            if decision.begins_txn:
                entry.txn_first_offset = first_offset
                self._ongoing[pid] = first_offset
            self._store(pid, _pack(entry), now_ms)
            return
        assert packed is not None
        # The producer goes on: epoch and start stay, the times are the batch's, the batch joins
        # the cache and the oldest beyond batches_to_retain leave (as they would from
        # entry.batches), all as slices of the packed bytes.
        kept = len(packed) - self._kept_bytes
        if kept < _HEAD.size:
            kept = _HEAD.size
        self._store(pid, b"".join((packed[:_EPOCH_AND_START],
                                   _TIMES.pack(timestamp, now_ms // 1000), packed[kept:],
                                   _BATCH.pack(batch.first_seq, batch.last_seq, last_offset))),
                    now_ms)

    def _apply_unsequenced(self, decision: Append, first_offset: int, timestamp: int,
                           now_ms: int) -> None:
        """A batch without sequences changes the epoch and the transaction only."""
        batch = decision.batch
        pid = batch.producer_id
        entry = self.entry(pid)
        if entry is None:
            entry = ProducerStateEntry(pid, batch.epoch, 0, [], timestamp, now_ms)
        elif entry.epoch != batch.epoch:
            entry.epoch, entry.start_seq, entry.batches = batch.epoch, 0, []
        entry.last_timestamp, entry.last_append_ms = timestamp, now_ms
        if decision.begins_txn:
            entry.txn_first_offset = first_offset
            self._ongoing[pid] = first_offset
        self._store(pid, _pack(entry), now_ms)

    def replay(self, batch: BatchIdentity, last_offset: int, timestamp: int,
               now_ms: int, first_offset: int | None = None) -> None:
        """Rebuild from the log: the log is the truth, so no rule is checked.

        ``now_ms`` is the time of the rebuild, not the batch's timestamp: a producer found in
        the log counts as active from then, as it would have had the broker not stopped (the
        batch's timestamp is the client's clock, and may be anything).
        """
        known: ProducerStateEntry | Tombstone | None = self.entry(batch.producer_id)
        if known is None:
            known = self.tombstone(batch.producer_id)
        # The stored range goes on only where the log does. A new epoch, or a batch that does
        # not follow the last one (a forgotten producer taken back mid-stream by row 2, with
        # its batches in between never stored), starts it afresh, as the append did; a range
        # running on from 0 across that gap would call the missing batches duplicates (row 9).
        # An entry left empty by a marker goes on from sequence 0.
        reset = (known is None or batch.epoch != known.epoch
                 or batch.first_seq != next_sequence(known.last_seq))
        begins = batch.transactional and batch.producer_id not in self._ongoing
        self.apply(Append(batch, reset, begins), last_offset, timestamp, now_ms, first_offset)

    # --- markers ---------------------------------------------------------------------------

    def validate_marker(self, marker: MarkerIdentity) -> EndTxn | Refuse:
        return decide_marker(marker, self._known(marker.producer_id))

    def apply_marker(self, decision: EndTxn, offset: int, timestamp: int,
                     now_ms: int) -> CompletedTxn | None:
        """Record a marker the log took at ``offset``; returns the transaction it ended here,
        if one was ongoing."""
        marker = decision.marker
        pid = marker.producer_id
        completed = None
        if decision.first_offset != NO_TXN:
            del self._ongoing[pid]
            completed = CompletedTxn(pid, decision.first_offset, offset, not marker.commit,
                                     next(iter(self._ongoing.values()), offset + 1))
        packed = self._entries.get(pid)
        if packed is None:
            tombstone = self.tombstone(pid)
            if tombstone is not None and tombstone.epoch == marker.epoch:
                return completed  # nothing it remembers changes
            entry = ProducerStateEntry(pid, marker.epoch, 0, [], timestamp, now_ms, NO_TXN,
                                       marker.coordinator_epoch)
        else:
            entry = _unpack(pid, packed)
            if entry.epoch != marker.epoch:
                # The cached batches are of the old epoch: the next one starts at 0.
                entry.epoch, entry.start_seq, entry.batches = marker.epoch, 0, []
            entry.txn_first_offset = NO_TXN
            entry.coordinator_epoch = marker.coordinator_epoch
            entry.last_timestamp, entry.last_append_ms = timestamp, now_ms
        self._store(pid, _pack(entry), now_ms)
        return completed

    def replay_marker(self, marker: MarkerIdentity, offset: int, timestamp: int,
                      now_ms: int) -> CompletedTxn | None:
        """A marker found in the log: no rule is checked (the log is the truth)."""
        first = self._ongoing.get(marker.producer_id, NO_TXN)
        return self.apply_marker(EndTxn(marker, first), offset, timestamp, now_ms)

    def _known(self, producer_id: int) -> ProducerStateEntry | Tombstone | None:
        known: ProducerStateEntry | Tombstone | None = self.entry(producer_id)
        return known if known is not None else self.tombstone(producer_id)

    def _start_of(self, decision: Append) -> int:
        """Where the stored range of a producer getting a fresh entry begins."""
        batch = decision.batch
        if not decision.reset:
            # Row 7 for a producer moved out to a compact record: its range goes on from where
            # it began. Beginning it at this batch would make a retry of an earlier batch,
            # stored, look never stored (row 11): the client would resend it under a new
            # epoch and it would be stored twice.
            tombstone = self.tombstone(batch.producer_id)
            if tombstone is not None:
                return tombstone.start_seq
        return batch.first_seq

    # --- storage ---------------------------------------------------------------------------

    def _store(self, pid: int, packed: bytes, now_ms: int) -> None:
        entries = self._entries
        if pid in entries:
            # Moved to the end (most recently active) unless already there: a pop and
            # re-insert leaves a hole in the dict until its next resize.
            if next(reversed(entries)) != pid:
                del entries[pid]
        else:
            self._tombstones.pop(pid, None)
            if len(entries) >= self.limits.max_producers:
                oldest = next((p for p in entries if p not in self._ongoing), None)
                if oldest is not None:  # else all hold transactions open: none may go
                    self._retire(oldest, now_ms)
        entries[pid] = packed

    def _retire(self, producer_id: int, now_ms: int) -> None:
        """Move a producer out of memory, keeping what judges its next batch."""
        entry = _unpack(producer_id, self._entries.pop(producer_id))
        self._put_tombstone(Tombstone(producer_id, entry.epoch, entry.start_seq, entry.last_seq,
                                      entry.last_offset, now_ms))

    def _put_tombstone(self, tombstone: Tombstone) -> None:
        self._tombstones.pop(tombstone.producer_id, None)
        if len(self._tombstones) >= self.limits.max_tombstones:
            self._forget(next(iter(self._tombstones)))
        self._tombstones[tombstone.producer_id] = _TOMBSTONE.pack(
            tombstone.epoch, tombstone.start_seq, tombstone.last_seq, tombstone.last_offset,
            tombstone.since)

    # --- time ------------------------------------------------------------------------------

    def expire(self, now_ms: int) -> tuple[int, int]:
        """Retire idle producers, drop old tombstones; returns (retired, dropped)."""
        idle = [pid for pid, packed in self._entries.items()
                if now_ms - _HEAD.unpack_from(packed)[5] * 1000 >= self.limits.expiration_ms
                and pid not in self._ongoing]
        for pid in idle:
            self._retire(pid, now_ms)
        old = []
        for pid, packed in self._tombstones.items():
            since = _TOMBSTONE.unpack(packed)[4]
            if now_ms - since >= self.limits.tombstone_ms:
                old.append(pid)
        for pid in old:
            self._forget(pid)
        return len(idle), len(old)

    def _forget(self, producer_id: int) -> None:
        del self._tombstones[producer_id]
        self.forgotten_up_to = max(self.forgotten_up_to, producer_id)

    def forget_everyone(self, highest_issued: int) -> None:
        """State was rebuilt from a log whose beginning is gone: any producer id issued so far
        may have been lost; ids issued later cannot have written to what is gone."""
        self.forgotten_up_to = max(self.forgotten_up_to, highest_issued)

    # --- snapshots -------------------------------------------------------------------------

    # The packed forms, for snapshot.py: a snapshot stores them as they are.
    PACKED_HEAD = _HEAD
    PACKED_BATCH = _BATCH
    PACKED_TOMBSTONE = _TOMBSTONE

    @staticmethod
    def valid_packed_entry_size(size: int) -> bool:
        batches, rest = divmod(size - _HEAD.size, _BATCH.size)
        return rest == 0 and 0 <= batches <= 255

    def packed_entries(self) -> list[tuple[int, bytes]]:
        return list(self._entries.items())

    def packed_tombstones(self) -> list[tuple[int, bytes]]:
        return list(self._tombstones.items())

    def load(self, entries: list[tuple[int, bytes]], tombstones: list[tuple[int, bytes]],
             forgotten_up_to: int) -> None:
        """Replace all state with packed entries and tombstones (from a snapshot), both least
        recently active first. An entry with more batches than batches_to_retain is trimmed
        at its next append; producers beyond max_producers (a limit lowered since) become
        compact records, as eviction would have made them."""
        self._entries = dict(entries)
        self._tombstones = dict(tombstones)
        self.forgotten_up_to = forgotten_up_to
        ongoing = [(_TXN_FIRST.unpack_from(packed, _TXN_AT)[0], pid)
                   for pid, packed in self._entries.items()]
        self._ongoing = {pid: first for first, pid in sorted(ongoing) if first != NO_TXN}
        while len(self._entries) > self.limits.max_producers:
            oldest = next((p for p in self._entries if p not in self._ongoing), None)
            if oldest is None:
                break
            self._retire(oldest, _unpack(oldest, self._entries[oldest]).last_append_ms)
        while len(self._tombstones) > self.limits.max_tombstones:
            self._forget(next(iter(self._tombstones)))
