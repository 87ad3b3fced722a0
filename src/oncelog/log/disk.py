"""Every file operation of the log goes through a Disk: the real one, or one that fails.

The log's promises (an append is all or nothing, nothing acknowledged is lost, recovery cuts
only what was never durable) are only as good as the tests that break the disk under it.
So log/ never calls ``os`` for its files: it calls a Disk, and tests hand it a MemoryDisk
(log/memory_disk.py) that makes writes short, fills up, answers EIO, fails fsync, or loses
power and keeps only what was made durable.

The interface is ``os``'s own, file descriptors included, so the real Disk is ``os`` with
nothing in between on the produce path.

Durability, as POSIX promises it and as MemoryDisk enforces it: a file's bytes are durable
after ``fsync``/``fdatasync`` of it; that a file exists under a name (after create, rename or
unlink) is durable after ``fsync_dir`` of its directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable, Sequence


class LogDirFailure(Exception):
    """The log can no longer vouch for its files (an fsync failed, or a failed append could
    not be undone): its directory must go offline, as Kafka takes a failed log dir offline,
    until a restart recovers it from what is on disk."""


def out_of_descriptors(exc: BaseException) -> bool:
    """Whether ``exc`` says the process (EMFILE) or the system (ENFILE) has no descriptor
    left: a resource error of the operation that needed one, answered to its request, never
    a failure of the directory (an fsync that needed to open the directory never ran)."""
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


class OsDisk:
    """The real filesystem."""

    open = staticmethod(os.open)
    close = staticmethod(os.close)
    dup = staticmethod(os.dup)
    write = staticmethod(os.write)
    writev = staticmethod(os.writev)
    pread = staticmethod(os.pread)
    ftruncate = staticmethod(os.ftruncate)
    fsync = staticmethod(os.fsync)
    fdatasync = staticmethod(os.fdatasync)
    listdir = staticmethod(os.listdir)
    unlink = staticmethod(os.unlink)
    rename = staticmethod(os.replace)
    isdir = staticmethod(os.path.isdir)
    exists = staticmethod(os.path.exists)

    @staticmethod
    def size(fd: int) -> int:
        return os.fstat(fd).st_size

    @staticmethod
    def mtime_ms(path: str) -> int:
        return os.stat(path).st_mtime_ns // 1_000_000

    @staticmethod
    def makedirs(path: str) -> None:
        os.makedirs(path, exist_ok=True)

    @staticmethod
    def fsync_dir(path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # A directory's descriptor taken ahead of a step that must fsync it: out of descriptors
    # (EMFILE) before the step decides nothing, after it would leave it undecided.
    @staticmethod
    def open_dir(path: str) -> int:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)

    fsync_open_dir = staticmethod(os.fsync)


class InstrumentedDisk(OsDisk):
    """The real filesystem with two hooks for tests and fault checks of a broker running in
    another process; chosen by environment variables, never set in production.

    ONCELOG_FSYNC_JOURNAL=<path>: after each successful fsync of a file, append "size path" to
    that journal. A test kills the broker (the page cache survives a kill, so a kill alone
    proves nothing about fsync), then cuts every file back to its journalled size
    (``cut_to_journal``), which is what a power cut may leave. The last line of a path is
    what is durable of it: the size an fsync made durable is read before it starts, and a
    line is written only when it is larger than the path's last one, under a lock (fsyncs
    run in worker threads too: a stale line landing after a newer one would cut away what
    the newer fsync made durable, and had been acknowledged); a truncation, unlink or
    rename writes its own line.

    ONCELOG_DISK_FAULTS=<op>:<path suffix>:<after>:<errno name>[;...]: the operation ``op``
    (write, fsync, ftruncate) on a path ending in the suffix fails with that errno once it
    has succeeded ``after`` times, e.g. ``fsync:.log:20:EIO``; it then keeps failing. In
    place of an errno name, ``SLOW<ms>`` makes it take that long instead (a slow disk), e.g.
    ``fsync:partition.metadata.tmp:0:SLOW20``.
    """

    def __init__(self, journal: str | None, faults: str | None) -> None:
        self._journal = None if journal is None else os.open(
            journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._paths: dict[int, str] = {}
        self._durable: dict[str, int] = {}  # path -> its journal's last size
        self._journal_lock = threading.Lock()
        # [op, suffix, successes left, errno or None, delay in seconds]; the counts are
        # decremented by worker threads too (openings, fsyncs), hence the lock
        self._faults: list[list] = []
        self._lock = threading.Lock()
        for spec in filter(None, (faults or "").split(";")):
            op, suffix, after, name = spec.split(":")
            slow = name.startswith("SLOW")  # a delay, not an error
            self._faults.append([op, suffix, int(after),
                                 None if slow else getattr(errno, name),
                                 int(name[4:]) / 1000 if slow else 0.0])

    def open(self, path: str, flags: int, mode: int = 0o777) -> int:  # type: ignore[override]
        fd = os.open(path, flags, mode)
        self._paths[fd] = os.path.abspath(path)
        if flags & os.O_TRUNC:
            self._set_durable(self._paths[fd], 0, grow=False)
        return fd

    def close(self, fd: int) -> None:  # type: ignore[override]
        self._paths.pop(fd, None)
        os.close(fd)

    def dup(self, fd: int) -> int:  # type: ignore[override]
        new = os.dup(fd)
        self._paths[new] = self._paths.get(fd, "")
        return new

    def _check(self, op: str, fd: int) -> None:
        path = self._paths.get(fd, "")
        delay = 0.0
        with self._lock:
            for fault in self._faults:
                if fault[0] == op and path.endswith(fault[1]):
                    if fault[2] <= 0 and fault[3] is None:
                        delay += fault[4]
                    elif fault[2] <= 0:
                        raise OSError(fault[3], f"{os.strerror(fault[3])} (injected)", path)
                    fault[2] -= 1
        if delay:
            time.sleep(delay)  # outside the lock: slow threads do not queue each other

    def _synced(self, fd: int, sync) -> None:
        path = self._paths.get(fd)
        if not path or self._journal is None:
            sync(fd)
            return
        size = os.fstat(fd).st_size  # written before the fsync: what it makes durable
        sync(fd)
        self._set_durable(path, size, grow=True)

    def _set_durable(self, path: str, size: int, grow: bool) -> None:
        """Journal ``size`` as what is durable of ``path``: the larger of it and the last
        one after an fsync (``grow``), at most it after a cut."""
        if self._journal is None:
            return
        with self._journal_lock:
            last = self._durable.get(path, 0)
            size = max(last, size) if grow else min(last, size)
            if size == last and path in self._durable:
                return
            self._durable[path] = size
            os.write(self._journal, f"{size} {path}\n".encode())

    def write(self, fd: int, data) -> int:  # type: ignore[override]
        self._check("write", fd)
        return os.write(fd, data)

    def writev(self, fd: int, parts) -> int:  # type: ignore[override]
        self._check("write", fd)
        return os.writev(fd, parts)

    def ftruncate(self, fd: int, length: int) -> None:  # type: ignore[override]
        self._check("ftruncate", fd)
        os.ftruncate(fd, length)
        path = self._paths.get(fd)
        if path:
            self._set_durable(path, length, grow=False)

    def fsync(self, fd: int) -> None:  # type: ignore[override]
        self._check("fsync", fd)
        self._synced(fd, os.fsync)

    def fdatasync(self, fd: int) -> None:  # type: ignore[override]
        self._check("fsync", fd)
        self._synced(fd, os.fdatasync)

    def unlink(self, path: str) -> None:  # type: ignore[override]
        os.unlink(path)
        self._set_durable(os.path.abspath(path), 0, grow=False)

    def rename(self, src: str, dst: str) -> None:  # type: ignore[override]
        os.replace(src, dst)
        src, dst = os.path.abspath(src), os.path.abspath(dst)
        with self._journal_lock:
            moved = self._durable.get(src, 0)
        self._set_durable(dst, 0, grow=False)
        self._set_durable(dst, moved, grow=True)
        self._set_durable(src, 0, grow=False)


def cut_to_journal(journal: str, directory: str,
                   suffixes: Sequence[str] = (".log",)) -> dict[str, int]:
    """What a power cut may leave of an InstrumentedDisk's files: each file under
    ``directory`` with one of ``suffixes`` cut back to its last journalled size (to nothing
    when it was never fsynced). Returns path -> size kept."""
    durable: dict[str, int] = {}
    with contextlib.suppress(FileNotFoundError), open(journal, encoding="utf-8") as f:
        for line in f:
            size, _, path = line.rstrip("\n").partition(" ")
            durable[path] = int(size)
    kept = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.abspath(os.path.join(root, name))
            if name.endswith(tuple(suffixes)):
                kept[path] = min(os.path.getsize(path), durable.get(path, 0))
                os.truncate(path, kept[path])
    return kept


def default_disk() -> OsDisk:
    journal = os.environ.get("ONCELOG_FSYNC_JOURNAL")
    faults = os.environ.get("ONCELOG_DISK_FAULTS")
    if journal or faults:
        return InstrumentedDisk(journal, faults)
    return OS_DISK


OS_DISK = OsDisk()


def read_file(disk: OsDisk, path: str) -> bytes:
    fd = disk.open(path, os.O_RDONLY)
    try:
        size = disk.size(fd)
        data = disk.pread(fd, size, 0)
        while len(data) < size:
            more = disk.pread(fd, size - len(data), len(data))
            if not more:
                break
            data += more
        return data
    finally:
        disk.close(fd)


def write_fully(disk: OsDisk, fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = disk.write(fd, view)
        if n <= 0:
            raise OSError(28, "no space left on device")  # ENOSPC: a write that took nothing
        view = view[n:]


def write_synced(disk: OsDisk, path: str, data: bytes,
                 fsync: Callable[[int], None] | None = None) -> None:
    """``data`` written to ``path`` (created or emptied) and fsynced (by ``fsync``, the
    disk's own unless the caller wraps it); on any failure the file is removed."""
    fd = disk.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            write_fully(disk, fd, data)
            (fsync or disk.fsync)(fd)
        finally:
            disk.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            disk.unlink(path)
        raise


def replace_file(disk: OsDisk, path: str, data: bytes) -> None:
    """Write ``data`` to a temporary file, fsync it and rename it over ``path``: the part of
    an atomic replace whose failure (an OSError) changes nothing, the temporary file
    removed. The directory's fsync, which makes the rename durable, is the caller's: what
    its failure means depends on the file."""
    tmp = path + ".tmp"
    write_synced(disk, tmp, data)
    try:
        disk.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            disk.unlink(tmp)
        raise


def write_atomically(disk: OsDisk, path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that it is durably either the old or the new bytes:
    replace_file, then the directory fsynced."""
    replace_file(disk, path, data)
    disk.fsync_dir(os.path.dirname(path) or ".")
