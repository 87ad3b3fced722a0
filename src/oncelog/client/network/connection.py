"""A blocking connection to one Kafka-compatible broker, with API version negotiation.

Used by the CLI tools and the admin client. Every call has a timeout; a broker that does not
answer in time raises KafkaTimeout and the connection is closed.
"""

from __future__ import annotations

import collections
import select
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.api_versions import API_VERSIONS_KEY, SUPPORTED_VERSIONS
from ...protocol.messages import decode_response, encode_request
from ...protocol.schema import build, request_module
from . import sasl
from .security import PLAINTEXT, ClientSecurity
from .throttle import raw_throttle_seconds, throttle_seconds

_SIZE = struct.Struct(">i")
_REUSE_ABOVE = 256 << 10  # smaller answers get a buffer of their own
# Receive buffers of earlier large answers, shared by the process's connections (a Spark
# worker runs task after task, each on new connections). A pipelined reader still holds the
# answer before the one it receives, so a few are kept, none larger than _KEEP_AT_MOST.
_SPARES: list[bytearray] = []
_SPARES_KEPT = 3
_KEEP_AT_MOST = 16 << 20
_SPARES_LOCK = threading.Lock()
# The client speaks what the protocol layer knows, but AddPartitionsToTxn only up to v3 (v4+
# is the brokers' batched form, KIP-890), InitProducerId up to v6 (KIP-939's two-phase
# commit fields: the producer's, whatever the broker implements), and the APIs whose newer
# versions name topics by id (or add nothing it uses) up to the last that names them.
CLIENT_API_VERSIONS = {
    **SUPPORTED_VERSIONS,
    apis.ADD_PARTITIONS_TO_TXN: (0, 3),
    apis.INIT_PRODUCER_ID: (0, 6),
    apis.PRODUCE: (3, 9),
    apis.FETCH: (4, 12),
    apis.LIST_OFFSETS: (1, 7),
    apis.METADATA: (0, 12),
    apis.FIND_COORDINATOR: (0, 4),
    apis.DELETE_TOPICS: (1, 5),
}


class KafkaError(Exception):
    """An error with Kafka's code (``error``). As confluent-kafka's KafkaError, it says what
    to do about it: ``is_retriable()`` (the same call may succeed later), ``is_fatal()``
    (the producer can do nothing more: close it), ``txn_requires_abort()`` (the transaction
    can only be aborted; the producer goes on with the next one)."""

    fatal = False
    abortable = False

    def __init__(self, error: ErrorCode, message: str | None = None) -> None:
        super().__init__(f"{error.name.upper()} ({int(error)})" + (f": {message}" if message
                                                                   else ""))
        self.error = error

    def code(self) -> ErrorCode:
        return self.error

    def name(self) -> str:
        return self.error.name.upper()

    def is_fatal(self) -> bool:
        return self.fatal

    def txn_requires_abort(self) -> bool:
        return self.abortable

    def is_retriable(self) -> bool:
        return not self.fatal and not self.abortable and self.error.retriable


class KafkaTimeout(KafkaError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.request_timed_out, message)


class RequestNotSent(KafkaError):
    """A request failed before a byte of it was written (it waited behind a re-authentication
    that failed, or its connection had closed): the broker never saw it."""


class OutcomeUnknown(KafkaError):
    """A record failed whose fate the producer could not learn: the broker may have stored
    it (once: it is never sent again where it could be stored twice) or may not. The message
    says why (librdkafka calls this status "possibly persisted")."""


class ProducerFatalError(KafkaError):
    """The producer stopped for good (fenced by a newer instance with its transactional id,
    not authorised, ...): every later call raises it; close the producer."""

    fatal = True


class TransactionAbortableError(KafkaError):
    """The current transaction failed and can only be aborted: call abort_transaction(),
    then begin the next one (Kafka's abortable errors)."""

    abortable = True


class TransactionAbortedError(KafkaError):
    """A record's transaction was aborted before the record was sent: it is not stored."""


class TransactionStateError(KafkaError):
    """A transactional call the producer's state does not allow (begin_transaction() twice,
    produce() outside a transaction, ...): nothing was done (Kafka's IllegalStateException,
    librdkafka's _STATE)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.invalid_txn_state, f"local: {message}")


def choose_versions(response: Any) -> dict[int, int]:
    """From an ApiVersions response: the newest version of each API both sides speak."""
    if response.error_code != ErrorCode.none:
        raise KafkaError(response.error_code, "ApiVersions failed")
    versions = {}
    for entry in response.api_keys:
        ours = CLIENT_API_VERSIONS.get(entry.api_key)
        if ours is None:
            continue
        best = min(ours[1], entry.max_version)
        if best >= max(ours[0], entry.min_version):
            versions[entry.api_key] = best
    return versions


def parse_bootstrap(servers: str) -> list[tuple[str, int]]:
    result = []
    for item in servers.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bootstrap server {item!r} is not host:port")
        result.append((host.strip("[]"), int(port)))
    return result


class BrokerConnection:
    def __init__(self, host: str, port: int, client_id: str = "oncelog",
                 timeout: float = 30.0, security: ClientSecurity = PLAINTEXT) -> None:
        self.host, self.port = host, port
        self.client_id = client_id
        self.timeout = timeout
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise KafkaError(ErrorCode.network_exception,
                             f"cannot connect to {host}:{port}: {exc}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.security = security
        if security.ssl_context is not None:
            self._start_tls(security.ssl_context)
        self._correlation = 0
        self.quiet_until = 0.0  # monotonic: nothing is sent before (KIP-219, throttle.py)
        self._size = bytearray(4)  # a frame's size prefix
        # (correlation id, api key, version, deadline: monotonic, None for ``timeout``)
        self._in_flight: collections.deque[tuple[int, int, int, float | None]] = \
            collections.deque()
        # answers of requests in flight when a re-authentication began, read before it
        self._kept: collections.deque[tuple[int, int, bytearray | memoryview]] = \
            collections.deque()
        self.versions: dict[int, int] = {}
        self.reauth = sasl.reauthentication(security)  # KIP-368: None without SASL
        self._negotiate()
        if self.reauth is not None:
            self._authenticate(self.reauth)

    def _start_tls(self, context: ssl.SSLContext) -> None:
        try:
            self.sock = context.wrap_socket(self.sock, server_hostname=self.host)
        except (OSError, ssl.SSLError) as exc:
            self.close()
            raise KafkaError(ErrorCode.sasl_authentication_failed,
                             f"TLS handshake with {self.host}:{self.port} failed: {exc}") from None

    def _authenticate(self, reauth: sasl.Reauthentication, again: bool = False) -> None:
        def step(api_key: int, make: Callable[[ModuleType, int], Any]) -> Any:
            version = self.version(api_key)
            self._send(api_key, version, make(request_module(api_key, version), version),
                       exchange=True)
            return self.receive()[1]

        try:
            reauth.authenticate(step, again)
        except sasl.SaslRefused as exc:
            self.close()
            raise KafkaError(exc.error, str(exc)) from None

    def _reauthenticate(self, reauth: sasl.Reauthentication, due: float) -> None:
        """Rows C3 and C7 of security/sasl_reauth_client.py: the answers of the requests in
        flight come first, each read within its own deadline and kept for its ``receive``;
        then the exchange, before the next request. An answer not begun by ``due`` (the
        next request's deadline) fails that request, not sent, and leaves the rest as they
        are: the next send drains on."""
        while len(self._kept) < len(self._in_flight):
            asked = self._in_flight[len(self._kept)]
            own = time.monotonic() + self.timeout if asked[3] is None else asked[3]
            if due < own and not self._readable_by(due):
                raise RequestNotSent(ErrorCode.request_timed_out, f"not sent: the answers "
                                     f"in flight on {self.host}:{self.port} (read before a "
                                     f"re-authentication) did not come before its deadline")
            try:
                self._kept.append(self._read_answer(asked, deadline=own))
            except KafkaError as exc:  # the connection is closed: the new request never left
                raise RequestNotSent(exc.error, f"not sent: {exc}") from exc
        kept, self._kept = self._kept, collections.deque()
        in_flight, self._in_flight = self._in_flight, collections.deque()
        try:
            self._authenticate(reauth, again=True)
        finally:  # their answers are theirs even when it failed (and closed the connection)
            self._kept, self._in_flight = kept, in_flight

    def _negotiate(self) -> None:
        _, response = self._call(API_VERSIONS_KEY, 0, build(
            request_module(API_VERSIONS_KEY, 0).ApiVersionsRequest))
        self.versions = choose_versions(response)

    def version(self, api_key: int) -> int:
        try:
            return self.versions[api_key]
        except KeyError:
            raise KafkaError(ErrorCode.unsupported_version,
                             f"the broker shares no version of api key {api_key} with us") from None

    def call(self, api_key: int, make: Callable[[ModuleType, int], Any]) -> Any:
        """Send the request ``make(request_module, version)`` builds; return the response."""
        version = self.version(api_key)
        _, response = self._call(api_key, version, make(request_module(api_key, version), version))
        return response

    def send_only(self, api_key: int, make: Callable[[ModuleType, int], Any],
                  deadline: float | None = None) -> int:
        """Send without waiting: for acks=0, or to pipeline (then ``receive`` in order).
        ``deadline`` (monotonic): by when its answer is due, if not within ``timeout``.

        Returns the correlation id.
        """
        version = self.version(api_key)
        return self._send(api_key, version, make(request_module(api_key, version), version),
                          deadline=deadline)

    def has_buffered_answer(self) -> bool:
        """An answer already read (during a re-authentication) waits for ``receive``: the
        socket will not signal it."""
        return bool(self._kept)

    def _send(self, api_key: int, version: int, body: Any, exchange: bool = False,
              deadline: float | None = None) -> int:
        reauth = self.reauth
        if reauth is not None and not exchange and \
                reauth.decide(time.monotonic()) is sasl.Action.REAUTHENTICATE:
            self._reauthenticate(reauth, time.monotonic() + self.timeout if deadline is None
                                 else deadline)
        wait = self.quiet_until - time.monotonic()
        if wait > 0:  # the broker throttled us: it would not read this before then
            time.sleep(wait)
        self._correlation += 1
        try:
            self.sock.sendall(encode_request(api_key, version, self._correlation,
                                             self.client_id, body))
        except OSError as exc:
            self.close()
            raise KafkaError(ErrorCode.network_exception, str(exc)) from None
        if not (api_key == apis.PRODUCE and body.acks == 0):  # acks=0 is never answered
            self._in_flight.append((self._correlation, api_key, version, deadline))
        return self._correlation

    def receive(self) -> tuple[int, Any]:
        """(correlation id, body) of the oldest pipelined request's answer."""
        api_key, version, frame = self._receive_frame()
        try:
            answer = decode_response(api_key, version, memoryview(frame).toreadonly())
        except Exception as exc:  # a value kio cannot hold (a lifetime of 2**62 ms), ...
            self.close()
            raise KafkaError(ErrorCode.network_exception, f"{self.host}:{self.port} sent an "
                             f"answer that does not decode: {exc!r}") from None
        self._throttled(throttle_seconds(answer[1]))
        return answer

    def _throttled(self, seconds: float) -> None:
        if seconds > 0:  # bounded: a throttle past the request timeout fails as a timeout
            self.quiet_until = max(self.quiet_until,
                                   time.monotonic() + min(seconds, self.timeout))

    def receive_raw(self, reuse: bool = False) -> tuple[int, bytearray | memoryview]:
        """The oldest pipelined request's answer undecoded, for a reader of its own
        (``protocol.fetch_response``): (version, the answer's frame: correlation id, header
        tags if flexible, body). ``reuse``: a large answer may be received into the memory
        of an earlier one nothing refers to any more (``_spare``)."""
        api_key, version, frame = self._receive_frame(reuse)
        self._throttled(raw_throttle_seconds(api_key, version, frame))
        return version, frame

    def call_raw(self, api_key: int, make: Callable[[ModuleType, int], Any]
                 ) -> tuple[int, bytearray]:
        """``call`` for an answer kio cannot read (DescribeTransactions' start time of -1):
        (version, the answer's frame: correlation id, header tags if flexible, body)."""
        self.send_only(api_key, make)
        return self.receive_raw()

    def _receive_frame(self, reuse: bool = False) -> tuple[int, int, bytearray | memoryview]:
        """(api key, version, frame) of the oldest pipelined request's answer, its
        correlation id checked."""
        if self._kept:  # read while re-authenticating (_reauthenticate)
            self._in_flight.popleft()
            return self._kept.popleft()
        return self._read_answer(self._in_flight.popleft(), reuse)

    def _read_answer(self, asked: tuple[int, int, int, float | None], reuse: bool = False,
                     deadline: float | None = None) -> tuple[int, int, bytearray | memoryview]:
        """The answer to ``asked``, whole within ``deadline`` if given, else within the
        connection's timeout from now: a broker trickling a byte per recv holds it no
        longer."""
        correlation, api_key, version, _ = asked
        try:
            frame = self._read_frame(reuse, time.monotonic() + self.timeout if deadline is None
                                     else deadline)
        except TimeoutError:
            self.close()
            raise KafkaTimeout(f"no answer from {self.host}:{self.port} in time") from None
        except OSError as exc:
            self.close()
            raise KafkaError(ErrorCode.network_exception, str(exc)) from None
        finally:
            if not self.closed:
                self.sock.settimeout(self.timeout)
        (got,) = _SIZE.unpack_from(frame, 0) if len(frame) >= 4 else (None,)
        if got != correlation:
            self.close()
            raise KafkaError(ErrorCode.unknown_server_error,
                             f"correlation id {got} answered where {correlation} was asked")
        return api_key, version, frame

    def _call(self, api_key: int, version: int, body: Any) -> tuple[int, Any]:
        self._send(api_key, version, body)
        return self.receive()

    def _readable_by(self, due: float) -> bool:
        """Whether the socket has something to read before ``due`` (monotonic)."""
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return True  # decrypted already: select would not see it
        try:
            ready, _, _ = select.select([self.sock], [], [], max(0.0, due - time.monotonic()))
        except (OSError, ValueError):
            return True  # the read says what became of the socket
        return bool(ready)

    def _read_into(self, view: memoryview, deadline: float | None = None) -> None:
        """Fill ``view`` from the socket, each recv bounded by the socket's timeout, or by
        what is left before ``deadline`` (a broker trickling bytes does not overrun it)."""
        got = 0
        while got < len(view):
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.sock.settimeout(left)
            n = self.sock.recv_into(view[got:])
            if not n:
                raise ConnectionError("the broker closed the connection")
            got += n

    def _read_frame(self, reuse: bool = False,
                    deadline: float | None = None) -> bytearray | memoryview:
        # Received straight into one buffer of the frame's size: a Fetch answer of megabytes
        # is not received in chunks and joined (a second copy of every byte).
        self._read_into(memoryview(self._size), deadline)
        (size,) = _SIZE.unpack(self._size)
        if size < 0:
            raise ConnectionError(f"the broker sent a frame of size {size}")
        frame = _spare(size) if reuse and size > _REUSE_ABOVE else bytearray(size)
        self._read_into(memoryview(frame), deadline)
        return frame

    @property
    def closed(self) -> bool:
        """Closed by close() or by a failure (which closes it): to be opened anew."""
        return self.sock.fileno() < 0

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> BrokerConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _references(buffers: list[bytearray], i: int) -> int:
    return sys.getrefcount(buffers[i])


# What _references counts for a buffer only its list holds (each view into it adds one),
# measured rather than assumed: the interpreter's own references differ between versions.
_UNREFERENCED = _references([bytearray(1)], 0)


def _spare(size: int) -> memoryview:
    """``size`` bytes of a kept receive buffer that nothing refers to any more (a view into
    it would hold a reference), else of a new one, kept in place of the smallest. Fresh
    memory costs a page fault per 4 KiB on first touch: megabyte answers received into new
    buffers one after another spent as long faulting as copying."""
    with _SPARES_LOCK:
        for i in range(len(_SPARES)):
            if len(_SPARES[i]) >= size and _references(_SPARES, i) == _UNREFERENCED:
                return memoryview(_SPARES[i])[:size]
        spare = bytearray(size)
        if size <= _KEEP_AT_MOST:
            if len(_SPARES) < _SPARES_KEPT:
                _SPARES.append(spare)
            else:
                smallest = min(range(len(_SPARES)), key=lambda i: len(_SPARES[i]))
                if len(_SPARES[smallest]) < size:
                    _SPARES[smallest] = spare
        return memoryview(spare)


def connect(bootstrap_servers: str, client_id: str = "oncelog",
            timeout: float = 30.0, security: ClientSecurity = PLAINTEXT) -> BrokerConnection:
    """A connection to the first reachable bootstrap server; refused authentication ends
    the search (another server would refuse the same credentials)."""
    last: Exception | None = None
    for host, port in parse_bootstrap(bootstrap_servers):
        try:
            return BrokerConnection(host, port, client_id, timeout, security)
        except KafkaError as exc:
            if exc.error == ErrorCode.sasl_authentication_failed:
                raise
            last = exc
    assert last is not None
    raise last
