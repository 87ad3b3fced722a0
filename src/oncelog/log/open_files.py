"""The segment files the broker holds open: at most a bound, the least recently used closed
first and reopened on demand.

Kafka keeps every segment's file open, so its descriptors grow with partitions times
segments and an operator raises ``ulimit -n`` to match. Here a segment holds its descriptor
only while it is among the ``limit`` most recently used: an idle partition's files and old
segments are closed, and opened again (by name) at their next read or append. Closing is
safe for data not yet fsynced: the page cache keeps it, and the next fsync (a new
descriptor of the same file) covers it, as fsync is per file, not per descriptor.

The bound is half the process's RLIMIT_NOFILE (the rest: client connections, and the files
opened for a moment to write an index, a snapshot or a checkpoint, or to fsync a directory).
"""

from __future__ import annotations

import resource
from collections import OrderedDict
from typing import Protocol

_FLOOR = 8  # a process with fewer descriptors than this cannot serve anyway


class Releasable(Protocol):
    def release(self) -> None: ...


class OpenFiles:
    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._lru: OrderedDict[Releasable, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def used(self, holder: Releasable) -> None:
        """``holder`` used its descriptor: it is the most recent now."""
        try:
            self._lru.move_to_end(holder)
        except KeyError:  # a copy of a segment (tests deep-copy logs): counted from now
            self.opened(holder)

    def __deepcopy__(self, memo: dict) -> OpenFiles:
        return self  # the process's one bound, shared by copies of what holds it

    def __copy__(self) -> OpenFiles:
        return self

    def opened(self, holder: Releasable) -> None:
        """``holder`` opened its file: the least recently used beyond the bound close."""
        self._lru[holder] = None
        while len(self._lru) > self.limit:
            oldest, _ = self._lru.popitem(last=False)
            oldest.release()

    def closed(self, holder: Releasable) -> None:
        self._lru.pop(holder, None)

    def release_all(self) -> None:
        """Close every descriptor counted here; each opens again by name at its next use."""
        while self._lru:
            holder, _ = self._lru.popitem(last=False)
            holder.release()


def default_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 16
    return max(_FLOOR, soft // 2)


OPEN_FILES = OpenFiles(default_limit())
