"""Single Kafka calls on one connection: produce a batch, fetch, list offsets.

The building blocks of the CLI tools; oncelog.Producer and oncelog.Consumer add batching,
retries and idempotence on top.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ..protocol import api_versions as apis
from ..protocol.schema import build
from .connection import BrokerConnection, KafkaError

EARLIEST = -2
LATEST = -1


@dataclass(frozen=True, slots=True)
class FetchResult:
    records: bytes
    high_watermark: int
    log_start_offset: int


def _produce_request(topic: str, partition: int, batch: bytes, acks: int, timeout_ms: int):
    def make(mod, version):
        pdata = build(mod.PartitionProduceData, index=partition, records=batch)
        tdata = build(mod.TopicProduceData, name=topic, partition_data=(pdata,))
        return build(mod.ProduceRequest, transactional_id=None, acks=acks,
                     timeout=datetime.timedelta(milliseconds=timeout_ms), topic_data=(tdata,))

    return make


def produce(conn: BrokerConnection, topic: str, partition: int, batch: bytes, acks: int = -1,
            timeout_ms: int = 30_000) -> int:
    """Append one record set; returns its base offset (-1 with acks=0)."""
    make = _produce_request(topic, partition, batch, acks, timeout_ms)
    if acks == 0:
        conn.send_only(apis.PRODUCE, make)
        return -1
    result = produce_result(conn.call(apis.PRODUCE, make))
    if result.error_code != ErrorCode.none:
        raise KafkaError(result.error_code, getattr(result, "error_message", None))
    return result.base_offset


def send_produce(conn: BrokerConnection, topic: str, partition: int, batch: bytes,
                 acks: int = -1, timeout_ms: int = 30_000) -> int:
    """Pipeline a produce request; read its answer with ``conn.receive`` then produce_result."""
    return conn.send_only(apis.PRODUCE, _produce_request(topic, partition, batch, acks,
                                                         timeout_ms))


def produce_result(response):
    """The one partition's answer in a single-partition produce response."""
    return response.responses[0].partition_responses[0]


def init_producer_id(conn: BrokerConnection) -> tuple[int, int]:
    """(producer id, epoch) for an idempotent producer."""
    def make(mod, version):
        return build(mod.InitProducerIdRequest, transactional_id=None,
                     transaction_timeout=datetime.timedelta(milliseconds=60_000),
                     producer_id=-1, producer_epoch=-1)

    response = conn.call(apis.INIT_PRODUCER_ID, make)
    if response.error_code != ErrorCode.none:
        raise KafkaError(response.error_code, "InitProducerId")
    return response.producer_id, response.producer_epoch


def fetch(conn: BrokerConnection, topic: str, partition: int, offset: int,
          max_wait_ms: int = 500, max_bytes: int = 1 << 20) -> FetchResult:
    def make(mod, version):
        p = build(mod.FetchPartition, partition=partition, current_leader_epoch=-1,
                  fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1,
                  partition_max_bytes=max_bytes)
        t = build(mod.FetchTopic, topic=topic, partitions=(p,))
        return build(mod.FetchRequest, replica_id=-1,
                     max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1,
                     max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
                     topics=(t,), forgotten_topics_data=(), rack_id="")

    response = conn.call(apis.FETCH, make)
    result = response.responses[0].partitions[0]
    if result.error_code != ErrorCode.none:
        raise KafkaError(result.error_code, f"fetch {topic}-{partition} at {offset}")
    return FetchResult(result.records or b"", result.high_watermark, result.log_start_offset)


FetchResults = dict[tuple[str, int], tuple[ErrorCode, FetchResult]]


def fetch_many(conn: BrokerConnection, positions: dict[tuple[str, int], int],
               max_wait_ms: int, max_bytes: int, partition_max_bytes: int,
               isolation_level: int = 0) -> FetchResults:
    """One Fetch for several partitions: per (topic, partition), its error and its data."""
    send_fetch(conn, positions, max_wait_ms, max_bytes, partition_max_bytes, isolation_level)
    return read_fetch(conn)


def send_fetch(conn: BrokerConnection, positions: dict[tuple[str, int], int],
               max_wait_ms: int, max_bytes: int, partition_max_bytes: int,
               isolation_level: int = 0) -> None:
    """fetch_many's request alone, pipelined: its answer is read_fetch's, in order."""
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for (topic, partition), offset in positions.items():
        by_topic.setdefault(topic, []).append((partition, offset))

    def make(mod, version):
        topics = tuple(
            build(mod.FetchTopic, topic=topic, partitions=tuple(
                build(mod.FetchPartition, partition=partition, current_leader_epoch=-1,
                      fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1,
                      partition_max_bytes=partition_max_bytes)
                for partition, offset in parts))
            for topic, parts in by_topic.items())
        return build(mod.FetchRequest, replica_id=-1,
                     max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1,
                     max_bytes=max_bytes, isolation_level=isolation_level, session_id=0,
                     session_epoch=-1, topics=topics, forgotten_topics_data=(), rack_id="")

    conn.send_only(apis.FETCH, make)


def read_fetch(conn: BrokerConnection) -> FetchResults:
    """The answer to the oldest request send_fetch pipelined on ``conn``."""
    _, response = conn.receive()
    results = {}
    for topic in response.responses:
        for p in topic.partitions:
            results[(topic.topic, p.partition_index)] = (
                p.error_code, FetchResult(p.records or b"", p.high_watermark, p.log_start_offset))
    return results


def list_offset(conn: BrokerConnection, topic: str, partition: int, timestamp: int) -> int:
    """EARLIEST, LATEST, or the first offset with a timestamp >= ``timestamp`` (-1: none)."""
    def make(mod, version):
        p = build(mod.ListOffsetsPartition, partition_index=partition, current_leader_epoch=-1,
                  timestamp=timestamp)
        t = build(mod.ListOffsetsTopic, name=topic, partitions=(p,))
        return build(mod.ListOffsetsRequest, replica_id=-1, isolation_level=0, topics=(t,))

    response = conn.call(apis.LIST_OFFSETS, make)
    result = response.topics[0].partitions[0]
    if result.error_code != ErrorCode.none:
        raise KafkaError(result.error_code, f"list offsets of {topic}-{partition}")
    return result.offset
