"""A rolled segment's seal: its fsync, then its index files, off the thread that rolled.

A 1 GiB segment rolled at full speed is still dirty in the page cache: its fsync took 263-292
ms, on the event loop, at every roll (docs/benchmarks.md, "The event loop at a segment
roll"). Kafka rolls without waiting for the old segment's fsync (a scheduler thread flushes
it); so does ``Log.roll``, and this module keeps every promise while a seal runs:

- Recovery. ``Log.roll`` creates ``<base>.unsealed`` beside the old segment before the new
  segment's directory fsync, which makes both durable; the seal removes it once the segment
  and its indexes are on disk. A start recovers (scans, cuts at the first bad batch) every
  segment with one, and a segment cut short drops every segment after it (``Log._open``).
  The removal is not fsynced (a marker that comes back costs a scan), so a segment that
  still has a marker is never compacted (``cleaning.plan`` stops before it): the cleaner's
  swap fsyncs the directory, making the removal durable before compaction can leave gaps a
  scan of a marked segment would take for damage.
- Acknowledgements. A flush covers the segments still sealing by waiting for their fsync
  (``Log.flush``, the partition's flush rounds), never by an fsync of its own: the seal's
  fsync may be the one told of a failed write-back, and on Linux an error is told once per
  open file. The seal opens the file anew for the same reason (a ``dup`` would share the
  segment's open file, and with it the one report).
- Failure. A failed fsync is ``error`` (LogDirFailure): its owner takes the directory
  offline, and every flush waiting on it fails.
- Files. Once ``cancel`` has returned the seal writes or removes no file by name (its fsync
  goes on, through its own descriptor): deleting, cutting or letting go of a segment
  cancels its seal first. A clean close waits for it (``Log.close``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable

from .disk import LogDirFailure
from .segment import LogSegment, segment_name

log = logging.getLogger(__name__)

UNSEALED_SUFFIX = ".unsealed"
# How long a close, a flush or a cancel waits for a seal before it takes the disk for failed
# (read at each wait: a test may shorten it).
SEAL_WAIT_S = 60.0


def marker_path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, segment_name(base_offset) + UNSEALED_SUFFIX)


class Seal:
    """The seal of ``segment`` (no longer appended to), whose marker file ``marker`` exists;
    ``run`` it once, in a worker thread or in place."""

    def __init__(self, segment: LogSegment, marker: str, fd: int) -> None:
        self.segment = segment
        self.marker = marker
        self._fd = fd  # the segment opened anew (see the module's text), closed by run
        self.error: LogDirFailure | None = None
        self.unmarked = False  # the marker is gone: the segment is sealed for good
        self._synced = threading.Event()  # the fsync ended (well or not)
        self._done = threading.Event()  # run ended
        # Held while files are written by name, so that cancel never lands half-way.
        self._files = threading.Lock()
        self._cancelled = False

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def run(self) -> None:
        """fsync, then the index files (each written atomically), then the marker removed.
        Never raises: a failed fsync is ``error``; a failed index write leaves the marker
        (the next start recovers the segment, as it would rebuild a missing index, and the
        cleaner leaves it alone until then)."""
        segment, disk = self.segment, self.segment._disk
        try:
            try:
                disk.fdatasync(self._fd)
            except OSError as exc:
                self.error = LogDirFailure(f"{segment.path}: fsync failed: {exc}")
            finally:
                with contextlib.suppress(OSError):
                    disk.close(self._fd)
                self._synced.set()
            if self.error is not None:
                return
            with self._files:
                if self._cancelled:
                    return
                try:
                    segment.write_indexes()
                    with contextlib.suppress(FileNotFoundError):
                        disk.unlink(self.marker)
                except OSError as exc:
                    log.warning("%s: writing its indexes failed (%s); the next start recovers "
                                "the segment", segment.path, exc)
                    return
                self.unmarked = True
        finally:
            self._done.set()

    def cancel(self) -> None:
        """No file is written or removed by name from now on. LogDirFailure when the index
        writes under way did not end within SEAL_WAIT_S (cancelled all the same)."""
        held = self._files.acquire(timeout=SEAL_WAIT_S)
        self._cancelled = True
        if not held:
            raise LogDirFailure(f"{self.segment.path}: its index files were still being "
                                f"written after {SEAL_WAIT_S} s")
        self._files.release()

    def check(self) -> None:
        """LogDirFailure when the fsync failed."""
        if self.error is not None:
            raise LogDirFailure(str(self.error))


def seal_here(seal: Seal) -> None:
    """Run the seal on the calling thread (tools, tests: no event loop to spare)."""
    seal.run()
    seal.check()


def wait_synced(seals: Iterable[Seal]) -> None:
    """Return once every seal's fsync succeeded: LogDirFailure when one failed, or when they
    took more than SEAL_WAIT_S in all."""
    _wait(seals, "_synced")


def wait_done(seals: Iterable[Seal]) -> None:
    """``wait_synced``, and the index files written too (or given up)."""
    _wait(seals, "_done")


def _wait(seals: Iterable[Seal], event: str) -> None:
    deadline = time.monotonic() + SEAL_WAIT_S
    for seal in seals:
        if not getattr(seal, event).wait(max(0.0, deadline - time.monotonic())):
            raise LogDirFailure(f"{seal.segment.path}: its seal did not end within "
                                f"{SEAL_WAIT_S} s")
        seal.check()
