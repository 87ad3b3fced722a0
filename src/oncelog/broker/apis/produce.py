"""Produce: validate each partition's batches, append them, answer per ``acks``.

An answer waits for the disk only where the flush policy makes it (``flush.messages``): the
partitions' fsyncs run in worker threads while the event loop serves everyone else, and a
partition whose fsync failed is answered KAFKA_STORAGE_ERROR.

Transactions (KIP-890 part 1): before a transactional batch begins a transaction in a
partition, the partition asks ``broker.txn_verifier`` (transactional id, producer id, epoch,
topic, partition) whether the coordinator has that partition in the producer's ongoing
transaction; anything but NONE is answered and nothing is stored. A request without a
transactional id cannot be verified: INVALID_TXN_STATE, as Kafka answers.

From v13 a topic is named by its id (KIP-516): an id no topic has is UNKNOWN_TOPIC_ID for
each of its partitions. From v10 a partition answered NOT_LEADER_OR_FOLLOWER carries the
leader and the brokers' endpoints (KIP-951).

Cluster mode (broker/replica_manager.py): only the partition's leader takes a produce
(NOT_LEADER_OR_FOLLOWER elsewhere); acks=all is refused NOT_ENOUGH_REPLICAS before the append
when the ISR is smaller than min.insync.replicas, and answered once the high watermark passed
the batch (a retry too), or NOT_ENOUGH_REPLICAS_AFTER_APPEND, or REQUEST_TIMED_OUT after the
request's timeout (cluster/isr.py's acks rows); acks=1 waits so too, with no minimum, once
the broker's controlled shutdown began (row K6).
A transactional v12+ request adds its partitions to the transaction itself only where
transaction version 2 is finalized (KIP-890 part 2); this broker finalizes no features, so
clients send AddPartitionsToTxn first, and v12+ batches are verified as v11's are.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from ...cluster import isr as isr_rules
from ...protocol import api_versions as apis
from ...protocol import produce_response
from ...protocol.messages import Request
from ...protocol.produce_response import NodeEndpoint, PartitionResult
from ...protocol.record_batch import InvalidBatch
from ...protocol.validation import InflateOffLoop, Inflation
from .. import authorize
from ..answers import CLOSE_CONNECTION, LaterAnswer
from ..authorize import Op, Rt
from ..log_limits import log_safe
from ..topics import INTERNAL_TOPICS

log = logging.getLogger(__name__)

VALID_ACKS = (-1, 0, 1)

# How many times a Produce opens a partition's log closed again before its turn.
_OPENINGS = 3
# Batches too large to decompress on the event loop are validated here, one at a time: what
# clients' batches hold decompressed is one batch's at most, on one core, and cramjam lets
# go of the GIL while it decompresses, so the loop serves everyone else meanwhile.
_INFLATER = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                  thread_name_prefix="oncelog-inflate")

_Pending = list[tuple[str, list[PartitionResult], int, "asyncio.Future[None]"]]

# (transactional id, producer id, epoch, topic, partition) -> NONE, or the error to answer.
TxnVerifier = Callable[[str | None, int, int, str, int], ErrorCode]


def handle_produce(broker, request: Request):
    """The whole response frame (written by produce_response, not kio), or a LaterAnswer
    giving it once what must be durable is; with acks=0 None, or CLOSE_CONNECTION when a
    partition was refused. A coroutine giving one of those when a partition's batches
    decompress to more than the event loop may take on (validation.InflateOffLoop), or
    when the transaction coordinator is on another broker (txn_verification.py)."""
    remote = broker.txn_verification
    ahead = None if remote is None else remote.ahead(request)
    if ahead is not None:
        return _verified_first(broker, request, ahead)
    return _produce(broker, request)


async def _verified_first(broker, request: Request, ahead):
    """KIP-890 part 1 with a coordinator elsewhere: its answers first, then the produce."""
    keys = await ahead
    try:
        answer = _produce(broker, request)
        if asyncio.iscoroutine(answer):
            answer = await answer
        if isinstance(answer, LaterAnswer):
            if not answer.ready:
                ready = asyncio.get_running_loop().create_future()
                answer.on_ready(lambda: ready.done() or ready.set_result(None))
                await ready
            answer = answer.answer
        return answer
    finally:
        broker.txn_verification.forget(keys)


def _produce(broker, request: Request):
    run = _ProduceRun(broker, request)
    if broker.authorizer is not None:
        run.refused = _refusals(broker, request)
    for topic_data in request.body.topic_data:
        for pdata in topic_data.partition_data:
            if not run.one(topic_data, pdata):
                return run.rest_off_loop(topic_data, pdata)
    return run.answer()


class _ProduceRun:
    """One produce request's partitions, appended in the order the request names them."""

    __slots__ = ("_topic", "broker", "failed", "inflation", "pending", "refused", "request",
                 "topics")

    def __init__(self, broker, request: Request) -> None:
        self.broker = broker
        self.request = request
        self.topics: list[tuple[str, list[PartitionResult]]] = []
        self.pending: _Pending = []
        self.failed = False
        self.inflation = Inflation()  # what its batches may decompress, in all
        self._topic = None
        # topic -> what it is answered instead of being appended (authorization)
        self.refused: Callable[[str], ErrorCode | None] | None = None

    def one(self, topic_data, pdata,
            validated: list | InvalidBatch | OSError | None = None) -> bool:
        """Append one partition's batches; False when they are to be validated off the
        event loop first (nothing was done)."""
        body = self.request.body
        name = _topic_name(self.broker, topic_data)
        refusal = None if self.refused is None else self.refused(name)
        if refusal is not None:
            outcome = _refused(refusal, name or topic_data.topic_id, pdata.index,
                               self.request.client_id)
        elif name is None:
            outcome = _unknown_topic_id(topic_data.topic_id, pdata.index,
                                        self.request.client_id)
        else:
            outcome = _produce_partition(self.broker, body.acks, name, pdata.index,
                                         pdata.records, self.request.client_id,
                                         body.transactional_id, self.inflation, validated,
                                         body.timeout_ms)
        if outcome is None:
            return False
        result, durable = outcome
        if topic_data is not self._topic:
            self._topic = topic_data
            # v13 names topics by id, and so does its answer
            self.topics.append((name if topic_data.topic_id is None else topic_data.topic_id,
                                []))
        partitions = self.topics[-1][1]
        self.failed = self.failed or result.error_code != 0
        if durable is not None:
            self.pending.append((name, partitions, len(partitions), durable))
        partitions.append(result)
        return True

    def answer(self):
        if self.request.body.acks == 0:
            # Nothing is answered, so Kafka closes the connection for the client to notice
            # that something went wrong (it then refreshes its metadata and sees the error in
            # its log).
            return CLOSE_CONNECTION if self.failed else None
        if self.pending:
            return LaterAnswer((durable for _, _, _, durable in self.pending),
                               lambda: _answer_when_durable(self.broker, self.request,
                                                            self.topics, self.pending))
        return _encode(self.broker, self.request, self.topics)

    def _to_open(self, topic_data, pdata):
        """The partition of ``pdata`` when its log is still to be opened for this request
        (one it may write: a refused one is not created), else None."""
        name = _topic_name(self.broker, topic_data)
        partition = self.broker.topics.partition(name, pdata.index) if name else None
        if partition is None or partition.is_open or name in INTERNAL_TOPICS or \
                pdata.records is None or \
                (self.refused is not None and self.refused(name) is not None) or \
                (partition.replication is not None and not partition.replication.is_leader):
            return None
        return partition

    async def _validate(self, partition, pdata) -> tuple:
        """``pdata`` with its records as validate_off_loop leaves them, and the headers (or
        the InvalidBatch refusing them)."""
        try:
            records, validated = await asyncio.get_running_loop().run_in_executor(
                _INFLATER, partition.validate_off_loop, pdata.records, self.inflation)
        except InvalidBatch as exc:
            return pdata, exc
        return pdata._replace(records=records), validated  # recompressed, maybe

    async def rest_off_loop(self, topic_data, pdata):
        """The partitions from ``pdata`` on, each validated in the worker thread first when
        its batches need it; the requests behind this one wait (as behind a Fetch).

        A first write creates the log, a first since a restart recovers it: file work and
        fsyncs, in worker threads (broker/log_opening.py). The logs this request opens are
        opened side by side, each once its batches validated (a refused batch creates
        nothing), and appended to in the request's order."""
        every = [(t, p) for t in self.request.body.topic_data for p in t.partition_data]
        rest = next(i for i, item in enumerate(every) if item[1] is pdata)
        prepared: dict[int, tuple] = {}
        for t, p in every[rest:]:
            partition = self._to_open(t, p)
            if partition is not None:
                prepared[id(p)] = checked = await self._validate(partition, p)
                if not isinstance(checked[1], InvalidBatch):
                    with contextlib.suppress(OSError):  # met again when it is appended
                        partition.start_opening()
        partitions = iter(every[rest + 1:])
        while True:
            # Its log may be closed again between its opening and this turn (a log-dir
            # move, a failed directory abandoned, the shutdown): opened again, the
            # partition looked up anew (it may be deleted), a bounded number of times.
            for _ in range(_OPENINGS):
                name = _topic_name(self.broker, topic_data)
                partition = self.broker.topics.partition(name, pdata.index) if name else None
                validated: list | InvalidBatch | OSError | None = None
                if partition is not None:
                    ready = prepared.pop(id(pdata), None)
                    pdata, validated = ready or await self._validate(partition, pdata)
                    if not isinstance(validated, InvalidBatch):
                        try:
                            await partition.open_async()
                        except OSError as exc:
                            validated = exc
                if self.one(topic_data, pdata, validated):
                    break
                prepared[id(pdata)] = (pdata, validated)  # not validated twice
            else:
                self.one(topic_data, pdata, OSError(
                    errno.EAGAIN, f"its log was closed {_OPENINGS} times once opened"))
            for topic_data, pdata in partitions:
                # Opened meanwhile: appended with its validation done above (run again on
                # the loop, it would charge the request's Inflation budget twice).
                if not self.one(topic_data, *prepared.get(id(pdata), (pdata, None))):
                    break
                prepared.pop(id(pdata), None)
            else:
                break
        answer = self.answer()
        if isinstance(answer, LaterAnswer):
            await asyncio.wait([durable for _, _, _, durable in self.pending])
            return _answer_when_durable(self.broker, self.request, self.topics, self.pending)
        return answer


def _refusals(broker, request: Request) -> Callable[[str | None], ErrorCode | None]:
    """Kafka's checks before anything is appended: transactional batches need Write on the
    transactional id (else every partition is answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
    then each topic Write (TOPIC_AUTHORIZATION_FAILED), before it is known to exist."""
    body = request.body
    if _has_transactional_records(body) and (
            body.transactional_id is None or not authorize.allowed(
                broker, request, Op.WRITE, Rt.TRANSACTIONAL_ID, body.transactional_id)):
        return lambda name: ErrorCode.transactional_id_authorization_failed
    names = {n for t in body.topic_data if (n := _topic_name(broker, t)) is not None}
    denied = names - authorize.allowed_names(broker, request, Op.WRITE, Rt.TOPIC, names)
    return lambda name: ErrorCode.topic_authorization_failed if name in denied else None


def _has_transactional_records(body) -> bool:
    """A partition's first batch is transactional (RecordBatch v2: magic at byte 16, the
    transactional bit 0x10 of the attributes' low byte at 22), as Kafka asks it."""
    for topic_data in body.topic_data:
        for pdata in topic_data.partition_data:
            records = pdata.records
            if records is not None and len(records) > 22 and records[16] == 2 \
                    and records[22] & 0x10:
                return True
    return False


def _refused(error: ErrorCode, topic, index: int,
             client_id: str | None) -> tuple[PartitionResult, None]:
    # the denial itself is logged (rate-limited) by authorize.allowed
    log.debug("produce to %s-%d from %s refused: %s", topic, index, log_safe(client_id),
              error.name)
    return PartitionResult(index, int(error), -1, -1, None), None


def _topic_name(broker, topic_data) -> str | None:
    """The topic a request's entry names: by name, or from v13 on by id (None: no such id)."""
    if topic_data.name is not None:
        return topic_data.name
    topic = broker.topics.by_id(topic_data.topic_id)
    return topic.name if topic is not None else None


def _encode(broker, request: Request, topics: list) -> bytes:
    """The answer; KIP-951's leader hint on each partition answered NOT_LEADER_OR_FOLLOWER."""
    nodes: tuple[NodeEndpoint, ...] = ()
    if any(p.error_code == ErrorCode.not_leader_or_follower for _, ps in topics for p in ps):
        topics = [(key, [p._replace(current_leader=_leader_of(broker, key, p.index))
                         if p.error_code == ErrorCode.not_leader_or_follower else p
                         for p in ps]) for key, ps in topics]
        nodes = tuple(NodeEndpoint(node, host, port)
                      for node, host, port, _ in broker.cluster_brokers(request.session.listener))
    return produce_response.encode(request.api_version, request.correlation_id, topics, nodes,
                                   request.throttle_ms)


def _leader_of(broker, key, index: int) -> tuple[int, int]:
    """(leader, leader epoch) of a partition as this broker knows them (KIP-951's hint)."""
    topic = broker.topics.get(key) if isinstance(key, str) else broker.topics.by_id(key)
    replication = None if topic is None or index >= len(topic.partitions) \
        else topic.partitions[index].replication
    if replication is None:
        return broker.broker_id, 0
    return replication.leader, replication.leader_epoch


def _unknown_topic_id(topic_id, index: int, client_id: str | None) -> tuple[PartitionResult,
                                                                             None]:
    log.info("produce to %s-%d from %s refused: no topic has this id (UNKNOWN_TOPIC_ID)",
             topic_id, index, log_safe(client_id))
    return PartitionResult(index, int(ErrorCode.unknown_topic_id), -1, -1,
                           f"no topic has the id {topic_id}"), None


def _answer_when_durable(broker, request: Request, topics: list, pending: _Pending) -> bytes:
    """The answer once every partition's fsync is done: those that failed say so."""
    for topic, partitions, i, durable in pending:
        error = durable.exception()
        if error is not None:
            result = partitions[i]
            log.error("produce to %s-%d from %s not acknowledged: %s", topic, result.index,
                      log_safe(request.client_id), error)
            # an acks=all answer (replication.ReplicationError) says its own error
            code = getattr(error, "error_code", ErrorCode.kafka_storage_error)
            partitions[i] = PartitionResult(result.index, int(code), -1,
                                            result.log_start_offset,
                                            f"not acknowledged: {error}")
    return _encode(broker, request, topics)


def _produce_partition(broker, acks: int, topic: str, index: int, records: bytes | None,
                       client_id: str | None, transactional_id: str | None,
                       inflation: Inflation, validated: list | InvalidBatch | OSError | None,
                       timeout_ms: int = 30_000
                       ) -> tuple[PartitionResult, asyncio.Future[None] | None] | None:
    """The partition's answer, and what must be done before it is sent (None: nothing); None
    instead when its batches are to be validated off the event loop first."""
    partition = None

    def failed(error: ErrorCode, message: str, level: int = logging.INFO,
               record_errors: tuple = ()) -> tuple[PartitionResult, None]:
        # Logged as well as answered: clients often show only the code, and with acks=0
        # the log is the only trace of a refused batch.
        log.log(level, "produce to %s-%d from %s refused: %s (%s)", topic, index,
                log_safe(client_id), log_safe(message), error.name)
        start = -1 if partition is None else _log_start_offset(partition)
        return PartitionResult(index, int(error), -1, start, message,
                               record_errors=record_errors), None

    if acks not in VALID_ACKS:
        return failed(ErrorCode.invalid_required_acks, f"acks must be -1, 0 or 1, not {acks}",
                      logging.WARNING)
    partition = broker.topics.partition(topic, index)
    if partition is None:
        return failed(ErrorCode.unknown_topic_or_partition, f"{topic}-{index} does not exist")
    if topic in INTERNAL_TOPICS:
        return failed(ErrorCode.invalid_topic_exception,
                      f"topic {topic!r} is internal: only the broker writes to it",
                      logging.WARNING)
    if records is None:
        return failed(ErrorCode.corrupt_message, "null record set", logging.WARNING)
    replication = partition.replication
    if replication is not None:  # cluster mode (broker/replica_manager.py)
        if not replication.is_leader:
            return failed(ErrorCode.not_leader_or_follower,
                          f"broker {broker.broker_id} does not lead {topic}-{index}")
        if acks == -1 and isr_rules.acks_all_before(len(replication.isr),
                                                    replication.min_insync):
            return failed(ErrorCode.not_enough_replicas,
                          f"the ISR {list(replication.isr)} is smaller than "
                          f"min.insync.replicas {replication.min_insync}")
    def verify(producer_id: int, epoch: int) -> ErrorCode:
        if transactional_id is None:
            return ErrorCode.invalid_txn_state
        return broker.txn_verifier(transactional_id, producer_id, epoch, topic, index)

    if not partition.is_open and not isinstance(validated, InvalidBatch | OSError):
        return None  # its log is opened in a worker thread first (rest_off_loop)
    try:
        if isinstance(validated, InvalidBatch | OSError):
            raise validated
        result = partition.append_records(records, verify, inflation, validated)
    except InflateOffLoop:
        return None
    except InvalidBatch as exc:
        broker.counters.inc(topic, index, exc.error.name)
        # A retry of something already stored is the idempotence working, not a fault.
        level = logging.INFO if exc.error == ErrorCode.duplicate_sequence_number \
            else logging.WARNING
        return failed(exc.error, str(exc), level, exc.record_errors)
    except OSError as exc:
        broker.counters.inc(topic, index, ErrorCode.kafka_storage_error.name)
        return failed(ErrorCode.kafka_storage_error, f"writing the log failed: {exc}",
                      logging.ERROR)
    broker.counters.inc(topic, index, "duplicate" if result.duplicate else "appended")
    # Asked with acks=0 too: the flush policy holds whether or not anyone waits for it.
    durable = partition.durable(result)
    if replication is not None and (acks == -1 or (acks == 1 and isr_rules.acks_one_waits(
            broker.replicas is not None and broker.replicas.leaving,
            bool(replication.handover_for)))):
        # answered once the ISR has it (acks=1 with no minimum: row K6)
        replicated = replication.wait_for(result.last_offset + 1, timeout_ms / 1000,
                                          None if acks == -1 else 1)
        if replicated is not None:
            durable = replicated if durable is None else asyncio.gather(durable, replicated)
    return PartitionResult(index, 0, result.base_offset, result.log_start_offset, None,
                           result.log_append_time), durable


def _log_start_offset(partition) -> int:
    """What Kafka answers with every error on a partition it has: Java's producer reads it on
    UNKNOWN_PRODUCER_ID to tell retention from lost state. A partition that holds nothing
    yet is not opened for it: a refused batch leaves no trace, not even an empty segment."""
    try:
        if not partition.is_open:  # not opened on the loop for an error's answer
            return 0 if not partition.holds_data() else -1
        return partition.log.log_start_offset
    except OSError:  # EMFILE too: the error being answered must still be answered
        return -1


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.PRODUCE: handle_produce,
}
