"""File helpers of the log: small files replaced atomically, blocks reserved ahead."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable


def write_atomically(path: str, data: bytes) -> None:
    """Write a temporary file, fsync it, rename it over ``path``."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _load_fallocate() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fallocate = ctypes.CDLL(None, use_errno=True).fallocate  # libc's, already loaded
    except (OSError, AttributeError):
        return None
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fallocate.restype = ctypes.c_int
    return fallocate


_fallocate = _load_fallocate()
_FALLOC_FL_KEEP_SIZE = 1


def reserve(fd: int, offset: int, length: int) -> bool:
    """Allocate the file's blocks for ``length`` bytes from ``offset`` without changing its
    size (Linux fallocate with FALLOC_FL_KEEP_SIZE); False where that is not possible.

    Readers and recovery see no difference: the size is still the data's end, and the
    blocks past it are freed by a truncation to that size (LogSegment.seal does one).
    """
    if _fallocate is None:
        return False
    return _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0
