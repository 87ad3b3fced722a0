"""Single Kafka calls on one connection: produce a batch, InitProducerId, fetch, list
offsets, find a coordinator, commit and fetch a group's offsets, and topic ids' names.

The building blocks of the CLI tools; oncelog.Producer and oncelog.Consumer add batching,
retries and idempotence on top. Must not know: any role's state (the consumer's group
membership sends its own calls, consumer/group_calls.py).
"""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol import fetch_response
from ...protocol.errors import ProtocolError
from ...protocol.schema import build
from ..topic_partition import CommitIdentity, OffsetAndMetadata, TopicPartition
from .connection import BrokerConnection, KafkaError

EARLIEST = -2
LATEST = -1


@dataclass(frozen=True, slots=True)
class FetchResult:
    records: bytes | memoryview  # a view into the Fetch answer's frame
    high_watermark: int
    log_start_offset: int
    last_stable_offset: int = -1
    # read_committed: (producer id, first offset) of each aborted transaction in the range.
    aborted_transactions: tuple[tuple[int, int], ...] = ()


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


def init_producer_id_request(mod, transactional_id: str | None = None,
                             timeout: datetime.timedelta = datetime.timedelta(milliseconds=60_000),
                             producer_id: int = -1, epoch: int = -1, two_phase: bool = False,
                             keep_prepared: bool = False):
    """An InitProducerId request of the version whose schema module is ``mod``: with no
    transactional id, an idempotent producer's. ``two_phase`` and ``keep_prepared`` (KIP-939)
    exist from v6 on: a caller asking for them checks the version first."""
    return build(mod.InitProducerIdRequest, transactional_id=transactional_id,
                 transaction_timeout=timeout, producer_id=producer_id, producer_epoch=epoch,
                 enable2_pc=two_phase, keep_prepared_txn=keep_prepared)


def init_producer_id(conn: BrokerConnection) -> tuple[int, int]:
    """(producer id, epoch) for an idempotent producer."""
    response = conn.call(apis.INIT_PRODUCER_ID, lambda mod, version: init_producer_id_request(mod))
    if response.error_code != ErrorCode.none:
        raise KafkaError(response.error_code, "InitProducerId")
    return response.producer_id, response.producer_epoch


def fetch(conn: BrokerConnection, topic: str, partition: int, offset: int,
          max_wait_ms: int = 500, max_bytes: int = 1 << 20,
          isolation_level: int = 0) -> FetchResult:
    """One partition's records from ``offset``; KafkaError for its error code. A large
    answer is received into a kept buffer (see ``BrokerConnection.receive_raw``)."""
    send_fetch(conn, {(topic, partition): offset}, max_wait_ms, max_bytes, max_bytes,
               isolation_level)
    return fetch_result(read_fetch(conn, reuse=True), topic, partition, offset)


def fetch_result(results: FetchResults, topic: str, partition: int, offset: int
                 ) -> FetchResult:
    """The partition's data in read_fetch's ``results``; KafkaError for its error code."""
    found = results.get((topic, partition))
    if found is None:
        raise KafkaError(ErrorCode.unknown_server_error,
                         f"the fetch answer holds nothing of {topic}-{partition}")
    error, result = found
    if error != ErrorCode.none:
        raise KafkaError(error, f"fetch {topic}-{partition} at {offset}")
    return result


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


def read_fetch(conn: BrokerConnection, reuse: bool = False) -> FetchResults:
    """The answer to the oldest request send_fetch pipelined on ``conn``. The records are
    memoryviews into the answer's frame (``protocol.fetch_response``), not copies;
    ``reuse``: see ``BrokerConnection.receive_raw``."""
    version, frame = conn.receive_raw(reuse)
    try:
        _, error, partitions = fetch_response.decode(frame, version)
        if error:
            raise KafkaError(ErrorCode(error), "fetch")
        return {(p.topic, p.partition): (
            ErrorCode(p.error_code),
            FetchResult(p.records if p.records is not None else b"", p.high_watermark,
                        p.log_start_offset, p.last_stable_offset, p.aborted_transactions))
            for p in partitions}
    except (ProtocolError, ValueError) as exc:  # ValueError: an error code Kafka lacks
        conn.close()
        raise KafkaError(ErrorCode.unknown_server_error,
                         f"unreadable fetch answer from {conn.host}:{conn.port}: {exc}") from None


def list_offset(conn: BrokerConnection, topic: str, partition: int, timestamp: int,
                isolation_level: int = 0) -> int:
    """EARLIEST, LATEST (with isolation_level 1, read_committed: the last stable offset), or
    the first offset with a timestamp >= ``timestamp`` (-1: none)."""
    def make(mod, version):
        p = build(mod.ListOffsetsPartition, partition_index=partition, current_leader_epoch=-1,
                  timestamp=timestamp)
        t = build(mod.ListOffsetsTopic, name=topic, partitions=(p,))
        return build(mod.ListOffsetsRequest, replica_id=-1, isolation_level=isolation_level,
                     topics=(t,))

    response = conn.call(apis.LIST_OFFSETS, make)
    result = response.topics[0].partitions[0]
    if result.error_code != ErrorCode.none:
        raise KafkaError(result.error_code, f"list offsets of {topic}-{partition}")
    return result.offset


# --- coordinators and committed offsets ------------------------------------------------------
# What a consumer, a transactional producer and the admin all ask a coordinator. The calls of
# a group's membership (JoinGroup...) are the consumer's: consumer/group_calls.py.

COORDINATOR_GROUP = 0  # FindCoordinator key type


@dataclass(frozen=True, slots=True)
class CoordinatorResult:
    error: ErrorCode
    node_id: int = -1
    host: str = ""
    port: int = -1
    message: str | None = None


def find_coordinator_request(key: str, key_type: int = COORDINATOR_GROUP):
    """A group's coordinator (key type 0), or a transactional id's (1, which v0 cannot
    ask: the answer would be the group coordinator of that name)."""
    def make(mod, version):
        if key_type != COORDINATOR_GROUP and version == 0:
            raise KafkaError(ErrorCode.unsupported_version,
                             "FindCoordinator v0 finds group coordinators only")
        # v4+ asks for a batch of keys (KIP-699); we ask for one.
        return build(mod.FindCoordinatorRequest, key=key, key_type=key_type,
                     coordinator_keys=(key,))

    return make


def find_coordinator_result(response) -> CoordinatorResult:
    found = response.coordinators[0] if hasattr(response, "coordinators") else response
    if hasattr(response, "coordinators") and not response.coordinators:
        return CoordinatorResult(ErrorCode.coordinator_not_available)
    return CoordinatorResult(found.error_code, found.node_id, found.host, found.port,
                             getattr(found, "error_message", None))


def committed_topics(topic_type, partition_type,
                     offsets: dict[TopicPartition, OffsetAndMetadata]) -> tuple:
    """The topics of an OffsetCommit or a TxnOffsetCommit (their schemas' types given): each
    topic once, in order, with its partitions in order."""
    by_topic: dict[str, list[tuple[int, OffsetAndMetadata]]] = {}
    for tp, committed in offsets.items():
        by_topic.setdefault(tp.topic, []).append((tp.partition, committed))
    return tuple(
        build(topic_type, name=topic, partitions=tuple(
            build(partition_type, partition_index=partition,
                  committed_offset=c.offset, committed_leader_epoch=-1,
                  committed_metadata=c.metadata if c.metadata is not None else "")
            for partition, c in sorted(parts, key=lambda item: item[0])))
        for topic, parts in sorted(by_topic.items()))


def offset_commit_request(group_id: str, identity: CommitIdentity,
                          offsets: dict[TopicPartition, OffsetAndMetadata]):
    def make(mod, version):
        topics = committed_topics(mod.OffsetCommitRequestTopic,
                                  mod.OffsetCommitRequestPartition, offsets)
        return build(mod.OffsetCommitRequest, group_id=group_id,
                     generation_id_or_member_epoch=identity.generation,
                     member_id=identity.member_id, group_instance_id=identity.instance_id,
                     topics=topics)

    return make


def offset_commit_errors(response) -> dict[TopicPartition, ErrorCode]:
    return {TopicPartition(t.name, p.partition_index): p.error_code
            for t in response.topics for p in t.partitions}


def offset_fetch_request(group_id: str, partitions: list[TopicPartition] | None,
                         require_stable: bool = False, member_id: str | None = None,
                         member_epoch: int = -1):
    """A member of a consumer-protocol group names itself (v9+: its epoch is checked, as
    Kafka's consumer does; STALE_MEMBER_EPOCH otherwise); others leave the member out.
    ``partitions`` None asks for every committed offset of the group (v2+)."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions or ():
        by_topic.setdefault(tp.topic, []).append(tp.partition)

    def make(mod, version):
        if hasattr(mod, "OffsetFetchRequestGroup"):  # v8+: several groups (KIP-709)
            topics = None if partitions is None else tuple(
                build(mod.OffsetFetchRequestTopics, name=topic,
                      partition_indexes=tuple(sorted(parts)))
                for topic, parts in sorted(by_topic.items()))
            group = build(mod.OffsetFetchRequestGroup, group_id=group_id, member_id=member_id,
                          member_epoch=member_epoch, topics=topics)
            return build(mod.OffsetFetchRequest, groups=(group,),
                         require_stable=require_stable)
        topics = None if partitions is None else tuple(
            build(mod.OffsetFetchRequestTopic, name=topic,
                  partition_indexes=tuple(sorted(parts)))
            for topic, parts in sorted(by_topic.items()))
        return build(mod.OffsetFetchRequest, group_id=group_id, topics=topics,
                     require_stable=require_stable)

    return make


CommittedOffsets = dict[TopicPartition, tuple[ErrorCode, OffsetAndMetadata | None]]


def offset_fetch_result(response) -> tuple[ErrorCode, CommittedOffsets]:
    """The group's error, and per partition its error and committed offset (None: none)."""
    if hasattr(response, "groups"):
        if not response.groups:
            return ErrorCode.coordinator_not_available, {}
        response = response.groups[0]
    result = {}
    for t in response.topics:
        for p in t.partitions:
            committed = (OffsetAndMetadata(p.committed_offset, p.metadata)
                         if p.committed_offset >= 0 else None)
            result[TopicPartition(t.name, p.partition_index)] = (p.error_code, committed)
    return getattr(response, "error_code", ErrorCode.none), result


def topic_names(conn: BrokerConnection) -> dict[uuid.UUID, str]:
    """Every topic's id and name (Metadata v10+ carries topic ids)."""
    def make(mod, version):
        return build(mod.MetadataRequest, topics=None, allow_auto_topic_creation=False,
                     include_topic_authorized_operations=False,
                     include_cluster_authorized_operations=False)

    if conn.version(apis.METADATA) < 10:
        raise KafkaError(ErrorCode.unsupported_version,
                         "the broker's Metadata has no topic ids (v10+ needed)")
    response = conn.call(apis.METADATA, make)
    return {t.topic_id: t.name for t in response.topics
            if t.error_code == ErrorCode.none and t.topic_id is not None
            and t.topic_id.int != 0}
