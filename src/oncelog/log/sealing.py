"""A rolled segment's seal: its fsync, then its index files, off the thread that rolled.

A 1 GiB segment rolled at full speed is still dirty in the page cache: its fsync took 263-292
ms, on the event loop, at every roll (docs/benchmarks.md, "The event loop at a segment
roll"). Kafka rolls without waiting for the old segment's fsync (a scheduler thread flushes
it); so does ``Log.roll``, and this module keeps every promise while a seal runs:

- Recovery. ``Log.roll`` creates ``<base>.unsealed`` beside the old segment before the new
  segment's directory fsync, which makes both durable. A start recovers (scans, cuts at the
  first bad batch) every segment with one, and a segment cut short drops every segment after
  it (``Log._open``). The seal removes the marker only once the segment's data is durable
  (its fsync done) and its index files are in place, and fsyncs the directory after: a marker
  never vanishes before its segment's bytes are on disk, and once a seal is ``unmarked`` its
  marker cannot come back. One that came back would have the next start scan the whole
  segment and, finding damage that loading a sealed segment never reads, drop every segment
  after it, acknowledged records with them. The cleaner stops before a segment not
  ``unmarked`` yet (``cleaning.plan``): a compacted segment has gaps a scan of a marked one
  takes for damage.
- Acknowledgements. A flush covers the segments still sealing by waiting for their fsync
  (``Log.flush``, the partition's flush rounds), never by an fsync of its own: the seal's
  fsync may be the one told of a failed write-back, and on Linux an error is told once per
  open file. The seal opens the file anew for the same reason (a ``dup`` would share the
  segment's open file, and with it the one report). It waits as long as that takes, as it
  waits for its own fsync (``wait_synced`` says why no bound).
- Deletion. A segment deleted (retention, DeleteRecords, a truncation) while its seal runs
  comes back after a power cut, marked and without what of it was not on disk yet, until a
  directory fsync after its unlink: the log keeps such a seal among those a flush waits for
  until then (``Log.pending_seals``), so that nothing after it is acknowledged while a start
  could still find it cut short and drop what follows.
- Failure. A failed fsync of the segment, or of its index files or of the directory after
  the marker's removal, is ``error`` (LogDirFailure): its owner takes the directory offline,
  and every flush waiting on it fails. A failed write of the index files or of the marker's
  removal (a full disk, EIO) is ``index_error``: the marker stays (a start
  recovers the segment and rebuilds its indexes, as for any index missing), and the owner
  runs the seal again (``retry``) when the cleaner or retention next looks at the partition.
- Files. The index files are written under names of this seal's own and fsynced, no lock
  held; ``cancel`` waits only for the renames and the marker's removal under way (metadata
  operations, of the kind the event loop makes itself at each roll), and once it has
  returned the seal renames or removes nothing by name (its fsync goes on, through its own
  descriptor): deleting, cutting or letting go of a segment cancels its seal first. A clean
  close waits for it (``Log.close``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterable

from .disk import LogDirFailure, write_synced
from .segment import LogSegment, segment_name

log = logging.getLogger(__name__)

UNSEALED_SUFFIX = ".unsealed"
# How long a clean close waits for the seals under way before it leaves the log to the next
# start's recovery (read at each wait: a test may shorten it). Only a close: giving up there
# costs a scan at the next start, never the directory.
SEAL_WAIT_S = 60.0
# Names of the seals' temporary files: never one another's, a cancelled seal still writing
# beside the seal of the same segment reopened (a truncation); ".tmp" last, so that opening
# a log removes any left over.
_TOKENS = itertools.count()


def marker_path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, segment_name(base_offset) + UNSEALED_SUFFIX)


class Seal:
    """The seal of ``segment`` (no longer appended to), whose marker file ``marker`` exists;
    ``run`` it once, in a worker thread or in place (again after ``rearm``, when its index
    files failed)."""

    def __init__(self, segment: LogSegment, marker: str, fd: int) -> None:
        self.segment = segment
        self.marker = marker
        self._fd = fd  # the segment opened anew (see the module's text), closed by run
        self.error: LogDirFailure | None = None
        self.index_error: OSError | None = None  # the last write of the files failed
        self.unmarked = False  # the marker's removal is durable: the segment is sealed
        self._synced = threading.Event()  # the fsync ended (well or not)
        self._done = threading.Event()  # run ended
        # Held while files are renamed or removed by name, so that cancel never lands
        # half-way; never while data is written or fsynced.
        self._files = threading.Lock()
        self._cancelled = False
        self._tmp = f".s{os.getpid()}-{next(_TOKENS)}"

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def synced(self) -> bool:
        """Its fsync succeeded: the segment's bytes are on disk."""
        return self._synced.is_set() and self.error is None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def needs_retry(self) -> bool:
        """Done, its fsync good, its files not: ``rearm`` and ``run`` it again."""
        return self._done.is_set() and self.error is None and not self.unmarked and \
            self.index_error is not None and not self._cancelled

    def rearm(self) -> None:
        """Before running a seal that ``needs_retry`` again (by the thread owning the log)."""
        assert self.needs_retry
        self._done.clear()

    def run(self) -> None:
        """The fsync (once), then the index files and the marker's removal. Never raises: a
        failed fsync is ``error``; a failed write of the files is ``index_error``."""
        try:
            if not self._synced.is_set():
                self._fsync()
            if self.error is None and not self._cancelled:
                self._write_files()
        finally:
            self._done.set()

    def _fsync(self) -> None:
        disk = self.segment._disk
        try:
            disk.fdatasync(self._fd)
        except OSError as exc:
            self.error = LogDirFailure(f"{self.segment.path}: fsync failed: {exc}")
        finally:
            with contextlib.suppress(OSError):
                disk.close(self._fd)
            self._synced.set()

    def _write_files(self) -> None:
        """Each index file written to a temporary file of its own and fsynced, then (under
        the lock, unless cancelled) renamed into place and the marker removed, then the
        directory fsynced: the renames and the removal durable together, after the data."""
        segment, disk = self.segment, self.segment._disk
        files = [(index.path, index.encoded())  # None: no file (one left behind goes)
                 for index in (segment.offset_index, segment.time_index, segment.txn_index)]
        written: dict[str, str] = {}  # final path -> its temporary file
        try:
            for path, data in files:
                if data is None:
                    continue
                if self._cancelled:
                    return
                stem, ext = os.path.splitext(path)
                tmp = stem + self._tmp + ext + ".tmp"
                write_synced(disk, tmp, data, functools.partial(_fsynced, disk.fsync))
                written[path] = tmp
            with self._files:
                if self._cancelled:
                    return
                for path, data in files:
                    if data is None:
                        with contextlib.suppress(FileNotFoundError):
                            disk.unlink(path)
                    else:
                        disk.rename(written[path], path)
                        del written[path]
                with contextlib.suppress(FileNotFoundError):
                    disk.unlink(self.marker)
            _fsynced(disk.fsync_dir, os.path.dirname(self.marker))
        except _FsyncFailed as exc:
            # As the segment's own fsync: what the disk says of a failed fsync is said
            # once, so nothing written since can be trusted; the owner takes the directory
            # offline (the marker stays: a start recovers the segment).
            self.error = LogDirFailure(f"{segment.path}: an fsync of its seal failed: "
                                       f"{exc.__cause__}")
            return
        except OSError as exc:
            self.index_error = exc
            log.warning("%s: writing its index files failed (%s); tried again when the "
                        "cleaner or retention next looks at it (a start would recover the "
                        "segment meanwhile)", segment.path, exc)
            return
        finally:
            for tmp in written.values():  # this seal's own names: no one else's file
                with contextlib.suppress(OSError):
                    disk.unlink(tmp)
        self.index_error = None
        self.unmarked = True

    def cancel(self) -> None:
        """No file is renamed or removed by name from now on. Waits only for the renames
        and removal under way, if any (see the module's text)."""
        with self._files:
            self._cancelled = True

    def check(self) -> None:
        """LogDirFailure when the fsync failed."""
        if self.error is not None:
            raise LogDirFailure(str(self.error))


class _FsyncFailed(OSError):
    """An fsync of the seal's second half failed (not a write: a full disk is retried)."""


def _fsynced(fsync, target) -> None:
    try:
        fsync(target)
    except OSError as exc:
        raise _FsyncFailed(exc.errno, str(exc)) from exc


def seal_here(seal: Seal) -> None:
    """Run the seal on the calling thread (tools, tests: no event loop to spare)."""
    seal.run()
    seal.check()


def wait_synced(seals: Iterable[Seal]) -> None:
    """Return once every seal's fsync succeeded: LogDirFailure when one failed.

    No bound, as the flush's own fsync has none (nor has Kafka's): a seal may wait its turn
    behind others, then write back a whole segment behind the rest of the disk's work, and a
    bound that fired there would take a healthy, busy directory offline; a seal whose fsync
    hangs is a disk that hangs, which would hold the flush's own fsync as well."""
    for seal in seals:
        seal._synced.wait()
        seal.check()


def wait_done(seals: Iterable[Seal]) -> None:
    """For a clean close: every seal ended, its index files written or given up. OSError
    (ETIMEDOUT) when they took more than SEAL_WAIT_S in all, queued time included: the close
    then leaves the log to the next start's recovery (the markers stay), which costs a scan
    and never the directory; LogDirFailure when a fsync failed."""
    deadline = time.monotonic() + SEAL_WAIT_S
    for seal in seals:
        if not seal._done.wait(max(0.0, deadline - time.monotonic())):
            raise OSError(errno.ETIMEDOUT, f"{seal.segment.path}: its seal did not end "
                                           f"within {SEAL_WAIT_S} s")
        seal.check()
