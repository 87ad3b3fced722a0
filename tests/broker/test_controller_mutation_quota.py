"""controller_mutation_rate (KIP-599) on a real broker: each partition a CreateTopics creates,
a CreatePartitions adds or a DeleteTopics deletes is a mutation taken from the client's token
bucket (burst = rate x controller.quota.window.num x window). From CreateTopics v6,
CreatePartitions v3 and DeleteTopics v5 (oncelog's own client sends them) a client whose
bucket is below zero is refused THROTTLING_QUOTA_EXCEEDED with the wait in throttle_time_ms,
while another client id is not; an older version (kafka-python's CreateTopics v3) is done and
throttled. The table is security/quotas.py's; its bucket is checked here too.
"""

from __future__ import annotations

import datetime
import socket
import struct
import urllib.request

import pytest
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kio.schema.errors import ErrorCode

from oncelog.client.admin.admin_quotas import alter_client_quotas
from oncelog.client.network.connection import connect
from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build
from oncelog.security import quotas as q

TIMEOUT = 20.0
TIMEOUT_MS = 20_000
WAIT = datetime.timedelta(milliseconds=TIMEOUT_MS)
RATE = 0.5  # mutations a second: with two one-second windows the burst is one partition


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory):
    from support.brokers import BrokerProcess

    broker = BrokerProcess(tmp_path_factory.mktemp("mutations") / "broker", {
        "controller.quota.window.num": "2", "controller.quota.window.size.seconds": "1",
        "num.partitions": "1"}).start()
    with connect(broker.bootstrap, "quota-admin", TIMEOUT) as conn:
        assert alter_client_quotas(conn, [
            ({"client-id": name}, {"controller_mutation_rate": RATE})
            for name in ("mutator", "old-mutator")]) == [None, None]
    yield broker
    assert broker.stop() == 0
    assert "Traceback" not in broker.log_text(), broker.log_text()


def _create(bootstrap: str, client_id: str, name: str, partitions: int):
    """CreateTopics at the newest version both speak (v7), on a connection of its own (a
    throttled one is muted)."""
    with connect(bootstrap, client_id, TIMEOUT) as conn:
        response = conn.call(apis.CREATE_TOPICS, lambda mod, _v: build(
            mod.CreateTopicsRequest, timeout=WAIT, validate_only=False, topics=(build(
                mod.CreatableTopic, name=name, num_partitions=partitions,
                replication_factor=1, assignments=(), configs=()),)))
        assert conn.version(apis.CREATE_TOPICS) >= 6
    (topic,) = response.topics
    return topic.error_code, response.throttle_time.total_seconds() * 1000


def test_a_strict_client_over_its_rate_is_refused_and_another_is_not(mbroker):
    # the first request may take the bucket below zero (5 partitions from a burst of 1)
    assert _create(mbroker.bootstrap, "mutator", "m-first", 5) == (ErrorCode.none, 0)
    error, throttle = _create(mbroker.bootstrap, "mutator", "m-second", 1)
    assert error == ErrorCode.throttling_quota_exceeded
    assert 0 < throttle <= 8000  # -(1 - 5) / 0.5 s, less what has refilled since
    # another client id has its own quota (none here)
    assert _create(mbroker.bootstrap, "someone-else", "m-other", 3) == (ErrorCode.none, 0)
    with connect(mbroker.bootstrap, "mutator", TIMEOUT) as conn:
        grow = conn.call(apis.CREATE_PARTITIONS, lambda mod, _v: build(
            mod.CreatePartitionsRequest, timeout=WAIT, validate_only=False, topics=(
                build(mod.CreatePartitionsTopic, name="m-other", count=4,
                      assignments=None),)))
    assert grow.results[0].error_code == ErrorCode.throttling_quota_exceeded
    assert grow.throttle_time.total_seconds() > 0
    with connect(mbroker.bootstrap, "mutator", TIMEOUT) as conn:
        deleted = conn.call(apis.DELETE_TOPICS, lambda mod, _v: build(
            mod.DeleteTopicsRequest, topic_names=("m-first",), timeout=WAIT))
        assert conn.version(apis.DELETE_TOPICS) >= 5
    assert deleted.responses[0].error_code == ErrorCode.throttling_quota_exceeded
    # nothing was made or removed for the refused ones
    with connect(mbroker.bootstrap, "quota-admin", TIMEOUT) as conn:
        topics = conn.call(apis.METADATA, lambda mod, _v: build(
            mod.MetadataRequest, topics=None, allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
            include_cluster_authorized_operations=False)).topics
    partitions = {t.name: len(t.partitions) for t in topics}
    assert "m-second" not in partitions
    assert partitions["m-first"] == 5 and partitions["m-other"] == 3


def _create_v3(port: int, name: str, partitions: int):
    request = CreateTopicsRequest(version=3, topics=[CreateTopicsRequest.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=1, assignments=[],
        configs=[])], timeout_ms=TIMEOUT_MS, validate_only=False)
    request.with_header(correlation_id=1, client_id="old-mutator")
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(request.encode(version=3, header=True, framed=True))
        size = struct.unpack(">i", _recv(sock, 4))[0]
        return CreateTopicsResponse.decode(_recv(sock, size), version=3, header=True)


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the broker")
        buf += chunk
    return bytes(buf)


def _throttled_answers(broker) -> float:
    with urllib.request.urlopen(broker.metrics_url, timeout=TIMEOUT) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("oncelog_throttled_answers_total "):
                return float(line.split()[1])
    raise AssertionError("oncelog_throttled_answers_total not in /metrics")


def test_an_older_version_is_done_and_throttled(mbroker):
    muted_before = _throttled_answers(mbroker)
    first = _create_v3(mbroker.port, "old-first", 3)
    assert first.topics[0].error_code == 0
    # a full bucket of 1 less 3: -2 tokens at 0.5 a second, as Kafka's 4 s
    assert first.throttle_time_ms == 4000
    second = _create_v3(mbroker.port, "old-second", 1)
    assert second.topics[0].error_code == 0  # done all the same
    assert second.throttle_time_ms > first.throttle_time_ms - 1000
    # and each connection was muted for it (KIP-219), as for the other quotas
    assert _throttled_answers(mbroker) == muted_before + 2


def test_the_bucket():
    bucket = q.TokenBucket()
    assert bucket.measure(2, 10, 1000) == 10  # full at first
    assert q.mutation_taken(True, bucket, 14, 2, 10, 1000) == 0  # strict: never throttled
    assert q.mutation_refused(True, bucket, 2, 10, 1000) == 2000  # -4 at 2 a second
    assert q.mutation_refused(True, bucket, 2, 10, 2500) == 500  # 3 refilled
    assert q.mutation_refused(True, bucket, 2, 10, 3000) == 0
    assert bucket.measure(2, 10, 60_000) == 10  # never past the burst
    assert q.mutation_refused(False, bucket, 2, 10, 60_000) == 0  # permissive: never refused
    assert q.mutation_taken(False, bucket, 13, 2, 10, 60_000) == 1500
