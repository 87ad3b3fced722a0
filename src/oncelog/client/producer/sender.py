"""The Sender: drains ready batches into Produce requests and acts on the answers.

It runs as an asyncio task: in the caller's event loop for oncelog.AIOProducer, in a
background thread's loop for oncelog.Producer. This module does the I/O; what becomes of a
batch once sent, answered, lost or looked up is Delivery's (delivery.py), which asks
IdempotenceManager (idempotence.py) for every sequence decision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol import produce_request, produce_response
from ...protocol.schema import build
from ..metrics import StatsTimer
from ..network import calls
from ..network.aio_connection import AsyncBrokerConnection
from ..network.connection import KafkaError, ProducerFatalError, RequestNotSent, parse_bootstrap
from ..topic_partition import TopicPartition
from .accumulator import RecordAccumulator
from .delivery import Delivery
from .idempotence import IdempotenceManager
from .producer_batch import ProducerBatch
from .producer_config import ProducerConfig
from .transactions import TransactionManager
from .txn_requests import TransactionalRequests

log = logging.getLogger(__name__)

_LEADER_ERRORS = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available,
                            ErrorCode.unknown_topic_or_partition, ErrorCode.fenced_leader_epoch,
                            ErrorCode.unknown_leader_epoch, ErrorCode.kafka_storage_error})
_METADATA = -1  # the key of the connection used for metadata and InitProducerId


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class Sender:
    def __init__(self, config: ProducerConfig, accumulator: RecordAccumulator,
                 idempotence: IdempotenceManager,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.acc = accumulator
        self.idem = idempotence
        self.clock = clock
        self.delivery = Delivery(config, accumulator, idempotence, clock)
        self.metrics = self.delivery.metrics
        self.stats = StatsTimer(self.metrics, config.client_id, config.statistics_interval_ms,
                                config.stats_cb)
        self._stats_task: asyncio.Task | None = None
        # A transactional producer's state and its coordinator requests (transactions.py,
        # txn_requests.py); None otherwise.
        self.txn: TransactionManager | None = None
        self.txn_io: TransactionalRequests | None = None
        if config.transactional_id is not None:
            self.txn = TransactionManager(config.transactional_id,
                                          config.transaction_timeout_ms, config.two_phase)
            self.txn_io = TransactionalRequests(self, self.txn)
            self.txn.on_fatal = self._txn_fatal
            self.delivery.on_failed = lambda batch, error: self.txn.batch_failed(error)
        self.brokers: dict[int, tuple[str, int]] = {}
        self.leaders: dict[TopicPartition, int] = {}
        self.partition_counts = accumulator.partition_counts  # produce() reads it too
        self.connections: dict[int, AsyncBrokerConnection] = {}
        self._connecting: dict[int, asyncio.Task] = {}
        self._node_retry_at: dict[int, float] = {}
        self._metadata_lock: asyncio.Lock | None = None
        self._metadata_task: asyncio.Task | None = None
        self._metadata_at = 0.0
        self._stale_topics: set[str] = set()
        self._woken = False
        self._waiter: asyncio.Future | None = None
        self.closing = False
        self.requests_in_flight = 0
        self._lookups: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the one start() ran in

    @property
    def fatal(self) -> KafkaError | None:
        """The error that stopped this producer, which every later produce() raises."""
        return self.delivery.fatal

    @fatal.setter
    def fatal(self, error: KafkaError | None) -> None:
        self.delivery.fatal = error

    # --- start-up ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._metadata_lock = asyncio.Lock()
        if self.stats.enabled:
            self._stats_task = self._loop.create_task(self._emit_stats())
        await self._refresh_metadata([])
        # A transactional producer gets its identity from init_transactions().
        if self.config.idempotence and not self.idem.has_identity and self.txn is None:
            await self._init_producer_id()

    async def _emit_stats(self) -> None:
        """stats_cb every statistics.interval.ms, on the sender's loop (as on_delivery)."""
        while True:
            await asyncio.sleep(self.stats.interval)
            self.stats.emit()

    def _txn_fatal(self, error: KafkaError) -> None:
        """The transaction manager stopped the producer: every later produce() raises."""
        if self.fatal is None:
            self.fatal = error
        self.acc.wake()

    async def _control(self) -> AsyncBrokerConnection:
        """A connection for metadata and InitProducerId: any broker, bootstrap ones first."""
        conn = self.connections.get(_METADATA)
        if conn is not None and not conn.closed:
            return conn
        candidates = parse_bootstrap(self.config.bootstrap_servers) + list(
            self.brokers.values())
        last: Exception | None = None
        for host, port in candidates:
            try:
                conn = await AsyncBrokerConnection.open(host, port, self.config.client_id,
                                                        self.config.request_timeout,
                                                        self.config.security)
            except KafkaError as exc:
                last = exc
                continue
            self.connections[_METADATA] = conn
            return conn
        raise last or KafkaError(ErrorCode.network_exception, "no bootstrap server")

    async def _control_call(self, api_key: int, make) -> object:
        conn = await self._control()
        try:
            return await conn.request(api_key, make)
        except KafkaError:
            conn.close()
            raise

    async def _init_producer_id(self) -> None:
        def make(mod, version):
            return calls.init_producer_id_request(mod)

        deadline = self.clock() + self.config.max_block
        while True:
            try:
                response = await self._control_call(apis.INIT_PRODUCER_ID, make)
                error = ErrorCode(response.error_code)
                if error == ErrorCode.none:
                    self.idem.set_identity(response.producer_id, response.producer_epoch)
                    log.debug("producer id %d epoch %d", response.producer_id,
                              response.producer_epoch)
                    return
                exc = KafkaError(error, "InitProducerId")
                if not error.retriable:
                    raise exc
            except KafkaError as exc_:
                exc = exc_
            if self.clock() >= deadline:
                raise exc
            await asyncio.sleep(self.config.retry_backoff)

    # --- metadata ---------------------------------------------------------------------------

    async def partitions_for(self, topic: str) -> int:
        """How many partitions ``topic`` has (asking the cluster, which may create it)."""
        count = self.partition_counts.get(topic)
        if count is not None:
            return count
        deadline = self.clock() + self.config.max_block
        while True:
            try:
                await self._refresh_metadata([topic])
            except KafkaError as exc:
                if self.clock() >= deadline or not exc.error.retriable:
                    raise
            count = self.partition_counts.get(topic)
            if count is not None:
                return count
            if self.clock() >= deadline:
                raise KafkaError(ErrorCode.unknown_topic_or_partition,
                                 f"topic {topic!r} not known within max.block.ms")
            await asyncio.sleep(self.config.retry_backoff)

    async def _refresh_metadata(self, topics: list[str]) -> None:
        assert self._metadata_lock is not None
        async with self._metadata_lock:
            wanted = sorted(set(topics) | set(self.partition_counts) | self._stale_topics)

            def make(mod, version):
                return build(mod.MetadataRequest, topics=tuple(
                    build(mod.MetadataRequestTopic, name=t, topic_id=None) for t in wanted),
                    allow_auto_topic_creation=True, include_topic_authorized_operations=False,
                    include_cluster_authorized_operations=False)

            response = await self._control_call(apis.METADATA, make)
            self._metadata_at = self.clock()
            self.brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
            for t in response.topics:
                error = ErrorCode(t.error_code)
                if error != ErrorCode.none:
                    if not error.retriable:
                        raise KafkaError(error, f"topic {t.name!r}")
                    continue
                self._stale_topics.discard(t.name)
                self.partition_counts[t.name] = len(t.partitions)
                for p in t.partitions:
                    if p.leader_id >= 0:
                        self.leaders[(t.name, p.partition_index)] = p.leader_id
                    else:
                        self.leaders.pop((t.name, p.partition_index), None)

    def _want_metadata(self, topic: str | None = None) -> None:
        if topic is not None:
            self._stale_topics.add(topic)
        if self._metadata_task is None or self._metadata_task.done():
            self._metadata_task = asyncio.get_running_loop().create_task(
                self._background_metadata())

    async def _background_metadata(self) -> None:
        try:
            await asyncio.sleep(self.config.retry_backoff)
            await self._refresh_metadata([])
        except KafkaError as exc:
            log.info("metadata refresh failed: %s", exc)
        self._wake()

    # --- connections ------------------------------------------------------------------------

    def _connection(self, node: int) -> AsyncBrokerConnection | None:
        conn = self.connections.get(node)
        if conn is not None and not conn.closed:
            return conn
        if node not in self._connecting and self._node_retry_at.get(node, 0) <= self.clock():
            self._connecting[node] = asyncio.get_running_loop().create_task(
                self._connect(node))
        return None

    async def _connect(self, node: int) -> None:
        host, port = self.brokers[node]
        try:
            conn = await AsyncBrokerConnection.open(host, port, self.config.client_id,
                                                    self.config.request_timeout,
                                                    self.config.security)
            self.connections[node] = conn
        except KafkaError as exc:
            log.info("broker %d at %s:%d: %s", node, host, port, exc)
            self._node_retry_at[node] = self.clock() + self.config.retry_backoff
            self._want_metadata()
        finally:
            self._connecting.pop(node, None)
            self._wake()

    def _wake(self) -> None:
        self._woken = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _sleep(self, timeout: float) -> None:
        """Until _wake or ``timeout``: a future and a timer, cheaper than wait_for's task
        on a path taken once per request."""
        loop = self._loop
        assert loop is not None
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, _settle, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    # --- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                now = self.clock()
                self.delivery.expire(now)
                if (self.idem.bump_needed or self.idem.needs_new_id) and self.idem.quiet() \
                        and self.txn is None:  # a transaction's epoch changes after it ends
                    await self._bump()
                next_ready = self._send_ready(now)
                if self.closing and not self.acc.incomplete and self.requests_in_flight == 0:
                    return
                if now - self._metadata_at > self.config.metadata_max_age:
                    self._metadata_at = now
                    self._want_metadata()
                timeout = max(0.0, min(next_ready, now + self.config.retry_backoff * 10)
                              - self.clock())
                with self.acc.lock:
                    self.acc.sender_deadline = min(self.acc.sender_deadline,
                                                   self.clock() + timeout)
                if not self._woken:
                    await self._sleep(timeout)
                self._woken = False
        except Exception as exc:
            # A bug here must not leave callers waiting forever: fail what is pending.
            log.exception("the producer's sender failed")
            self.abort(KafkaError(ErrorCode.unknown_server_error, f"sender failed: {exc!r}"))
            raise

    def _send_ready(self, now: float) -> float:
        """Send what may go now; when the next batch becomes ready by lingering."""
        # A round takes one batch per partition (a request holds at most one per partition);
        # rounds go on while they send something, so a partition with a backlog fills its
        # in-flight window now instead of one request per answer.
        while True:
            sent, next_ready = self._send_round(now)
            if not sent:
                return next_ready

    def _send_round(self, now: float) -> tuple[bool, float]:
        heads, next_ready = self.acc.ready_heads(now)
        with self.acc.lock:
            self.acc.sender_deadline = float("inf")
        if self.fatal is not None:
            for batch in heads:
                self.delivery.refuse_after_fatal(batch)
            return False, next_ready
        txn = self.txn
        if txn is not None:
            error = txn.undrained_error()
            if error is not None:
                self._fail_undrained(error)
                return False, next_ready
        requests: dict[int, list[ProducerBatch]] = {}
        sizes: dict[int, int] = {}
        for batch in heads:
            tp = (batch.topic, batch.partition)
            if txn is not None and not txn.may_send(tp):
                continue  # until AddPartitionsToTxn has added its partition
            node = self.leaders.get(tp)
            if node is None:
                self._want_metadata(batch.topic)
                continue
            conn = self._connection(node)
            if conn is None:
                continue
            # Before compression the size is an upper bound: good enough to split requests.
            if requests.get(node) and sizes[node] + batch.size > self.config.max_request_size:
                continue  # the next request takes it
            if not self.delivery.take(batch, conn.in_flight):
                continue
            requests.setdefault(node, []).append(batch)
            sizes[node] = sizes.get(node, 0) + batch.size
        for node, batches in requests.items():
            self._send(self.connections[node], batches)
        if txn is not None:
            assert self.txn_io is not None
            self.txn_io.maybe_add_partitions()
        return bool(requests), next_ready

    def _fail_undrained(self, error: KafkaError) -> None:
        """A transaction that must be aborted, or is: what was not sent of it never is."""
        for batch in self.acc.drain_all():
            self.idem.give_up(batch)
            self.delivery.fail(batch, error)

    def _send(self, conn: AsyncBrokerConnection, batches: list[ProducerBatch]) -> None:
        by_topic: dict[str, list[ProducerBatch]] = {}
        for batch in batches:
            by_topic.setdefault(batch.topic, []).append(batch)
        topics = [(topic, [(b.partition, b.data) for b in group])
                  for topic, group in by_topic.items()]
        acks = self.config.acks
        timeout_ms = int(self.config.request_timeout * 1000)
        transactional_id = self.config.transactional_id

        def encode(version: int, correlation: int, client_id: str) -> list:
            return produce_request.encode(version, correlation, client_id, transactional_id,
                                          acks, timeout_ms, topics)

        try:
            future = conn.request_encoded(apis.PRODUCE, encode, produce_response.decode,
                                          expect_response=acks != 0)
        except KafkaError as exc:  # refused before a byte was written: not sent
            for batch in batches:
                self.delivery.lost(batch, exc, sent=False)
            return
        self.requests_in_flight += 1
        self.metrics.request_sent(sum(b.count for b in batches))
        sent_at = self.clock()
        future.add_done_callback(lambda f: self._answered(f, batches, sent_at))

    def _answered(self, future: asyncio.Future, batches: list[ProducerBatch],
                  sent_at: float) -> None:
        self.requests_in_flight -= 1
        self._wake()
        exc = future.exception()
        if exc is not None:
            for batch in batches:  # one never written is refused, in effect: not maybe-stored
                self.delivery.lost(batch, exc, sent=not isinstance(exc, RequestNotSent))
            return
        self.metrics.request_answered(self.clock() - sent_at)
        response = future.result()
        if response is None:  # acks=0: nothing will tell us more
            for batch in batches:
                self.delivery.answered(batch, ErrorCode.none, -1)
            return
        answers = {(t.name, p.index): p for t in response for p in t.partition_responses}
        for batch in batches:
            answer = answers.get((batch.topic, batch.partition))
            if answer is None:
                self.delivery.lost(batch, KafkaError(
                    ErrorCode.unknown_server_error, "the response left this partition out"))
                continue
            error = ErrorCode(answer.error_code)
            if error in _LEADER_ERRORS:
                self._want_metadata(batch.topic)
            if self.delivery.answered(batch, error, answer.base_offset, answer.error_message):
                task = asyncio.get_running_loop().create_task(self._look_up(batch))
                self._lookups.add(task)  # a task nobody references may be collected mid-way
                task.add_done_callback(self._lookups.discard)

    async def _look_up(self, batch: ProducerBatch) -> None:
        """How far does the partition hold this producer? (DescribeProducers, KIP-664.)
        Asked again until it answers: a failed lookup is no evidence either way."""
        try:
            held = await self._describe_producer(batch)
        except KafkaError as exc:
            self.delivery.lookup_failed(batch, exc)
        else:
            self.delivery.looked_up(batch, held)
        self._wake()

    async def _describe_producer(self, batch: ProducerBatch) -> tuple[int, int] | None:
        """(epoch, last sequence) the partition holds for this producer, None when it holds
        nothing for it; raises KafkaError once the batch's delivery timeout has passed."""
        def make(mod, version):
            return build(mod.DescribeProducersRequest, topics=(
                build(mod.TopicRequest, name=batch.topic,
                      partition_indexes=(batch.partition,)),))

        deadline = batch.created + self.config.delivery_timeout
        while True:
            try:
                leader = self.connections.get(
                    self.leaders.get((batch.topic, batch.partition), -2))
                if leader is not None and not leader.closed:
                    response = await leader.request(apis.DESCRIBE_PRODUCERS, make)
                else:
                    response = await self._control_call(apis.DESCRIBE_PRODUCERS, make)
                partition = response.topics[0].partitions[0]
                if partition.error_code != 0:
                    raise KafkaError(ErrorCode(partition.error_code), "DescribeProducers")
                for entry in partition.active_producers:
                    if entry.producer_id == self.idem.producer_id:
                        return entry.producer_epoch, entry.last_sequence
                return None
            except KafkaError as exc:
                if self.clock() >= deadline:
                    raise KafkaError(exc.error, "delivery.timeout.ms expired while asking "
                                     "the broker how much of this producer it holds "
                                     f"(DescribeProducers: {exc})") from None
                log.info("DescribeProducers for %s-%d failed (%s): asking again",
                         batch.topic, batch.partition, exc)
                await asyncio.sleep(self.config.retry_backoff)

    def abort(self, error: KafkaError) -> None:
        """Fail every record not yet settled (a forced close, or a sender failure)."""
        self.delivery.abort(error)

    async def _bump(self) -> None:
        if self.delivery.bump():
            try:
                await self._init_producer_id()
            except KafkaError as exc:
                self.fatal = ProducerFatalError(exc.error, f"a new producer id: {exc}")

    # --- shutdown ---------------------------------------------------------------------------

    def close_connections(self) -> None:
        if self._stats_task is not None:
            self._stats_task.cancel()
        if self.txn_io is not None:
            self.txn_io.close()
        for conn in list(self.connections.values()):
            conn.close()
        self.connections.clear()
        for task in self._connecting.values():
            task.cancel()
        if self._metadata_task is not None:
            self._metadata_task.cancel()
