"""The client's side of SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) over Kafka's SaslHandshake
v1 and SaslAuthenticate, sans-IO: ``exchange`` yields each request to send and is sent its
answer. oncelog's clients (client/network/sasl.py) and a broker reaching another broker
(broker/inter_broker_connect.py) drive the same steps, each over its own I/O.

The SCRAM math is scram.py's, the broker's own. The server's last message is checked too: a
broker that does not know the password's ServerKey is refused.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Generator
from typing import Any

from kio.schema.errors import ErrorCode

from ..protocol import api_versions as apis
from ..protocol.schema import build
from . import scram

# One step: (api key, build(request module, version) -> request) sent; its answer comes back.
Step = tuple[int, Callable[[Any, int], Any]]


class SaslRefused(Exception):
    """The exchange failed: the broker's error code, or SASL_AUTHENTICATION_FAILED."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


def exchange(mechanism: str, username: str, password_text: str
             ) -> Generator[Step, Any, int]:
    """Yields the requests to send, receives their answers; SaslRefused when the broker
    refuses or does not prove it knows the credential. Returns the session's lifetime in ms
    the broker told (KIP-368; 0: it never ends, see sasl_reauth_client.py)."""
    answer = yield apis.SASL_HANDSHAKE, lambda mod, _v: build(mod.SaslHandshakeRequest,
                                                              mechanism=mechanism)
    _check(answer, f"the broker does not offer {mechanism} "
                   f"(it offers {', '.join(getattr(answer, 'mechanisms', ()) or ())})")
    password = password_text.encode()
    if mechanism == "PLAIN":
        token = b"\0" + username.encode() + b"\0" + password
        answer = yield _authenticate(token)
        _check(answer, "PLAIN")
        return lifetime_ms(answer)
    nonce = scram.new_nonce()
    first = scram.client_first(username, nonce)
    answer = yield _authenticate(first)
    _check(answer, mechanism)
    try:
        server = scram.parse_server_first(bytes(answer.auth_bytes), nonce)
        final, signature = scram.client_final(mechanism, password,
                                              first.decode()[len("n,,"):], server)
    except scram.ScramError as exc:
        raise SaslRefused(ErrorCode.sasl_authentication_failed, f"{mechanism}: {exc}") \
            from None
    answer = yield _authenticate(final)
    _check(answer, mechanism)
    try:
        scram.check_server_final(bytes(answer.auth_bytes), signature)
    except scram.ScramError as exc:
        raise SaslRefused(ErrorCode.sasl_authentication_failed, f"{mechanism}: {exc}") \
            from None
    return lifetime_ms(answer)


def lifetime_ms(answer: Any) -> int:
    """The session lifetime a SaslAuthenticate answer tells (0 in v0, which has no field)."""
    lifetime = getattr(answer, "session_lifetime", None)
    if isinstance(lifetime, datetime.timedelta):
        return max(0, round(lifetime.total_seconds() * 1000))
    return max(0, int(lifetime or 0))


def _authenticate(token: bytes) -> Step:
    return apis.SASL_AUTHENTICATE, lambda mod, _v: build(mod.SaslAuthenticateRequest,
                                                         auth_bytes=token)


def _check(answer: Any, what: str) -> None:
    if answer.error_code != ErrorCode.none:
        message = getattr(answer, "error_message", None) or what
        raise SaslRefused(answer.error_code, message)
