"""What a client can make the broker write to its log: bounded, whatever it sends.

Two rules, each in one place:

- ``log_safe(text)``: a string a client chose (a topic name, a group or transactional id, a
  config value, an error message that quotes one) is logged at most ``LOG_SAFE_CHARS``
  characters long, with its full length noted. Ten 5,000,000-character topic names would
  otherwise add 50 MB to the log.
- ``RateLimitedLog``: a line a client can provoke again and again (a refused connection, an
  unsupported version, a Metadata request for an invalid topic name) is written at most
  ``burst`` times per ``interval_s`` for each site; the rest are counted, and one summary line
  per site says how many were left out once the interval is over. The sites are a fixed set,
  so the counts take constant memory whatever the clients do.
- ``install_log_bounds()``: behind both, every argument of every line the broker process
  writes is cut to ``LOG_ARG_MAX_CHARS`` (a safety net for a site that logs a client string
  without ``log_safe``, such as a coordinator logging a transactional id).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable

LOG_SAFE_CHARS = 200
LOG_ARG_MAX_CHARS = 2000  # the safety net's: above what the broker itself logs in one argument


def log_safe(text: object, limit: int = LOG_SAFE_CHARS) -> str:
    """``text`` (any object, as ``%s`` shows it) cut to ``limit``
    characters, its length noted when cut."""
    shown = text if isinstance(text, str) else str(text)
    if len(shown) <= limit:
        return shown
    return f"{shown[:limit]}...[{len(shown):,} chars]"


class RateLimitedLog:
    """One logger's repeated lines, written at most ``burst`` times per ``interval_s`` per
    site (a name for the kind of line), then counted and summed up."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0, burst: int = 10,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.burst = burst
        self.clock = clock
        self._lock = threading.Lock()  # the metrics thread may log too
        # site -> [start of its interval, lines written in it, lines left out in it, level]
        self._sites: dict[str, list] = {}
        _ALL.add(self)

    def log(self, level: int, site: str, msg: str, *args: object) -> None:
        now = self.clock()
        with self._lock:
            state = self._sites.get(site)
            if state is None or now - state[0] >= self.interval_s:
                if state is not None:
                    self._summary(site, state)
                state = self._sites[site] = [now, 0, 0, level]
            if state[1] >= self.burst:
                state[2] += 1
                return
            state[1] += 1
        self.logger.log(level, msg, *args)

    def flush(self) -> None:
        """The summaries of the intervals that are over (the broker calls it periodically,
        so a burst that stops is still summed up)."""
        now = self.clock()
        with self._lock:
            for site, state in list(self._sites.items()):
                if now - state[0] >= self.interval_s:
                    self._summary(site, state)
                    del self._sites[site]

    def _summary(self, site: str, state: list) -> None:
        if state[2]:
            self.logger.log(state[3], "%d more %r lines left out in the last %.0f s (at most "
                            "%d logged per %.0f s)", state[2], site,
                            self.clock() - state[0], self.burst, self.interval_s)


_ALL: weakref.WeakSet[RateLimitedLog] = weakref.WeakSet()


def flush_rate_limited() -> None:
    """Every RateLimitedLog's summaries that are due (the broker calls it every few
    seconds)."""
    for limited in list(_ALL):
        limited.flush()


class _BoundedArguments(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args:
            record.args = tuple(
                a if isinstance(a, (int, float)) or a is None
                else log_safe(a, LOG_ARG_MAX_CHARS) for a in args)
        return True


def install_log_bounds() -> None:
    """The safety net on every handler of the root logger (the broker's process)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _BoundedArguments) for f in handler.filters):
            handler.addFilter(_BoundedArguments())
