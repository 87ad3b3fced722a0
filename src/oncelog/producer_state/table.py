"""ProducerTable: a partition's live producers, packed, in recency order.

What a dict keyed by producer id cost for each producer (issue 26: 227 bytes with 5 cached
batches, Kafka's figure is 180): the packed entry as a ``bytes`` object (110 bytes, 144
allocated with its header), the key as an int object (32) and the dict's entry, index and
spare room (35-52). Here the same packed entries lie in slots of one ``bytearray``, each slot
as wide as the widest entry (``width``), with the producer id, the entry's length and the two
recency links in ``array``s beside it, and an open-addressing index of slot numbers (linear
probing, at most half full, deletions shifting back so that no probe ever crosses a hole):
about 8 + 2 + 8 + width bytes a slot, plus 4 to 8 bytes of index a producer, and slots grow
by a quarter when full (no per-producer Python object at all).

It behaves as the dict did, moving a producer to the end on every write: ``put`` makes the
producer the most recently active, iteration goes least recently active first, ``pop``
frees the slot for the next producer. An entry wider than the slots widens them all (a
snapshot holding more batches than ``batches_to_retain``, or the limit raised): a copy of
the table, as rare as those. A slot keeps its number as long as its producer stays, so the
last producer looked up is remembered by slot (validate then apply of one batch find it
once). tests/producer_state/test_producer_table.py holds it to a dict under random
operations.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator

_NONE = -1  # no slot: an empty index position, the end of a recency list
_MULTIPLIER = 0x9E3779B97F4A7C15  # Fibonacci hashing: producer ids spread whatever their runs
_MASK64 = (1 << 64) - 1
_MIN_INDEX_BITS = 3


class ProducerTable:
    def __init__(self, width: int, capacity: int = 0) -> None:
        self._width = width  # bytes of a slot: the widest entry it holds
        self._count = 0
        self._slots = 0  # slots made (used or free)
        self._data = bytearray()
        self._view = memoryview(self._data)
        self._pids = array("q")
        self._lengths = array("H")
        self._older = array("i")  # recency links: the next less / more recently active slot
        self._newer = array("i")
        self._oldest = self._newest = _NONE
        self._free = _NONE  # free slots, linked through _newer
        self._bits = _MIN_INDEX_BITS
        self._index = array("i", [_NONE]) * (1 << self._bits)
        # The last producer looked up or written, its slot, and its entry once read or
        # written (validate then apply of one batch read it twice: copied out once).
        self._found_pid: int | None = None
        self._found_slot = _NONE
        self._found_packed: bytes | None = None
        if capacity:
            self._grow_slots(capacity)
            self._reindex(capacity)

    # --- reading ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def __contains__(self, pid: int) -> bool:
        return self._slot(pid) != _NONE

    def get(self, pid: int) -> bytes | None:
        if pid == self._found_pid and self._found_packed is not None:
            return self._found_packed
        slot = self._slot(pid)
        if slot == _NONE:
            return None
        at = slot * self._width
        packed = self._found_packed = bytes(self._view[at:at + self._lengths[slot]])
        return packed

    def __iter__(self) -> Iterator[int]:
        """Producer ids, least recently active first."""
        pids, newer = self._pids, self._newer
        slot = self._oldest
        while slot != _NONE:
            following = newer[slot]
            yield pids[slot]
            slot = following

    def items(self) -> Iterator[tuple[int, bytes]]:
        """(producer id, packed entry), least recently active first."""
        pids, newer, lengths, view, width = (self._pids, self._newer, self._lengths,
                                             self._view, self._width)
        slot = self._oldest
        while slot != _NONE:
            following = newer[slot]
            at = slot * width
            yield pids[slot], bytes(view[at:at + lengths[slot]])
            slot = following

    # --- writing ---------------------------------------------------------------------------

    def put(self, pid: int, packed: bytes) -> None:
        """``packed`` is the producer's entry, and the producer the most recently active."""
        if not self.replace(pid, packed):
            if len(packed) > self._width:
                self._widen(len(packed))
            self._write(self._new_slot(pid), packed)

    def replace(self, pid: int, packed: bytes) -> bool:
        """``put`` for a producer already here (False, nothing done: it is not)."""
        # (the produce path's: the producer is the one validate just read, as a rule)
        slot = self._found_slot if pid == self._found_pid else self._slot(pid)
        if slot == _NONE:
            return False
        size = len(packed)
        if size > self._width:
            self._widen(size)
        newest = self._newest
        if slot != newest:  # moved to the newest end (_unlink, _link_newest, inline here)
            older, newer = self._older, self._newer
            before, after = older[slot], newer[slot]
            if before == _NONE:
                self._oldest = after
            else:
                newer[before] = after
            older[after] = before  # (not the newest: someone is after it)
            older[slot] = newest
            newer[slot] = _NONE
            newer[newest] = slot
            self._newest = slot
        at = slot * self._width
        self._view[at:at + size] = packed
        self._lengths[slot] = size
        self._found_packed = packed if type(packed) is bytes else None
        return True

    def _write(self, slot: int, packed: bytes) -> None:
        at = slot * self._width
        size = len(packed)
        self._view[at:at + size] = packed
        self._lengths[slot] = size
        # (the producer's slot is _found_slot: put and replace looked it up or made it)
        self._found_packed = packed if type(packed) is bytes else None

    def pop(self, pid: int) -> bytes:
        """The producer's entry, the producer gone (KeyError: not here)."""
        position = self._position(pid)
        slot = self._index[position]
        if slot == _NONE:
            raise KeyError(pid)
        at = slot * self._width
        packed = bytes(self._view[at:at + self._lengths[slot]])
        self._unindex(position)
        self._unlink(slot)
        self._newer[slot] = self._free
        self._free = slot
        self._count -= 1
        if self._found_pid == pid:
            self._found_pid, self._found_slot, self._found_packed = None, _NONE, None
        return packed

    @classmethod
    def of(cls, entries: Iterable[tuple[int, bytes]], width: int) -> ProducerTable:
        """A table of ``entries``, least recently active first (a snapshot's order), made in
        one pass: each in the next slot. A producer id twice keeps its first place and its
        last entry, as ``dict(entries)`` did."""
        entries = list(entries)
        width = max(width, max((len(packed) for _, packed in entries), default=0))
        table = cls(width, len(entries))
        index, pids, lengths, view = table._index, table._pids, table._lengths, table._view
        mask = (1 << table._bits) - 1
        shift = 64 - table._bits
        slot = 0
        for pid, packed in entries:
            position = ((pid * _MULTIPLIER) & _MASK64) >> shift
            while True:
                held = index[position]
                if held == _NONE or pids[held] == pid:
                    break
                position = (position + 1) & mask
            at = (slot if held == _NONE else held) * width
            view[at:at + len(packed)] = packed
            if held != _NONE:
                lengths[held] = len(packed)
                continue
            index[position] = slot
            pids[slot] = pid
            lengths[slot] = len(packed)
            slot += 1
        if slot:
            # slots 0..slot-1 in order, the rest free (as _grow_slots left them, after them)
            table._older[:slot] = array("i", range(-1, slot - 1))
            table._newer[:slot] = array("i", range(1, slot + 1))
            table._newer[slot - 1] = _NONE
            table._oldest, table._newest = 0, slot - 1
            table._free = slot if slot < table._slots else _NONE
            table._count = slot
        return table

    # --- the index -------------------------------------------------------------------------

    def _home(self, pid: int) -> int:
        return ((pid * _MULTIPLIER) & _MASK64) >> (64 - self._bits)

    def _position(self, pid: int) -> int:
        """The index position holding ``pid``'s slot, or the empty one ending its probe."""
        index, pids = self._index, self._pids
        mask = (1 << self._bits) - 1
        position = ((pid * _MULTIPLIER) & _MASK64) >> (64 - self._bits)
        while True:
            slot = index[position]
            if slot == _NONE or pids[slot] == pid:
                return position
            position = (position + 1) & mask

    def _slot(self, pid: int) -> int:
        if pid == self._found_pid:
            return self._found_slot
        index, pids = self._index, self._pids  # _position, inline on the produce path
        mask = (1 << self._bits) - 1
        position = ((pid * _MULTIPLIER) & _MASK64) >> (64 - self._bits)
        while True:
            slot = index[position]
            if slot == _NONE or pids[slot] == pid:
                break
            position = (position + 1) & mask
        if slot != _NONE:
            self._found_pid, self._found_slot, self._found_packed = pid, slot, None
        return slot

    def _unindex(self, position: int) -> None:
        """Empty ``position``, shifting back the entries after it whose probe crossed it."""
        index, pids = self._index, self._pids
        mask = (1 << self._bits) - 1
        hole = following = position
        while True:
            following = (following + 1) & mask
            slot = index[following]
            if slot == _NONE:
                break
            home = self._home(pids[slot])
            # It stays unless its home lies cyclically outside (hole, following].
            if (hole < following and (home <= hole or home > following)) or (
                    hole > following and home <= hole and home > following):
                index[hole] = slot
                hole = following
        index[hole] = _NONE

    def _reindex(self, count: int) -> None:
        """An index of at least twice ``count`` positions, every used slot in it."""
        bits = _MIN_INDEX_BITS
        while (1 << bits) < 2 * count:
            bits += 1
        self._bits = bits
        self._index = index = array("i", [_NONE]) * (1 << bits)
        mask = (1 << bits) - 1
        pids, newer = self._pids, self._newer
        slot = self._oldest
        while slot != _NONE:
            position = self._home(pids[slot])
            while index[position] != _NONE:
                position = (position + 1) & mask
            index[position] = slot
            slot = newer[slot]

    # --- slots -----------------------------------------------------------------------------

    def _new_slot(self, pid: int) -> int:
        if self._free == _NONE:
            self._grow_slots(self._slots + max(self._slots // 4, 8))
        slot = self._free
        self._free = self._newer[slot]
        if 2 * (self._count + 1) > len(self._index):
            self._reindex(self._count + 1)
        position = self._position(pid)
        self._index[position] = slot
        self._pids[slot] = pid
        self._count += 1
        self._link_newest(slot)
        self._found_pid, self._found_slot, self._found_packed = pid, slot, None
        return slot

    def _grow_slots(self, slots: int) -> None:
        added = slots - self._slots
        self._view.release()
        self._data.extend(bytes(added * self._width))
        self._view = memoryview(self._data)
        self._pids.extend(array("q", [0]) * added)
        self._lengths.extend(array("H", [0]) * added)
        self._older.extend(array("i", [_NONE]) * added)
        # the new slots, free, in order, ahead of any freed before
        self._newer.extend(array("i", range(self._slots + 1, slots + 1)))
        self._newer[slots - 1] = self._free
        self._free = self._slots
        self._slots = slots

    def _widen(self, width: int) -> None:
        old, view, lengths = self._width, self._view, self._lengths
        data = bytearray(self._slots * width)
        for slot in range(self._slots):
            data[slot * width:slot * width + lengths[slot]] = \
                view[slot * old:slot * old + lengths[slot]]
        view.release()
        self._data, self._width = data, width
        self._view = memoryview(data)

    def _unlink(self, slot: int) -> None:
        older, newer = self._older, self._newer
        before, after = older[slot], newer[slot]
        if before == _NONE:
            self._oldest = after
        else:
            newer[before] = after
        if after == _NONE:
            self._newest = before
        else:
            older[after] = before

    def _link_newest(self, slot: int) -> None:
        newest = self._newest
        self._older[slot] = newest
        self._newer[slot] = _NONE
        if newest == _NONE:
            self._oldest = slot
        else:
            self._newer[newest] = slot
        self._newest = slot
