"""The server's side of one SASL exchange, per mechanism: ``step(token)`` takes what the client
sent and gives what to send back, until ``done``; AuthenticationFailed ends it.

| mechanism | step | client sends | server answers | fails when |
|---|---|---|---|---|
| PLAIN | 1 | authzid NUL user NUL password | nothing (done) | (a) |
| SCRAM-SHA-* | 1 | client-first n,,n=user,r=cnonce | server-first r=cnonce+snonce,s=,i= | (b) |
| SCRAM-SHA-* | 2 | client-final c=biws,r=nonce,p=proof | server-final v=signature (done) | (c) |
| any | later | anything | - | always (the exchange is over) |

(a) malformed, an authzid that is not the user, an unknown user, a wrong password;
(b) malformed, channel binding or token authentication asked, an unknown user;
(c) malformed, a nonce that is not the server's, a proof that does not match.

PLAIN checks a password against the listener's static users when its JAAS configuration
names some (Kafka's ``user_<name>="<password>"``), else against the user's SCRAM credential
(SCRAM-SHA-512 first, else SCRAM-SHA-256): one user list for every mechanism, no password kept.
Every comparison of secrets is ``secrets.compare_digest``.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from . import scram
from .credentials import ScramCredentials

PLAIN = "PLAIN"
SUPPORTED_MECHANISMS = (PLAIN, *scram.MECHANISMS)


class AuthenticationFailed(Exception):
    """The client did not prove who it is. ``str()`` is what the client is told (Kafka's
    words); ``reason`` is for the broker's log only."""

    def __init__(self, told: str, reason: str) -> None:
        super().__init__(told)
        self.reason = reason


def _invalid(mechanism: str, reason: str) -> AuthenticationFailed:
    return AuthenticationFailed(f"Authentication failed during authentication due to invalid "
                                f"credentials with SASL mechanism {mechanism}", reason)


class SaslServer:
    mechanism = ""
    done = False
    username = ""

    def step(self, token: bytes) -> bytes:
        raise NotImplementedError


class PlainServer(SaslServer):
    mechanism = PLAIN

    def __init__(self, credentials: ScramCredentials,
                 static_users: Mapping[str, str] | None) -> None:
        self.credentials = credentials
        self.static_users = static_users

    def step(self, token: bytes) -> bytes:
        if self.done:
            raise _invalid(PLAIN, "a token after the exchange ended")
        self.done = True
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise _invalid(PLAIN, "not authzid NUL user NUL password")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise _invalid(PLAIN, "not UTF-8") from None
        if not user or (authzid and authzid != user):
            raise _invalid(PLAIN, "an empty user or an authorization id that is not the user")
        if not self._matches(user, password.encode()):
            raise _invalid(PLAIN, f"wrong password or unknown user {user!r}")
        self.username = user
        return b""

    def _matches(self, user: str, password: bytes) -> bool:
        if self.static_users is not None:
            expected = self.static_users.get(user)
            return expected is not None and secrets.compare_digest(expected.encode(), password)
        for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
            credential = self.credentials.get(user, mechanism)
            if credential is not None:
                return scram.password_matches(mechanism, credential, password)
        return False


class ScramServer(SaslServer):
    def __init__(self, mechanism: str, credentials: ScramCredentials) -> None:
        self.mechanism = mechanism
        self.credentials = credentials
        self._first: scram.ClientFirst | None = None
        self._server_first = b""
        self._nonce = ""
        self._credential: scram.ScramCredential | None = None
        self._steps = 0

    def step(self, token: bytes) -> bytes:
        self._steps += 1
        try:
            if self._steps == 1:
                return self._client_first(token)
            if self._steps == 2 and self._first is not None and self._credential is not None:
                final = scram.verify_client_final(self.mechanism, self._credential, self._first,
                                                  self._server_first, self._nonce, token)
                self.username = self._first.username
                self.done = True
                return final
        except scram.ScramError as exc:
            raise _invalid(self.mechanism, str(exc)) from None
        raise _invalid(self.mechanism, "a token after the exchange ended")

    def _client_first(self, token: bytes) -> bytes:
        first = scram.parse_client_first(token)
        if first.extensions.get("tokenauth", "").lower() == "true":
            raise scram.ScramError("delegation token authentication is not available")
        credential = self.credentials.get(first.username, self.mechanism)
        if credential is None:
            raise scram.ScramError(f"unknown user {first.username!r}")
        self._first, self._credential = first, credential
        self._nonce = first.nonce + scram.new_nonce()
        self._server_first = scram.server_first(self._nonce, credential)
        return self._server_first


def new_server(mechanism: str, credentials: ScramCredentials,
               plain_users: Mapping[str, str] | None) -> SaslServer:
    if mechanism == PLAIN:
        return PlainServer(credentials, plain_users)
    return ScramServer(mechanism, credentials)
