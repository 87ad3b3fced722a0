"""Connections from this broker to the other brokers of its cluster (cluster mode only).

Connections are opened by ``opener(broker)``: inter_broker_connect.py's one step, to the other
broker's registered endpoint of ``inter.broker.listener.name``, with that listener's TLS and
SASL; the replica fetcher and the channel both use it.

``BrokerConnection`` speaks Kafka's protocol as a client: requests go out with increasing
correlation ids and may overlap; one reader matches each answer to its request by the
correlation id. Each call is bounded by a timeout; a call that times out, a frame that makes
no sense and a lost connection fail every call waiting on the connection, which is then
closed (Kafka's NetworkClient disconnects on a request timeout too). A SASL session with a
lifetime is authenticated again before it ends, between calls, as oncelog's clients do
(security/sasl_reauth_client.py, rows C1-C6: calls made meanwhile wait for it).

``InterBrokerChannel`` keeps one connection per destination broker for the requests brokers
send each other besides replication (WriteTxnMarkers to partition leaders, AddPartitionsToTxn
``verify_only`` to transaction coordinators): made on first use, made again after a loss
with Kafka's reconnect backoff (``reconnect.backoff.ms`` 50 doubling to
``reconnect.backoff.max.ms`` 1000), all closed on shutdown. The replica fetcher keeps its own
``BrokerConnection`` per leader (its long-polling Fetch would hold answers up behind it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..protocol.messages import decode_response, encode_request
from ..protocol.schema import request_module
from ..security.sasl_reauth_client import Action, Reauthentication
from .frame_receiver import AT_ONCE, FrameReceiver
from .inter_broker_connect import SASL_VERSIONS, open_connection

log = logging.getLogger(__name__)

_CORRELATION = struct.Struct(">i")
MAX_FRAME = 1 << 30
CONNECT_TIMEOUT_S = 10.0  # Kafka's socket.connection.setup.timeout.ms
REQUEST_TIMEOUT_S = 30.0  # Kafka's request.timeout.ms
RECONNECT_BACKOFF_S = 0.05  # reconnect.backoff.ms
RECONNECT_BACKOFF_MAX_S = 1.0  # reconnect.backoff.max.ms

# broker id -> an open (and, as the listener asks, authenticated) connection to it, and its
# SASL session to re-authenticate when it has one
Opener = Callable[[int], Awaitable[tuple]]


class InterBrokerError(Exception):
    """The request got no answer: no connection, lost, timed out, or a frame that makes no
    sense. Nothing is known of whether the other broker acted on it."""


async def connect(open_to: Opener, destination: int, client_id: str,
                  timeout_s: float = REQUEST_TIMEOUT_S, frame_at_once: int = AT_ONCE
                  ) -> BrokerConnection:
    """A connection to broker ``destination`` made by ``open_to`` (``opener``'s: the one
    place a broker opens one, secured as the inter-broker listener asks). Answers up to
    ``frame_at_once`` bytes are allocated whole on their size, larger ones as they arrive
    (frame_receiver.py): the largest legitimate answer on the connection."""
    try:
        reader, writer, *reauth = await open_to(destination)
    except (OSError, TimeoutError) as exc:
        raise InterBrokerError(f"connecting to broker {destination}: {exc!r}") from exc
    return BrokerConnection(reader, writer, client_id, timeout_s, *reauth,
                            frame_at_once=frame_at_once)


def opener(broker) -> Opener:
    """How ``broker`` opens connections to the others: on the inter-broker listener, with its
    TLS and SASL (inter_broker_connect.py)."""
    return functools.partial(open_connection, broker)


class BrokerConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 client_id: str, timeout_s: float, reauth: Reauthentication | None = None,
                 frame_at_once: int = AT_ONCE) -> None:
        self.reader, self.writer = reader, writer
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.correlation = 0
        self.closed = False
        # correlation id -> (api key, version, its decoder or None: kio's, the answer)
        self._waiting: dict[int, tuple[int, int, Callable | None, asyncio.Future]] = {}
        # Calls given up whose answers may still come (at most one per call sent since).
        self._abandoned: set[int] = set()
        self.reauth = reauth
        self._reauthenticating: asyncio.Task | None = None
        # the answers read straight into their frames from now on (last: it may find the
        # connection lost already)
        FrameReceiver.take_over(reader, writer, MAX_FRAME, self._answered, self._lost,
                                frame_at_once)

    async def call(self, api_key: int, version: int, body, timeout_s: float | None = None,
                   decode: Callable[[memoryview], Any] | None = None):
        """The answer to one request within ``timeout_s`` in all (a re-authentication it
        waits for included); raises InterBrokerError when there is none. ``decode``: reads
        the answer's frame (without its size) instead of kio's entity (a follower's Fetch:
        protocol/fetch_response.py, the records left in the frame)."""
        timeout_s = timeout_s or self.timeout_s
        if self.reauth is not None:
            began = time.monotonic()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._reauthenticated(self.reauth)
            except TimeoutError as exc:
                raise InterBrokerError("timed out waiting for a re-authentication") from exc
            timeout_s -= time.monotonic() - began
            if timeout_s <= 0:
                raise InterBrokerError("timed out waiting for a re-authentication")
        return await self._call(api_key, version, body, timeout_s, decode)

    async def _reauthenticated(self, reauth: Reauthentication) -> None:
        """Rows C3-C5 before a call: it begins the exchange past the point and waits for the
        one running; the point after an exchange is at least the broker's minimum gap
        later (C5 (a)), so the call then goes out rather than beginning another."""
        while not self.closed:
            action = reauth.decide(time.monotonic())
            if action is Action.SEND:
                return
            if action is Action.REAUTHENTICATE:  # row C3; the calls behind wait (C4)
                reauth.begin()
                self._reauthenticating = asyncio.get_running_loop().create_task(
                    self._reauthenticate(reauth))
            task = self._reauthenticating
            if task is None:  # running without its task: only once closed
                return
            await asyncio.wait({task})  # not shield: its cancellation is not this call's

    async def _reauthenticate(self, reauth: Reauthentication) -> None:
        async def step(api_key: int, make):
            version = SASL_VERSIONS[api_key]
            return await self._call(api_key, version, make(request_module(api_key, version),
                                                           version))
        try:
            await reauth.authenticate_async(step, again=True)
        except Exception as exc:  # row C6: refused, lost, or an answer that does not decode
            log.warning("re-authenticating to another broker failed: %s; closing the "
                        "connection", exc)
            self._fail(InterBrokerError(f"re-authentication failed: {exc}"))
        finally:
            self._reauthenticating = None

    async def _call(self, api_key: int, version: int, body, timeout_s: float | None = None,
                    decode: Callable[[memoryview], Any] | None = None):
        if self.closed:
            raise InterBrokerError("the connection is closed")
        self.correlation = (self.correlation + 1) & 0x7FFFFFFF
        correlation = self.correlation
        answer = asyncio.get_running_loop().create_future()
        self._waiting[correlation] = (api_key, version, decode, answer)
        try:
            self.writer.write(encode_request(api_key, version, correlation, self.client_id,
                                             body))
            async with asyncio.timeout(timeout_s or self.timeout_s):
                await self.writer.drain()
                return await answer
        except TimeoutError as exc:
            self._fail(InterBrokerError(f"no answer to api key {api_key} within "
                                        f"{timeout_s or self.timeout_s:.0f}s"))
            raise InterBrokerError("timed out") from exc
        except (OSError, EOFError) as exc:
            self._fail(InterBrokerError(repr(exc)))
            raise InterBrokerError(repr(exc)) from exc
        except asyncio.CancelledError:
            # The answer may still come: dropped then, as the answer of a call given up (a
            # stray correlation id would fail every other call on the connection).
            if not self.closed:
                self._abandoned.add(correlation)
            raise
        finally:
            self._waiting.pop(correlation, None)

    def _answered(self, frame: memoryview) -> None:
        """One answer, whole (FrameReceiver's call): to the call waiting for it."""
        if self.closed:
            return
        try:
            (correlation,) = _CORRELATION.unpack_from(frame)
            waiting = self._waiting.get(correlation)
            if waiting is None and correlation in self._abandoned:
                self._abandoned.discard(correlation)
                return
            if waiting is None:
                raise InterBrokerError(f"an answer to correlation id {correlation}, which "
                                       f"no request waits for")
            api_key, version, decode, answer = waiting
            decoded = decode_response(api_key, version, frame)[1] if decode is None \
                else decode(frame)
        except Exception as exc:  # an answer that cannot be read: every call fails
            self._fail(exc if isinstance(exc, InterBrokerError) else InterBrokerError(repr(exc)))
            return
        if not answer.done():
            answer.set_result(decoded)

    def _lost(self, exc: BaseException | None) -> None:
        """The connection ended, or sent a frame size out of bounds: every call fails."""
        if not self.closed:
            self._fail(InterBrokerError(repr(exc)))

    def _fail(self, error: InterBrokerError) -> None:
        for *_, answer in self._waiting.values():
            if not answer.done():
                answer.set_exception(error)
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            task, self._reauthenticating = self._reauthenticating, None
            if task is not None and task is not asyncio.current_task():
                task.cancel()
            self.writer.close()
            # no answer can come now: the calls waiting fail at once (those _fail failed
            # keep their own error)
            for *_, answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(InterBrokerError("the connection is closed"))


class InterBrokerChannel:
    """One connection per destination broker, made on first use and after a loss."""

    def __init__(self, broker_id: int, open_to: Opener,
                 timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.broker_id = broker_id
        self.open_to = open_to
        self.timeout_s = timeout_s
        self._connections: dict[int, BrokerConnection] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._backoff: dict[int, tuple[float, float]] = {}  # id -> (next attempt, delay)
        self._closed = False

    async def call(self, destination: int, api_key: int, version: int, body,
                   timeout_s: float | None = None):
        """The answer of ``destination`` to one request; InterBrokerError when none came."""
        conn = await self._connection(destination)
        try:
            return await conn.call(api_key, version, body, timeout_s or self.timeout_s)
        except InterBrokerError:
            self._lost(destination, conn)
            raise

    async def _connection(self, destination: int) -> BrokerConnection:
        if self._closed:
            raise InterBrokerError("the broker is shutting down")
        conn = self._connections.get(destination)
        if conn is not None and not conn.closed:
            return conn
        lock = self._locks.setdefault(destination, asyncio.Lock())
        async with lock:  # one connect at a time per destination; the others use it
            conn = self._connections.get(destination)
            if conn is not None and not conn.closed:
                return conn
            next_at, delay = self._backoff.get(destination, (0.0, 0.0))
            wait = next_at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                conn = await connect(self.open_to, destination, f"broker-{self.broker_id}",
                                     self.timeout_s)
            except InterBrokerError:
                self._failed_attempt(destination, delay)
                raise
            if self._closed:
                conn.close()
                raise InterBrokerError("the broker is shutting down")
            self._backoff.pop(destination, None)
            self._connections[destination] = conn
            return conn

    def _failed_attempt(self, destination: int, delay: float) -> None:
        delay = min(RECONNECT_BACKOFF_MAX_S, delay * 2) if delay else RECONNECT_BACKOFF_S
        self._backoff[destination] = (time.monotonic() + delay, delay)

    def _lost(self, destination: int, conn: BrokerConnection) -> None:
        conn.close()
        if self._connections.get(destination) is conn:
            del self._connections[destination]
            self._failed_attempt(destination, 0.0)

    def close(self) -> None:
        self._closed = True
        for conn in self._connections.values():
            with contextlib.suppress(Exception):
                conn.close()
        self._connections.clear()
