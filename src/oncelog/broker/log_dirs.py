"""A log directory's health: online, or offline after a failure nothing could undo.

Kafka takes a log directory offline when a write to it fails in a way that leaves its files in
doubt (LogDirFailureChannel): its partitions answer KAFKA_STORAGE_ERROR, the rest of the broker
keeps serving, and the next start recovers the directory from what is on disk. oncelog does the
same, but only where it must: a failed append that could be cut back leaves the directory
online (see log/segment.py); an fsync that failed, or a cut that failed, takes it offline.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


class LogDirOffline(OSError):
    """Raised for any use of a partition whose log directory is offline."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(errno.EIO, f"log directory {path} is offline ({reason}); restart the "
                                    "broker to recover it")


class LogDir:
    def __init__(self, path: str) -> None:
        self.path = path
        self.offline_reason: str | None = None
        self._on_offline: list[Callable[[], None]] = []

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
