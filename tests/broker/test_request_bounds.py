"""One request may not freeze the broker or blow its memory (issue 28 #5, issue 21 #10).

* CreateTopics and CreatePartitions: at most 10,000 partitions in one request, as Kafka 4's
  controller (POLICY_VIOLATION "Excessively large number of partitions per request.").
* Fetch: an answer holds at most ``fetch.max.bytes`` of records (one batch more when the
  first is larger), whatever max_bytes the request asks, as Kafka's broker.
* The broker: at most ``max.broker.partitions`` (KIP-578's name) in all, whoever creates
  them (CreateTopics, CreatePartitions, auto-creation), internal topics exempt.
* Any request: at most MAX_REQUEST_ELEMENTS array elements in all, refused before it is
  decoded (closed connection and a log line): a 93.5 MB ListOffsets peaked at 1.7 GB.
* IncrementalAlterConfigs: duplicate keys found in linear time (20,000 operations stalled
  the broker 3.9 s), asserted as a ratio to a request a tenth the size.
"""

from __future__ import annotations

import datetime
import socket
import time

from confluent_kafka import Producer
from kio.schema.create_partitions.v3.request import (
    CreatePartitionsRequest,
    CreatePartitionsTopic,
)
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.incremental_alter_configs.v1.request import (
    AlterableConfig,
    AlterConfigsResource,
    IncrementalAlterConfigsRequest,
)
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from support.brokers import loop_cpu
from support.hostile_clients import fetch_frame
from support.raw_wire import connect, read_frame

from oncelog.protocol.messages import MAX_REQUEST_ELEMENTS, decode_response, encode_request

CREATE_TOPICS, LIST_OFFSETS, INCREMENTAL_ALTER_CONFIGS = 19, 2, 44
CREATE_PARTITIONS, METADATA, FIND_COORDINATOR = 37, 3, 10
POLICY_VIOLATION = 44
INVALID_REQUEST = 42


def _call(sock: socket.socket, api_key: int, version: int, body, correlation_id: int = 1):
    sock.sendall(encode_request(api_key, version, correlation_id, "bounds", body))
    got, response = decode_response(api_key, version, read_frame(sock))
    assert got == correlation_id
    return response


def _create(*topics: tuple[str, int]) -> CreateTopicsRequest:
    return CreateTopicsRequest(
        topics=tuple(CreatableTopic(name=name, num_partitions=n, replication_factor=1,
                                    assignments=(), configs=()) for name, n in topics),
        timeout=datetime.timedelta(seconds=30), validate_only=False)


def test_create_topics_holds_at_most_10000_partitions_per_request(broker):
    with connect(broker) as sock:
        sock.settimeout(60)
        refused = _call(sock, CREATE_TOPICS, 7, _create(("wide-a", 6000), ("wide-b", 6000)))
        assert [(t.name, t.error_code) for t in refused.topics] == [
            ("wide-a", POLICY_VIOLATION), ("wide-b", POLICY_VIOLATION)]
        assert refused.topics[0].error_message == \
            "Excessively large number of partitions per request."
        fine = _call(sock, CREATE_TOPICS, 7, _create(("narrow", 3), ("wide-a", 1)), 2)
        # wide-a was not made by the refused request
        assert [(t.name, t.error_code) for t in fine.topics] == [("narrow", 0), ("wide-a", 0)]


def _grow(*topics: tuple[str, int]) -> CreatePartitionsRequest:
    return CreatePartitionsRequest(
        topics=tuple(CreatePartitionsTopic(name=name, count=n, assignments=None)
                     for name, n in topics),
        timeout=datetime.timedelta(seconds=30), validate_only=False)


def test_create_partitions_adds_at_most_10000_partitions_per_request(broker):
    with connect(broker) as sock:
        sock.settimeout(60)
        _call(sock, CREATE_TOPICS, 7, _create(("grow-a", 1), ("grow-b", 1)))
        refused = _call(sock, CREATE_PARTITIONS, 3, _grow(("grow-a", 6001), ("grow-b", 6001)))
        assert [(t.name, t.error_code, t.error_message) for t in refused.results] == [
            (name, POLICY_VIOLATION, "Excessively large number of partitions per request.")
            for name in ("grow-a", "grow-b")]
        fine = _call(sock, CREATE_PARTITIONS, 3, _grow(("grow-a", 3), ("grow-b", 2)), 2)
        assert [(t.name, t.error_code) for t in fine.results] == [("grow-a", 0), ("grow-b", 0)]


def test_the_broker_holds_at_most_max_broker_partitions(start_broker):
    broker = start_broker(max_broker_partitions=10, offsets_topic_num_partitions=3)
    with connect(broker) as sock:
        sock.settimeout(60)
        made = _call(sock, CREATE_TOPICS, 7, _create(("first", 6)))
        assert made.topics[0].error_code == 0
        over = _call(sock, CREATE_TOPICS, 7, _create(("second", 5)), 2)
        assert over.topics[0].error_code == POLICY_VIOLATION
        assert "max.broker.partitions (10)" in over.topics[0].error_message
        grown = _call(sock, CREATE_PARTITIONS, 3, _grow(("first", 11)), 3)
        assert grown.results[0].error_code == POLICY_VIOLATION
        grown = _call(sock, CREATE_PARTITIONS, 3, _grow(("first", 10)), 4)
        assert grown.results[0].error_code == 0
        auto = _call(sock, METADATA, 12, MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name="auto"),),
            allow_auto_topic_creation=True, include_topic_authorized_operations=False), 5)
        assert auto.topics[0].error_code == POLICY_VIOLATION
        # the coordinators' topics are created whatever clients did
        found = _call(sock, FIND_COORDINATOR, 4, FindCoordinatorRequest(
            key_type=0, coordinator_keys=("g",)), 6)
        assert found.coordinators[0].error_code in (0, 15)  # created, or still loading
        listed = _call(sock, METADATA, 12, MetadataRequest(
            topics=None, allow_auto_topic_creation=False,
            include_topic_authorized_operations=False), 7)
        assert sorted((t.name, len(t.partitions)) for t in listed.topics) == [
            ("__consumer_offsets", 3), ("first", 10)]


def test_a_fetch_answer_holds_at_most_fetch_max_bytes(start_broker):
    broker = start_broker(fetch_max_bytes=65536)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "batch.size": 4096,
                         "linger.ms": 5})
    for i in range(300):
        producer.produce("wide-fetch", bytes([i % 251]) * 1024)
    assert producer.flush(30) == 0
    with connect(broker) as sock:
        sock.settimeout(60)
        sock.sendall(fetch_frame("wide-fetch", 50_000_000, 1))
        answer = read_frame(sock)
    print(f"a Fetch asking 50 MB of a 300 KiB log answered {len(answer)} bytes")
    assert 60_000 < len(answer) < 65536 + 8192  # fetch.max.bytes and one batch at most


def _list_offsets(partitions: int) -> bytes:
    parts = tuple(ListOffsetsPartition(partition_index=i, current_leader_epoch=-1,
                                       timestamp=-1) for i in range(partitions))
    body = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(
        ListOffsetsTopic(name="nowhere", partitions=parts),))
    return encode_request(LIST_OFFSETS, 7, 1, "bounds", body)


def test_a_request_of_too_many_elements_is_refused_before_decoding(broker):
    with connect(broker) as sock:
        sock.settimeout(60)
        sock.sendall(_list_offsets(MAX_REQUEST_ELEMENTS + 1))
        try:
            assert sock.recv(65536) == b""
        except ConnectionResetError:
            pass
    assert f"more than {MAX_REQUEST_ELEMENTS}" in broker.log_text()
    with connect(broker) as sock:
        sock.sendall(_list_offsets(1000))
        _, response = decode_response(LIST_OFFSETS, 7, read_frame(sock))
        assert len(response.topics[0].partitions) == 1000


def _alter(operations: int) -> IncrementalAlterConfigsRequest:
    """``operations`` SETs of distinct made-up keys, then one key named twice."""
    configs = [AlterableConfig(name=f"k{i}", config_operation=0, value="1")
               for i in range(operations - 2)]
    configs += [AlterableConfig(name="retention.ms", config_operation=0, value="1")] * 2
    return IncrementalAlterConfigsRequest(resources=(AlterConfigsResource(
        resource_type=2, resource_name="narrow", configs=tuple(configs)),), validate_only=True)


def test_incremental_alter_configs_is_linear_in_its_operations(broker):
    with connect(broker) as sock:
        sock.settimeout(120)
        _call(sock, CREATE_TOPICS, 7, _create(("narrow", 1)))
        times = {}
        for ops in (2_000, 20_000):
            frame = encode_request(INCREMENTAL_ALTER_CONFIGS, 1, 1, "bounds", _alter(ops))
            best = float("inf")
            for _ in range(3):
                start = loop_cpu(broker.proc.pid)
                sock.sendall(frame)
                _, response = decode_response(INCREMENTAL_ALTER_CONFIGS, 1, read_frame(sock))
                time.sleep(0.005)  # the loop finishes what follows the answer
                best = min(best, loop_cpu(broker.proc.pid) - start)
                assert response.responses[0].error_code == INVALID_REQUEST
            times[ops] = best
    print(f"IncrementalAlterConfigs: {times}")
    # linear: about 10 (request bytes to read and decode are 10 times as many); the
    # quadratic check was about 100
    assert times[20_000] < 30 * times[2_000]
