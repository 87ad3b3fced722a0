"""The loop every ZooKeeper follower of cluster/ runs on its own thread: a pass when a watch
wakes it, or every ``recheck_s`` anyway (a watch lost with a session is re-armed by the next
pass), until it is stopped."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator


def woken(stopped: threading.Event, wake: threading.Event, recheck_s: float,
          due: Callable[[], float | None] | None = None) -> Iterator[None]:
    """Yields once per wake-up or recheck (or sooner, once ``due()`` seconds have passed:
    a deadline the follower set itself); ends as soon as ``stopped`` is set."""
    while not stopped.is_set():
        soon = None if due is None else due()
        wake.wait(recheck_s if soon is None else min(recheck_s, soon))
        wake.clear()
        if stopped.is_set():
            return
        yield
