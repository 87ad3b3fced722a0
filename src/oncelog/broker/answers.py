"""What a request handler may return besides an answer: the connection acts on these.

* ``CLOSE_CONNECTION``: close the connection (after the answers before it are written);
* ``Throttled``: an answer, then the connection is muted for a quota's throttle time;
* ``LaterAnswer``: the request's work is done (a produce appended its batches), only its
  answer waits (for the fsync that makes them durable). The connection goes on handling the
  requests behind it, so one fsync can cover the batches of several pipelined requests
  (group commit), and writes their answers strictly in order, each once it is ready.

A handler that returns a plain coroutine is different: its work itself waits (a long-polling
Fetch), and the requests behind it wait for it.

LaterAnswer is callbacks, not a task: the durable produce is the path whose latency is an
fsync plus this, and a task with asyncio.wait costs several turns of the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

CLOSE_CONNECTION = object()


class Throttled:
    """An answer (any of the above but a coroutine) whose client is over a quota: the
    connection sends it, then is muted for ``ms`` (broker/client_quotas.py)."""

    __slots__ = ("answer", "ms")

    def __init__(self, answer: object, ms: int) -> None:
        self.answer = answer
        self.ms = ms


class LaterAnswer:
    """The answer ``build()`` gives once every future in ``waits`` is done (failed or not:
    ``build`` looks at them); CLOSE_CONNECTION if ``build`` fails."""

    __slots__ = ("_build", "_left", "_on_ready", "answer", "ready")

    def __init__(self, waits: Iterable[asyncio.Future], build: Callable[[], bytes]) -> None:
        self._build = build
        self._on_ready: Callable[[], None] | None = None
        self.answer: object = None
        self.ready = False
        waits = list(waits)
        self._left = len(waits)
        for future in waits:  # a done future's callback runs later too, never right here
            future.add_done_callback(self._one_done)
        if not waits:
            self._finish()

    def on_ready(self, callback: Callable[[], None]) -> None:
        self._on_ready = callback

    def _one_done(self, _: asyncio.Future) -> None:
        self._left -= 1
        if self._left == 0:
            self._finish()

    def _finish(self) -> None:
        try:
            self.answer = self._build()
        except Exception:
            log.exception("building an answer failed; closing the connection")
            self.answer = CLOSE_CONNECTION
        self.ready = True
        if self._on_ready is not None:
            self._on_ready()
