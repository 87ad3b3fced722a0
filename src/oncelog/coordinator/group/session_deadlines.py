"""The classic members' session deadlines, all on one event-loop timer.

A timer of the event loop for each member cost about 500 bytes of Python objects under uvloop
(its TimerHandle, the libuv timer's wrapper, the bound method and arguments), plus the libuv
timer itself, for every member of every group (issue 26: a one-member group held 2,254
bytes). Here a member's deadline is one small object in a heap, and the coordinator has one
loop timer, set for the earliest of them.

The contract is the loop's: ``call_at(when, group, member)`` returns a handle with ``when()``
and ``cancel()``; ``expired(group, member)`` runs once ``when`` has passed (in deadline order,
each on its own: one that raises is logged and the others still run), never after
``cancel()``, also not when an earlier expiry of the same turn cancelled it. Cancelled
deadlines leave the heap when they reach its top, or all at once when they are most of it
(as asyncio does with its own timers).

Deadlines are rounded up to whole milliseconds: uvloop's clock counts milliseconds and its
timers fire on them, so a deadline between two would find the timer fired before it, and the
timer set again for the same deadline, until the clock passes it (1,380 turns for 20
deadlines under uvloop before; 20 after).

With a ``clock`` given there is no loop timer: the caller runs what is due with
``run_due(now)`` (the group model test advances time for a member that way).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# At most this many expiries a turn of the loop: the rest (many members loaded with one
# deadline) run in its next turns, with other work between, as separate timers would.
RUN_AT_ONCE = 256


def whole_ms(when: float) -> float:
    """``when`` rounded up to a whole millisecond."""
    return math.ceil(when * 1000) / 1000


class SessionDeadline(float):
    """A deadline is its own time: a float (the heap orders deadlines as floats), with the
    group and member it ends. Its time lives inside the object rather than in a float of its
    own beside it: 24 bytes less a member whose session end a Heartbeat or a join moved past
    its deadline's (issue 26). Deadlines are compared by identity only (``is``)."""

    __slots__ = ("_owner", "group", "member")

    def __new__(cls, owner: SessionDeadlines, when: float, group: Any,
                member: Any) -> SessionDeadline:
        deadline = float.__new__(cls, when)
        deadline._owner = owner
        deadline.group = group
        deadline.member = member
        return deadline

    def when(self) -> float:
        return float(self)

    def cancel(self) -> None:
        owner = self._owner
        if owner is not None:  # not yet run or cancelled
            self._owner = self.group = self.member = None
            owner.cancelled += 1


class SessionDeadlines:
    def __init__(self, expired: Callable[[Any, Any], None],
                 clock: Callable[[], float] | None = None) -> None:
        self._expired = expired
        self._clock = clock  # None: the running loop's, with a loop timer
        self._heap: list[SessionDeadline] = []
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = 0.0  # the deadline ``_timer`` was set for
        self.cancelled = 0  # cancelled deadlines still in the heap

    def __len__(self) -> int:
        return len(self._heap) - self.cancelled

    def now(self) -> float:
        clock = self._clock
        return clock() if clock is not None else asyncio.get_running_loop().time()

    def call_at(self, when: float, group: Any, member: Any) -> SessionDeadline:
        deadline = SessionDeadline(self, whole_ms(when), group, member)
        heap = self._heap
        if self.cancelled > 64 and self.cancelled * 2 > len(heap):
            heap[:] = [d for d in heap if d._owner is not None]
            heapq.heapify(heap)
            self.cancelled = 0
        heapq.heappush(heap, deadline)
        if heap[0] is deadline and self._clock is None:
            self._arm()
        return deadline

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def run_due(self, now: float) -> None:
        """Run the deadlines due at ``now``, earliest first, at most RUN_AT_ONCE. One at a
        time, each taken from the heap just before it runs: one an earlier expiry cancelled
        is skipped, and those not run stay in the heap whatever an expiry raises."""
        heap = self._heap
        ran = 0
        while heap and ran < RUN_AT_ONCE and heap[0] <= now:
            deadline = heapq.heappop(heap)
            if deadline._owner is None:
                self.cancelled -= 1
                continue
            deadline._owner = None  # run: a cancel() from now on changes nothing
            ran += 1
            try:
                self._expired(deadline.group, deadline.member)
            except Exception:
                log.exception("a session expiry failed")

    def _arm(self) -> None:
        heap = self._heap
        while heap and heap[0]._owner is None:
            heapq.heappop(heap)
            self.cancelled -= 1
        if self._timer is not None:
            # Compared with the time it was asked for: a loop's handle may round its own.
            if heap and self._armed_for == heap[0]:
                return
            self._timer.cancel()
            self._timer = None
        if heap:
            self._armed_for = float(heap[0])
            self._timer = asyncio.get_running_loop().call_at(self._armed_for, self._run)

    def _run(self) -> None:
        self._timer = None
        try:
            self.run_due(asyncio.get_running_loop().time())
        finally:  # also when an expiry raised past run_due: the rest still run
            self._arm()
