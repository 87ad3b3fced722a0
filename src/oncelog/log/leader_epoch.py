"""A partition's leader epochs: which epoch's leader wrote the log from which offset (KIP-101).

Kept in Kafka's ``leader-epoch-checkpoint`` file in the partition's directory, written
atomically whenever it changes (rarely: once per leader change)::

    0                  <- the file format's version
    2                  <- how many entries follow
    0 0                <- epoch, its start offset
    3 1200

Entries rise in both epoch and start offset. The decisions, one function each:

| row | asked                                          | answer                                 |
|-----|------------------------------------------------|----------------------------------------|
| A1  | ``assign(e, o)``, e above the latest epoch     | entry (e, o) added; entries starting   |
|     |                                                | at or after o first removed            |
| A2  | ``assign(e, o)``, e at or below the latest     | nothing (a batch of an epoch known)    |
| Q1  | ``end_offset_for(e)``, e the latest epoch      | (e, the log end offset)                |
| Q2  | e below the latest, some entry at or below e   | (that entry's epoch, the start of the  |
|     |                                                | first entry above e)                   |
| Q3  | e below every entry                            | (e, the first entry's start offset)    |
| Q4  | e above the latest, or no entry, or e = -1     | (-1, -1): UNDEFINED                    |
| T1  | ``truncate_from_end(o)``                       | entries starting at or after o removed |

Q1-Q4 are Kafka's LeaderEpochFileCache.endOffsetFor: a follower asking for its latest epoch
learns where the leader's log left that epoch, and truncates there.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os

from .disk import OsDisk, read_file, write_atomically

log = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
_VERSION = 0
MAX_ENTRIES = 1_000_000  # a count read from the file is checked before anything is built


class LeaderEpochCache:
    def __init__(self, directory: str, disk: OsDisk) -> None:
        self.path = os.path.join(directory, LEADER_EPOCH_CHECKPOINT_FILE)
        self._disk = disk
        self.entries: list[tuple[int, int]] = self._read()
        self._written = list(self.entries)

    def _read(self) -> list[tuple[int, int]]:
        try:
            text = read_file(self._disk, self.path).decode("ascii")
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("%s: unreadable (%s); leader epochs start empty", self.path, exc)
            return []
        return parse(text, self.path)

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else UNDEFINED_EPOCH

    def start_offset_of(self, epoch: int) -> int | None:
        for entry_epoch, start in self.entries:
            if entry_epoch == epoch:
                return start
        return None

    def assign(self, epoch: int, start_offset: int) -> bool:
        """A1/A2; True when the cache changed (and was written)."""
        if epoch <= self.latest_epoch or epoch < 0:
            return False
        kept = [e for e in self.entries if e[1] < start_offset]
        self.entries = [*kept, (epoch, start_offset)]
        self._write()
        return True

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Q1-Q4: (epoch, end offset) as the leader answers OffsetForLeaderEpoch."""
        if epoch == UNDEFINED_EPOCH or not self.entries or epoch > self.latest_epoch:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == self.latest_epoch:
            return epoch, log_end_offset
        epochs = [e for e, _ in self.entries]
        higher = bisect.bisect_right(epochs, epoch)  # the first entry above ``epoch``
        if higher == 0:
            return epoch, self.entries[0][1]
        return self.entries[higher - 1][0], self.entries[higher][1]

    def truncate_from_end(self, end_offset: int) -> None:
        """T1: the log was cut back to ``end_offset``."""
        kept = [e for e in self.entries if e[1] < end_offset]
        if kept != self.entries:
            self.entries = kept
            self._write()

    def _write(self) -> None:
        """An OSError leaves the entries in memory as they were (the file holds them, or
        after a failed fsync of the directory possibly the new ones): never ahead of it."""
        try:
            write_atomically(self._disk, self.path, render(self.entries))
        except OSError:
            self.entries = self._written
            raise
        self._written = list(self.entries)


def render(entries: list[tuple[int, int]]) -> bytes:
    lines = [str(_VERSION), str(len(entries))] + [f"{e} {o}" for e, o in entries]
    return ("\n".join(lines) + "\n").encode("ascii")


def parse(text: str, where: str = "leader-epoch-checkpoint") -> list[tuple[int, int]]:
    """Kafka's checkpoint text; an unreadable file starts empty (the leader's answers make
    the follower truncate, as for a replica that never had the file)."""
    lines = text.split("\n")
    try:
        if int(lines[0]) != _VERSION:
            raise ValueError(f"version {lines[0]!r}")
        count = int(lines[1])
        if not 0 <= count <= min(MAX_ENTRIES, len(lines) - 2):
            raise ValueError(f"{count} entries")
        entries = []
        for line in lines[2:2 + count]:
            epoch_text, offset_text = line.split()
            entries.append((int(epoch_text), int(offset_text)))
    except (ValueError, IndexError) as exc:
        log.warning("%s: unreadable (%s); leader epochs start empty", where, exc)
        return []
    if any(a[0] >= b[0] or a[1] > b[1] for a, b in itertools.pairwise(entries)):
        log.warning("%s: entries out of order; leader epochs start empty", where)
        return []
    return entries
