"""Produce: validate each partition's batches, append them, answer per ``acks``."""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from ..protocol.api_versions import PRODUCE
from ..protocol.messages import Request
from ..protocol.record_batch import InvalidBatch
from ..protocol.schema import build, response_module
from .api_meta import NO_THROTTLE

log = logging.getLogger(__name__)

VALID_ACKS = (-1, 0, 1)


def handle_produce(broker, request: Request):
    body = request.body
    mod = response_module(PRODUCE, request.api_version)
    topics = []
    for topic_data in body.topic_data:
        partitions = []
        for pdata in topic_data.partition_data:
            result = _produce_partition(broker, body.acks, topic_data.name, pdata.index,
                                        pdata.records, request.client_id)
            partitions.append(build(mod.PartitionProduceResponse, index=pdata.index,
                                    record_errors=(), **result))
        topics.append(build(mod.TopicProduceResponse, name=topic_data.name,
                            partition_responses=tuple(partitions)))
    if body.acks == 0:
        return None
    return build(mod.ProduceResponse, responses=tuple(topics), throttle_time=NO_THROTTLE)


def _produce_partition(broker, acks: int, topic: str, index: int, records: bytes | None,
                       client_id: str | None) -> dict:
    def failed(error: ErrorCode, message: str, level: int = logging.INFO) -> dict:
        # Logged as well as answered: clients often show only the code, and with acks=0
        # the log is the only trace of a refused batch.
        log.log(level, "produce to %s-%d from %s refused: %s (%s)", topic, index, client_id,
                message, error.name)
        return {"error_code": error, "base_offset": -1, "log_append_time": None,
                "log_start_offset": -1, "error_message": message}

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
        return failed(ErrorCode.kafka_storage_error, f"writing the log failed: {exc}",
                      logging.ERROR)
    broker.counters.inc(topic, index, "duplicate" if result.duplicate else "appended")
    return {"error_code": ErrorCode.none, "base_offset": result.base_offset,
            "log_append_time": None, "log_start_offset": result.log_start_offset,
            "error_message": None}
