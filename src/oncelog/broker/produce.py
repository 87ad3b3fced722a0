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
import logging
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from ..protocol import produce_response
from ..protocol.messages import Request
from ..protocol.produce_response import PartitionResult
from ..protocol.record_batch import InvalidBatch
from .answers import CLOSE_CONNECTION, LaterAnswer
from .topics import INTERNAL_TOPICS

log = logging.getLogger(__name__)

VALID_ACKS = (-1, 0, 1)

_Pending = list[tuple[str, list[PartitionResult], int, "asyncio.Future[None]"]]

# (transactional id, producer id, epoch, topic, partition) -> NONE, or the error to answer.
TxnVerifier = Callable[[str | None, int, int, str, int], ErrorCode]


def handle_produce(broker, request: Request):
    """The whole response frame (written by produce_response, not kio), or a LaterAnswer
    giving it once what must be durable is; with acks=0 None, or CLOSE_CONNECTION when a
    partition was refused."""
    body = request.body
    topics = []
    pending: _Pending = []
    failed = False
    for topic_data in body.topic_data:
        partitions: list[PartitionResult] = []
        for pdata in topic_data.partition_data:
            result, durable = _produce_partition(broker, body.acks, topic_data.name,
                                                 pdata.index, pdata.records, request.client_id,
                                                 body.transactional_id)
            failed = failed or result.error_code != 0
            if durable is not None:
                pending.append((topic_data.name, partitions, len(partitions), durable))
            partitions.append(result)
        topics.append((topic_data.name, partitions))
    if body.acks == 0:
        # Nothing is answered, so Kafka closes the connection for the client to notice that
        # something went wrong (it then refreshes its metadata and sees the error in its log).
        return CLOSE_CONNECTION if failed else None
    if pending:
        return LaterAnswer((durable for _, _, _, durable in pending),
                           lambda: _answer_when_durable(request, topics, pending))
    return produce_response.encode(request.api_version, request.correlation_id, topics)


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
                       client_id: str | None, transactional_id: str | None
                       ) -> tuple[PartitionResult, asyncio.Future[None] | None]:
    """The partition's answer, and what must be done before it is sent (None: nothing)."""
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
        result = partition.append_records(records, verify)
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
    try:
        if not partition.holds_data():
            return 0
        return partition.log.log_start_offset
    except OSError:  # EMFILE too: the error being answered must still be answered
        return -1
