"""The broker-wide bound on requests read and not yet handled (sans-IO: counts and a queue).

Kafka's network threads stop reading when the queue to the request handlers is full
(``queued.max.requests``) or when the memory pool for request bytes is empty
(``queued.max.request.bytes``). In oncelog one event loop plays both parts: a connection asks
this budget before it takes a frame off the wire (for a large frame: before its buffer is
allocated), and a connection that is refused stops reading until it is offered room.

The rules, all here:

* A frame is admitted while anything is left, whatever its size (Kafka's non-strict memory
  pool): the bytes held exceed the limit by at most one frame, and a frame larger than what
  is left never waits forever. The limit is validated to be at least
  ``socket.request.max.bytes`` (Kafka's rule).
* A request's bytes count against ``queued.max.request.bytes`` from its admission until its
  handler is done with it.
* ``queued.max.requests`` counts the requests that wait for nothing but the broker: read and
  not yet taken up by a handler, on a connection that is neither waiting for a handler's
  coroutine (a long-polling Fetch) nor for its client to read its answers. Requests behind
  those wait for something else, as they would in Kafka, where the connection is muted and
  they stay in the socket: the connection reports them (``count``) only while they could be
  handled. So clients that never read their answers, or that queue requests behind a Fetch
  that waits, cannot spend the count and stop the broker from reading anyone else's
  requests; each connection bounds how many it reads ahead.
* Refused connections wait in arrival order. While any wait, room goes to them first, one
  by one (``offer``), and anyone else asking is refused and queued behind them: a connection
  that floods cannot cut in line.
"""

from __future__ import annotations

from typing import Any

_NO_LIMIT = 1 << 62


class RequestBudget:
    def __init__(self, max_requests: int, max_bytes: int) -> None:
        self.max_requests = max_requests
        self.max_bytes = max_bytes if max_bytes > 0 else 0  # 0: no limit (Kafka: <= 0)
        self.requests = 0  # read, not taken up by a handler, waiting only for the broker
        self.bytes = 0  # admitted, not yet handled
        self.refusals = 0  # frames refused for want of room (a counter for operators)
        self._waiting: dict[Any, None] = {}  # an ordered set: the order of arrival
        self._turn: Any = None  # the waiter being offered room

    def has_room(self) -> bool:
        return self.requests < self.max_requests and (
            not self.max_bytes or self.bytes < self.max_bytes)

    def admit(self, who: Any, size: int) -> bool:
        """Take on a frame of ``size`` bytes for ``who``, or queue ``who`` and say no. (The
        frame is counted by ``count`` once its connection says it waits for the broker.)"""
        if (self._waiting and who is not self._turn) or self.requests >= self.max_requests \
                or (self.max_bytes and self.bytes >= self.max_bytes):  # has_room, inlined
            if who not in self._waiting:
                self._waiting[who] = None
            self.refusals += 1
            return False
        self.bytes += size
        return True

    def room(self, who: Any) -> tuple[int, int]:
        """(requests, bytes) ``who`` may take on without asking frame by frame: what is
        left, strictly; nothing while others wait first. (Then ``take`` the bytes used.)"""
        if self._waiting and who is not self._turn:
            return 0, 0
        return (max(0, self.max_requests - self.requests),
                max(0, self.max_bytes - self.bytes) if self.max_bytes else _NO_LIMIT)

    def take(self, size: int) -> None:
        """Bytes taken on within ``room``."""
        self.bytes += size

    def count(self, change: int) -> None:
        """A connection's requests that wait only for the broker grew (or shrank) by
        ``change``."""
        self.requests += change

    def finished(self, size: int) -> None:
        """Bytes of requests handled (or dropped with their connection)."""
        self.bytes -= size

    def should_offer(self) -> bool:
        return bool(self._waiting) and self.has_room()

    def offer(self) -> Any:
        """The first waiter, now allowed to take room ahead of the others; None when no one
        waits or there is no room. Each call ends the turn of the one before."""
        self._turn = None
        if not self.should_offer():
            return None
        who = next(iter(self._waiting))
        del self._waiting[who]
        self._turn = who
        return who

    def forget(self, who: Any) -> None:
        """``who`` is gone (its connection closed)."""
        self._waiting.pop(who, None)
        if self._turn is who:
            self._turn = None

    def is_waiting(self, who: Any) -> bool:
        return who in self._waiting

    @property
    def waiting(self) -> int:
        return len(self._waiting)
