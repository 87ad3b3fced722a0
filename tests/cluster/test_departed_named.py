"""A leader killed (SIGKILL): the Metadata answer that first names its partition's new leader
still names the dead broker among the brokers, so librdkafka does not decommission it in the
same answer and hand the moved partition back to "no leader" for another second
(cluster/departed_brokers.py, measured in bench/replication.py's failover); DescribeCluster
names only the registered; a little later Metadata stops naming it. A broker stopped cleanly
(SIGTERM: its leaderships moved before it left) is named no more once gone, so a fan-out to
every named broker (kafka-python's and oncelog's admin ListGroups) right after a rolling
restart's stop reaches only live brokers.

Before: the dead broker left Metadata's brokers in the answer that moved its partitions; a
first version of the grace named a cleanly stopped broker for 3 s (found by a review)."""

from __future__ import annotations

import pytest
from support.three_brokers import TIMEOUT, ThreeBrokers
from support.waits import wait_for
from support.zookeepers import registered_member

from oncelog.client.admin.admin import Admin
from oncelog.cluster.departed_brokers import GRACE_S

TOPIC = "departed"
STOPPED = "departed-stopped"


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    running = ThreeBrokers(zookeeper, tmp_path_factory.mktemp("departed"), "departed", {})
    yield running
    running.close()


def test_a_dead_leader_is_named_in_the_answer_that_moves_its_partition(cluster):
    with Admin({"bootstrap.servers": cluster.brokers[3].bootstrap}) as admin:
        admin.create_topic(TOPIC, assignments={0: [1, 2, 3]})
        wait_for(lambda: admin.metadata([TOPIC]).topics[TOPIC].partitions[0].leader == 1,
                 TIMEOUT, "broker 1 leading")
        cluster.brokers[1].kill()
        answers = []

        def moved() -> bool:
            answers.append(admin.metadata([TOPIC]))
            return answers[-1].topics[TOPIC].partitions[0].leader not in (1, -1)

        wait_for(moved, TIMEOUT, "a new leader named")
        first = answers[-1]
        assert 1 in first.brokers, first.brokers
        assert [b.node_id for b in admin.describe_cluster().brokers] == [2, 3]
        wait_for(lambda: 1 not in admin.metadata([TOPIC]).brokers, GRACE_S + TIMEOUT,
                 "broker 1 no longer named")


def test_a_cleanly_stopped_broker_is_not_named_once_gone(cluster):
    from kafka.admin import KafkaAdminClient

    for b in (1, 2, 3):
        if not cluster.brokers[b].alive:
            cluster.brokers[b].start()
    cluster.wait_named_by_all("three brokers")
    bootstrap = cluster.brokers[1].bootstrap
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(STOPPED, assignments={0: [3, 1, 2]})
        wait_for(lambda: admin.metadata([STOPPED]).topics[STOPPED].partitions[0].leader == 3,
                 TIMEOUT, "broker 3 leading")
        admin.list_groups()  # the group coordinators are up on every broker
        cluster.brokers[3].stop()  # SIGTERM: controlled shutdown, then its session closed
        wait_for(lambda: [b.node_id for b in admin.describe_cluster().brokers] == [1, 2],
                 TIMEOUT, "DescribeCluster no longer naming broker 3")
        assert sorted(admin.metadata([STOPPED]).brokers) == [1, 2]
        admin.list_groups()  # every named broker answers
    client = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        client.list_groups()  # kafka-python raises on the first broker that does not answer
    finally:
        client.close()


def test_a_broker_seen_in_controlled_shutdown_left_cleanly_a_killed_one_not(zookeeper):
    """membership.py's ``left_cleanly``, on a real ZooKeeper: broker 2 makes its controlled
    shutdown znode, then its session closes; broker 3's session closes without one (a
    crash); broker 2 registers again."""
    from oncelog.cluster import znodes as zn
    from oncelog.cluster.membership import ClusterMember

    connect = zookeeper.chroot("left-cleanly")
    members: dict[int, ClusterMember] = {}

    try:
        for b in (1, 2, 3):
            members[b] = registered_member(connect, b)
        me = members[1]
        me.zk.ensure_path(zn.CONTROLLED_SHUTDOWN)
        members[2].zk.create(f"{zn.CONTROLLED_SHUTDOWN}/2", b"", ephemeral=True)
        me.pass_once()  # the stop's znode read (its watch would start this pass)
        members.pop(2).close()
        members.pop(3).close()
        me.pass_once()
        assert [b.broker_id for b in me.brokers] == [1]
        assert me.left_cleanly == {2}
        members[2] = registered_member(connect, 2)
        me.pass_once()
        assert me.left_cleanly == frozenset()
    finally:
        for member in members.values():
            member.close()
