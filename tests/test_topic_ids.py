"""The versions that name topics by id (KIP-516) and the other fields Kafka 4.1's versions add,
against a real broker: Produce v13, Fetch v13+, DeleteTopics v6, Metadata v10+ by id, with
an unknown id answered UNKNOWN_TOPIC_ID; ids stable across a restart; ListOffsets' -4/-5;
DescribeQuorum and ListConfigResources as a one-node cluster answers them."""

from __future__ import annotations

import datetime
import socket
import struct
import time
import uuid

from brokers import create_topic
from crafted import batch_of, record
from kio.schema.errors import ErrorCode

from oncelog.protocol import api_versions as apis
from oncelog.protocol.messages import decode_response, encode_request
from oncelog.protocol.schema import build, request_module

IO_TIMEOUT = 30.0
MS = datetime.timedelta(milliseconds=1)


class Wire:
    """One connection speaking kio-encoded requests at chosen versions."""

    def __init__(self, broker) -> None:
        self.sock = socket.create_connection(("127.0.0.1", broker.port), timeout=IO_TIMEOUT)
        self.next_id = 1

    def call(self, key: int, version: int, cls_name: str, **fields):
        mod = request_module(key, version)
        body = build(getattr(mod, cls_name), **fields)
        self.next_id += 1
        self.sock.sendall(encode_request(key, version, self.next_id, "topic-ids", body))
        (size,) = struct.unpack(">i", self._exact(4))
        got, answer = decode_response(key, version, self._exact(size))
        assert got == self.next_id
        return answer

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        deadline = time.monotonic() + IO_TIMEOUT
        while len(buf) < n:
            assert time.monotonic() < deadline
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


def topic_id(wire: Wire, name: str) -> uuid.UUID:
    mod = request_module(apis.METADATA, 13)
    answer = wire.call(apis.METADATA, 13, "MetadataRequest", topics=(
        build(mod.MetadataRequestTopic, name=name, topic_id=None),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    (topic,) = answer.topics
    assert topic.error_code == ErrorCode.none and answer.error_code == ErrorCode.none
    return topic.topic_id


def produce_v13(wire: Wire, tid: uuid.UUID, value: bytes):
    mod = request_module(apis.PRODUCE, 13)
    batch = batch_of(record(0, value=value), 1, int(time.time() * 1000))
    answer = wire.call(apis.PRODUCE, 13, "ProduceRequest", transactional_id=None, acks=-1,
                       timeout=1000 * MS, topic_data=(build(
                           mod.TopicProduceData, topic_id=tid, partition_data=(
                               build(mod.PartitionProduceData, index=0, records=batch),)),))
    (topic,) = answer.responses
    assert topic.topic_id == tid
    (partition,) = topic.partition_responses
    return partition


def fetch(wire: Wire, version: int, tid: uuid.UUID | None, name: str = "",
          current_leader_epoch: int = -1, whole: bool = False):
    mod = request_module(apis.FETCH, version)
    part = build(mod.FetchPartition, partition=0, current_leader_epoch=current_leader_epoch,
                 fetch_offset=0,
                 last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20,
                 replica_directory_id=None, high_watermark=-1)
    answer = wire.call(apis.FETCH, version, "FetchRequest", cluster_id=None,
                       replica_state=build(mod.ReplicaState, replica_id=-1, replica_epoch=-1)
                       if hasattr(mod, "ReplicaState") else None,
                       replica_id=-1, max_wait=0 * MS, min_bytes=0, max_bytes=1 << 20,
                       isolation_level=0, session_id=0, session_epoch=-1, topics=(
                           build(mod.FetchTopic, topic=name, topic_id=tid,
                                 partitions=(part,)),),
                       forgotten_topics_data=(), rack_id="")
    if whole:
        return answer
    (topic,) = answer.responses
    (partition,) = topic.partitions
    return topic, partition


def test_produce_and_fetch_by_topic_id(broker):
    create_topic(broker.bootstrap, "by-id")
    wire = Wire(broker)
    try:
        tid = topic_id(wire, "by-id")
        assert produce_v13(wire, tid, b"first").error_code == ErrorCode.none
        assert produce_v13(wire, tid, b"second").base_offset == 1
        for version in range(13, 19):
            topic, partition = fetch(wire, version, tid)
            assert (topic.topic_id, partition.error_code, partition.high_watermark) == \
                (tid, ErrorCode.none, 2)
            assert b"first" in partition.records and b"second" in partition.records
        # the names still work below v13, and answer the same records
        _, by_name = fetch(wire, 12, None, "by-id")
        assert by_name.records == partition.records

        stranger = uuid.uuid4()
        assert produce_v13(wire, stranger, b"lost").error_code == ErrorCode.unknown_topic_id
        topic, partition = fetch(wire, 18, stranger)
        assert (topic.topic_id, partition.error_code) == (stranger, ErrorCode.unknown_topic_id)
        mod = request_module(apis.METADATA, 13)
        answer = wire.call(apis.METADATA, 13, "MetadataRequest", topics=(
            build(mod.MetadataRequestTopic, name=None, topic_id=stranger),
            build(mod.MetadataRequestTopic, name=None, topic_id=tid)),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        assert [(t.error_code, t.name, t.topic_id) for t in answer.topics] == \
            [(ErrorCode.unknown_topic_id, None, stranger), (ErrorCode.none, "by-id", tid)]
    finally:
        wire.close()
    # the id is the topic's for good: the same after a restart, and produce by it works
    broker.restart()
    wire = Wire(broker)
    try:
        assert topic_id(wire, "by-id") == tid
        assert produce_v13(wire, tid, b"third").base_offset == 2
    finally:
        wire.close()


def test_delete_topics_by_id(broker):
    for name in ("gone-by-id", "gone-by-name"):
        create_topic(broker.bootstrap, name)
    wire = Wire(broker)
    try:
        tid = topic_id(wire, "gone-by-id")
        other = topic_id(wire, "gone-by-name")
        stranger = uuid.uuid4()
        mod = request_module(apis.DELETE_TOPICS, 6)
        answer = wire.call(apis.DELETE_TOPICS, 6, "DeleteTopicsRequest", timeout=5000 * MS,
                           topics=tuple(build(mod.DeleteTopicState, name=n, topic_id=i)
                                        for n, i in ((None, tid), (None, stranger),
                                                     ("gone-by-name", other),
                                                     ("gone-by-name", None))))
        assert [(r.name, r.topic_id, r.error_code) for r in answer.responses] == [
            ("gone-by-id", tid, ErrorCode.none),
            (None, stranger, ErrorCode.unknown_topic_id),
            ("gone-by-name", other, ErrorCode.invalid_request),  # name and id both
            ("gone-by-name", other, ErrorCode.none),
        ]
        mod = request_module(apis.METADATA, 13)
        answer = wire.call(apis.METADATA, 13, "MetadataRequest", topics=(
            build(mod.MetadataRequestTopic, name=None, topic_id=tid),),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        assert answer.topics[0].error_code == ErrorCode.unknown_topic_id
    finally:
        wire.close()


def test_list_offsets_of_the_tiered_storage_timestamps(broker):
    """-4 (earliest local, v8) is the log start offset: the whole log is local; -5 (latest
    tiered, v9) is -1 with leader epoch -1: nothing is tiered. Kafka answers so with remote
    storage off."""
    create_topic(broker.bootstrap, "tiers")
    wire = Wire(broker)
    try:
        tid = topic_id(wire, "tiers")
        for i in range(3):
            produce_v13(wire, tid, b"%d" % i)
        mod = request_module(apis.LIST_OFFSETS, 10)
        answer = wire.call(apis.LIST_OFFSETS, 10, "ListOffsetsRequest", replica_id=-1,
                           isolation_level=0, timeout=1000 * MS, topics=(build(
                               mod.ListOffsetsTopic, name="tiers", partitions=tuple(
                                   build(mod.ListOffsetsPartition, partition_index=0,
                                         current_leader_epoch=-1, timestamp=ts)
                                   for ts in (-1, -2, -4, -5))),))
        assert [(p.error_code, p.offset, p.leader_epoch) for p in answer.topics[0].partitions] \
            == [(ErrorCode.none, 3, 0), (ErrorCode.none, 0, 0), (ErrorCode.none, 0, 0),
                (ErrorCode.none, -1, -1)]
    finally:
        wire.close()


def test_describe_quorum_and_list_config_resources(broker):
    create_topic(broker.bootstrap, "configured")
    wire = Wire(broker)
    try:
        mod = request_module(apis.DESCRIBE_QUORUM, 2)
        answer = wire.call(apis.DESCRIBE_QUORUM, 2, "DescribeQuorumRequest", topics=(build(
            mod.TopicData, topic_name="__cluster_metadata",
            partitions=(build(mod.PartitionData, partition_index=0),)),))
        assert answer.error_code == ErrorCode.none
        (partition,) = answer.topics[0].partitions
        (voter,) = partition.current_voters
        assert partition.leader_id == voter.replica_id == answer.nodes[0].node_id
        assert partition.observers == ()
        assert answer.nodes[0].listeners[0].port == broker.port
        wrong = wire.call(apis.DESCRIBE_QUORUM, 2, "DescribeQuorumRequest", topics=(build(
            mod.TopicData, topic_name="configured",
            partitions=(build(mod.PartitionData, partition_index=0),)),))
        assert wrong.error_code == ErrorCode.unknown_topic_or_partition

        answer = wire.call(apis.LIST_CONFIG_RESOURCES, 1, "ListConfigResourcesRequest",
                           resource_types=(2, 4))
        assert answer.error_code == ErrorCode.none
        listed = {(r.resource_name, r.resource_type) for r in answer.config_resources}
        assert listed == {("configured", 2), (str(partition.leader_id), 4)}
        # v0 (ListClientMetricsResources): client-metrics subscriptions; there are none
        answer = wire.call(apis.LIST_CONFIG_RESOURCES, 0, "ListConfigResourcesRequest")
        assert (answer.error_code, answer.config_resources) == (ErrorCode.none, ())
        answer = wire.call(apis.LIST_CONFIG_RESOURCES, 1, "ListConfigResourcesRequest",
                           resource_types=(99,))
        assert answer.error_code == ErrorCode.invalid_request
    finally:
        wire.close()
