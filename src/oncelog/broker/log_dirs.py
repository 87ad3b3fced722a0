"""A log directory's health: online, or offline after a failure nothing could undo.

Kafka takes a log directory offline when a write to it fails in a way that leaves its files in
doubt (LogDirFailureChannel): its partitions answer KAFKA_STORAGE_ERROR, the rest of the broker
keeps serving, and the next start recovers the directory from what is on disk. oncelog does the
same, but only where it must: a failed append that could be cut back leaves the directory
online (see log/segment.py); an fsync that failed, or a cut that failed, takes it offline.
"""

from __future__ import annotations

import concurrent.futures
import errno
import logging
import os
import time
from collections.abc import Callable

from ..log.disk import out_of_descriptors

log = logging.getLogger(__name__)


class LogDirOffline(OSError):
    """Raised for any use of a partition whose log directory is offline."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(errno.EIO, f"log directory {path} is offline ({reason}); restart the "
                                    "broker to recover it")


SEAL_WORKERS = 4


class LogDir:
    def __init__(self, path: str) -> None:
        self.path = path
        self.offline_reason: str | None = None
        self._on_offline: list[Callable[[], None]] = []
        self._seal_pool: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def seal_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """Where the seals of this directory's rolled segments run (log/sealing.py): a pool
        of the directory's own, never the loop's default executor (a flush round there waits
        for a seal, and must not wait for one queued behind it) nor one shared with another
        directory (a hung disk would hold a healthy one's acknowledgements). Kafka flushes
        after a roll in background threads likewise."""
        if self._seal_pool is None:
            self._seal_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=SEAL_WORKERS,
                thread_name_prefix=f"seal-{os.path.basename(self.path.rstrip(os.sep))}")
        return self._seal_pool

    @property
    def offline(self) -> bool:
        return self.offline_reason is not None

    def when_offline(self, callback: Callable[[], None]) -> None:
        self._on_offline.append(callback)

    def fail(self, cause: BaseException) -> LogDirOffline:
        """Take the directory offline (once); returns the error to raise to the caller."""
        if self.offline_reason is None:
            self.offline_reason = str(cause)
            log.error("log directory %s is now OFFLINE: %s. Its partitions answer "
                      "KAFKA_STORAGE_ERROR until the broker is restarted, which recovers them "
                      "from what is on disk; the rest of the broker keeps serving.", self.path,
                      cause)
            for callback in self._on_offline:
                try:
                    callback()
                except Exception:
                    log.exception("closing partitions of the failed directory %s", self.path)
        return self.error()

    def error(self) -> LogDirOffline:
        return LogDirOffline(self.path, self.offline_reason or "?")


_START_ATTEMPTS = 4


def listdir_at_start(path: str) -> list[str]:
    """os.listdir for the start's scan of a log directory. Out of descriptors (EMFILE,
    ENFILE: the system's may come back) is no failure of the directory, which would start
    the broker without its topics: retried a few times (0.35 s in all), then raised for the
    start to fail."""
    for attempt in range(_START_ATTEMPTS):
        try:
            return os.listdir(path)
        except OSError as exc:
            if not out_of_descriptors(exc) or attempt + 1 == _START_ATTEMPTS:
                raise
            log.warning("%s: out of file descriptors scanning it at start (%s); retrying",
                        path, exc)
            time.sleep(0.05 * 2 ** attempt)
    raise AssertionError("unreachable")


def volume_bytes(path: str) -> tuple[int, int]:
    """(total, usable) bytes of the volume holding ``path``, as DescribeLogDirs v4 reports
    them; (-1, -1) when the volume cannot be asked."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return -1, -1
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize


def directory_bytes(path: str) -> int:
    """The size of a partition directory's segments (its ``.log`` files), as Kafka reports a
    replica's size; 0 for a directory that is not there."""
    try:
        names = os.listdir(path)
    except OSError:
        return 0
    total = 0
    for name in names:
        if name.endswith(".log"):
            try:
                total += os.stat(os.path.join(path, name)).st_size
            except OSError:
                pass  # deleted by retention meanwhile
    return total


# A file name holds at most 255 bytes (topic names are ASCII: bytes are characters).
FILE_NAME_MAX = 255


def suffixed_dir_name(partition_dir_name: str, unique: str, suffix: str) -> str:
    """"<topic>-<p>.<unique><suffix>" (a partition directory being deleted, moved or set
    aside), the topic cut short so that it fits in a file name, as Kafka names its
    ``-delete`` and ``-stray`` directories: the partition, the id and the suffix are what
    is read back from it."""
    topic, _, index = partition_dir_name.rpartition("-")
    tail = f"-{index}.{unique}{suffix}"
    return topic[:FILE_NAME_MAX - len(tail)] + tail
