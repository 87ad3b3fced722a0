"""The versions that name topics by id (KIP-516) and the other fields Kafka 4.1's versions add,
against a real broker: Produce v13, Fetch v13+, DeleteTopics v6, Metadata v10+ by id, with
an unknown id answered UNKNOWN_TOPIC_ID; ids stable across a restart; ListOffsets' -4/-5;
DescribeQuorum and ListConfigResources as a one-node cluster answers them."""

from __future__ import annotations

import time
import uuid

from kio.schema.errors import ErrorCode
from support.brokers import create_topic
from support.crafted import batch_of, record
from support.topic_ids_helpers import MS, Wire, fetch, topic_id

from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build, request_module


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
