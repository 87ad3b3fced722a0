"""A Kafka-aware fault-injecting TCP proxy for loopback tests and demonstrations.

It cuts both directions into Kafka frames, matches responses to requests by correlation id,
and applies Rules: drop, delay or duplicate a request, drop or delay a response, empty a Fetch
answer of its records, or cut the connection right after the broker answered (the client never
learns the outcome: the classic cause of duplicates). Metadata and FindCoordinator responses
are rewritten to name the proxy, so clients keep talking through it instead of going around
it.

Use from Python::

    with ChaosProxy(("127.0.0.1", broker_port)) as proxy:
        proxy.add_rule(Rule.parse(Action.DROP_RESPONSE, "produce:3,4"))
        client.connect(proxy.bootstrap)

or from the shell: ``oncelog chaos proxy --upstream 127.0.0.1:9092 --listen 127.0.0.1:19092
--drop-response produce:3,4``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..protocol import api_versions as apis
from ..protocol.messages import (
    ProtocolError,
    decode_request,
    decode_response,
    encode_response,
    peek_header,
)
from .rules import Action, Rule

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
_MAX_FRAME = 1 << 30
_START_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened to a frame, for tests and sequence diagrams."""

    at: float
    connection: int
    direction: str  # "request" or "response"
    api_key: int
    correlation_id: int
    what: str  # "forwarded", or the action taken


@dataclass
class _Pending:
    api_key: int
    api_version: int
    actions: list[Rule]
    eat: bool = False  # the extra answer to a duplicated request


class ChaosProxy:
    def __init__(self, upstream: tuple[str, int],
                 listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.upstream = upstream
        self.listen = listen
        self.rules: list[Rule] = []
        self.events: list[Event] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.address: tuple[str, int] | None = None

    @property
    def bootstrap(self) -> str:
        assert self.address is not None, "the proxy is not started"
        return f"{self.address[0]}:{self.address[1]}"

    # --- rules -----------------------------------------------------------------------------

    def add_rule(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def _fire(self, api_key: int, frame: bytes) -> list[Rule]:
        with self._lock:
            candidates = [r for r in self.rules if r.api_key == api_key]
            if not candidates:
                return []
            named = _partitions_named(frame) if any(r.topic for r in candidates) else set()
            fired = []
            for rule in candidates:
                if rule.topic is not None and (rule.topic, rule.partition) not in named:
                    continue
                rule.seen += 1
                if rule.seen in rule.occurrences:
                    fired.append(rule)
            return fired

    def _event(self, conn: int, direction: str, api_key: int, corr: int, what: str) -> None:
        with self._lock:
            self.events.append(Event(time.monotonic(), conn, direction, api_key, corr, what))
        if what != "forwarded":
            log.info("connection %d: %s %s of api %d (correlation id %d)", conn, what,
                     direction, api_key, corr)

    # --- running in the background (tests) ---------------------------------------------------

    def start(self) -> ChaosProxy:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self.serve())
            except BaseException as exc:  # surfaced to start()'s caller
                failure.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=run, name="chaos-proxy", daemon=True)
        self._thread.start()
        if not started.wait(_START_TIMEOUT) or failure:
            raise RuntimeError(f"chaos proxy did not start: {failure}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_START_TIMEOUT)
            self._thread = None

    def __enter__(self) -> ChaosProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()

    # --- serving ---------------------------------------------------------------------------

    async def serve(self) -> None:
        self._server = await asyncio.start_server(self._handle, *self.listen)
        self.address = self._server.sockets[0].getsockname()[:2]
        log.info("chaos proxy on %s:%d forwarding to %s:%d", *self.address, *self.upstream)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        self._close_all()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(self, client_r: asyncio.StreamReader,
                      client_w: asyncio.StreamWriter) -> None:
        conn = next(self._ids)
        try:
            broker_r, broker_w = await asyncio.open_connection(*self.upstream)
        except OSError as exc:
            log.warning("connection %d: upstream %s:%d unreachable: %s", conn, *self.upstream,
                        exc)
            client_w.close()
            return
        self._writers.update((client_w, broker_w))
        pending: dict[int, collections.deque[_Pending]] = collections.defaultdict(
            collections.deque)
        cut = asyncio.Event()
        tasks = [
            asyncio.create_task(self._requests(conn, client_r, broker_w, pending, cut)),
            asyncio.create_task(self._responses(conn, broker_r, client_w, pending, cut)),
            asyncio.create_task(cut.wait()),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass  # the proxy is stopping: close this connection like any other
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for writer in (client_w, broker_w):
            writer.close()
            self._writers.discard(writer)

    async def _requests(self, conn: int, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter, pending, cut: asyncio.Event) -> None:
        while True:
            frame = await _read_frame(reader)
            if frame is None:
                return
            api_key, api_version, corr = peek_header(frame)
            fired = self._fire(api_key, frame)
            actions = {rule.action: rule for rule in fired}
            if Action.DROP_REQUEST in actions:
                self._event(conn, "request", api_key, corr, Action.DROP_REQUEST.value)
                continue
            if Action.DELAY_REQUEST in actions:
                self._event(conn, "request", api_key, corr, Action.DELAY_REQUEST.value)
                await asyncio.sleep(actions[Action.DELAY_REQUEST].delay_ms / 1000)
            pending[corr].append(_Pending(api_key, api_version, fired))
            writer.write(_SIZE.pack(len(frame)) + frame)
            self._event(conn, "request", api_key, corr, "forwarded")
            if Action.DUPLICATE_REQUEST in actions:
                pending[corr].append(_Pending(api_key, api_version, [], eat=True))
                writer.write(_SIZE.pack(len(frame)) + frame)
                self._event(conn, "request", api_key, corr, Action.DUPLICATE_REQUEST.value)
            await writer.drain()

    async def _responses(self, conn: int, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter, pending, cut: asyncio.Event) -> None:
        while True:
            frame = await _read_frame(reader)
            if frame is None:
                return
            (corr,) = _SIZE.unpack_from(frame, 0)
            waiting = pending.get(corr)
            if not waiting:
                log.warning("connection %d: response to unknown correlation id %d", conn, corr)
                writer.write(_SIZE.pack(len(frame)) + frame)
                continue
            request = waiting.popleft()
            if not waiting:
                del pending[corr]
            actions = {rule.action: rule for rule in request.actions}
            if request.eat:
                self._event(conn, "response", request.api_key, corr, "ate duplicate's answer")
                continue
            if Action.CUT_AFTER_REQUEST in actions:
                self._event(conn, "response", request.api_key, corr,
                            Action.CUT_AFTER_REQUEST.value)
                cut.set()
                return
            if Action.DROP_RESPONSE in actions:
                self._event(conn, "response", request.api_key, corr, Action.DROP_RESPONSE.value)
                continue
            if Action.DELAY_RESPONSE in actions:
                self._event(conn, "response", request.api_key, corr,
                            Action.DELAY_RESPONSE.value)
                await asyncio.sleep(actions[Action.DELAY_RESPONSE].delay_ms / 1000)
            if Action.EMPTY_RESPONSE in actions:
                self._event(conn, "response", request.api_key, corr,
                            Action.EMPTY_RESPONSE.value)
                frame = _without_records(request, corr, frame)
            frame = self._rewrite(request, corr, frame)
            writer.write(_SIZE.pack(len(frame)) + frame)
            await writer.drain()
            self._event(conn, "response", request.api_key, corr, "forwarded")

    def _rewrite(self, request: _Pending, corr: int, frame: bytes) -> bytes:
        """Point Metadata and FindCoordinator answers at the proxy."""
        if request.api_key not in (apis.METADATA, apis.FIND_COORDINATOR):
            return frame
        _, body = decode_response(request.api_key, request.api_version, frame)
        body = _point_at(body, *self.address)
        return encode_response(request.api_key, request.api_version, corr, body)[4:]


def _without_records(request: _Pending, corr: int, frame: bytes) -> bytes:
    """A Fetch answer with every partition's records taken out."""
    _, body = decode_response(request.api_key, request.api_version, frame)
    body = dataclasses.replace(body, responses=tuple(
        dataclasses.replace(topic, partitions=tuple(
            dataclasses.replace(p, records=None if p.records is None else b"")
            for p in topic.partitions))
        for topic in body.responses))
    return encode_response(request.api_key, request.api_version, corr, body)[4:]


def _point_at(entity: Any, host: str, port: int) -> Any:
    """A copy of a kio entity with every (host, port) pair replaced, recursively."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        if dataclasses.is_dataclass(value):
            changes[f.name] = _point_at(value, host, port)
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            changes[f.name] = tuple(_point_at(v, host, port) for v in value)
    names = {f.name for f in dataclasses.fields(entity)}
    if {"host", "port"} <= names and entity.port >= 0:
        changes.update(host=host, port=port)
    return dataclasses.replace(entity, **changes) if changes else entity


def _partitions_named(frame: bytes) -> set[tuple[str, int]]:
    try:
        request = decode_request(frame)
    except ProtocolError:
        return set()
    named = set()
    for topic in getattr(request.body, "topic_data", ()) or getattr(request.body, "topics", ()):
        name = getattr(topic, "name", None) or getattr(topic, "topic", None)
        for p in getattr(topic, "partition_data", ()) or getattr(topic, "partitions", ()):
            index = getattr(p, "index", None)
            if index is None:
                index = getattr(p, "partition", getattr(p, "partition_index", None))
            named.add((name, index))
    return named


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readexactly(4)
        (size,) = _SIZE.unpack(head)
        if not 0 <= size <= _MAX_FRAME:
            return None
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
