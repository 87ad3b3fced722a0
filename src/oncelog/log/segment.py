"""One segment of a partition's log: the ``.log`` file of batches and its indexes (offset,
time, and aborted transactions).

An append is all or nothing: when any part of a write fails (a short write, ENOSPC, EIO), the
file is cut back to its size before the append and nothing in memory moves, so the next
append goes where this one would have. If even the cut fails, the segment can no longer vouch
for its bytes and raises LogDirFailure: its directory goes offline until a restart recovers it.
A failed fsync raises LogDirFailure too: after one, the kernel may have dropped the very pages
it could not write (and says so only once), so nothing written since the last good fsync is
known to be durable.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time

from ..protocol.record_batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    crc_of,
    read_header,
)
from .disk import LogDirFailure, OsDisk
from .index import OffsetIndex, TimeIndex
from .open_files import OPEN_FILES, OpenFiles
from .txn_index import TransactionIndex

log = logging.getLogger(__name__)

_SCAN_CHUNK = 1 << 20
# Offsets in the index are relative to the segment's base offset, in 32 bits: Kafka rolls a
# segment before an offset would not fit a signed 32-bit delta, and so do we.
MAX_RELATIVE_OFFSET = (1 << 31) - 1


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def segment_files(directory: str, base_offset: int, suffix: str = ""
                  ) -> tuple[str, str, str, str]:
    """The paths of a segment's log, offset index, time index and aborted transaction index
    (``suffix`` after each: the cleaner writes a segment as ``.cleaned`` files before it
    takes the names)."""
    stem = os.path.join(directory, segment_name(base_offset))
    return (stem + ".log" + suffix, stem + ".index" + suffix, stem + ".timeindex" + suffix,
            stem + ".txnindex" + suffix)


class LogSegment:
    def __init__(self, directory: str, base_offset: int, index_interval_bytes: int,
                 disk: OsDisk, suffix: str = "", files: OpenFiles = OPEN_FILES) -> None:
        self.base_offset = base_offset
        self.path, index_path, time_index_path, txn_index_path = segment_files(
            directory, base_offset, suffix)
        self._disk = disk
        self.offset_index = OffsetIndex(index_path, disk)
        self.time_index = TimeIndex(time_index_path, disk)
        self.txn_index = TransactionIndex(txn_index_path, disk)
        # False: the aborted transaction index must be rebuilt from the log (the partition
        # replays producer state over this segment), after a recovery or a bad file.
        self.txn_index_trusted = True
        self.index_interval_bytes = index_interval_bytes
        # The descriptor, -1 while released (see open_files.py): every use goes through
        # _file(), and no raw descriptor is kept across a call that may open another file.
        self._files = files
        self._closed = False
        self._fd = disk.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        files.opened(self)
        self.size = disk.size(self._fd)
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.first_batch_timestamp = -1
        self.created_at_ms = int(time.time() * 1000)
        self._bytes_since_index = 0
        self.unflushed_messages = 0

    # --- opening -------------------------------------------------------------------------

    def load(self) -> bool:
        """Open a segment closed cleanly: trust its indexes, rescan only after the last entry.

        Returns False when it had to be recovered instead (see ``recover``)."""
        if not self.offset_index.load(self.size):
            self.recover()
            return False
        start = 0
        if len(self.offset_index):
            start = self.offset_index.positions[-1]
            self.next_offset = self.base_offset + self.offset_index.relative_offsets[-1]
        if self._scan(start, check_crc=False, index=False) != self.size:
            self.recover()
            return False
        if not self.time_index.load(self.next_offset - self.base_offset):
            self.recover()
            return False
        self._bytes_since_index = self.size - start
        if self.time_index.last_timestamp > self.max_timestamp:
            self.max_timestamp = self.time_index.last_timestamp
            self.offset_of_max_timestamp = self.base_offset + self.time_index.relative_offsets[-1]
        if self.size >= HEADER_SIZE:
            first = read_header(self._disk.pread(self._file(), HEADER_SIZE, 0))
            self.first_batch_timestamp = first.max_timestamp
        if not self.txn_index.load(self.base_offset, self.next_offset):
            log.warning("%s: unreadable aborted transaction index; rebuilding it", self.path)
            self.txn_index.clear()
            self.txn_index_trusted = False
        return True

    def recover(self) -> int:
        """Validate every batch, truncate a torn or corrupt tail, rebuild both indexes.

        Returns the number of bytes truncated.
        """
        self.offset_index.clear()
        self.time_index.clear()
        self.txn_index.clear()
        self.txn_index_trusted = False
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.first_batch_timestamp = -1
        self._bytes_since_index = 0
        valid_end = self._scan(0, check_crc=True)
        truncated = self.size - valid_end
        if truncated:
            log.warning(
                "%s: truncating %d bytes of torn or corrupt data after byte %d",
                self.path, truncated, valid_end,
            )
            self._disk.ftruncate(self._file(), valid_end)
            self._disk.fsync(self._file())
            self.size = valid_end
        return truncated

    def _scan(self, start: int, check_crc: bool, index: bool = True) -> int:
        """Walk batches from ``start``, updating offsets, timestamps and indexes.

        Returns the position after the last good batch.
        """
        pos = start
        while pos + HEADER_SIZE <= self.size:
            header_bytes = self._disk.pread(self._file(), HEADER_SIZE, pos)
            if len(header_bytes) < HEADER_SIZE:
                break
            header = read_header(header_bytes)
            if (
                header.magic != 2
                or header.batch_length < HEADER_SIZE - LOG_OVERHEAD
                or pos + header.size > self.size
                # Offsets only rise: a follower takes a compacted leader's batches with
                # the gaps between them (as the cleaner leaves them here), in any segment,
                # the one appended to as well. So only a base offset (a field the CRC does
                # not cover) damaged below the last or out of the segment's range is seen,
                # as Kafka's recovery sees no more.
                or header.base_offset < self.next_offset
                or header.last_offset_delta < 0
                or header.last_offset - self.base_offset > MAX_RELATIVE_OFFSET
            ):
                break
            if check_crc:
                body = self._disk.pread(self._file(), header.size, pos)
                if len(body) < header.size or crc_of(body, 0, header.size) != header.crc:
                    break
            self._track(header, pos, index)
            pos += header.size
        return pos

    # --- writing -------------------------------------------------------------------------

    def fits(self, last_offset: int) -> bool:
        """Whether a batch ending at ``last_offset`` can go in this segment's indexes."""
        return last_offset - self.base_offset <= MAX_RELATIVE_OFFSET

    def _track(self, header: BatchHeader, position: int, index: bool = True) -> None:
        if self.first_batch_timestamp < 0 and position == 0:
            self.first_batch_timestamp = header.max_timestamp
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = header.base_offset
        if index and (self._bytes_since_index >= self.index_interval_bytes or position == 0):
            self.offset_index.append(header.base_offset - self.base_offset, position)
            # Kafka's rule: the entry is the running maximum, so every batch before the entry's
            # offset has a timestamp no greater than the entry's.
            self.time_index.maybe_append(
                self.max_timestamp, self.offset_of_max_timestamp - self.base_offset
            )
            self._bytes_since_index = 0
        self._bytes_since_index += header.size
        self.next_offset = header.last_offset + 1

    def append(self, parts: list, headers: list[BatchHeader]) -> None:
        """Write the buffers in ``parts`` (the batches, in order) with one writev: all of them,
        or none (an OSError, the segment as before), or LogDirFailure."""
        if not self.fits(headers[-1].last_offset):
            raise ValueError(f"{self.path}: offset {headers[-1].last_offset} does not fit "
                             "this segment; the log should have rolled")
        position = self.size
        total = sum(len(p) for p in parts)
        try:
            written = self._disk.writev(self._file(), parts)
            if written < total:  # a short write on a regular file: the disk is full, say why
                self._write_rest(parts, written)
        except BaseException as exc:
            self._cut_back(position, exc)
            raise
        for header in headers:
            self._track(header, position)
            position += header.size
            self.unflushed_messages += header.records_count
        self.size = position

    def _cut_back(self, size: int, cause: BaseException) -> None:
        """Undo a failed append: the file ends where it did before it."""
        try:
            self._disk.ftruncate(self._file(), size)
        except OSError as exc:
            raise LogDirFailure(f"{self.path}: an append failed ({cause}) and its bytes could "
                                f"not be cut away ({exc})") from exc
        log.warning("%s: an append failed (%s); cut the segment back to %d bytes", self.path,
                    cause, size)

    def _write_rest(self, parts: list, written: int) -> None:
        rest = memoryview(b"".join(bytes(p) for p in parts))[written:]
        while rest:
            n = self._disk.write(self._file(), rest)
            if n <= 0:
                raise OSError(28, "No space left on device (a write took no bytes)")
            rest = rest[n:]

    def flush(self) -> None:
        """fsync; raises LogDirFailure when it fails."""
        fd = self._file()  # an error opening it (EMFILE) is not a failed fsync
        try:
            self._disk.fdatasync(fd)
        except OSError as exc:
            raise LogDirFailure(f"{self.path}: fsync failed: {exc}") from exc
        self.unflushed_messages = 0

    def dup_fd(self) -> int:
        """A descriptor of this file for an fsync in another thread: closing the segment
        meanwhile cannot make that fsync land on a file opened later under the same number."""
        return self._disk.dup(self._file())

    def seal(self) -> None:
        """Make the segment durable with its indexes, on the calling thread (a clean
        shutdown; a roll seals off it, see sealing.py)."""
        self.flush()
        self.save_indexes()

    def save_indexes(self) -> None:
        self.end_time_index()
        self.offset_index.save()
        self.time_index.save()
        self.txn_index.save()

    def end_time_index(self) -> None:
        """The time index's last entry: the segment's largest timestamp (it takes no more
        appends)."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(
                self.max_timestamp, self.offset_of_max_timestamp - self.base_offset
            )

    # --- reading -------------------------------------------------------------------------

    def read_at(self, position: int, size: int) -> bytes:
        return self._disk.pread(self._file(), size, position)

    def position_of(self, offset: int) -> int | None:
        """File position of the batch holding ``offset`` (or the first one after it)."""
        if offset >= self.next_offset:
            return None
        pos = self.offset_index.lookup(max(0, offset - self.base_offset))
        while pos + HEADER_SIZE <= self.size:
            header = read_header(self._disk.pread(self._file(), HEADER_SIZE, pos))
            if header.last_offset >= offset:
                return pos
            pos += header.size
        return None

    def headers_from(self, position: int):
        """Yield (position, header) of each batch from ``position`` to the end."""
        pos = position
        while pos + HEADER_SIZE <= self.size:
            chunk = self._disk.pread(self._file(), min(_SCAN_CHUNK, self.size - pos), pos)
            view = memoryview(chunk)
            inner = 0
            while inner + HEADER_SIZE <= len(view):
                header = read_header(view, inner)
                yield pos + inner, header
                inner += header.size
            if inner == 0:
                return
            pos += inner

    @property
    def modified_ms(self) -> int:
        """When the file was last written (retention's clock for records without timestamps)."""
        return self._disk.mtime_ms(self.path)

    @property
    def is_open(self) -> bool:
        """Not closed for good (its descriptor may be released meanwhile)."""
        return not self._closed

    def _file(self) -> int:
        fd = self._fd
        if fd >= 0:
            self._files.used(self)
            return fd
        if self._closed:
            raise OSError(errno.EBADF, f"{self.path}: the segment is closed")
        fd = self._disk.open(self.path, os.O_RDWR | os.O_APPEND)
        self._fd = fd
        self._files.opened(self)
        return fd

    def adopt(self, files: OpenFiles) -> None:
        """Move from the bound the segment was opened under to ``files`` (both used only by
        the thread calling this): an open descriptor counts against ``files`` now."""
        if files is self._files:
            return
        self._files.closed(self)
        self._files = files
        if self._fd >= 0 and not self._closed:
            files.opened(self)

    def release(self) -> None:
        """Close the descriptor (the least recently used of the broker's); the next use
        opens the file again."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            with contextlib.suppress(OSError):  # a descriptor a test's crash() dropped
                self._disk.close(fd)

    def files(self) -> tuple[str, str, str, str]:
        return self.path, self.offset_index.path, self.time_index.path, self.txn_index.path

    def renamed(self, paths: tuple[str, str, str, str]) -> None:
        """The files were renamed to ``paths`` (the descriptor follows a rename)."""
        (self.path, self.offset_index.path, self.time_index.path,
         self.txn_index.path) = paths

    def truncate_at(self, position: int) -> None:
        """Cut the file at ``position``, durably; the indexes are left to ``recover`` (the
        log is opened again after a truncation)."""
        self._disk.ftruncate(self._file(), position)
        self._disk.fsync(self._file())
        self.size = position

    def close(self) -> None:
        self._closed = True
        self._files.closed(self)
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            self._disk.close(fd)

    def delete(self) -> None:
        """Remove the files: the log first, so that what is left of a segment whose removal
        was cut short is an index without its log, which opening ignores and removes."""
        self.close()
        for path in self.files():
            try:
                self._disk.unlink(path)
            except FileNotFoundError:
                pass
