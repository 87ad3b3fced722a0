"""KIP-368 on the client's side: a connection whose broker told a session lifetime in
SaslAuthenticate (``session_lifetime_ms`` > 0) authenticates again on the same connection
before the session ends, between its requests. Sans-IO: oncelog's blocking and asyncio
connections (client/network/) and a broker's connection to another (broker/inter_broker.py)
each ask ``decide`` before a request goes out and drive ``Reauthentication.authenticate``
(``authenticate_async``) over their own I/O.

What becomes of a request about to go out (``decide``; rows C5-C6 are what the connection
does when a re-authentication ends, C7 what the blocking one does before one begins):

| # | session | re-authentication | the request |
|---|---|---|---|
| C1 | no lifetime (0, or not told) | - | sent |
| C2 | before its re-authentication point | none running | sent |
| C3 | at or past that point | none running | one begins now; the request waits (C4) |
| C4 | any | running | waits, in order, until it ends |
| C5 | re-authenticated | ends | waiting requests sent in order (a), a new point (C1 if 0) |
| C6 | refused, or the connection lost | ends | closed; waiting requests fail, not sent |
| C7 | at or past the point, in flight | blocking conn. | their answers read, kept; then C3 (b) |

(a) even when the new point has passed too (an exchange longer than the window): a request
waits for at most one exchange to end, or it could wait for one after another. The new point
is never earlier than ``MIN_REAUTH_GAP_S`` after the exchange ended: the broker refuses a
SaslHandshake within a second of the last one (broker/sasl_reauth.py R2) and would close the
connection, so a request right after an exchange goes out (C2) rather than beginning one.
(b) each answer read within its own deadline; one that has not begun to arrive by the new
request's deadline fails the new request, not sent (its caller may retry), and leaves the
requests in flight and the connection as they were: the next request drains on.

The re-authentication point is ``lifetime * f`` after the SaslHandshake of the last exchange
went out (before the broker's clock started, so never after the broker's end), ``f`` drawn
uniformly from [0.85, 0.95] as Java's client does, so that connections opened together do not
all re-authenticate at once; ``rng`` (a ``random.Random``) may be seeded for a reproducible
point.

Why the requests wait: the broker's SaslGate closes a connection sending anything but
SaslHandshake / SaslAuthenticate during an exchange (broker/sasl_gate.py), and closes one whose
session ended at its next request other than SaslHandshake (broker/sasl_reauth.py, R3), while it
accepts a SaslHandshake even after the end (R1). Requests already in flight when one begins are
answered in order before the exchange's answers (the broker handles a connection's frames in
order), so, as Java's client (which keeps the answers arriving during the exchange for their
callers), the exchange does not wait for them; a blocking connection, which cannot read
ahead for its caller, keeps their answers for it. Re-authentication happens only when a request
is to be sent (Java's too): an idle connection re-authenticates at its next request, with a
SaslHandshake the broker accepts even after the end.

Why C7 drains rather than sending on: the broker closes a connection at any request other than
SaslHandshake that arrives after its session ended (R3), so a request must never go out past
the point with no exchange first; the blocking connection therefore reads the answers in flight
before the exchange, and reads each within the deadline its caller gave (``send_only``'s;
else the connection's timeout): a JoinGroup the coordinator holds through a rebalance is not
failed at the socket's timeout. They would arrive before the next request's answer anyway (in
order). Its caller learns of answers read so from ``has_buffered_answer`` (the socket will not
signal them). A Produce with acks=0 is never answered: it is not in flight.
"""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from . import sasl_client

WINDOW = (0.85, 0.95)  # Java's: the point is drawn uniformly between these parts of a lifetime
MIN_REAUTH_GAP_S = 1.0  # Kafka's broker: at most one re-authentication a second (R2)
_RNG = random.Random()


class Action(enum.Enum):
    SEND = "C1/C2"
    REAUTHENTICATE = "C3"
    WAIT = "C4"


def decide(now: float, due_at: float | None, running: bool) -> Action:
    """Rows C1-C4 (seconds on one monotonic clock; ``due_at`` None: no lifetime)."""
    if running:
        return Action.WAIT
    if due_at is None or now < due_at:
        return Action.SEND
    return Action.REAUTHENTICATE


class Reauthentication:
    """One connection's SASL credentials and session: when to authenticate again."""

    def __init__(self, mechanism: str, username: str, password: str,
                 rng: random.Random | None = None) -> None:
        self.mechanism, self.username, self.password = mechanism, username, password
        self.rng = rng or _RNG
        self.due_at: float | None = None  # monotonic seconds; None: never (C1)
        self.running = False
        self.count = 0  # re-authentications done on this connection

    def authenticate(self, call: Callable[..., Any], again: bool = False) -> None:
        """One exchange, each step's request sent and answered by ``call(api key, make)``;
        SaslRefused, or what ``call`` raises (the connection then closes: C6)."""
        steps = sasl_client.exchange(self.mechanism, self.username, self.password)
        self.begin()
        began = time.monotonic()
        try:
            step = next(steps)
            while True:
                step = steps.send(call(*step))
        except StopIteration as done:
            self.authenticated(began, done.value, again, time.monotonic())
        except BaseException:
            self.failed()
            raise

    async def authenticate_async(self, call: Callable[..., Awaitable[Any]],
                                 again: bool = False) -> None:
        """``authenticate`` over an asyncio connection."""
        steps = sasl_client.exchange(self.mechanism, self.username, self.password)
        self.begin()
        began = time.monotonic()
        try:
            step = next(steps)
            while True:
                step = steps.send(await call(*step))
        except StopIteration as done:
            self.authenticated(began, done.value, again, time.monotonic())
        except BaseException:
            self.failed()
            raise

    def decide(self, now: float) -> Action:
        return decide(now, self.due_at, self.running)

    def begin(self) -> None:
        """Row C3: the connection starts an exchange (also for the first authentication)."""
        self.running = True

    def authenticated(self, began: float, lifetime: int, again: bool,
                      ended: float | None = None) -> None:
        """Row C5: the exchange whose SaslHandshake went out at ``began`` is done (at
        ``ended``, ``began`` if not given); the next point no earlier than the broker's
        minimum gap after it, (a)."""
        self.running = False
        self.count += again
        self.due_at = None if lifetime <= 0 else max(
            began + lifetime / 1000 * self.rng.uniform(*WINDOW),
            (began if ended is None else ended) + MIN_REAUTH_GAP_S)

    def failed(self) -> None:
        """Row C6 (the connection closes it)."""
        self.running = False
        self.due_at = None
