"""Produce: validate each partition's batches, append them, answer per ``acks``.

An answer waits for the disk only where the flush policy makes it (``flush.messages``): the
partitions' fsyncs run in worker threads while the event loop serves everyone else, and a
partition whose fsync failed is answered KAFKA_STORAGE_ERROR.

Transactions (KIP-890 part 1): before a transactional batch begins a transaction in a
partition, the partition asks ``broker.txn_verifier`` (transactional id, producer id, epoch,
topic, partition) whether the coordinator has that partition in the producer's ongoing
transaction; anything but NONE is answered and nothing is stored. A request without a
transactional id cannot be verified: INVALID_TXN_STATE, as Kafka answers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from ..protocol import produce_response
from ..protocol.messages import Request
from ..protocol.produce_response import PartitionResult
from ..protocol.record_batch import InvalidBatch
from ..protocol.validation import InflateOffLoop, Inflation
from .answers import CLOSE_CONNECTION, LaterAnswer
from .topics import INTERNAL_TOPICS

log = logging.getLogger(__name__)

VALID_ACKS = (-1, 0, 1)

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
    decompress to more than the event loop may take on (validation.InflateOffLoop)."""
    run = _ProduceRun(broker, request)
    for topic_data in request.body.topic_data:
        for pdata in topic_data.partition_data:
            if not run.one(topic_data, pdata):
                return run.rest_off_loop(topic_data, pdata)
    return run.answer()


class _ProduceRun:
    """One produce request's partitions, appended in the order the request names them."""

    __slots__ = ("_topic", "broker", "failed", "inflation", "pending", "request", "topics")

    def __init__(self, broker, request: Request) -> None:
        self.broker = broker
        self.request = request
        self.topics: list[tuple[str, list[PartitionResult]]] = []
        self.pending: _Pending = []
        self.failed = False
        self.inflation = Inflation()  # what its batches may decompress, in all
        self._topic = None

    def one(self, topic_data, pdata, validated: list | InvalidBatch | None = None) -> bool:
        """Append one partition's batches; False when they are to be validated off the
        event loop first (nothing was done)."""
        body = self.request.body
        outcome = _produce_partition(self.broker, body.acks, topic_data.name, pdata.index,
                                     pdata.records, self.request.client_id,
                                     body.transactional_id, self.inflation, validated)
        if outcome is None:
            return False
        result, durable = outcome
        if topic_data is not self._topic:
            self._topic = topic_data
            self.topics.append((topic_data.name, []))
        partitions = self.topics[-1][1]
        self.failed = self.failed or result.error_code != 0
        if durable is not None:
            self.pending.append((topic_data.name, partitions, len(partitions), durable))
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
                               lambda: _answer_when_durable(self.request, self.topics,
                                                            self.pending))
        return produce_response.encode(self.request.api_version, self.request.correlation_id,
                                       self.topics)

    async def rest_off_loop(self, topic_data, pdata):
        """The partitions from ``pdata`` on, each validated in the worker thread first when
        its batches need it; the requests behind this one wait (as behind a Fetch)."""
        loop = asyncio.get_running_loop()
        partitions = iter([(t, p) for t in self.request.body.topic_data
                           for p in t.partition_data])
        for item in partitions:
            if item[1] is pdata:
                break
        while True:
            partition = self.broker.topics.partition(topic_data.name, pdata.index)
            validated: list | InvalidBatch | None = None
            if partition is not None:
                try:
                    records, validated = await loop.run_in_executor(
                        _INFLATER, partition.validate_off_loop, pdata.records, self.inflation)
                    pdata = pdata._replace(records=records)  # recompressed, maybe
                except InvalidBatch as exc:
                    validated = exc
            self.one(topic_data, pdata, validated)
            for topic_data, pdata in partitions:
                if not self.one(topic_data, pdata):
                    break
            else:
                break
        answer = self.answer()
        if isinstance(answer, LaterAnswer):
            await asyncio.wait([durable for _, _, _, durable in self.pending])
            return _answer_when_durable(self.request, self.topics, self.pending)
        return answer


def _answer_when_durable(request: Request, topics: list, pending: _Pending) -> bytes:
    """The answer once every partition's fsync is done: those that failed say so."""
    for topic, partitions, i, durable in pending:
        error = durable.exception()
        if error is not None:
            result = partitions[i]
            log.error("produce to %s-%d from %s not acknowledged: %s", topic, result.index,
                      request.client_id, error)
            partitions[i] = PartitionResult(result.index, int(ErrorCode.kafka_storage_error),
                                            -1, result.log_start_offset,
                                            f"making the records durable failed: {error}")
    return produce_response.encode(request.api_version, request.correlation_id, topics)


def _produce_partition(broker, acks: int, topic: str, index: int, records: bytes | None,
                       client_id: str | None, transactional_id: str | None,
                       inflation: Inflation, validated: list | InvalidBatch | None
                       ) -> tuple[PartitionResult, asyncio.Future[None] | None] | None:
    """The partition's answer, and what must be done before it is sent (None: nothing); None
    instead when its batches are to be validated off the event loop first."""
    partition = None

    def failed(error: ErrorCode, message: str, level: int = logging.INFO,
               record_errors: tuple = ()) -> tuple[PartitionResult, None]:
        # Logged as well as answered: clients often show only the code, and with acks=0
        # the log is the only trace of a refused batch.
        log.log(level, "produce to %s-%d from %s refused: %s (%s)", topic, index, client_id,
                message, error.name)
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
    def verify(producer_id: int, epoch: int) -> ErrorCode:
        if transactional_id is None:
            return ErrorCode.invalid_txn_state
        return broker.txn_verifier(transactional_id, producer_id, epoch, topic, index)

    try:
        if isinstance(validated, InvalidBatch):
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
    return PartitionResult(index, 0, result.base_offset, result.log_start_offset, None,
                           result.log_append_time), durable


def _log_start_offset(partition) -> int:
    """What Kafka answers with every error on a partition it has: Java's producer reads it on
    UNKNOWN_PRODUCER_ID to tell retention from lost state. A partition that holds nothing
    yet is not opened for it: a refused batch leaves no trace, not even an empty segment."""
    if not partition.holds_data():
        return 0
    try:
        return partition.log.log_start_offset
    except OSError:
        return -1
