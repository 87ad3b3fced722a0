"""One bounded wait for a condition, for tests that watch a cluster settle."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float, what: str,
             interval: float = 0.02) -> T:
    """The condition's first truthy value, polled every ``interval`` seconds; AssertionError
    naming ``what`` when none comes within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"not within {timeout}s: {what}")
