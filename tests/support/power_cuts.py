"""A disk whose power goes at a chosen mutating operation, for the seal's power-cut tests
(tests/log/test_seal.py, the random histories of seal_model.py), and a producer-id source
that takes every id as issued."""

from __future__ import annotations

import os

from oncelog.log.memory_disk import MemoryDisk

MUTATIONS = ("open", "write", "writev", "ftruncate", "fsync", "fdatasync", "rename", "unlink",
             "fsync_dir", "open_dir", "fsync_open_dir")


class PowerCut(BaseException):
    """The power goes here: nothing after it runs (no handler takes it for an OSError)."""


class CuttingDisk(MemoryDisk):
    """A MemoryDisk whose power goes at its ``cut_at``-th mutating operation (from 0); it
    names each operation it did (``done``)."""

    def __init__(self) -> None:
        super().__init__()
        self.cut_at: int | None = None
        self.done: list[str] = []

    def restore(self) -> None:
        self.cut_at = None


def _cutting(name):
    method = getattr(MemoryDisk, name)

    def operation(self, *args, **kwargs):
        if self.cut_at is not None and len(self.done) >= self.cut_at:
            raise PowerCut(name)
        target = args[0] if args and isinstance(args[0], str) else \
            self._fds[args[0]].path if args and args[0] in self._fds else ""
        self.done.append(f"{name} {os.path.basename(target)}")
        return method(self, *args, **kwargs)

    operation.__name__ = name
    return operation


for _name in MUTATIONS:
    setattr(CuttingDisk, _name, _cutting(_name))


class IssuedBelow:
    def is_issued(self, producer_id: int) -> bool:
        return True

    def highest_claimed(self) -> int:
        return 0
