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


def _libc_function(name: str, argtypes: list) -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)  # libc's, already loaded
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


_fallocate = _libc_function("fallocate", [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                          ctypes.c_int64])
_fstatfs = _libc_function("fstatfs", [ctypes.c_int, ctypes.c_char_p])
_FALLOC_FL_KEEP_SIZE = 1
_STATFS_SIZE = 256  # more than struct statfs on any Linux ABI
_MEMORY_FILESYSTEMS = (0x01021994, 0x858458F6)  # tmpfs, ramfs (statfs f_type)


def reserving_pays(fd: int) -> bool:
    """Whether ``reserve`` makes later writes to this file cheaper. Not on tmpfs or ramfs:
    their fallocate fills in the memory pages, the very work the writes would have done,
    in one lump (about 2 ms for 8 MiB)."""
    if _fallocate is None or _fstatfs is None:
        return False
    buf = ctypes.create_string_buffer(_STATFS_SIZE)
    if _fstatfs(fd, buf) != 0:
        return False
    f_type = ctypes.c_long.from_buffer(buf).value  # the struct's first field
    return f_type & 0xFFFFFFFF not in _MEMORY_FILESYSTEMS


def reserve(fd: int, offset: int, length: int) -> bool:
    """Allocate the file's blocks for ``length`` bytes from ``offset`` without changing its
    size (Linux fallocate with FALLOC_FL_KEEP_SIZE); False where that is not possible.

    Readers and recovery see no difference: the size is still the data's end, and the
    blocks past it are freed by a truncation to that size (LogSegment.seal does one).
    """
    if _fallocate is None:
        return False
    return _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0
