"""Produce: validate each partition's batches, append them, answer per ``acks``.

An answer waits for the disk only where the flush policy makes it (``flush.messages``): the
partitions' fsyncs run in worker threads while the event loop serves everyone else, and a
partition whose fsync failed is answered KAFKA_STORAGE_ERROR.
"""

from __future__ import annotations

import asyncio
import logging

from kio.schema.errors import ErrorCode

from ..protocol import produce_response
from ..protocol.messages import Request
from ..protocol.produce_response import PartitionResult
from ..protocol.record_batch import InvalidBatch

log = logging.getLogger(__name__)

VALID_ACKS = (-1, 0, 1)


def handle_produce(broker, request: Request):
    """The whole response frame (written by produce_response, not kio), None for acks=0, or
    a coroutine giving the frame once what must be durable is."""
    body = request.body
    topics = []
    pending: list[tuple[str, list[PartitionResult], int, asyncio.Future[None]]] = []
    for topic_data in body.topic_data:
        partitions: list[PartitionResult] = []
        for pdata in topic_data.partition_data:
            result, durable = _produce_partition(broker, body.acks, topic_data.name,
                                                 pdata.index, pdata.records, request.client_id)
            if durable is not None:
                pending.append((topic_data.name, partitions, len(partitions), durable))
            partitions.append(PartitionResult(pdata.index, *result))
        topics.append((topic_data.name, partitions))
    if body.acks == 0:
        return None
    if pending:
        return _when_durable(request, topics, pending)
    return produce_response.encode(request.api_version, request.correlation_id, topics)


async def _when_durable(
        request: Request, topics: list,
        pending: list[tuple[str, list[PartitionResult], int, asyncio.Future[None]]]) -> bytes:
    await asyncio.wait({durable for _, _, _, durable in pending})
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
                       client_id: str | None
                       ) -> tuple[tuple[int, int, int, str | None], asyncio.Future[None] | None]:
    """((error code, base offset, log start offset, error message), what to await first)."""
    def failed(error: ErrorCode, message: str, level: int = logging.INFO) -> tuple:
        # Logged as well as answered: clients often show only the code, and with acks=0
        # the log is the only trace of a refused batch.
        log.log(level, "produce to %s-%d from %s refused: %s (%s)", topic, index, client_id,
                message, error.name)
        return (int(error), -1, -1, message), None

    if acks not in VALID_ACKS:
        return failed(ErrorCode.invalid_required_acks, f"acks must be -1, 0 or 1, not {acks}",
                      logging.WARNING)
    partition = broker.topics.partition(topic, index)
    if partition is None:
        return failed(ErrorCode.unknown_topic_or_partition, f"{topic}-{index} does not exist")
    if records is None:
        return failed(ErrorCode.corrupt_message, "null record set", logging.WARNING)
    try:
        result = partition.append_records(records)
    except InvalidBatch as exc:
        broker.counters.inc(topic, index, exc.error.name)
        # A retry of something already stored is the idempotence working, not a fault.
        level = logging.INFO if exc.error == ErrorCode.duplicate_sequence_number \
            else logging.WARNING
        return failed(exc.error, str(exc), level)
    except OSError as exc:
        broker.counters.inc(topic, index, ErrorCode.kafka_storage_error.name)
        return failed(ErrorCode.kafka_storage_error, f"writing the log failed: {exc}",
                      logging.ERROR)
    broker.counters.inc(topic, index, "duplicate" if result.duplicate else "appended")
    # Asked with acks=0 too: the flush policy holds whether or not anyone waits for it.
    durable = partition.durable(result)
    return (0, result.base_offset, result.log_start_offset, None), durable
