"""The broker process: the asyncio server, connections, dispatch, background duties.

Each connection answers its requests strictly in order (Kafka's rule for pipelined
requests): a request that must wait (a long-polling Fetch) holds back the ones behind it on
the same connection, never those on other connections.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import inspect
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..coordinator.producer_id_manager import ProducerIdManager
from ..metadata.store import NO_VERSION, BadVersion, LocalFileStore
from ..protocol import api_versions as apis
from ..protocol.messages import (
    FrameReader,
    ProtocolError,
    UnsupportedVersion,
    decode_request,
    encode_response,
)
from . import metrics
from .admin import handle_create_topics, handle_delete_topics, handle_describe_configs
from .api_meta import (
    handle_api_versions,
    handle_find_coordinator,
    handle_metadata,
    unsupported_api_versions_body,
)
from .config import BrokerConfig
from .counters import Counters
from .fetch import handle_fetch, handle_list_offsets
from .produce import CLOSE_CONNECTION, handle_produce
from .producer_ids import handle_describe_producers, handle_init_producer_id
from .topics import TopicManager

log = logging.getLogger(__name__)

METADATA_DIR = ".oncelog-metadata"
_CLOSE = CLOSE_CONNECTION
_MAX_QUEUED_REQUESTS = 64

HANDLERS: dict[int, Callable[[Any, Any], Any]] = {
    apis.PRODUCE: handle_produce,
    apis.FETCH: handle_fetch,
    apis.LIST_OFFSETS: handle_list_offsets,
    apis.METADATA: handle_metadata,
    apis.FIND_COORDINATOR: handle_find_coordinator,
    apis.API_VERSIONS_KEY: handle_api_versions,
    apis.CREATE_TOPICS: handle_create_topics,
    apis.DELETE_TOPICS: handle_delete_topics,
    apis.DESCRIBE_CONFIGS: handle_describe_configs,
    apis.INIT_PRODUCER_ID: handle_init_producer_id,
    apis.DESCRIBE_PRODUCERS: handle_describe_producers,
}
assert set(HANDLERS) == set(apis.SUPPORTED_VERSIONS), "every advertised API needs a handler"


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker_id: int = config.get("broker.id")
        os.makedirs(config.log_dir, exist_ok=True)
        self.store = LocalFileStore(os.path.join(config.log_dir, METADATA_DIR))
        self.cluster_id = self._cluster_id()
        self.producer_ids = ProducerIdManager(self.store, self.broker_id)
        self.topics = TopicManager(config, self.store, self.producer_ids)
        self.counters = Counters()
        self.advertised_host = ""
        self.advertised_port = -1
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[Connection] = set()
        self._tasks: list[asyncio.Task] = []
        self._stopped = asyncio.Event()

    def _cluster_id(self) -> str:
        value, _ = self.store.get("cluster/id")
        if value is None:
            value = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
            try:
                self.store.compare_and_set("cluster/id", value, NO_VERSION)
            except BadVersion:
                value, _ = self.store.get("cluster/id")
        return value

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        listener = self.config.listener
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self), listener.host, listener.port, reuse_address=True,
        )
        sock = self._server.sockets[0]
        host, port = sock.getsockname()[:2]
        advertised = self.config.advertised
        if advertised is not None:
            self.advertised_host, self.advertised_port = advertised.host, advertised.port
        else:
            self.advertised_host = host if host not in ("0.0.0.0", "::") else socket.gethostname()
            self.advertised_port = port
        self._tasks = [
            asyncio.create_task(self._every(self.config.get("log.retention.check.interval.ms"),
                                            self.apply_retention)),
            asyncio.create_task(self._every(self.config.get("log.flush.scheduler.interval.ms"),
                                            self.flush_by_time)),
            asyncio.create_task(self._every(
                self.config.get("producer.id.expiration.check.interval.ms"),
                self.expire_producers)),
        ]
        log.info("broker %d of cluster %s listening on %s:%d, advertising %s:%d, data in %s",
                 self.broker_id, self.cluster_id, host, port, self.advertised_host,
                 self.advertised_port, os.path.abspath(self.config.log_dir))
        return host, port

    async def _every(self, interval_ms: int, duty: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                duty()
            except Exception:
                log.exception("background duty %s failed", duty.__name__)

    def apply_retention(self) -> None:
        if self.topics.log_dir_state.offline:
            return
        now = int(time.time() * 1000)
        for partition in self._partitions_with_data():
            try:
                partition.apply_retention(now)
            except OSError as exc:
                log.error("%s: retention failed: %s", partition.name, exc)

    def expire_producers(self) -> None:
        now = int(time.time() * 1000)
        for partition in list(self.topics.open_partitions()):
            partition.expire_producers(now)

    def _partitions_with_data(self):
        for topic in list(self.topics.topics.values()):
            for partition in topic.partitions:
                if partition.holds_data():
                    yield partition

    def flush_by_time(self) -> None:
        now = int(time.time() * 1000)
        for partition in list(self.topics.open_partitions()):
            partition.flush_if_due(now)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.close()
        self.topics.close()
        log.info("broker %d stopped cleanly", self.broker_id)
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # --- requests ------------------------------------------------------------------------

    def handle_frame(self, frame: bytes, peer: str) -> Any:
        """bytes to send, None (no response), a coroutine giving either, or _CLOSE."""
        try:
            request = decode_request(frame)
        except UnsupportedVersion as exc:
            if exc.api_key == apis.API_VERSIONS_KEY:
                log.info("%s: ApiVersions v%d is newer than ours, answering v0", peer,
                         exc.api_version)
                return encode_response(apis.API_VERSIONS_KEY, 0, exc.correlation_id,
                                       unsupported_api_versions_body())
            log.warning("%s: %s; closing the connection", peer, exc)
            return _CLOSE
        except ProtocolError as exc:
            log.warning("%s: %s; closing the connection", peer, exc)
            return _CLOSE
        try:
            body = HANDLERS[request.api_key](self, request)
        except Exception:
            log.exception("%s: api key %d v%d failed; closing the connection", peer,
                          request.api_key, request.api_version)
            return _CLOSE
        if inspect.iscoroutine(body):
            return self._finish(request, body, peer)
        if body is None or body is _CLOSE or isinstance(body, bytes):  # none, close, encoded
            return body
        return encode_response(request.api_key, request.api_version, request.correlation_id,
                               body)

    async def _finish(self, request, pending, peer: str) -> Any:
        try:
            body = await pending
        except Exception:
            log.exception("%s: api key %d v%d failed; closing the connection", peer,
                          request.api_key, request.api_version)
            return _CLOSE
        if body is None or isinstance(body, bytes):  # no answer, or one already encoded
            return body
        return encode_response(request.api_key, request.api_version, request.correlation_id,
                               body)


class Connection(asyncio.BufferedProtocol):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.reader = FrameReader(broker.config.get("socket.request.max.bytes"))
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.queue: collections.deque[bytes | memoryview] = collections.deque()
        self.busy = False
        self.closed = False
        self.paused = False
        self.pending: asyncio.Future | None = None
        self.http: bytes | None = None  # set when the peer speaks HTTP (metrics), not Kafka
        self.seen_kafka = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.broker._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.queue.clear()
        self.broker._connections.discard(self)

    # Reading is BufferedProtocol's: the event loop receives into the FrameReader's memory
    # (a large frame's own buffer), not into bytes objects we would copy again.

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        reader = self.reader
        reader.received(nbytes)
        if self.http is not None:
            self._serve_http(reader.take_pending())
            return
        if not self.seen_kafka:
            if reader.buffered < 4:
                return  # too little to tell Kafka from HTTP
            if reader.pending()[:4] in metrics.HTTP_METHODS:
                self._serve_http(reader.take_pending())
                return
            self.seen_kafka = True
        try:
            frames = reader.frames()
        except ProtocolError as exc:
            log.warning("%s: %s; closing the connection", self.peer, exc)
            self.close()
            return
        if not frames:
            return
        self.queue.extend(frames)
        if len(self.queue) > _MAX_QUEUED_REQUESTS and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        if not self.busy:
            self._drain()

    def _serve_http(self, data: bytes) -> None:
        self.http = (self.http or b"") + data
        answer = metrics.http_response(self.http, self.broker)
        if answer is not None:
            self.transport.write(answer)
            self.close()

    def _drain(self) -> None:
        # Answers of one pass go out in one write: pipelined requests cost one send, not many.
        out: list[bytes] = []
        try:
            while self.queue and not self.closed:
                result = self.broker.handle_frame(self.queue.popleft(), self.peer)
                if inspect.iscoroutine(result):
                    self.busy = True
                    self.pending = asyncio.ensure_future(self._await(result))
                    return
                if result is _CLOSE:
                    self._flush(out)
                    self.close()
                    return
                if result is not None:
                    out.append(result)
        finally:
            self._flush(out)
        if self.paused and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def _flush(self, out: list[bytes]) -> None:
        if out and not self.closed:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()

    async def _await(self, pending) -> None:
        result = await pending
        self.busy = False
        if not self.closed:
            self._send(result)
            self._drain()

    def _send(self, result: Any) -> None:
        if result is _CLOSE:
            self.close()
        elif result is not None:
            self.transport.write(result)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def run_broker(config: BrokerConfig, on_started: Callable[[str, int], None] | None = None) -> None:
    """Run a broker until SIGINT or SIGTERM, then shut it down cleanly."""
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run

    async def main() -> None:
        broker = Broker(config)
        host, port = await broker.start()
        if on_started is not None:
            on_started(host, port)
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        await stopping.wait()
        await broker.stop()

    runner(main())
