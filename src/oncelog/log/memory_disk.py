"""A Disk in memory that fails on demand and loses power: the log's promises under test.

It keeps, for every file, the bytes a reader sees now and the bytes made durable by the last
fsync of it; for every directory, the names made durable by the last fsync of it. Then:

- ``fail(op, ...)`` makes the next matching operation fail: a write that takes some bytes and
  raises (ENOSPC, EIO), a short write, an fsync or a truncate that fails;
- ``capacity`` bounds the bytes all files may hold: a write past it is short, then ENOSPC, as
  on a full filesystem;
- ``crash()`` is kill -9: open files are closed, everything written stays (the page cache);
- ``power_loss(rng)`` is a power cut: each directory keeps only the names its last fsync saw,
  each file only its durable bytes plus, at random, some of what was written after them (a
  prefix, possibly followed by zeros, as a filesystem that extended the size before the data
  may show), and a truncation or overwrite that was never synced is undone.

Directories themselves are durable once made (a simplification: the log fsyncs the parent of
a directory it creates anyway). It is for tests and fault checks; nothing here is fast. Each
operation holds a lock: a seal (sealing.py) and a flush use it from worker threads while the
event loop does.
"""

from __future__ import annotations

import errno
import functools
import os
import random
import threading
import time
from dataclasses import dataclass, field


@dataclass
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    mtime_ms: int = 0


@dataclass
class _Open:
    inode: _Inode
    path: str
    append: bool
    position: int = 0


@dataclass
class _Fault:
    op: str  # "write" (write and writev), "fsync" (fsync and fdatasync), "ftruncate", "open",
    #          "rename", "fsync_dir", "unlink"
    error: int  # an errno, or 0 for a short write that raises nothing
    partial: int  # bytes a failing write takes before it fails (or a short write returns)
    path_suffix: str
    times: int


def _oserror(code: int, path: str = "") -> OSError:
    return OSError(code, os.strerror(code), path) if path else OSError(code, os.strerror(code))


class MemoryDisk:
    def __init__(self) -> None:
        self._files: dict[str, _Inode] = {}
        self._dirs: set[str] = {"/"}
        self._durable_names: dict[str, dict[str, _Inode]] = {}
        self._fds: dict[int, _Open] = {}
        self._next_fd = 3
        self._faults: list[_Fault] = []
        self.capacity: int | None = None
        # RLIMIT_NOFILE: opening a file (or a directory, to fsync or list it) past this many
        # descriptors fails with EMFILE, as the process's limit makes it
        self.max_fds: int | None = None
        self.faults_hit = 0
        self._lock = threading.RLock()

    # A copy (tests deep-copy a disk to replay a history) gets a lock of its own.
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # --- faults ----------------------------------------------------------------------------

    def fail(self, op: str, error: int = errno.EIO, partial: int = 0, path_suffix: str = "",
             times: int = 1) -> None:
        """Make the next ``times`` operations ``op`` on a path ending in ``path_suffix`` fail
        with ``error`` (0: a short write of ``partial`` bytes that raises nothing)."""
        self._faults.append(_Fault(op, error, partial, path_suffix, times))

    def clear_faults(self) -> None:
        self._faults.clear()

    def _fault(self, op: str, path: str) -> _Fault | None:
        for fault in self._faults:
            if fault.op == op and path.endswith(fault.path_suffix):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                self.faults_hit += 1
                return fault
        return None

    @property
    def open_fds(self) -> int:
        return len(self._fds)

    def _descriptor_left(self, path: str = "") -> None:
        if self.max_fds is not None and len(self._fds) >= self.max_fds:
            raise _oserror(errno.EMFILE, path)

    @property
    def used(self) -> int:
        return sum(len(inode.data) for inode in self._files.values())

    # --- power -----------------------------------------------------------------------------

    def crash(self) -> None:
        """kill -9: the process's files are closed; the page cache keeps what was written."""
        self._fds.clear()

    def power_loss(self, rng: random.Random) -> None:
        """A power cut: only what was made durable stays, plus some of the rest by chance."""
        self._fds.clear()
        self._faults.clear()
        survivors: dict[str, _Inode] = {}
        for directory in self._dirs:
            survivors.update({os.path.join(directory, name): inode for name, inode
                              in self._durable_names.get(directory, {}).items()})
        for inode in survivors.values():
            durable = inode.durable
            data = bytes(inode.data)
            if data[:len(durable)] == durable and len(data) > len(durable):
                kept = rng.randint(0, len(data) - len(durable))
                zeros = rng.choice((0, 0, rng.randint(0, 64)))
                inode.data = bytearray(durable + data[len(durable):len(durable) + kept]
                                       + bytes(zeros))
            else:
                inode.data = bytearray(durable)
            inode.durable = bytes(inode.data)
        self._files = survivors
        self._durable_names = {
            directory: {name: inode for name, inode in names.items()
                        if os.path.join(directory, name) in survivors}
            for directory, names in self._durable_names.items()
        }

    # --- descriptors -----------------------------------------------------------------------

    def _open_file(self, fd: int) -> _Open:
        try:
            return self._fds[fd]
        except KeyError:
            raise _oserror(errno.EBADF) from None

    def open(self, path: str, flags: int, mode: int = 0o777) -> int:
        path = os.path.abspath(path)
        self._descriptor_left(path)
        if self._fault("open", path):
            raise _oserror(errno.EIO, path)
        inode = self._files.get(path)
        if inode is None:
            if not flags & os.O_CREAT:
                raise _oserror(errno.ENOENT, path)
            if os.path.dirname(path) not in self._dirs:
                raise _oserror(errno.ENOENT, path)
            inode = self._files[path] = _Inode(mtime_ms=_now_ms())
        if flags & os.O_TRUNC:
            inode.data.clear()
        fd = self._next_fd
        self._next_fd += 1
        self._fds[fd] = _Open(inode, path, bool(flags & os.O_APPEND))
        return fd

    def close(self, fd: int) -> None:
        self._open_file(fd)
        del self._fds[fd]

    def dup(self, fd: int) -> int:
        opened = self._open_file(fd)
        self._descriptor_left(opened.path)
        new = self._next_fd
        self._next_fd += 1
        self._fds[new] = _Open(opened.inode, opened.path, opened.append, opened.position)
        return new

    def size(self, fd: int) -> int:
        return len(self._open_file(fd).inode.data)

    def mtime_ms(self, path: str) -> int:
        inode = self._files.get(os.path.abspath(path))
        if inode is None:
            raise _oserror(errno.ENOENT, path)
        return inode.mtime_ms

    # --- data ------------------------------------------------------------------------------

    def write(self, fd: int, data) -> int:
        opened = self._open_file(fd)
        data = bytes(data)
        fault = self._fault("write", opened.path)
        if fault is not None:
            taken = min(fault.partial, len(data))
            self._put(opened, data[:taken])
            if fault.error:
                raise _oserror(fault.error, opened.path)
            return taken
        if self.capacity is not None:
            room = max(0, self.capacity - self.used)
            if room < len(data):
                if room == 0:
                    raise _oserror(errno.ENOSPC, opened.path)
                data = data[:room]
        self._put(opened, data)
        return len(data)

    def writev(self, fd: int, parts) -> int:
        return self.write(fd, b"".join(bytes(p) for p in parts))

    def _put(self, opened: _Open, data: bytes) -> None:
        inode = opened.inode
        position = len(inode.data) if opened.append else opened.position
        if position > len(inode.data):
            inode.data.extend(bytes(position - len(inode.data)))
        inode.data[position:position + len(data)] = data
        opened.position = position + len(data)
        inode.mtime_ms = _now_ms()

    def pread(self, fd: int, n: int, position: int) -> bytes:
        return bytes(self._open_file(fd).inode.data[position:position + n])

    def ftruncate(self, fd: int, length: int) -> None:
        opened = self._open_file(fd)
        fault = self._fault("ftruncate", opened.path)
        if fault is not None:
            raise _oserror(fault.error or errno.EIO, opened.path)
        data = opened.inode.data
        if length < len(data):
            del data[length:]
        else:
            data.extend(bytes(length - len(data)))

    def fsync(self, fd: int) -> None:
        opened = self._open_file(fd)
        if self._fault("fsync", opened.path) is not None:
            # Linux may drop the pages it failed to write, and reports it only once: nothing
            # since the last good fsync can be counted on.
            raise _oserror(errno.EIO, opened.path)
        opened.inode.durable = bytes(opened.inode.data)

    fdatasync = fsync

    # --- names -----------------------------------------------------------------------------

    def listdir(self, path: str) -> list[str]:
        path = os.path.abspath(path)
        self._descriptor_left(path)
        if path not in self._dirs:
            raise _oserror(errno.ENOENT, path)
        names = {os.path.basename(p) for p in self._files if os.path.dirname(p) == path}
        names |= {os.path.basename(d) for d in self._dirs
                  if d != path and os.path.dirname(d) == path}
        return sorted(names)

    def exists(self, path: str) -> bool:
        path = os.path.abspath(path)
        return path in self._files or path in self._dirs

    def isdir(self, path: str) -> bool:
        return os.path.abspath(path) in self._dirs

    def makedirs(self, path: str) -> None:
        path = os.path.abspath(path)
        while path not in self._dirs:
            self._dirs.add(path)
            path = os.path.dirname(path)

    def unlink(self, path: str) -> None:
        path = os.path.abspath(path)
        if self._fault("unlink", path):
            raise _oserror(errno.EIO, path)
        if self._files.pop(path, None) is None:
            raise _oserror(errno.ENOENT, path)

    def rename(self, src: str, dst: str) -> None:
        """Files only: the log renames nothing else."""
        src, dst = os.path.abspath(src), os.path.abspath(dst)
        if self._fault("rename", src):
            raise _oserror(errno.EIO, src)
        if src not in self._files:
            raise _oserror(errno.ENOENT, src)
        self._files[dst] = self._files.pop(src)

    def fsync_dir(self, path: str) -> None:
        path = os.path.abspath(path)
        self._descriptor_left(path)
        self._sync_names(path)

    def open_dir(self, path: str) -> int:
        path = os.path.abspath(path)
        self._descriptor_left(path)
        if path not in self._dirs:
            raise _oserror(errno.ENOENT, path)
        fd = self._next_fd
        self._next_fd += 1
        self._fds[fd] = _Open(_Inode(mtime_ms=_now_ms()), path, False, 0)
        return fd

    def fsync_open_dir(self, fd: int) -> None:
        self._sync_names(self._open_file(fd).path)

    def _sync_names(self, path: str) -> None:
        if path not in self._dirs:
            raise _oserror(errno.ENOENT, path)
        if self._fault("fsync_dir", path):
            raise _oserror(errno.EIO, path)
        self._durable_names[path] = {os.path.basename(p): inode for p, inode
                                     in self._files.items() if os.path.dirname(p) == path}


def _now_ms() -> int:
    return int(time.time() * 1000)


def _locked(method):
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


for _name in ("fail", "clear_faults", "crash", "power_loss", "open", "close", "dup", "size",
              "mtime_ms", "write", "writev", "pread", "ftruncate", "fsync", "listdir",
              "exists", "isdir", "makedirs", "unlink", "rename", "fsync_dir", "open_dir",
              "fsync_open_dir"):
    setattr(MemoryDisk, _name, _locked(getattr(MemoryDisk, _name)))
MemoryDisk.fdatasync = MemoryDisk.fsync
