"""The controller's pass costs ZooKeeper requests in proportion to what changed, not to the
partitions there are (watched_topics.py): a pass over a steady cluster makes a few
requests whatever the partition count, and a pass after k partitions changed reads about k
states. Yet it decides on what ZooKeeper holds: a change another client made just before the
pass (a leader's ISR write, a config) is what the pass decides on. Requests are counted at
the controller's kazoo client (a multi is one)."""

from __future__ import annotations

import pytest
from support.zookeepers import count_requests

from oncelog.cluster import znodes as zn
from oncelog.cluster.controller import Controller
from oncelog.cluster.membership import ClusterMember
from oncelog.cluster.topic_admin import TopicAdmin
from oncelog.metadata.zookeeper import ZooKeeperStore

pytestmark = pytest.mark.xdist_group("zookeeper")

TOPIC = "many"
PARTITIONS = 300
STEADY_REQUESTS = 20  # the live brokers, shutdowns, deletions, log dir events, config changes


@pytest.fixture
def cluster(zookeeper):
    """Brokers 1 and 2 registered (1 the controller); broker 3 never is. A topic of
    PARTITIONS partitions on (1, 2), each led by 1 with ISR (1, 2)."""
    connect = zookeeper.chroot("requests")
    stores = [ZooKeeperStore(connect, 10_000) for _ in range(2)]
    members = [ClusterMember(store, b, None) for b, store in zip((1, 2), stores, strict=True)]
    try:
        for broker, member in zip((1, 2), members, strict=True):
            member.start("127.0.0.1", 9000 + broker, background=False)
        assert members[0].is_controller
        other = stores[1].client
        TopicAdmin(stores[1]).ensure_paths()
        other.create(zn.topic_path(TOPIC), zn.TopicAssignment(
            "AAAAAAAAAAAAAAAAAAAAAA", {p: (1, 2) for p in range(PARTITIONS)}, {}, {}).encode(),
            makepath=True)
        other.ensure_path(zn.partitions_path(TOPIC))
        for start in range(0, PARTITIONS, 100):
            txn = other.transaction()
            for p in range(start, start + 100):
                txn.create(f"{zn.partitions_path(TOPIC)}/{p}", b"")
                txn.create(zn.partition_state_path(TOPIC, p),
                           zn.PartitionState(1, 0, (1, 2), 1).encode())
            assert not [r for r in txn.commit() if isinstance(r, Exception)]
        yield Controller(members[0], lambda: False), other
    finally:
        for member in members:
            member.close()


def settle(controller: Controller) -> None:
    for _ in range(10):
        if not controller.pass_once():
            return
    raise AssertionError("the controller did not settle")


def state(zk, p: int) -> zn.PartitionState:
    return zn.PartitionState.decode(zk.get(zn.partition_state_path(TOPIC, p))[0])


def test_a_steady_pass_makes_a_few_requests_whatever_the_partition_count(cluster):
    controller, _ = cluster
    settle(controller)  # the first pass reads everything
    sent = count_requests(controller.store.client)
    assert controller.pass_once() is False
    assert sent[0] <= STEADY_REQUESTS, f"{sent[0]} requests for {PARTITIONS} partitions"


def test_a_pass_reads_again_only_the_states_that_changed(cluster):
    controller, zk = cluster
    settle(controller)
    changed = range(0, PARTITIONS, 10)
    for p in changed:  # a leader's ISR writes: (1, 2) -> (1,) -> (1, 2), versions moved on
        zk.set(zn.partition_state_path(TOPIC, p), zn.PartitionState(1, 0, (1,), 1).encode())
    sent = count_requests(controller.store.client)
    assert controller.pass_once() is False  # (1,) is a valid ISR: nothing to decide
    assert sent[0] <= STEADY_REQUESTS + len(changed), sent[0]


def test_a_pass_decides_on_a_change_made_just_before_it(cluster):
    """No wait for the watch: the state written by another client just before the pass is
    the one decided on (its version is the write's condition, so a stale one would only
    lose the write; here the decision itself depends on it)."""
    controller, zk = cluster
    settle(controller)
    # partition 7 is led by broker 3 now, which is not registered: F1 elects broker 1
    zk.set(zn.partition_state_path(TOPIC, 7), zn.PartitionState(3, 4, (3, 1), 1).encode())
    assert controller.pass_once() is True
    got = state(zk, 7)
    assert (got.leader, got.leader_epoch, got.isr) == (1, 5, (1,))
    # broker 2 leaves: every partition's ISR shrinks (L1), in a few transactions
    sent = count_requests(controller.store.client)
    zk.create(f"{zn.CONTROLLED_SHUTDOWN}/2", b"", ephemeral=True, makepath=True)
    assert controller.pass_once() is True
    assert sent[0] <= STEADY_REQUESTS + PARTITIONS // 100 + 2, sent[0]
    assert all(state(zk, p).isr == (1,) for p in range(PARTITIONS))


def test_a_topic_config_written_after_the_first_read_is_decided_on(cluster):
    """unclean.leader.election.enable set on the topic after the controller read it (the
    config znode did not exist then)."""
    controller, zk = cluster
    settle(controller)
    # partition 3: its only ISR member (broker 3) is not registered; broker 1 is eligible
    # but out of sync: only an unclean election may make it leader (F2)
    zk.set(zn.partition_state_path(TOPIC, 3), zn.PartitionState(3, 2, (3,), 1).encode())
    settle(controller)
    assert state(zk, 3).leader == zn.NO_LEADER  # F3: offline, clean elections only
    zk.create(zn.topic_config_path(TOPIC),
              zn.encode_topic_config({"unclean.leader.election.enable": "true"}), makepath=True)
    settle(controller)
    assert state(zk, 3).leader == 1


def test_a_replica_watch_reads_again_only_what_changed(cluster):
    """A broker's replica watch (replica_watch.py) keeps its view the same way: a second
    read costs a few requests, not two per partition, and still holds a change made just
    before it."""
    from oncelog.cluster.replica_watch import ReplicaWatch

    controller, zk = cluster
    watch = ReplicaWatch(controller.store, 2, lambda view, vouched: None)
    try:
        first = watch.read_view()
        assert len(first[TOPIC].states) == PARTITIONS
        zk.set(zn.partition_state_path(TOPIC, 11),
               zn.PartitionState(2, 1, (2, 1), 1).encode())
        sent = count_requests(controller.store.client)
        again = watch.read_view()
    finally:
        watch.close()
    assert sent[0] <= 5, sent[0]
    assert again[TOPIC].states[11] == (zn.PartitionState(2, 1, (2, 1), 1), 1)
    assert {p: s for p, s in again[TOPIC].states.items() if p != 11} == \
        {p: s for p, s in first[TOPIC].states.items() if p != 11}


def test_a_broker_shutting_down_is_told_once_its_moves_landed(cluster):
    """The controller writes into the broker's controlled-shutdown znode once a pass has
    landed every move (cluster_mode.py stops on that word, not on reading every state)."""
    controller, zk = cluster
    settle(controller)
    path = f"{zn.CONTROLLED_SHUTDOWN}/1"
    zk.create(path, b"", ephemeral=True, makepath=True)
    zk.create(f"{zn.CONTROLLED_SHUTDOWN}/3", b"", ephemeral=True)  # not registered: ignored
    assert controller.pass_once() is True
    assert all(state(zk, p).leader == 2 for p in range(PARTITIONS))  # F1 for every one
    assert zk.get(path)[0] == zn.CONTROLLED_SHUTDOWN_MOVED
    assert zk.get(f"{zn.CONTROLLED_SHUTDOWN}/3")[0] == b""


def _small_topic(controller: Controller, zk, name: str) -> None:
    zk.create(zn.topic_path(name), zn.TopicAssignment(
        "BBBBBBBBBBBBBBBBBBBBBB", {0: (1, 2), 1: (1, 2)}, {}, {}).encode())
    settle(controller)
    assert all(zk.exists(zn.partition_state_path(name, p)) for p in (0, 1))


def test_a_partition_znode_made_after_the_read_does_not_stall_a_deletion(cluster):
    """The partitions' children are watched like the rest: a partition znode made after the
    picture was read is in the first deletion's transaction, which otherwise fails
    NotEmpty."""
    controller, zk = cluster
    _small_topic(controller, zk, "late-node")
    zk.create(f"{zn.partitions_path('late-node')}/7", b"")
    zk.create(zn.delete_topic_path("late-node"), b"", makepath=True)
    controller.pass_once()  # deleted by the first pass: no NotEmpty, no second read
    assert zk.exists(zn.topic_path("late-node")) is None


def test_a_deletion_from_a_stale_picture_is_read_again_not_retried_forever(cluster):
    """A transaction whose answer was lost may have made a partition znode the picture does
    not hold (modelled by dropping it from the picture): the deletion fails NotEmpty, marks
    the topic, and the next pass reads it again and deletes it."""
    controller, zk = cluster
    _small_topic(controller, zk, "stale-node")
    controller.context._topics["stale-node"].partition_nodes.discard(1)
    zk.create(zn.delete_topic_path("stale-node"), b"", makepath=True)
    settle(controller)
    assert zk.exists(zn.topic_path("stale-node")) is None


def test_a_deposed_controller_tells_no_broker_its_moves_landed(cluster):
    """'moved' is written as the decisions are, under the controller epoch's check: a
    controller deposed without knowing it yet is refused, and the broker waits on."""
    from oncelog.cluster.membership import ControllerMoved

    controller, zk = cluster
    settle(controller)
    path = f"{zn.CONTROLLED_SHUTDOWN}/2"
    zk.create(path, b"", ephemeral=True, makepath=True)
    zk.set(zn.CONTROLLER_EPOCH, zk.get(zn.CONTROLLER_EPOCH)[0])  # another's claim
    with pytest.raises(ControllerMoved):
        controller._tell_moved(frozenset({2}))
    assert zk.get(path)[0] == b""
