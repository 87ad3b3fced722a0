"""ProducerStateManager: one partition's memory of its producers, kept small.

Split as Kafka splits it: ``validate`` judges a batch (rules.decide) without changing
anything, the caller appends the batch to the log, then ``apply`` records it. A batch the log
did not take leaves no trace here.

Memory: each live producer is one fixed-size slot of a bytearray (epoch, last append time and
the last N batches packed with struct), found through a dict from producer id to slot number:
about 230 bytes a producer with 5 cached batches, instead of several hundred for Python
objects. The dict's order is recency: the least recently active producer is evicted first when
``max_producers`` is reached, and becomes a Tombstone, as do producers idle longer than
``expiration_ms``. Tombstones are packed too (30 bytes each) and go after ``tombstone_ms``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .rules import (
    Append,
    BatchIdentity,
    CachedBatch,
    Decision,
    ProducerStateEntry,
    Tombstone,
    decide,
)

_SLOT_HEAD = struct.Struct("<hBxq")  # epoch, batch count, last append time
_BATCH = struct.Struct("<iiqq")  # first seq, last seq, last offset, timestamp
_TOMBSTONE = struct.Struct("<hiqq")  # epoch, last seq, last offset, since


@dataclass(frozen=True, slots=True)
class StateLimits:
    batches_to_retain: int = 5
    max_producers: int = 100_000
    expiration_ms: int = 24 * 3600 * 1000
    tombstone_ms: int = 7 * 24 * 3600 * 1000
    max_tombstones: int = 1_000_000


class ProducerStateManager:
    def __init__(self, limits: StateLimits | None = None) -> None:
        self.limits = limits or StateLimits()
        self._slot_size = _SLOT_HEAD.size + _BATCH.size * self.limits.batches_to_retain
        self._arena = bytearray()
        self._free: list[int] = []
        self._slots: dict[int, int] = {}  # producer id -> slot, least recently active first
        self._tombstones: dict[int, bytes] = {}  # producer id -> packed, oldest first

    # --- reading state ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def tombstone_count(self) -> int:
        return len(self._tombstones)

    def entry(self, producer_id: int) -> ProducerStateEntry | None:
        slot = self._slots.get(producer_id)
        return None if slot is None else self._unpack(producer_id, slot)

    def tombstone(self, producer_id: int) -> Tombstone | None:
        packed = self._tombstones.get(producer_id)
        if packed is None:
            return None
        return Tombstone(producer_id, *_TOMBSTONE.unpack(packed))

    def entries(self) -> Iterator[ProducerStateEntry]:
        for producer_id, slot in list(self._slots.items()):
            yield self._unpack(producer_id, slot)

    def tombstones(self) -> Iterator[Tombstone]:
        for producer_id in list(self._tombstones):
            yield self.tombstone(producer_id)

    # --- the produce path ------------------------------------------------------------------

    def validate(self, batch: BatchIdentity, pid_issued: Callable[[int], bool]) -> Decision:
        known: ProducerStateEntry | Tombstone | None = self.entry(batch.producer_id)
        if known is None:
            known = self.tombstone(batch.producer_id)
        # Only ask whether the id was issued for producers we know nothing of: a known producer
        # was necessarily issued (its batches are in this log).
        issued = known is not None or pid_issued(batch.producer_id)
        return decide(batch, known, issued)

    def apply(self, decision: Append, last_offset: int, timestamp: int, now_ms: int) -> None:
        """Record an appended batch; ``last_offset`` is the offset the log gave its last record."""
        batch = decision.batch
        cached = CachedBatch(batch.first_seq, batch.last_seq, last_offset, timestamp)
        entry = None if decision.reset else self.entry(batch.producer_id)
        if entry is None:
            entry = ProducerStateEntry(batch.producer_id, batch.epoch, [], now_ms)
        entry.batches.append(cached)
        del entry.batches[:-self.limits.batches_to_retain]
        entry.last_timestamp = now_ms
        self._store(entry)

    def replay(self, batch: BatchIdentity, last_offset: int, timestamp: int) -> None:
        """Rebuild from the log: the log is the truth, so no rule is checked."""
        entry = self.entry(batch.producer_id)
        reset = entry is None or batch.epoch != entry.epoch
        self.apply(Append(batch, reset), last_offset, timestamp, timestamp)

    # --- storage ---------------------------------------------------------------------------

    def _unpack(self, producer_id: int, slot: int) -> ProducerStateEntry:
        base = slot * self._slot_size
        epoch, count, last_ts = _SLOT_HEAD.unpack_from(self._arena, base)
        pos = base + _SLOT_HEAD.size
        batches = [CachedBatch(*_BATCH.unpack_from(self._arena, pos + i * _BATCH.size))
                   for i in range(count)]
        return ProducerStateEntry(producer_id, epoch, batches, last_ts)

    def _store(self, entry: ProducerStateEntry) -> None:
        slot = self._slots.pop(entry.producer_id, None)
        if slot is None:
            self._tombstones.pop(entry.producer_id, None)
            if len(self._slots) >= self.limits.max_producers:
                self._retire(next(iter(self._slots)), entry.last_timestamp)
            slot = self._allocate()
        self._slots[entry.producer_id] = slot  # re-inserted last: the most recently active
        base = slot * self._slot_size
        _SLOT_HEAD.pack_into(self._arena, base, entry.epoch, len(entry.batches),
                             entry.last_timestamp)
        pos = base + _SLOT_HEAD.size
        for i, b in enumerate(entry.batches):
            _BATCH.pack_into(self._arena, pos + i * _BATCH.size, b.first_seq, b.last_seq,
                             b.last_offset, b.timestamp)

    def _allocate(self) -> int:
        if self._free:
            return self._free.pop()
        slot = len(self._arena) // self._slot_size
        self._arena.extend(bytes(self._slot_size))
        return slot

    def _retire(self, producer_id: int, now_ms: int) -> None:
        """Move a producer out of memory, keeping what judges its next batch."""
        entry = self.entry(producer_id)
        slot = self._slots.pop(producer_id)
        self._free.append(slot)
        assert entry is not None
        self._put_tombstone(Tombstone(producer_id, entry.epoch, entry.last_seq,
                                      entry.last_offset, now_ms))

    def _put_tombstone(self, tombstone: Tombstone) -> None:
        self._tombstones.pop(tombstone.producer_id, None)
        if len(self._tombstones) >= self.limits.max_tombstones:
            del self._tombstones[next(iter(self._tombstones))]
        self._tombstones[tombstone.producer_id] = _TOMBSTONE.pack(
            tombstone.epoch, tombstone.last_seq, tombstone.last_offset, tombstone.since)

    # --- time ------------------------------------------------------------------------------

    def expire(self, now_ms: int) -> tuple[int, int]:
        """Retire idle producers, drop old tombstones; returns (retired, dropped)."""
        idle = [pid for pid, slot in self._slots.items()
                if now_ms - self._last_append(slot) >= self.limits.expiration_ms]
        for pid in idle:
            self._retire(pid, now_ms)
        old = [pid for pid in self._tombstones
               if now_ms - self.tombstone(pid).since >= self.limits.tombstone_ms]
        for pid in old:
            del self._tombstones[pid]
        return len(idle), len(old)

    def _last_append(self, slot: int) -> int:
        return _SLOT_HEAD.unpack_from(self._arena, slot * self._slot_size)[2]

    # --- snapshots -------------------------------------------------------------------------

    def load(self, entries: list[ProducerStateEntry], tombstones: list[Tombstone]) -> None:
        """Replace all state (from a snapshot); both lists oldest activity first."""
        self._arena = bytearray()
        self._free = []
        self._slots = {}
        self._tombstones = {}
        for tombstone in tombstones:
            self._put_tombstone(tombstone)
        for entry in entries:
            del entry.batches[:-self.limits.batches_to_retain]
            self._store(entry)
