"""oncelog.Admin's calls to a partition's leader (ListOffsets, DeleteRecords,
DescribeProducers, WriteTxnMarkers) follow the leader when it dies, as Kafka's Admin does:
each attempt looks the leader up afresh and a retriable error (the dead leader's
connection, NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE) is asked again until the admin's
timeout (client/admin/base.py, AdminBase._leader_call). Broker 1 leads both topics and is
SIGKILLed: ``moved`` has a second replica (broker 2 takes over once broker 1's ZooKeeper
session expires), ``orphan`` has none (no leader ever again)."""

from __future__ import annotations

import json
import time

import pytest
from kio.schema.errors import ErrorCode
from support.three_brokers import TIMEOUT, ThreeBrokers
from support.waits import wait_for

from oncelog.client.admin.admin import Admin
from oncelog.client.network import calls
from oncelog.client.network.connection import KafkaError

ADMIN_TIMEOUT_S = 2.0  # the orphan's call gives up after it: short, so the test is cheap


class Cluster(ThreeBrokers):
    def __init__(self, zookeeper, root) -> None:
        super().__init__(zookeeper, root, "adminretry", {"num.partitions": "1"})
        for topic, replicas in (("moved", [1, 2]), ("orphan", [1])):
            with Admin({"bootstrap.servers": self.brokers[3].bootstrap}) as admin:
                admin.create_topic(topic, assignments={0: replicas})
            wait_for(lambda topic=topic: self.leader(topic) == 1, TIMEOUT,
                     f"broker 1 leading {topic}")

    def leader(self, topic: str) -> int:
        path = f"/brokers/topics/{topic}/partitions/0/state"
        return json.loads(self.zk.get(path)[0])["leader"] if self.zk.exists(path) else -1


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    running = Cluster(zookeeper, tmp_path_factory.mktemp("adminretry"))
    yield running
    running.close()


def _admin(cluster: Cluster, timeout_s: float) -> Admin:
    # Broker 3 answers Metadata: it names broker 1 the leader until the controller moves it.
    return Admin({"bootstrap.servers": cluster.brokers[3].bootstrap,
                  "request.timeout.ms": str(int(timeout_s * 1000))})


def test_a_leader_call_follows_the_leader_when_it_dies(cluster):
    """Before: the first call after the kill raised NETWORK_EXCEPTION (the connection to
    the dead leader, and the stale metadata naming it)."""
    with _admin(cluster, TIMEOUT) as admin:
        assert admin.list_offsets({("moved", 0): calls.LATEST}) == {("moved", 0): 0}
        cluster.brokers[1].kill()
        assert admin.list_offsets({("moved", 0): calls.LATEST}) == {("moved", 0): 0}
        assert cluster.leader("moved") == 2
        assert admin.describe_producers("moved", [0]) == {0: []}
        assert admin.delete_records({("moved", 0): 0}) == {("moved", 0): 0}


def test_a_leader_call_gives_up_at_the_timeout_with_the_retriable_error(cluster):
    cluster.brokers[1].kill()  # no-op after the test before
    with _admin(cluster, ADMIN_TIMEOUT_S) as admin:
        started = time.monotonic()
        answer = admin.list_offsets({("orphan", 0): calls.LATEST})[("orphan", 0)]
        took = time.monotonic() - started
        assert isinstance(answer, KafkaError) and answer.is_retriable(), answer
        # It was asked again until the timeout (one backoff short at most), not failed
        # at once; then given up.
        assert took >= ADMIN_TIMEOUT_S - 0.5, took
        with pytest.raises(KafkaError) as raised:
            admin.abort_transaction("orphan", 0, producer_id=1, producer_epoch=0,
                                    coordinator_epoch=0)
        assert raised.value.is_retriable(), raised.value


def test_a_topic_metadata_refuses_is_answered_its_own_error_at_once(cluster):
    """A topic the Metadata answer leaves out with an error of its own (here a name Kafka
    refuses; an ACL's TOPIC_AUTHORIZATION_FAILED takes the same way) keeps that error,
    not UNKNOWN_TOPIC_OR_PARTITION, and is not asked again."""
    with _admin(cluster, TIMEOUT) as admin:
        answer = admin.list_offsets({("no spaces!", 0): calls.LATEST})[("no spaces!", 0)]
        assert isinstance(answer, KafkaError), answer
        assert answer.error == ErrorCode.invalid_topic_exception, answer
