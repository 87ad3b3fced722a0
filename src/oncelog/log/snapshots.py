"""Snapshot files beside a partition's segments: ``<offset>.snapshot``, written atomically.

The log stores and lists the bytes; what they mean belongs to producer_state/.
"""

from __future__ import annotations

import contextlib
import os

from .disk import OsDisk, read_file, write_atomically
from .segment import segment_name

SUFFIX = ".snapshot"


class SnapshotFiles:
    def __init__(self, directory: str, disk: OsDisk) -> None:
        self.dir = directory
        self._disk = disk

    def path(self, offset: int) -> str:
        return os.path.join(self.dir, segment_name(offset) + SUFFIX)

    def offsets(self) -> list[int]:
        """Offsets of the snapshots on disk, newest first."""
        found = []
        for name in self._disk.listdir(self.dir):
            stem = name[: -len(SUFFIX)]
            if name.endswith(SUFFIX) and stem.isdigit():
                found.append(int(stem))
        return sorted(found, reverse=True)

    def write(self, offset: int, data: bytes) -> None:
        write_atomically(self._disk, self.path(offset), data)

    def read(self, offset: int) -> bytes:
        return read_file(self._disk, self.path(offset))

    def delete(self, offset: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._disk.unlink(self.path(offset))

    def keep_newest(self, count: int) -> None:
        """Older snapshots are only fallbacks for a damaged newer one: a few suffice."""
        for older in self.offsets()[count:]:
            self.delete(older)

    def delete_older_than(self, offset: int) -> None:
        """Drop snapshots below ``offset`` (the log start), always keeping the newest one."""
        for older in self.offsets()[1:]:
            if older < offset:
                self.delete(older)
