"""An asyncio connection to one Kafka-compatible broker: version negotiation, pipelined requests.

Requests are written as they are sent and answered in order (Kafka answers in order on one
connection); each ``request`` returns a future. A broker that does not answer within the
request timeout, a reset or a malformed answer fails every pending future with
NETWORK_EXCEPTION or REQUEST_TIMED_OUT and closes the connection: what was in flight on it has
an unknown outcome, which the producer's sequence numbers resolve on retry.

The socket is driven with the loop's add_reader/add_writer and plain socket calls rather than
a transport: Python's socket calls release the GIL for the system call (uvloop's transports
keep it), so while the kernel copies a 16 KiB request the thread calling produce() runs.
TLS (security.protocol ssl, sasl_ssl) keeps that shape: ``ssl.SSLObject`` over memory
buffers encrypts what is sent and decrypts what is received, the socket calls stay plain.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import ssl
import struct
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol.api_versions import API_VERSIONS_KEY
from ...protocol.messages import decode_response, encode_request
from ...protocol.schema import build, request_module
from . import sasl
from .connection import KafkaError, KafkaTimeout, RequestNotSent, choose_versions
from .security import PLAINTEXT, ClientSecurity
from .throttle import throttle_seconds

log = logging.getLogger(__name__)
_SIZE = struct.Struct(">i")
_RECEIVE = 256 * 1024
_PARTS_PER_SEND = 512  # under any system's IOV_MAX


class AsyncBrokerConnection:
    def __init__(self, host: str, port: int, client_id: str, timeout: float,
                 security: ClientSecurity = PLAINTEXT) -> None:
        self.host, self.port = host, port
        self.security = security
        self._tls: ssl.SSLObject | None = None  # with its two buffers, under TLS
        self._tls_in = self._tls_out = ssl.MemoryBIO()
        self.client_id = client_id
        self.timeout = timeout
        self.versions: dict[int, int] = {}
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._unsent: collections.deque[memoryview] = collections.deque()  # when the socket is full
        self._received = bytearray()  # bytes of answers not yet complete
        self._correlation = 0
        # KIP-219: after a throttled answer, frames wait here until quiet_until (monotonic):
        # (correlation id, frame's parts, the future of one that expects no answer, or None)
        self.quiet_until = 0.0
        self._held: collections.deque[tuple[int, list, asyncio.Future | None]] = \
            collections.deque()
        self._release: asyncio.TimerHandle | None = None
        # (correlation id, api key, version, future, deadline, the API's own decoder or None)
        self._pending: collections.deque[tuple[int, int, int, asyncio.Future, float, Any]] = \
            collections.deque()
        self._watchdog: asyncio.TimerHandle | None = None
        # KIP-368 (security/sasl_reauth_client.py): None without SASL; while it re-authenticates,
        # requests wait here, unnumbered, as _send was given them (row C4)
        self.reauth = sasl.reauthentication(security)
        self._reauthenticating: asyncio.Task | None = None
        self._waiting: collections.deque[tuple] = collections.deque()
        self.closed = False
        self.on_close: Callable[[AsyncBrokerConnection], None] | None = None

    @classmethod
    async def open(cls, host: str, port: int, client_id: str, timeout: float,
                   security: ClientSecurity = PLAINTEXT) -> AsyncBrokerConnection:
        conn = cls(host, port, client_id, timeout, security)
        try:
            await asyncio.wait_for(conn._connect(), timeout)
        except ssl.SSLError as exc:
            conn.close()
            raise KafkaError(ErrorCode.sasl_authentication_failed,
                             f"TLS handshake with {host}:{port} failed: {exc}") from None
        except (OSError, TimeoutError) as exc:
            conn.close()
            raise KafkaError(ErrorCode.network_exception,
                             f"cannot connect to {host}:{port}: {exc}") from None
        try:
            await conn._negotiate()
            if conn.reauth is not None:
                await conn._authenticate(conn.reauth)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _connect(self) -> None:
        infos = await self._loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        last: OSError | None = None
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await self._loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            except BaseException:  # cancelled (open's timeout): the socket is ours to close
                sock.close()
                raise
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock
            if self.security.ssl_context is not None:
                await self._handshake(sock, self.security.ssl_context)
            self._loop.add_reader(sock.fileno(), self._readable)
            return
        raise last or OSError(f"no address for {self.host}")

    async def _handshake(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self._tls_in, self._tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(self._tls_in, self._tls_out, server_hostname=self.host)
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if self._tls_out.pending:
                    await self._loop.sock_sendall(sock, self._tls_out.read())
                data = await self._loop.sock_recv(sock, _RECEIVE)
                if not data:
                    raise ConnectionError("the broker closed the connection during TLS") \
                        from None
                self._tls_in.write(data)
        if self._tls_out.pending:
            await self._loop.sock_sendall(sock, self._tls_out.read())
        self._tls = tls

    async def _authenticate(self, reauth: sasl.Reauthentication, again: bool = False) -> None:
        def step(api_key: int, make: Callable[[ModuleType, int], Any]) -> asyncio.Future:
            version = self._version(api_key)
            body = make(request_module(api_key, version), version)
            return self._send(api_key, version, lambda correlation: [encode_request(
                api_key, version, correlation, self.client_id, body)], None, exchange=True)

        try:
            await reauth.authenticate_async(step, again)
        except sasl.SaslRefused as exc:
            raise KafkaError(exc.error, str(exc)) from None

    async def _reauthenticate(self, reauth: sasl.Reauthentication) -> None:
        """Row C3: the exchange goes out behind the requests in flight (answered first, in
        order); the requests waiting meanwhile go out once it is done (C5), or fail with the
        connection (C6)."""
        try:
            await self._authenticate(reauth, again=True)
        except Exception as exc:  # refused, lost, or an answer that does not decode
            log.warning("closing connection to %s:%d: re-authentication failed: %s",
                        self.host, self.port, exc)
            self._fail(exc if isinstance(exc, KafkaError) else KafkaError(
                ErrorCode.network_exception, f"re-authentication failed: {exc!r}"))
            return
        finally:
            self._reauthenticating = None
        waiting, self._waiting = self._waiting, collections.deque()
        for item in waiting:
            future = item[5]
            if future.done():  # cancelled while it waited: not sent
                continue
            try:
                self._dispatch(*item)
            except Exception as exc:  # its own (an encoder's error): the rest go on
                if not future.done():
                    future.set_exception(exc)

    async def _negotiate(self) -> None:
        self.versions = {API_VERSIONS_KEY: 0}
        response = await self.request(API_VERSIONS_KEY,
                                      lambda mod, _version: build(mod.ApiVersionsRequest))
        self.versions = choose_versions(response)

    @property
    def local_port(self) -> int | None:
        """This end's port (None unless open): how a broker's log names the connection."""
        try:
            return self._sock.getsockname()[1] if self._sock is not None else None
        except OSError:  # closed
            return None

    @property
    def in_flight(self) -> int:
        return len(self._pending) + len(self._waiting)

    def request(self, api_key: int, make: Callable[[ModuleType, int], Any],
                expect_response: bool = True) -> asyncio.Future:
        """Send now; the future resolves to the response body (to None without a response)."""
        version = self._version(api_key)
        body = make(request_module(api_key, version), version)
        return self._send(api_key, version, lambda correlation: [encode_request(
            api_key, version, correlation, self.client_id, body)], None, expect_response)

    def request_encoded(self, api_key: int, encode: Callable[[int, int, str], list],
                        decode: Callable[[int, bytes], Any],
                        expect_response: bool = True) -> asyncio.Future:
        """As request, for APIs with codecs of their own (Produce, on the producer's hot
        path): ``encode(version, correlation id, client id)`` gives the frame's parts,
        ``decode(version, frame)`` reads the answer."""
        version = self._version(api_key)
        return self._send(api_key, version,
                          lambda correlation: encode(version, correlation, self.client_id),
                          decode, expect_response)

    def _version(self, api_key: int) -> int:
        version = self.versions.get(api_key)
        if version is None:
            raise KafkaError(ErrorCode.unsupported_version,
                             f"{self.host}:{self.port} shares no version of api key {api_key}")
        return version

    def _send(self, api_key: int, version: int, frame: Callable[[int], list],
              decode: Callable[[int, bytes], Any] | None,
              expect_response: bool = True, exchange: bool = False) -> asyncio.Future:
        future = self._loop.create_future()
        reauth = self.reauth
        if reauth is not None and not exchange and not self.closed:
            action = reauth.decide(time.monotonic())
            if action is not sasl.Action.SEND:
                if action is sasl.Action.REAUTHENTICATE:
                    reauth.begin()
                    self._reauthenticating = self._loop.create_task(
                        self._reauthenticate(reauth))
                self._waiting.append((api_key, version, frame, decode, expect_response,
                                      future))
                return future
        self._dispatch(api_key, version, frame, decode, expect_response, future)
        return future

    def _dispatch(self, api_key: int, version: int, frame: Callable[[int], list],
                  decode: Callable[[int, bytes], Any] | None, expect_response: bool,
                  future: asyncio.Future) -> None:
        """Number the request and write it (or hold it while throttled)."""
        if self.closed or self._sock is None:
            if not future.done():
                future.set_exception(RequestNotSent(
                    ErrorCode.network_exception,
                    f"connection to {self.host}:{self.port} is closed"))
            return
        try:
            parts = frame(self._correlation + 1)
        except Exception as exc:  # an encoder's error: nothing of it was written
            raise RequestNotSent(ErrorCode.unknown_server_error,
                                 f"not sent: the request could not be encoded: {exc!r}") from exc
        self._correlation += 1
        now = time.monotonic()
        if expect_response:
            # Pending before the write: a write that fails fails it with the rest. Its time
            # starts when it is sent.
            self._pending.append((self._correlation, api_key, version, future,
                                  max(now, self.quiet_until) + self.timeout, decode))
            if self._watchdog is None:
                self._arm_watchdog()
        if self._held or now < self.quiet_until:
            # the broker throttled us: sent when that ends; one expecting no answer is done
            # only then (failed meanwhile, it was not sent: _fail)
            self._held.append((self._correlation, parts,
                               None if expect_response else future))
            if self._release is None:
                self._release = self._loop.call_later(self.quiet_until - now, self._send_held)
            return
        if not expect_response and not future.done():
            future.set_result(None)
        self._write(parts)

    def _send_held(self) -> None:
        self._release = None
        wait = self.quiet_until - time.monotonic()
        if wait > 0:  # throttled again meanwhile
            self._release = self._loop.call_later(wait, self._send_held)
            return
        while self._held and not self.closed:
            _, parts, unanswered = self._held.popleft()
            if unanswered is not None and not unanswered.done():
                unanswered.set_result(None)
            self._write(parts)

    def _write(self, parts: list) -> None:
        if self._tls is not None:
            self._tls.write(b"".join(parts))
            parts = [self._tls_out.read()]
        self._send_raw(parts)

    def _send_raw(self, parts: list) -> None:
        """Bytes as they go on the wire (under TLS: already encrypted)."""
        if self._unsent:  # behind earlier bytes the socket had no room for
            self._unsent.extend(memoryview(part) for part in parts)
            return
        try:
            if len(parts) > _PARTS_PER_SEND:
                parts = [b"".join(parts)]
            sent = self._sock.sendmsg(parts) if self._sock is not None else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._connection_lost(exc)
            return
        for part in parts:
            if sent >= len(part):
                sent -= len(part)
                continue
            self._unsent.append(memoryview(part)[sent:])
            sent = 0
        if self._unsent and self._sock is not None:
            self._loop.add_writer(self._sock.fileno(), self._writable)

    def _writable(self) -> None:
        unsent = self._unsent
        while unsent and self._sock is not None:
            try:
                sent = self._sock.sendmsg(list(unsent)[:_PARTS_PER_SEND])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._connection_lost(exc)
                return
            while sent and unsent:
                head = unsent[0]
                if sent >= len(head):
                    sent -= len(head)
                    unsent.popleft()
                else:
                    unsent[0] = head[sent:]
                    sent = 0
        if self._sock is not None:
            self._loop.remove_writer(self._sock.fileno())

    def _readable(self) -> None:
        if self._sock is None:
            return
        try:
            data = self._sock.recv(_RECEIVE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._connection_lost(exc)
            return
        if not data:
            self._connection_lost(None)
            return
        if self._tls is not None:
            data = self._decrypt(data)
            if not data:
                return
        self._data_received(data)

    def _decrypt(self, data: bytes) -> bytes | None:
        """What ``data`` completes of the TLS records received; None once the connection is
        lost (a TLS error or the broker's close_notify)."""
        assert self._tls is not None
        self._tls_in.write(data)
        plain = []
        try:
            while chunk := self._tls.read(_RECEIVE):
                plain.append(chunk)
        except ssl.SSLWantReadError:
            pass
        except (ssl.SSLError, ssl.SSLZeroReturnError) as exc:
            self._connection_lost(exc)
            return None
        if self._tls_out.pending:  # TLS's own messages (a key update): sent as they come
            self._send_raw([self._tls_out.read()])
        return b"".join(plain)

    def _arm_watchdog(self) -> None:
        if not self._pending:
            self._watchdog = None
            return
        delay = max(0.0, self._pending[0][4] - time.monotonic())
        self._watchdog = self._loop.call_later(delay, self._check_timeout)

    def _check_timeout(self) -> None:
        self._watchdog = None
        if self._pending and self._pending[0][4] <= time.monotonic():
            self._fail(KafkaTimeout(f"no answer from {self.host}:{self.port} within "
                                    f"{self.timeout}s"))
            return
        self._arm_watchdog()

    def _data_received(self, data: bytes) -> None:
        """Answers as they arrive, cut into frames here: no task or coroutine per answer."""
        buf = self._received
        buf += data
        pos = 0
        try:
            while len(buf) - pos >= 4:
                (size,) = _SIZE.unpack_from(buf, pos)
                if size < 4:
                    raise KafkaError(ErrorCode.unknown_server_error,
                                     f"an answer of {size} bytes")
                end = pos + 4 + size
                if end > len(buf):
                    break
                self._answer(bytes(memoryview(buf)[pos + 4:end]))
                if self.closed:
                    return
                pos = end
        except KafkaError as exc:
            log.warning("closing connection to %s:%d: %s", self.host, self.port, exc)
            self._fail(exc)
            return
        except Exception as exc:  # an answer that does not decode
            log.warning("closing connection to %s:%d: %r", self.host, self.port, exc)
            self._fail(KafkaError(ErrorCode.network_exception, f"bad answer: {exc!r}"))
            return
        del buf[:pos]

    def _answer(self, frame: bytes) -> None:
        (got,) = _SIZE.unpack_from(frame, 0)
        # Answers come in order, so one for a later request means the earlier ones will never
        # come (a proxy or a broker dropped them): they are lost.
        while self._pending and self._pending[0][0] < got:
            lost = self._pending.popleft()[3]
            if not lost.done():
                lost.set_exception(KafkaError(ErrorCode.network_exception,
                                              f"{self.host}:{self.port} skipped the answer"))
        if not self._pending or self._pending[0][0] != got:
            raise KafkaError(ErrorCode.unknown_server_error,
                             f"an answer to correlation id {got}, never asked")
        _, api_key, version, future, _, decode = self._pending.popleft()
        body = decode(version, frame) if decode is not None \
            else decode_response(api_key, version, frame)[1]
        throttle = throttle_seconds(body)
        if throttle > 0:  # bounded: a throttle past the request timeout fails as a timeout
            self.quiet_until = max(self.quiet_until,
                                   time.monotonic() + min(throttle, self.timeout))
        if not future.done():
            future.set_result(body)

    def _connection_lost(self, exc: Exception | None) -> None:
        self._fail(KafkaError(ErrorCode.network_exception,
                              f"connection to {self.host}:{self.port} lost"
                              + (f": {exc}" if exc else "")))

    def _fail(self, error: KafkaError) -> None:
        pending, self._pending = self._pending, collections.deque()
        waiting, self._waiting = self._waiting, collections.deque()
        held, self._held = self._held, collections.deque()
        # Held behind a throttle (from the first held on, all are) or waiting behind a
        # re-authentication: never written, the broker never saw them, a retry is safe.
        unsent = RequestNotSent(error.error, f"not sent: {error}")
        first_held = held[0][0] if held else None
        for correlation, _, _, future, _, _ in pending:
            if not future.done():
                future.set_exception(error if first_held is None or correlation < first_held
                                     else unsent)
        for future in [entry[2] for entry in held] + [entry[5] for entry in waiting]:
            if future is not None and not future.done():
                future.set_exception(unsent)
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._release is not None:
            self._release.cancel()
            self._release = None
        if self._sock is not None:
            sock, self._sock = self._sock, None
            if not self._loop.is_closed():
                self._loop.remove_reader(sock.fileno())
                self._loop.remove_writer(sock.fileno())
            self._unsent.clear()
            sock.close()
        task, self._reauthenticating = self._reauthenticating, None
        if task is not None and task is not asyncio.current_task(self._loop):
            task.cancel()
        if self._pending or self._waiting or self._held:
            self._fail(KafkaError(ErrorCode.network_exception, "connection closed"))
        if self.on_close is not None:
            self.on_close(self)
