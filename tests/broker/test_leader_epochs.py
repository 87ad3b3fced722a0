"""OffsetForLeaderEpoch (KIP-101/KIP-320): every partition has had one leader, this broker,
at epoch 0. A consumer that resumes from a committed offset with its leader epoch asks where
that epoch ends before fetching (librdkafka does, once the broker serves the API); the
answer must let it go on where it stopped, not detect a truncation."""

from __future__ import annotations

import datetime
import socket
import struct
import time

import confluent_kafka
from kio.schema.errors import ErrorCode
from support.brokers import create_topic
from support.topic_ids_helpers import Wire, fetch, topic_id

from oncelog.protocol import api_versions as apis
from oncelog.protocol.messages import decode_response, encode_request
from oncelog.protocol.schema import build, request_module

TIMEOUT = 30.0


def ask(broker, version: int, topic: str, partition: int, current: int, epoch: int):
    mod = request_module(apis.OFFSET_FOR_LEADER_EPOCH, version)
    body = build(mod.OffsetForLeaderEpochRequest, replica_id=-1, topics=(build(
        mod.OffsetForLeaderTopic, topic=topic, partitions=(build(
            mod.OffsetForLeaderPartition, partition=partition, current_leader_epoch=current,
            leader_epoch=epoch),)),))
    with socket.create_connection(("127.0.0.1", broker.port), timeout=TIMEOUT) as sock:
        sock.sendall(encode_request(apis.OFFSET_FOR_LEADER_EPOCH, version, 9, "t", body))
        sock_file = sock.makefile("rb")
        (size,) = struct.unpack(">i", sock_file.read(4))
        _, answer = decode_response(apis.OFFSET_FOR_LEADER_EPOCH, version, sock_file.read(size))
    (result,) = answer.topics[0].partitions
    return result.error_code, result.leader_epoch, result.end_offset


def test_where_epochs_end(broker):
    create_topic(broker.bootstrap, "epochs")
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(5):
        producer.produce("epochs", b"%d" % i, partition=0)
    assert producer.flush(TIMEOUT) == 0
    for version in (2, 3, 4):
        assert ask(broker, version, "epochs", 0, -1, 0) == (ErrorCode.none, 0, 5)
        assert ask(broker, version, "epochs", 0, 0, 0) == (ErrorCode.none, 0, 5)
        assert ask(broker, version, "epochs", 0, 0, 3) == (ErrorCode.none, -1, -1)
        assert ask(broker, version, "epochs", 0, 2, 0)[0] == ErrorCode.unknown_leader_epoch
        assert ask(broker, version, "epochs", 7, -1, 0)[0] == \
            ErrorCode.unknown_topic_or_partition


def test_librdkafka_validates_a_position_and_goes_on(broker):
    """A position with a leader epoch (from a commit, or given) is checked with
    OffsetForLeaderEpoch before librdkafka fetches from it; epoch 0 ends at the log end, past
    the position, so nothing was truncated and reading goes on from there."""
    create_topic(broker.bootstrap, "resume")
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce("resume", b"%d" % i, partition=0)
    assert producer.flush(TIMEOUT) == 0
    consumer = confluent_kafka.Consumer({"bootstrap.servers": broker.bootstrap,
                                         "group.id": "validators"})
    got = []
    try:
        consumer.assign([confluent_kafka.TopicPartition("resume", 0, 4, leader_epoch=0)])
        deadline = time.monotonic() + TIMEOUT
        while len(got) < 6 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                got.append((message.offset(), message.leader_epoch(), message.value()))
    finally:
        consumer.close()
    assert got == [(i, 0, b"%d" % i) for i in range(4, 10)]


def test_fetch_and_list_offsets_check_the_current_leader_epoch(broker):
    """KIP-320's check, and KIP-951's hint with FENCED_LEADER_EPOCH (Fetch v16+): the leader
    (this broker, epoch 0) and its endpoint."""
    create_topic(broker.bootstrap, "fenced")
    wire = Wire(broker)
    try:
        tid = topic_id(wire, "fenced")
        for version in (12, 15, 16, 18):
            key = None if version < 13 else tid
            _, ok = fetch(wire, version, key, "fenced", current_leader_epoch=0)
            assert ok.error_code == ErrorCode.none
            _, ahead = fetch(wire, version, key, "fenced", current_leader_epoch=3)
            assert ahead.error_code == ErrorCode.unknown_leader_epoch
            answer = fetch(wire, version, key, "fenced", current_leader_epoch=-2, whole=True)
            (behind,) = answer.responses[0].partitions
            assert behind.error_code == ErrorCode.fenced_leader_epoch
            if version >= 16:
                assert (behind.current_leader.leader_id, behind.current_leader.leader_epoch) \
                    == (answer.node_endpoints[0].node_id, 0)
                assert answer.node_endpoints[0].port == broker.port
        mod = request_module(apis.LIST_OFFSETS, 10)
        answer = wire.call(apis.LIST_OFFSETS, 10, "ListOffsetsRequest", replica_id=-1,
                           isolation_level=0, timeout=datetime.timedelta(seconds=1), topics=(
                               build(mod.ListOffsetsTopic, name="fenced", partitions=tuple(
                                   build(mod.ListOffsetsPartition, partition_index=0,
                                         current_leader_epoch=epoch, timestamp=-1)
                                   for epoch in (-1, 0, 1, -2))),))
        assert [p.error_code for p in answer.topics[0].partitions] == [
            ErrorCode.none, ErrorCode.none, ErrorCode.unknown_leader_epoch,
            ErrorCode.fenced_leader_epoch]
    finally:
        wire.close()
