"""KIP-368: a SASL session ends ``connections.max.reauth.ms`` after it was authenticated
(per listener and mechanism, see listener_security.py); the client, told the lifetime in
SaslAuthenticate v1+, authenticates again on the same connection before then, or loses the
connection at its next request. Kafka's SocketServer and KafkaChannel decide the same.

A frame on an authenticated connection whose session has a lifetime (``decide``):

| # | frame | session | outcome |
|---|---|---|---|
| R1 | SaslHandshake | no re-authentication began in the last second | re-authenticate (a) |
| R2 | SaslHandshake | one began less than 1 s ago, not over | handled: ILLEGAL_SASL_STATE |
| R3 | any other, or R2's | over | closed, logged |
| R4 | any other | not over | handled |

(a) this frame and the next go to a new SaslGate until it is done (R5-R8); as a first
authentication, but:

| # | exchange | outcome |
|---|---|---|
| R5 | SaslHandshake, another mechanism | NONE; then SASL_AUTHENTICATION_FAILED, closed |
| R6 | done, naming another principal | SASL_AUTHENTICATION_FAILED, closed (b) |
| R7 | done, the same principal | NONE with the new lifetime; the session's end moves |
| R8 | failed | as a first authentication fails: delayed answer, closed |

(b) "Cannot change principals during re-authentication", Kafka's words.

A mechanism without a lifetime (0, the default) has none of this: its frames go straight to
the broker once authenticated, and a SaslHandshake there is answered ILLEGAL_SASL_STATE.
Re-authentication may begin after the session ended (R1 is asked first), as in Kafka.
"""

from __future__ import annotations

import enum
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..protocol import api_versions as apis
from ..security.principal import KafkaPrincipal
from ..security.sasl_reauth_client import MIN_REAUTH_GAP_S
from .answers import CLOSE_CONNECTION
from .log_limits import RateLimitedLog

log = logging.getLogger(__name__)
_expired = RateLimitedLog(log)
_API_KEY = struct.Struct(">h")
# Kafka's: re-authentication is costly, at most once a second; oncelog's clients' points
# keep to it (sasl_reauth_client.py C5 (a))
MIN_REAUTH_INTERVAL_S = MIN_REAUTH_GAP_S


class Step(enum.Enum):
    REAUTHENTICATE = "R1"
    SERVE = "R2/R4"
    CLOSE = "R3"


def decide(api_key: int | None, now: float, ends_at: float,
           last_start: float | None) -> Step:
    """Rows R1-R4 (times in seconds on one monotonic clock)."""
    if api_key == apis.SASL_HANDSHAKE and (
            last_start is None or now - last_start >= MIN_REAUTH_INTERVAL_S):
        return Step.REAUTHENTICATE
    return Step.CLOSE if now > ends_at else Step.SERVE


@dataclass
class SaslSession:
    """What an authenticated SASL connection keeps of its session for re-authentication."""

    principal: KafkaPrincipal
    mechanism: str
    ends_at: float  # time.monotonic() seconds
    last_start: float | None = None  # when the last re-authentication began


class SessionExpiry:
    """The connection's frame handler once authenticated with a session lifetime: rows
    R1-R4, then the broker's handler. ``begin(session)`` gives the SaslGate's handler for a
    re-authentication (passed in: the gate builds this object, so neither imports the
    other)."""

    def __init__(self, conn, session: SaslSession, listener: str,
                 begin: Callable[[SaslSession], Callable]) -> None:
        self.conn = conn
        self.session = session
        self.listener = listener
        self.begin = begin

    def handle(self, frame, peer: str, session):
        now = time.monotonic()
        api_key = _API_KEY.unpack_from(frame, 0)[0] if len(frame) >= _API_KEY.size else None
        step = decide(api_key, now, self.session.ends_at, self.session.last_start)
        if step is Step.REAUTHENTICATE:
            self.session.last_start = now
            gate = self.begin(self.session)
            self.conn.handle = gate
            return gate(frame, peer, session)
        if step is Step.CLOSE:
            _expired.log(logging.INFO, f"session expired on {self.listener}",
                         "%s: listener %s: the session of %s ended %.0f ms ago and was not "
                         "re-authenticated (connections.max.reauth.ms); closing the "
                         "connection", peer, self.listener, self.session.principal,
                         (now - self.session.ends_at) * 1000)
            return CLOSE_CONNECTION
        return self.conn.broker.handle_frame(frame, peer, session)
