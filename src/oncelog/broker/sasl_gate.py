"""A SASL listener's connection before it is authenticated: the gate every frame passes
until the client has proven who it is (Kafka's SaslServerAuthenticator).

| state | frame | answer | next |
|---|---|---|---|
| handshake | ApiVersions | answered as always | handshake |
| handshake | SaslHandshake, mechanism enabled | NONE, the enabled mechanisms | exchange |
| handshake | SaslHandshake, mechanism not enabled | UNSUPPORTED_SASL_MECHANISM (a) | closed |
| handshake | SaslAuthenticate | ILLEGAL_SASL_STATE | closed |
| exchange | SaslAuthenticate, the exchange goes on | NONE, the server's token | exchange |
| exchange | SaslAuthenticate, the exchange is done | NONE, the server's last token | done |
| exchange | SaslAuthenticate, the client failed | SASL_AUTHENTICATION_FAILED (b) | closed |
| exchange | SaslHandshake | ILLEGAL_SASL_STATE | closed |
| any | any other request, or a malformed one | none, a log line | closed at once |

(a) with the enabled mechanisms; (b) with Kafka's message. After SaslHandshake v0 the
exchange's tokens come bare, without Kafka's request framing (each frame one token, each
answer one token), and a failure closes without an answer.

Once authenticated, a mechanism with a session lifetime (KIP-368's connections.max.reauth.ms)
has its SaslAuthenticate answer say it, and the connection's frames pass sasl_reauth.py's
SessionExpiry, which hands a re-authentication to a new gate (``previous``: the session).

Each refusal is logged, rate-limited per listener (sites named by it, a fixed set): wrong
passwords flooding one listener are counted and summed up, and hide no other listener's.

"Delayed": the answer is written ``connection.failed.authentication.delay.ms`` after the
failure, then the connection closes; nothing more is read from it meanwhile. Once
authenticated the connection's session is ``User:<name>`` on its listener and every frame goes
to the broker as on any other listener.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import struct
import time

from kio.schema.errors import ErrorCode

from ..metadata.store import MetadataUnavailable
from ..protocol import api_versions as apis
from ..protocol.messages import ProtocolError, UnsupportedVersion, decode_request, encode_response
from ..protocol.schema import build, response_module
from ..security.principal import KafkaPrincipal
from ..security.sasl_server import AuthenticationFailed, SaslServer, new_server
from .answers import CLOSE_CONNECTION
from .log_limits import RateLimitedLog, log_safe
from .sasl_reauth import SaslSession, SessionExpiry

log = logging.getLogger(__name__)
_failures = RateLimitedLog(log)
_HEADER = struct.Struct(">hh")
_SIZE = struct.Struct(">i")
_ALLOWED = (apis.API_VERSIONS_KEY, apis.SASL_HANDSHAKE, apis.SASL_AUTHENTICATE)


class SaslGate:
    def __init__(self, conn, listener, credentials, previous: SaslSession | None = None) -> None:
        self.conn = conn  # the broker's Connection (server.py)
        self.listener = listener  # its ListenerSecurity
        self.credentials = credentials
        self.previous = previous  # re-authenticating this session (sasl_reauth.py)
        self.server: SaslServer | None = None
        self.raw = False  # SaslHandshake v0: tokens without Kafka's request framing
        self.bad_mechanism: str | None = None  # row R5: refused at the SaslAuthenticate

    def handle(self, frame, peer: str, session):
        """What Connection._handle_queued does with a frame before authentication."""
        try:
            return self._handle(frame, peer, session)
        except MetadataUnavailable as exc:  # ZooKeeper away: nobody gets in meanwhile
            _failures.log(logging.WARNING, "credentials unavailable",
                          "%s: listener %s: %s; closing the connection", peer,
                          self.listener.name, exc)
        except Exception:
            log.exception("%s: listener %s: the SASL exchange failed; closing the connection",
                          peer, self.listener.name)
        return CLOSE_CONNECTION

    def _handle(self, frame, peer: str, session):
        if self.raw:
            return self._raw_token(bytes(frame), peer)
        if len(frame) < _HEADER.size:
            return self._refuse(peer, "a frame shorter than a request header")
        api_key, _ = _HEADER.unpack_from(frame, 0)
        if api_key not in _ALLOWED:
            return self._refuse(peer, f"api key {api_key} before authentication")
        if api_key == apis.API_VERSIONS_KEY:
            return self.conn.broker.handle_frame(frame, peer, session)
        try:
            request = decode_request(frame, peer, session)
        except (ProtocolError, UnsupportedVersion) as exc:
            return self._refuse(peer, f"{log_safe(exc)}")
        if api_key == apis.SASL_HANDSHAKE:
            return self._handshake(request, peer)
        return self._authenticate(request, peer)

    def _refuse(self, peer: str, why: str):
        _failures.log(logging.WARNING, f"unauthenticated request on {self.listener.name}",
                      "%s: listener %s: %s; closing the connection", peer, self.listener.name,
                      why)
        return CLOSE_CONNECTION

    def _handshake(self, request, peer: str):
        mod = response_module(apis.SASL_HANDSHAKE, request.api_version)
        enabled = self.listener.mechanisms
        mechanism = request.body.mechanism
        if self.server is not None:
            return self._fail(request, build(mod.SaslHandshakeResponse,
                                             error_code=ErrorCode.illegal_sasl_state,
                                             mechanisms=enabled),
                              peer, "a second SaslHandshake")
        if mechanism not in enabled:
            return self._fail(request, build(mod.SaslHandshakeResponse,
                                             error_code=ErrorCode.unsupported_sasl_mechanism,
                                             mechanisms=enabled),
                              peer, f"mechanism {log_safe(mechanism)!r} is not enabled")
        self.server = new_server(mechanism, self.credentials, self.listener.plain_users)
        if self.previous is not None and mechanism != self.previous.mechanism:
            self.bad_mechanism = (f"SASL mechanism '{mechanism}' requested by client is not "
                                  f"supported for re-authentication of mechanism "
                                  f"'{self.previous.mechanism}'")
        self.raw = request.api_version == 0
        return encode_response(apis.SASL_HANDSHAKE, request.api_version, request.correlation_id,
                               build(mod.SaslHandshakeResponse, error_code=ErrorCode.none,
                                     mechanisms=enabled))

    def _authenticate(self, request, peer: str):
        mod = response_module(apis.SASL_AUTHENTICATE, request.api_version)

        def answer(error: ErrorCode, message: str | None, token: bytes, lifetime_ms: int = 0):
            return build(mod.SaslAuthenticateResponse, error_code=error, error_message=message,
                         auth_bytes=token,
                         session_lifetime=datetime.timedelta(milliseconds=lifetime_ms))

        if self.server is None:
            return self._fail(request, answer(ErrorCode.illegal_sasl_state,
                                              "SaslAuthenticate before SaslHandshake", b""),
                              peer, "SaslAuthenticate before SaslHandshake")
        try:
            token = self._step(bytes(request.body.auth_bytes))
            lifetime_ms = self._authenticated(peer) if self.server.done else 0
        except AuthenticationFailed as exc:
            return self._fail(request, answer(ErrorCode.sasl_authentication_failed, str(exc),
                                              b""), peer, exc.reason)
        return encode_response(apis.SASL_AUTHENTICATE, request.api_version,
                               request.correlation_id,
                               answer(ErrorCode.none, None, token, lifetime_ms))

    def _step(self, token: bytes) -> bytes:
        assert self.server is not None
        if self.bad_mechanism is not None:
            raise AuthenticationFailed(self.bad_mechanism, self.bad_mechanism)
        return self.server.step(token)

    def _raw_token(self, token: bytes, peer: str):
        assert self.server is not None
        try:
            reply = self._step(token)
            if self.server.done:
                self._authenticated(peer)
        except AuthenticationFailed as exc:
            return self._fail(None, None, peer, exc.reason)
        return _SIZE.pack(len(reply)) + reply

    def _authenticated(self, peer: str) -> int:
        """The exchange is done: the connection is the principal's (row R6 refuses another
        on re-authentication); the session's lifetime in ms, 0 without one."""
        server = self.server
        assert server is not None
        principal = KafkaPrincipal("User", server.username)
        previous = self.previous
        if previous is not None and principal != previous.principal:
            was = previous.principal
            raise AuthenticationFailed(
                f"Cannot change principals during re-authentication from "
                f"{was.principal_type}.{was.name}: {principal.principal_type}.{principal.name}",
                f"re-authentication as {log_safe(principal)}, not {log_safe(was)}")
        lifetime_ms = self.listener.reauth_ms.get(server.mechanism, 0)
        log.info("%s: %s as %s with %s on listener %s%s", peer,
                 "authenticated" if previous is None else "re-authenticated",
                 log_safe(principal), server.mechanism, self.listener.name,
                 f" for {lifetime_ms} ms" if lifetime_ms else "")
        self.conn.authenticated(principal)
        if lifetime_ms:
            session = SaslSession(principal, server.mechanism,
                              time.monotonic() + lifetime_ms / 1000,
                              previous.last_start if previous is not None else None)
            self.conn.handle = SessionExpiry(self.conn, session, self.listener.name,
                                             self._begin).handle
        return lifetime_ms

    def _begin(self, session: SaslSession):
        """Row R1: a new gate's handler re-authenticates ``session``."""
        return SaslGate(self.conn, self.listener, self.credentials, session).handle

    def _fail(self, request, body, peer: str, reason: str):
        """Answer after the delay, then close; nothing else is handled meanwhile."""
        mechanism = self.server.mechanism if self.server is not None else "-"
        _failures.log(logging.WARNING, f"authentication failed on {self.listener.name}",
                      "%s: authentication failed on listener %s (%s): %s; closing the "
                      "connection", peer, self.listener.name, mechanism, log_safe(reason))
        frame = None if request is None else encode_response(
            request.api_key, request.api_version, request.correlation_id, body)
        return self._answer_later(frame)

    async def _answer_later(self, frame: bytes | None):
        await asyncio.sleep(self.listener.failed_delay_s)
        conn = self.conn
        if frame is not None and not conn.closed:
            conn.transport.write(frame)
        conn.close()
        return None
