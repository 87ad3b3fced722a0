"""The aborted transaction index of one segment (``.txnindex``), as Kafka's TransactionIndex.

One entry per transaction aborted by a marker in this segment: the producer id, the
transaction's first offset, its last offset (the ABORT marker's), and the partition's last
stable offset once it was complete. A read_committed Fetch answers the entries overlapping
the range it returns, so that the consumer drops those producers' records in them.

The file is Kafka's layout, 34-byte entries, big-endian: version int16 (0), producer id int64,
first offset int64, last offset int64, last stable offset int64. Like the other indexes here
it lives in memory and is written whole (atomically) when the segment is sealed; no file
means no entry. A segment recovered after a crash has its entries rebuilt from the log by the
partition (replaying producer state, which knows which transaction each marker ends), and so
does one whose file does not read.
"""

from __future__ import annotations

import contextlib
import struct
from typing import NamedTuple

from .disk import OsDisk, read_file, write_atomically

_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size  # 34
VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TransactionIndex:
    def __init__(self, path: str, disk: OsDisk) -> None:
        self.path = path
        self._disk = disk
        self.entries: list[AbortedTxn] = []

    def __len__(self) -> int:
        return len(self.entries)

    def append(self, entry: AbortedTxn) -> None:
        self.entries.append(entry)

    def clear(self) -> None:
        self.entries.clear()

    def drop_from(self, offset: int) -> None:
        """Forget the transactions whose marker is at or after ``offset`` (to be replayed)."""
        self.entries = [e for e in self.entries if e.last_offset < offset]

    def overlapping(self, start: int, upper: int) -> list[AbortedTxn]:
        """Entries of transactions with data in [start, upper)."""
        return [e for e in self.entries if e.last_offset >= start and e.first_offset < upper]

    def encoded(self) -> bytes | None:
        """The file's bytes; None: no entry, no file (one left behind is removed)."""
        return encode(self.entries) if self.entries else None

    def save(self) -> None:
        data = self.encoded()
        if data is not None:
            write_atomically(self._disk, self.path, data)
            return
        with contextlib.suppress(FileNotFoundError):
            self._disk.unlink(self.path)

    def load(self, base_offset: int, next_offset: int) -> bool:
        """Load from disk (no file: no entry); False when the file cannot describe a segment
        holding offsets ``base_offset`` to ``next_offset`` (exclusive)."""
        try:
            data = read_file(self._disk, self.path)
        except FileNotFoundError:
            self.entries = []
            return True
        try:
            entries = decode(data)
        except ValueError:
            return False
        if any(not base_offset <= e.last_offset < next_offset or e.first_offset > e.last_offset
               for e in entries):
            return False
        self.entries = entries
        return True


def encode(entries: list[AbortedTxn]) -> bytes:
    return b"".join(_ENTRY.pack(VERSION, *entry) for entry in entries)


def decode(data: bytes) -> list[AbortedTxn]:
    if len(data) % ENTRY_SIZE:
        raise ValueError(f"{len(data)} bytes is no whole number of {ENTRY_SIZE}-byte entries")
    entries = []
    for version, *fields in _ENTRY.iter_unpack(data):
        if version != VERSION:
            raise ValueError(f"entry version {version}")
        entries.append(AbortedTxn(*fields))
    return entries
