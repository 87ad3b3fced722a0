"""The broker process: the asyncio server, connections, dispatch, background duties.

Each connection answers its requests strictly in order (Kafka's rule for pipelined
requests): a request that must wait (a long-polling Fetch) holds back the ones behind it on
the same connection, never those on other connections.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import inspect
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from types import CoroutineType
from typing import Any

from ..coordinator.producer_id_manager import ProducerIdManager, carry_over
from ..metadata.store import NO_VERSION, BadVersion, LocalFileStore
from ..protocol import api_versions as apis
from ..protocol.messages import (
    DECODED_BYTES_PER_ELEMENT,
    FrameReader,
    ProtocolError,
    UnsupportedVersion,
    decode_request,
    encode_response,
)
from ..protocol.spliced import SplicedAnswer, encode_spliced
from ..security.credentials import ScramCredentials
from . import dynamic_config, inter_broker, internal_topics, metrics
from .announce import listener_line, metrics_line
from .answers import CLOSE_CONNECTION, LaterAnswer, Throttled
from .apis.api_meta import unsupported_api_versions_body
from .apis.groups import make_coordinator
from .apis.produce import TxnVerifier
from .apis.registry import HANDLERS
from .apis.transactions import make_transaction_coordinator
from .authorize import make_authorizer
from .client_quotas import ClientQuotas, with_throttle
from .config import BrokerConfig
from .connection_limits import ConnectionLimits
from .counters import Counters
from .inter_broker import InterBrokerChannel
from .inter_broker_connect import inter_broker_security
from .listener_security import ListenerSecurity, certificate_principal, listener_securities
from .log_cleaner import LogCleaner
from .log_limits import RateLimitedLog, flush_rate_limited, log_safe
from .partition_opening import open_all
from .request_budget import RequestBudget
from .sasl_gate import SaslGate
from .session import PLAINTEXT_SESSION, Session
from .splice_sender import SpliceSender, write_answers
from .topics import INTERNAL_TOPICS, TopicManager
from .txn_verification import TxnVerification, local_verifier

log = logging.getLogger(__name__)
# Connections closed for what their client sent: one client reconnecting in a loop must not
# write a line each time.
_refused = RateLimitedLog(log)

METADATA_DIR = ".oncelog-metadata"
_CLOSE = CLOSE_CONNECTION
_NO_LIMIT = 1 << 62
# Per connection (see Connection): read-ahead beyond the request being handled, what it may
# have handled in one turn of the event loop, and the write buffer's water marks. A full
# receive buffer (256 KiB) of requests of 4 KiB or more fits the read-ahead, so pipelining
# producers keep one pass and one write per read, as before.
_READ_AHEAD_FRAMES = 64
_READ_AHEAD_BYTES = 1 << 20
_FRAMES_PER_TURN = 64
_BYTES_PER_TURN = 1 << 20
_WRITE_HIGH = 64 * 1024
_WRITE_LOW = 16 * 1024
# Answers a connection may hold behind a LaterAnswer (one waiting for its fsync) before it
# stops handling requests until the oldest is written.
_BEHIND_MOST = 64



class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker_id: int = config.get("broker.id")
        self.listeners = listener_securities(config)  # TLS files read here: ConfigError first
        # Cluster mode: how this broker reaches the others (inter_broker_connect.py), checked
        self.inter_broker_security = inter_broker_security(config) \
            if config.get("zookeeper.connect") is not None else None
        os.makedirs(config.log_dir, exist_ok=True)
        self.store = LocalFileStore(os.path.join(config.log_dir, METADATA_DIR))
        dynamic_config.load(self.store, config)  # AlterConfigs of earlier runs
        self.cluster = _join_cluster(config)  # None without zookeeper.connect
        try:
            self._build(config)
        except BaseException:
            # e.g. ClusterStartError from an internal topic's partition count: the ZooKeeper
            # session and the logs opened so far are closed, not left to the process's end
            self._close_unstarted()
            raise

    def _build(self, config: BrokerConfig) -> None:
        """What __init__ makes once the broker joined its cluster (if any)."""
        self.cluster_id = self._cluster_id()
        # In cluster mode the producer-id blocks are claimed in ZooKeeper, shared by all,
        # above any this broker claimed alone before.
        if self.cluster is not None:
            carry_over(self.store, self.cluster.store, self.broker_id)
        # SCRAM users: ZooKeeper's in a cluster, so every broker knows the same ones.
        self.credentials = ScramCredentials(self.store if self.cluster is None
                                            else self.cluster.store)
        self.producer_ids = ProducerIdManager(
            self.store if self.cluster is None else self.cluster.store, self.broker_id)
        self.topics = TopicManager(config, self.store, self.producer_ids)
        # None without authorizer.class.name: everything is allowed, as in Kafka.
        self.authorizer = make_authorizer(
            config, self.store if self.cluster is None else self.cluster.store,
            shared=self.cluster is not None)
        self.replicas = _replica_manager(self)  # None without zookeeper.connect
        # Cluster mode: topics come from ZooKeeper (cluster_mode.py); handlers take
        # ``cluster_topics or topics``.
        self.cluster_mode = _cluster_mode(self)
        self.cluster_topics = None if self.cluster_mode is None else self.cluster_mode.topics
        self.log_cleaner = LogCleaner(self.topics, config)
        self.topics.moves.cleaning = lambda: self.log_cleaner.cleaning_now
        self.groups = make_coordinator(config, self.topics, self)
        # Cluster mode: requests to the other brokers (markers, verification), and KIP-890
        # part 1 with the coordinator wherever it is.
        self.inter_broker = None if self.cluster is None else InterBrokerChannel(
            self.broker_id, inter_broker.opener(self))
        self.transactions = make_transaction_coordinator(self, config, self.topics)
        self.txn_verification = None if self.inter_broker is None else TxnVerification(
            self, self.inter_broker)
        if self.replicas is not None:  # coordinators follow their partitions' leadership
            self.replicas.on_leadership = internal_topics.on_leadership(self)
        # Asked before a transactional batch begins a transaction in a partition (KIP-890
        # part 1): the transaction coordinator's word.
        self.txn_verifier: TxnVerifier = local_verifier(self.transactions) \
            if self.txn_verification is None else self.txn_verification
        self.counters = Counters()
        # In a cluster the quotas are the cluster's (ZooKeeper's /config/users, /config/clients)
        self.quotas = ClientQuotas(config, self.store if self.cluster is None
                                   else self.cluster.store)
        self.connection_limits = ConnectionLimits(config)
        self.budget = RequestBudget(config.get("queued.max.requests"),
                                    config.get("queued.max.request.bytes"))
        self._offer_scheduled = False
        self.turn = 0
        self._turn_scheduled = False
        self.handling_now = self.handling_before = 0  # connections handling in this turn
        self.write_pauses = 0  # times a connection stopped because its answers were unread
        self.zero_copy_bytes = 0  # record bytes sent with sendfile (splice_sender.py)
        self.advertised_host = ""  # the first listener's (cluster registration, logs)
        self.advertised_port = -1
        self.advertised: dict[str, tuple[str, int]] = {}  # each listener's, by name
        self.bound: dict[str, tuple[str, int]] = {}
        self._servers: list[asyncio.base_events.Server] = []
        self.metrics: metrics.MetricsServer | None = None  # metrics.listener's
        self.metrics_address: tuple[str, int] | None = None
        self._connections: set[Connection] = set()
        self._tasks: list[asyncio.Task] = []
        self._stopped = asyncio.Event()

    def _close_unstarted(self) -> None:
        topics = getattr(self, "topics", None)
        if topics is not None:
            topics.close()
        if self.cluster is not None:
            self.cluster.close()

    def _cluster_id(self) -> str:
        value, _ = self.store.get("cluster/id")
        if value is None:
            value = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
            try:
                self.store.compare_and_set("cluster/id", value, NO_VERSION)
            except BadVersion:
                value, _ = self.store.get("cluster/id")
        # In cluster mode the first broker's id is everyone's (ZooKeeper's /cluster/id).
        return value if self.cluster is None else self.cluster.cluster_id(value)

    def cluster_brokers(self, listener: str | None = None, departed: bool = False
                        ) -> list[tuple[int, str, int, str | None]]:
        """(id, host, port, rack) of the cluster's brokers: every registered one in
        cluster mode (as registered), and with ``departed`` (Metadata's list) those that
        left a moment ago (cluster/departed_brokers.py); else this one on ``listener``."""
        if self.cluster is not None and self.cluster.brokers:
            brokers = self.cluster_mode.metadata_brokers() \
                if departed and self.cluster_mode is not None else self.cluster.brokers
            return [(b.broker_id, *b.endpoint(listener), b.rack) for b in brokers]
        return [(self.broker_id, *self.endpoint(listener), None)]

    def endpoint(self, listener: str | None = None) -> tuple[str, int]:
        """Where a client that came in on ``listener`` reaches this broker (its advertised
        address: each client is told the endpoints of its own listener)."""
        return self.advertised.get(listener or "", (self.advertised_host, self.advertised_port))

    def controller_id(self) -> int:
        """-1 while a cluster has no controller (Kafka's answer then)."""
        return self.broker_id if self.cluster is None else self.cluster.controller.controller_id

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        """Listen on every listener; (host, port) of the first."""
        loop = asyncio.get_running_loop()
        for listener in self.listeners:
            endpoint = listener.endpoint
            server = await loop.create_server(
                (lambda listener=listener: Connection(self, listener)), endpoint.host,
                endpoint.port, reuse_address=True, ssl=listener.ssl_context)
            self._servers.append(server)
            host, port = server.sockets[0].getsockname()[:2]
            self.bound[listener.name] = (host, port)
            advertised = self.config.advertised_listeners.get(listener.name)
            self.advertised[listener.name] = (advertised.host, advertised.port) if advertised \
                else (host if host not in ("0.0.0.0", "::") else socket.gethostname(), port)
        first = self.listeners[0].name
        host, port = self.bound[first]
        self.advertised_host, self.advertised_port = self.advertised[first]
        self._tasks = [
            asyncio.create_task(self._every(self.config.get("log.retention.check.interval.ms"),
                                            self.apply_retention)),
            asyncio.create_task(self._every(self.config.get("log.flush.scheduler.interval.ms"),
                                            self.flush_by_time)),
            asyncio.create_task(self._every(
                self.config.get("producer.id.expiration.check.interval.ms"),
                self.expire_producers)),
            asyncio.create_task(self._every(
                self.config.get("offsets.retention.check.interval.ms"),
                self.groups.expire_offsets)),
            asyncio.create_task(self._every(
                self.config.get("transaction.abort.timed.out.transaction.cleanup.interval.ms"),
                self.transactions.abort_timed_out)),
            asyncio.create_task(self._every(
                self.config.get("transaction.remove.expired.transaction.cleanup.interval.ms"),
                self.transactions.expire_ids)),
            asyncio.create_task(self._load_groups()),
            asyncio.create_task(self._every(10_000, flush_rate_limited)),
            asyncio.create_task(self._every(self.quotas.samples * self.quotas.window_ms,
                                            self.quotas.expire)),
            asyncio.create_task(self._every(self.connection_limits.idle_check_ms,
                                            self._close_idle)),
        ]
        if self.log_cleaner.enabled:
            self._tasks.append(asyncio.create_task(self.log_cleaner.run()))
        if self.quotas.in_cluster:
            self._tasks.append(asyncio.create_task(self._follow_quota_changes()))
        if self.authorizer is not None and self.cluster is not None:
            # the other brokers' ACL changes (this broker's own are seen at once)
            self._tasks.append(asyncio.create_task(self._every(1000, self.authorizer.refresh)))
        if self.cluster is not None:
            try:
                self.cluster.start(self.advertised_host, self.advertised_port, endpoints=tuple(
                    (e.name, *self.advertised[e.name], e.security_protocol)
                    for e in (listener.endpoint for listener in self.listeners)))
                self.replicas.start()
                self.cluster_mode.start()
            except Exception:
                await self.stop()  # closed as on SIGTERM, then the error is the exit
                raise
        metrics_at = self.config.metrics_listener
        if metrics_at is not None:
            self.metrics = metrics.MetricsServer(self)
            self.metrics_address = await self.metrics.start(metrics_at.host, metrics_at.port)
            log.info("metrics served at http://%s:%d/metrics", *self.metrics_address)
        log.info("broker %d of cluster %s listening on %s, data in %s", self.broker_id,
                 self.cluster_id, ", ".join(
                     f"{name} {h}:{p} (advertising {':'.join(map(str, self.advertised[name]))})"
                     for name, (h, p) in self.bound.items()), ", ".join(self.topics.log_dirs))
        return host, port

    async def _every(self, interval_ms: int, duty: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                duty()
            except Exception:
                log.exception("background duty %s failed", duty.__name__)

    async def _follow_quota_changes(self) -> None:
        while True:
            await asyncio.sleep(1)
            try:
                await self.quotas.follow_changes()
            except Exception:
                log.exception("following the cluster's client quota changes failed")

    async def _load_groups(self) -> None:
        # The internal partitions written before this start are recovered in worker
        # threads first, not on the loop by the coordinators' reads.
        await open_all(p for name in INTERNAL_TOPICS if (t := self.topics.get(name))
                       for p in t.partitions)
        # A load that fails is logged and retried (coordinator/ownership.py O12); each
        # guarded all the same, so that one coordinator's bug never stops the other's load.
        for coordinator in (self.groups, self.transactions):
            try:
                await coordinator.load_all()
            except Exception:
                log.exception("loading %s failed; its partitions answer NOT_COORDINATOR or "
                              "COORDINATOR_LOAD_IN_PROGRESS", type(coordinator).__name__)

    def apply_retention(self) -> None:
        now = int(time.time() * 1000)
        for partition in self._partitions_with_data():
            if partition.log_dir.offline:
                continue
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

    def _close_idle(self) -> None:
        for conn in self.connection_limits.idle(list(self._connections), time.monotonic()):
            log.info("%s: idle for more than connections.max.idle.ms (%d); closing it",
                     conn.peer, self.connection_limits.idle_ms)
            conn.close()

    def flush_by_time(self) -> None:
        now = int(time.time() * 1000)
        for partition in list(self.topics.open_partitions()):
            partition.flush_if_due(now)

    async def stop(self) -> None:
        if self.cluster_mode is not None:  # leaderships moved away while still serving
            if self.replicas is not None:
                await self.replicas.leave()
            await self.cluster_mode.controlled_shutdown()
        for task in self._tasks:
            task.cancel()
        for server in self._servers:
            server.close()
        if self.metrics is not None:
            self.metrics.close()
        for conn in list(self._connections):
            conn.close()
        self.transactions.close()
        if self.inter_broker is not None:
            self.inter_broker.close()
        self.groups.close()
        if self.replicas is not None:
            await self.replicas.close()
        self.topics.close()
        if self.cluster_mode is not None:
            self.cluster_mode.close()
        if self.cluster is not None:
            self.cluster.close()
        log.info("broker %d stopped cleanly", self.broker_id)
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # --- turns and the request budget ----------------------------------------------------

    def current_turn(self) -> int:
        """A number that changes once per turn of the event loop with work in it: the first
        caller in a turn schedules the change, which runs after the turn's socket reads.
        Connections count themselves in ``handling_now`` when they first handle requests in
        a turn."""
        if not self._turn_scheduled:
            self._turn_scheduled = True
            asyncio.get_running_loop().call_soon(self._next_turn)
        return self.turn

    def _next_turn(self) -> None:
        self._turn_scheduled = False
        self.turn += 1
        self.handling_before, self.handling_now = self.handling_now, 0

    def budget_released(self) -> None:
        """Offer freed room to the connections waiting for it, in their order, once the
        current callback is done (never from inside another connection's pass)."""
        if not self._offer_scheduled and self.budget.should_offer():
            self._offer_scheduled = True
            asyncio.get_running_loop().call_soon(self._offer_room)

    def _offer_room(self) -> None:
        self._offer_scheduled = False
        while (conn := self.budget.offer()) is not None:
            conn.pump()

    def network_stats(self) -> dict[str, int]:
        """What /metrics reports about connections and the memory they hold."""
        conns = list(self._connections)  # one step: the metrics thread asks
        return {
            "connections": len(conns),
            "queued_requests": self.budget.requests,
            "queued_request_bytes": self.budget.bytes,
            "unsent_response_bytes": sum(c.transport.get_write_buffer_size() for c in conns
                                         if c.transport is not None and not c.closed),
            "waiting_answers_unread": sum(1 for c in conns if c.write_paused and not c.closed),
            "waiting_request_budget": self.budget.waiting,
            "request_budget_refusals": self.budget.refusals,
            "write_pauses": self.write_pauses,
            "throttled_answers": self.quotas.throttled,
            "connections_throttled": sum(1 for c in conns if c.muted and not c.closed),
            "connections_refused": self.connection_limits.refused,
            "connections_delayed": self.connection_limits.delayed,
            "zero_copy_bytes": self.zero_copy_bytes,
        }

    # --- requests ------------------------------------------------------------------------

    def handle_frame(self, frame: bytes, peer: str, session: Session = PLAINTEXT_SESSION) -> Any:
        """bytes to send, None (no response), a coroutine giving either, a LaterAnswer, or
        _CLOSE, any of these but a coroutine wrapped in Throttled (see answers.py)."""
        try:
            request = decode_request(frame, peer, session)
        except UnsupportedVersion as exc:
            if exc.api_key == apis.API_VERSIONS_KEY:
                log.info("%s: ApiVersions v%d is newer than ours, answering v0", peer,
                         exc.api_version)
                return encode_response(apis.API_VERSIONS_KEY, 0, exc.correlation_id,
                                       unsupported_api_versions_body())
            _refused.log(logging.WARNING, "unsupported version",
                         "%s: %s; closing the connection", peer, log_safe(exc))
            return _CLOSE
        except ProtocolError as exc:
            _refused.log(logging.WARNING, "malformed request", "%s: %s; closing the connection",
                         peer, log_safe(exc))
            return _CLOSE
        if self.quotas.active:
            return self._answer_within_quotas(request, peer)
        return self._answer(request, peer)

    def _answer_within_quotas(self, request, peer: str) -> Any:
        """_answer, the request measured against its client's quotas (client_quotas.py);
        Throttled when it is over one."""
        quotas = self.quotas
        throttle = quotas.before(request)
        if throttle:
            request = dataclasses.replace(request, throttle_ms=throttle)
        if quotas.time_measured:
            started = time.perf_counter_ns()
            result = self._answer(request, peer)
            quotas.handled(request, time.perf_counter_ns() - started)
        else:
            result = self._answer(request, peer)
        mutated = quotas.take_mutation_throttle()  # controller_mutation_rate (in the answer)
        if mutated and inspect.iscoroutine(result):
            return self._muted_when_done(result, mutated)
        throttle = max(throttle, mutated)
        if not throttle or inspect.iscoroutine(result) or result is _CLOSE:
            return result  # a coroutine's answer is throttled when it is done (_finish)
        quotas.throttled += 1
        return Throttled(result, throttle)

    async def _muted_when_done(self, pending, throttle: int) -> Any:
        """A waiting handler's answer, its connection muted for ``throttle`` ms after it."""
        frame = await pending
        if frame is _CLOSE:
            return frame
        if isinstance(frame, Throttled):
            frame.ms = max(frame.ms, throttle)
            return frame
        self.quotas.throttled += 1
        return Throttled(frame, throttle)

    def _answer(self, request, peer: str) -> Any:
        try:
            body = HANDLERS[request.api_key](self, request)
        except Exception:
            log.exception("%s: api key %d v%d failed; closing the connection", peer,
                          request.api_key, request.api_version)
            return _CLOSE
        if isinstance(body, CoroutineType):  # (inspect.iscoroutine, without a call)
            return self._finish(request, body, peer)
        if body is None or body is _CLOSE or isinstance(body, (bytes, LaterAnswer,
                                                               SplicedAnswer)):
            return body  # no answer, close, an answer already encoded or one to come
        return _encoded(request, body, peer, self._answer_limit(request))

    async def _finish(self, request, pending, peer: str) -> Any:
        # A handler that waits (a long-polling Fetch, a JoinGroup) keeps its decoded request
        # meanwhile: that counts against the request budget as its frame does.
        decoded = request.elements * DECODED_BYTES_PER_ELEMENT
        self.budget.take(decoded)
        try:
            body = await pending
        except Exception:
            log.exception("%s: api key %d v%d failed; closing the connection", peer,
                          request.api_key, request.api_version)
            return _CLOSE
        finally:
            self.budget.finished(decoded)
            self.budget_released()
        if body is None or body is _CLOSE or isinstance(body, (bytes, SplicedAnswer)):
            frame = body  # see handle_frame
        else:
            if request.api_key == apis.FETCH and self.quotas.active:
                body, throttle = self.quotas.fetched(request, body)
                if throttle != request.throttle_ms:
                    request = dataclasses.replace(request, throttle_ms=throttle)
            frame = _encoded(request, body, peer, self._answer_limit(request))
        if request.throttle_ms and frame is not _CLOSE:
            self.quotas.throttled += 1
            return Throttled(frame, request.throttle_ms)
        return frame

    def _answer_limit(self, request) -> int:
        """The largest answer sent: a frame either way is at most socket.request.max.bytes,
        but for Fetch, whose answers fetch.max.bytes bounds (one batch more at most, or a
        consumer could never read past a batch that large)."""
        if request.api_key == apis.FETCH:
            return _NO_LIMIT
        return self.config.get("socket.request.max.bytes")


def _encoded(request, body, peer: str, limit: int) -> Any:
    """The answer's frame; an answer that cannot be encoded (a handler's bug) closes the
    connection with the traceback logged, as a handler that raised does, and so does one
    larger than ``limit`` (with a log line): no connection holds an answer past it unsent."""
    if request.throttle_ms:
        body = with_throttle(body, request.throttle_ms)
    try:
        # A Fetch answer's records may be regions of segment files, sent with sendfile.
        encode = encode_spliced if request.api_key == apis.FETCH else encode_response
        frame = encode(request.api_key, request.api_version, request.correlation_id, body)
    except Exception:
        log.exception("%s: api key %d v%d: the answer could not be encoded; closing the "
                      "connection", peer, request.api_key, request.api_version)
        return _CLOSE
    if len(frame) - 4 > limit:
        _refused.log(logging.WARNING, "answer too large",
                     "%s: the answer to api key %d v%d is %d bytes, more than "
                     "socket.request.max.bytes (%d); closing the connection", peer,
                     request.api_key, request.api_version, len(frame) - 4, limit)
        return _CLOSE
    return frame


class Connection(asyncio.BufferedProtocol):
    """One client connection: frames in, answers out, strictly in order.

    Memory it may hold, and why it is bounded (Kafka's network thread does the same by
    muting a channel):

    * frames taken off the wire and not yet handled: a frame is taken on only with the
      broker's RequestBudget's consent; beyond the one being handled, at most
      ``_READ_AHEAD_FRAMES`` frames and ``_READ_AHEAD_BYTES`` bytes are read ahead, except
      that a connection with nothing queued may always start one frame (any size up to
      ``socket.request.max.bytes``). What is refused stays in the kernel and the receive
      buffer, and reading pauses. The frames read ahead count against
      ``queued.max.requests`` only while nothing but the broker holds them up (``counted``;
      see RequestBudget), and their bytes always.
    * answers the peer has not read: above the transport's high-water mark
      (``_WRITE_HIGH``) the connection handles nothing more and reads nothing more until the
      transport has drained to its low-water mark. A pass writes its answers once they
      reach ``_WRITE_HIGH``, so unread answers stay under twice ``_WRITE_HIGH`` plus one
      answer.

    Answers to come (answers.LaterAnswer: a produce whose answer waits for its fsync) do not
    stop the requests behind them from being handled, so one fsync covers the batches of
    several pipelined requests; every answer from the first of them on waits in ``behind``
    and is written in order once the ones before it are (at most ``_BEHIND_MOST``).

    Fairness: once a connection has handled ``_FRAMES_PER_TURN`` frames or
    ``_BYTES_PER_TURN`` bytes of requests in one turn of the event loop (one round of socket
    reads, see Broker.current_turn), it stops reading and handling until the next turn (so
    at most one read-ahead's worth more), unless no other connection handled requests in
    this turn or the one before. The event loop reads a socket up to 32 times in a
    row when data keeps coming, so without this a connection that floods would get many
    megabytes handled for each request of a client that does not.
    """

    def __init__(self, broker: Broker, listener: ListenerSecurity) -> None:
        self.broker = broker
        self.listener = listener
        self.budget = broker.budget
        self.reader = FrameReader(broker.config.get("socket.request.max.bytes"))
        # Where each frame goes: the broker, or a SASL listener's gate until authenticated.
        self.handle: Callable[[Any, str, Session], Any] = broker.handle_frame
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.queue: collections.deque[bytes | memoryview] = collections.deque()
        self.ahead_count = 0  # frames taken on and not yet handed to a handler (queued, or
        self.ahead_bytes = 0  # a large one still being received), and their bytes
        self.counted = 0  # of those, the ones in the budget's count (see RequestBudget)
        self.busy = False  # a handler's coroutine is running; what follows waits for it
        # Answers in order behind a LaterAnswer: LaterAnswers, answers ready, and _CLOSE
        # (then ``closing``: nothing more is handled).
        self.behind: collections.deque = collections.deque()
        self.closing = False
        self.closed = False
        self.write_paused = False  # the peer is not reading our answers
        self.reading_paused = False
        self.pass_scheduled = False
        self.turn = -1  # the broker's turn this connection last handled requests in
        self.turn_frames = self.turn_bytes = 0  # and what it handled in it
        self.pending: asyncio.Future | None = None
        self.session = PLAINTEXT_SESSION  # who the peer is (authentication replaces it)
        self.muted = False  # over a quota: nothing read or handled until the timer ends it
        self._unmute: asyncio.TimerHandle | None = None
        self.last_active = time.monotonic()  # last read or write (connections.max.idle.ms)
        self.ip: str | None = None  # counted in the broker's ConnectionLimits while set
        # Writes answers holding file regions (zero-copy Fetch), and every answer while it
        # holds any: see splice_sender.py.
        self.splicer: SpliceSender | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        refused = self.broker.connection_limits.admit(peer[0] if peer else "?")
        if refused:
            _refused.log(logging.WARNING, "too many connections", "%s: %s; closing the "
                         "connection", self.peer, refused)
            self.close()
            return
        self.ip = peer[0] if peer else "?"
        throttle = self.broker.quotas.connection_throttle(self.ip)
        if throttle:
            _refused.log(logging.WARNING, "connection rate", "%s: over its address's "
                         "connection_creation_rate; closing it in %d ms", self.peer, throttle)
            transport.pause_reading()
            self.closing = True
            self._unmute = asyncio.get_running_loop().call_later(throttle / 1000, self.close)
            self.broker._connections.add(self)
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport.set_write_buffer_limits(high=_WRITE_HIGH, low=_WRITE_LOW)
        self.broker._connections.add(self)
        listener = self.listener
        endpoint = listener.endpoint
        # TLS is done by now: a client certificate names the principal (SSL listeners).
        principal = certificate_principal(transport.get_extra_info("peercert"),
                                          listener.principal_rules) \
            if endpoint.tls and not endpoint.sasl else PLAINTEXT_SESSION.principal
        if principal is None:
            _refused.log(logging.WARNING, "no principal mapping rule", "%s: listener %s: no "
                         "ssl.principal.mapping.rules rule applies to the client certificate's "
                         "subject; closing the connection", self.peer, endpoint.name)
            self.close()
            return
        self.session = Session(principal, endpoint.name, endpoint.security_protocol)
        if principal is not PLAINTEXT_SESSION.principal and not endpoint.sasl:
            log.info("%s: authenticated as %s by its certificate on listener %s", self.peer,
                     log_safe(principal), endpoint.name)
        if endpoint.sasl:
            self.handle = SaslGate(self, listener, self.broker.credentials).handle
            # Kafka's bound on what an unauthenticated client may make the broker hold.
            self.reader._max_size = min(listener.max_receive,
                                        self.broker.config.get("socket.request.max.bytes"))
        # KIP-612: over a connection creation rate, served only once the throttle ends
        delay = self.broker.connection_limits.creation_delay(
            endpoint.name, time.monotonic_ns() // 1_000_000)
        if delay:
            _refused.log(logging.INFO, "connection creation rate", "%s: over listener %s's "
                         "connection creation rate; served in %d ms", self.peer, endpoint.name,
                         delay)
            self._mute_after(Throttled(None, delay))

    def authenticated(self, principal) -> None:
        """The SASL exchange is done: from the next frame on, the broker's as any other."""
        self.session = Session(principal, self.session.listener, self.session.security_protocol)
        self.handle = self.broker.handle_frame
        self.reader._max_size = self.broker.config.get("socket.request.max.bytes")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.ip is not None:
            self.broker.connection_limits.release(self.ip)
            self.ip = None
        if self._unmute is not None:
            self._unmute.cancel()
        self.queue.clear()
        self.behind.clear()
        if self.splicer is not None:
            self.splicer.drop()
        broker = self.broker
        self.budget.count(-self.counted)
        self.budget.finished(self.ahead_bytes)
        self.ahead_count = self.ahead_bytes = self.counted = 0
        self.budget.forget(self)
        broker._connections.discard(self)
        broker.budget_released()

    # Reading is BufferedProtocol's: the event loop receives into the FrameReader's memory
    # (a large frame's own buffer), not into bytes objects we would copy again.

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        reader = self.reader
        reader.received(nbytes)
        self.last_active = time.monotonic()
        self.pump()

    # --- the pass: take frames on, handle them, decide about reading ----------------------

    def pump(self) -> None:
        """Take on what may be taken, handle it, then settle the count and reading."""
        while not self.closed:
            if not self._take_frames():
                return
            if not self.queue or self.held_up or self.write_paused or self.pass_scheduled:
                break
            if self._turn_spent():
                self._schedule_pass()  # the others' turn first
                break
            self._handle_queued()
            if not self.reader.held_back:
                break  # everything received was taken on: nothing more to take now
        if self.closed:
            return
        waits_for_broker = 0 if self.held_up or self.write_paused else self.ahead_count
        if waits_for_broker != self.counted:
            self.budget.count(waits_for_broker - self.counted)
            self.counted = waits_for_broker
            self.broker.budget_released()
        if self.reader.held_back and not (self.held_up or self.write_paused or self.queue
                                          or self.budget.is_waiting(self)):
            self._schedule_pass()  # room was made: take the rest on after the others' turn
        self._set_reading(not (self.write_paused or self.reader.held_back
                               or self.pass_scheduled or self.muted))

    @property
    def held_up(self) -> bool:
        """Handling waits: for a handler's coroutine, for answers behind it, to close, or for
        a quota's throttle to end."""
        return self.busy or self.closing or self.muted or len(self.behind) >= _BEHIND_MOST

    def _turn_spent(self) -> bool:
        """Whether this connection had its share of the current turn of the event loop (a
        connection alone has it all: yielding would only cost it)."""
        broker = self.broker
        turn = broker.current_turn()
        if turn != self.turn:
            self.turn = turn
            self.turn_frames = self.turn_bytes = 0
            broker.handling_now += 1
            return False
        return (self.turn_frames >= _FRAMES_PER_TURN or self.turn_bytes >= _BYTES_PER_TURN) \
            and max(broker.handling_now, broker.handling_before) > 1

    def _schedule_pass(self) -> None:
        if not self.pass_scheduled:
            self.pass_scheduled = True
            asyncio.get_running_loop().call_soon(self._pass)

    def _pass(self) -> None:
        self.pass_scheduled = False
        self.pump()

    def _take_frames(self) -> bool:
        """Cut what may be taken on into the queue; False when the connection closed.

        First within what the read-ahead and the budget's room allow without asking (the
        hot path: no call per frame), then, if frames were left, frame by frame."""
        if self.write_paused:
            return True
        reader = self.reader
        room_frames, room_bytes = self.budget.room(self)
        try:
            frames = reader.frames(min(room_frames, _READ_AHEAD_FRAMES - self.ahead_count),
                                   min(room_bytes, _READ_AHEAD_BYTES - self.ahead_bytes))
            taken, taken_bytes = reader.free_used
            if taken:
                self.ahead_count += taken
                self.ahead_bytes += taken_bytes
                self.budget.take(taken_bytes)
            if reader.held_back:
                frames += reader.frames(0, 0, self._admit)
        except ProtocolError as exc:
            _refused.log(logging.WARNING, "malformed frame", "%s: %s; closing the connection",
                         self.peer, log_safe(exc))
            self.close()
            return False
        if frames:
            self.queue.extend(frames)
        return True

    def _admit(self, size: int) -> bool:
        ahead = self.ahead_count
        if (ahead or self.held_up or self.write_paused) and (
                self.write_paused or ahead >= _READ_AHEAD_FRAMES
                or self.ahead_bytes + size > _READ_AHEAD_BYTES):
            return False
        if not self.budget.admit(self, size):
            self.broker.budget_released()  # in case room is there and others go first
            return False
        self.ahead_count += 1
        self.ahead_bytes += size
        return True

    def _handle_queued(self) -> int:
        """Handle queued frames in order until one must be awaited or answers pile up.
        Answers of one pass go out in one write: pipelined requests cost one send, not many.
        This is the hot path of every request: the counts are settled once per pass (nothing
        else runs meanwhile), and only what can change inside the loop is checked there."""
        if self.held_up or self.write_paused or self.closed:
            return 0
        broker = self.broker
        queue = self.queue
        behind = self.behind
        before = len(queue)
        out: list[bytes] = []
        unsent = taken_bytes = awaited = 0
        try:
            while queue and not self.muted:
                size = len(queue[0])
                taken_bytes += size
                result = self.handle(queue.popleft(), self.peer, self.session)
                if type(result) is Throttled:
                    result = self._mute_after(result)
                if isinstance(result, CoroutineType):  # (inspect.iscoroutine, without a call)
                    self.busy = True
                    self.pending = asyncio.ensure_future(self._await(result, size))
                    awaited = size
                    break
                if isinstance(result, LaterAnswer):
                    self._flush(out)  # the answers before it go first
                    unsent = 0
                    behind.append(result)
                    result.on_ready(self._answer_ready)
                    if len(behind) >= _BEHIND_MOST:
                        break
                    continue
                if result is _CLOSE:
                    self._flush(out)
                    if behind:  # after the answers it came behind
                        behind.append(_CLOSE)
                        self.closing = True
                    else:
                        self.close()  # connection_lost comes later, from the event loop
                    break
                if behind:
                    if result is not None:
                        behind.append(result)
                    continue
                if result is not None:
                    out.append(result)
                    unsent += len(result)
                    if unsent >= _WRITE_HIGH:
                        self._flush(out)
                        unsent = 0
                        if self.write_paused:
                            break
        finally:
            self._flush(out)
            taken = before - len(queue)
            self.ahead_count -= taken
            self.ahead_bytes -= taken_bytes
            self.turn_frames += taken
            self.turn_bytes += taken_bytes
            self.budget.finished(taken_bytes - awaited)
            broker.budget_released()  # the count is settled at the end of the pump
        return taken

    def _flush(self, out: list) -> None:
        if out and not self.closed:
            splicer = self.splicer
            if splicer is not None and splicer.busy:
                splicer.write(out)
            else:
                try:
                    data = b"".join(out)  # one bytes: itself, not a copy
                except TypeError:  # a SplicedAnswer among them
                    write_answers(self, out)
                else:
                    self.transport.write(data)
            self.last_active = time.monotonic()
        out.clear()

    def _mute_after(self, throttled: Throttled) -> Any:
        """KIP-219: the answer goes out now, then nothing more is read or handled for the
        throttle time (clients back off for it themselves; one that does not gets no answers
        meanwhile)."""
        if not self.closed:
            self.muted = True
            if self._unmute is not None:
                self._unmute.cancel()
            self._unmute = asyncio.get_running_loop().call_later(throttled.ms / 1000,
                                                                 self._unmuted)
        return throttled.answer

    def _unmuted(self) -> None:
        self._unmute = None
        self.muted = False
        if not self.closed:
            self.pump()

    @property
    def idle(self) -> bool:
        """Nothing going on but waiting for the peer (what connections.max.idle.ms ends)."""
        return not (self.busy or self.behind or self.muted or self.queue or self.closed)

    async def _await(self, pending, size: int) -> None:
        try:
            result = await pending
        finally:
            self.busy = False
            self.pending = None
            self.budget.finished(size)
            self.broker.budget_released()
        if type(result) is Throttled:
            result = self._mute_after(result)
        if not self.closed:
            self._send(result)
            self.pump()

    def _send(self, result: Any) -> None:
        if self.behind:
            self.behind.append(result)
            self._answer_ready()
        elif result is _CLOSE:
            self.close()
        elif result is not None:
            self._flush([result])

    def _answer_ready(self) -> None:
        """Write the answers at the head of ``behind`` that are ready, in order."""
        if self.closed:
            return
        behind = self.behind
        out: list[bytes] = []
        while behind:
            head = behind[0]
            if isinstance(head, LaterAnswer):
                if not head.ready:
                    break
                head = head.answer
            behind.popleft()
            if head is _CLOSE:
                self._flush(out)
                self.close()
                return
            if head is not None:
                out.append(head)
        self._flush(out)
        if not self.closed and not self.busy:
            self.pump()

    # --- flow control ----------------------------------------------------------------------

    def pause_writing(self) -> None:
        self.write_paused = True
        self.broker.write_pauses += 1
        self._set_reading(False)

    def resume_writing(self) -> None:
        if self.splicer is not None and self.splicer.busy:
            return  # the transport drained; the splicer has not: it resumes when it has
        self.write_paused = False
        self.pump()

    def _set_reading(self, wanted: bool) -> None:
        if self.closed or wanted != self.reading_paused:
            return
        self.reading_paused = not wanted
        if wanted:
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()

    def close(self) -> None:
        self.closed = True
        if self.splicer is not None and self.splicer.busy:
            self.splicer.close_when_done = True  # after the answers it holds, as transport's
        elif self.transport is not None:
            self.transport.close()


def _log_pending_tasks() -> None:
    """SIGUSR1: every task the broker is waiting on, with the whole chain of coroutines it
    waits in (a request that never gets its answer shows here)."""
    tasks = asyncio.all_tasks()
    log.warning("SIGUSR1: %d tasks pending", len(tasks))
    for task in tasks:
        chain = []
        awaited: Any = task.get_coro()
        while awaited is not None and len(chain) < 20:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None:
                chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} "
                             f"{frame.f_code.co_name}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        if awaited is not None:
            chain.append(repr(awaited))
        log.warning("task %s waits in:\n  %s", task.get_name(), "\n  ".join(chain))


def _join_cluster(config: BrokerConfig):
    """The broker's ClusterMember when zookeeper.connect is set (cluster/), else None; kazoo
    is imported only then."""
    if config.get("zookeeper.connect") is None:
        return None
    from ..cluster.membership import ClusterMember

    return ClusterMember.connect(
        config.get("zookeeper.connect"), config.get("zookeeper.session.timeout.ms"),
        config.get("zookeeper.connection.timeout.ms"), config.get("broker.id"),
        config.get("broker.rack"))


def _cluster_mode(broker: Broker):
    if broker.cluster is None:
        return None
    from .cluster_mode import ClusterMode

    return ClusterMode(broker)
def _replica_manager(broker: Broker):
    """The broker's ReplicaManager in cluster mode (broker/replica_manager.py), else None."""
    if broker.cluster is None:
        return None
    from .replica_manager import ReplicaManager

    return ReplicaManager(broker)


def run_broker(config: BrokerConfig, on_started: Callable[[str, int], None] | None = None) -> None:
    """Run a broker until SIGINT or SIGTERM, then shut it down cleanly."""
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run

    async def main() -> None:
        # The handlers come first: a SIGTERM sent the moment the broker says it listens (or
        # while it starts) stops it cleanly, never by the signal's default action.
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        loop.add_signal_handler(signal.SIGUSR1, _log_pending_tasks)
        broker = Broker(config)
        host, port = await broker.start()
        if on_started is not None and broker.metrics_address is not None:
            print(metrics_line(*broker.metrics_address), flush=True)  # before the Kafka line
        if on_started is not None:
            for name, (bound_host, bound_port) in broker.bound.items():
                print(listener_line(name, bound_host, bound_port), flush=True)
            on_started(host, port)
        await stopping.wait()
        await broker.stop()

    runner(main())
