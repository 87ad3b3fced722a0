"""Partition state writes travel in batches (cluster/batches.py): many partitions in one
ZooKeeper transaction, each still conditional on its znode's version (and the controller's
on its epoch). On a real ZooKeeper: a partition whose znode moved on underneath fails alone
(its writer reads it again) and every other partition of the batch is written; a deposed
controller's batch writes nothing; a batch larger than a transaction's bound is split and
written whole; a leader letting a broker into an ISR writes only while that broker is
registered."""

from __future__ import annotations

import json
import time

import pytest
from kazoo.exceptions import NoNodeError
from support.zookeepers import store_fixture

from oncelog.cluster import batches
from oncelog.cluster import znodes as zn
from oncelog.cluster.controller import Controller
from oncelog.cluster.leader_election import Decision
from oncelog.cluster.membership import ClusterMember, ControllerMoved
from oncelog.cluster.replica_watch import IsrWrite, ReplicaWatch
from oncelog.metadata.zookeeper import ZooKeeperStore

pytestmark = pytest.mark.xdist_group("zookeeper")

TOPIC = "batched"
PARTITIONS = 7


store = store_fixture("batches")


def _topic(store: ZooKeeperStore, partitions: int = PARTITIONS) -> None:
    zk = store.client
    zk.create(zn.topic_path(TOPIC), zn.TopicAssignment(
        "AAAAAAAAAAAAAAAAAAAAAA", {p: (1, 2, 3) for p in range(partitions)}, {}, {}).encode(),
        makepath=True)
    for p in range(partitions):
        zk.create(zn.partition_state_path(TOPIC, p),
                  zn.PartitionState(1, 0, (1, 2, 3), 1).encode(), makepath=True)


def _state(store: ZooKeeperStore, p: int) -> dict:
    return json.loads(store.client.get(zn.partition_state_path(TOPIC, p))[0])


def _controller(store: ZooKeeperStore) -> Controller:
    member = ClusterMember(store, 1, None)
    member.start("127.0.0.1", 9092, background=False)  # registers, wins the election
    assert member.is_controller
    return Controller(member, lambda: False)


def test_a_controller_batch_loses_only_the_partition_that_moved_on(store):
    _topic(store)
    controller = _controller(store)
    [topic] = controller.read_topics()
    epoch = controller.member.controller.epoch
    decisions = {p: Decision("L1", zn.PartitionState(1, 0, (1, 2), epoch))
                 for p in range(PARTITIONS)}
    # a leader's ISR write lands on partition 3 after the controller read it
    store.client.set(zn.partition_state_path(TOPIC, 3),
                     zn.PartitionState(1, 0, (1, 3), 1).encode())
    landed = controller.write([(topic, decisions)])
    assert landed == {(TOPIC, p): p != 3 for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        assert _state(store, p)["isr"] == ([1, 3] if p == 3 else [1, 2]), p
    # the next pass reads partition 3 again and its decision lands
    [topic] = controller.read_topics()
    assert controller.write([(topic, {3: decisions[3]})]) == {(TOPIC, 3): True}
    assert _state(store, 3)["isr"] == [1, 2]


def test_a_deposed_controllers_batch_writes_nothing(store):
    _topic(store)
    controller = _controller(store)
    [topic] = controller.read_topics()
    epoch = controller.member.controller.epoch
    # another broker's claim raised the controller epoch meanwhile
    store.client.set(zn.CONTROLLER_EPOCH, zn.encode_epoch(epoch + 1))
    with pytest.raises(ControllerMoved):
        controller.write([(topic, {p: Decision("F1", zn.PartitionState(2, 1, (2, 3), epoch))
                                   for p in range(PARTITIONS)})])
    assert all(_state(store, p)["leader"] == 1 for p in range(PARTITIONS))


def test_a_batch_beyond_the_bound_is_split_and_written_whole(store, monkeypatch):
    monkeypatch.setattr(batches, "BATCH_ITEMS", 3)  # 7 partitions: three transactions
    zk = store.client
    zk.create(zn.topic_path(TOPIC), zn.TopicAssignment(
        "AAAAAAAAAAAAAAAAAAAAAA", {p: (1, 2) for p in range(PARTITIONS)}, {}, {}).encode(),
        makepath=True)
    controller = _controller(store)
    [topic] = controller.read_topics()  # no state yet: N1 creates them
    epoch = controller.member.controller.epoch
    landed = controller.write([(topic, {p: Decision("N1", zn.PartitionState(1, 0, (1, 2),
                                                                            epoch))
                                        for p in range(PARTITIONS)})])
    assert all(landed.values()) and len(landed) == PARTITIONS
    assert all(_state(store, p)["isr"] == [1, 2] for p in range(PARTITIONS))


def test_a_leaders_isr_batch_loses_only_the_partition_that_moved_on(store):
    _topic(store)
    watch = ReplicaWatch(store, 1, lambda view, vouched: None)
    # the controller moved partition 5 on since the leader read it (version 0)
    store.client.set(zn.partition_state_path(TOPIC, 5),
                     zn.PartitionState(2, 1, (2, 3), 1).encode())
    wanted = zn.PartitionState(1, 0, (1, 2), 1)
    versions = watch.write_isrs([IsrWrite(TOPIC, p, wanted, 0) for p in range(PARTITIONS)])
    assert versions == [None if p == 5 else 1 for p in range(PARTITIONS)]
    for p in range(PARTITIONS):
        assert _state(store, p)["isr"] == ([2, 3] if p == 5 else [1, 2]), p
    # Kafka's change notification names every partition written, in one znode
    [note] = store.client.get_children("/isr_change_notification")
    named = json.loads(store.client.get(f"/isr_change_notification/{note}")[0])["partitions"]
    assert sorted(n["partition"] for n in named) == [p for p in range(PARTITIONS) if p != 5]


def test_pipelined_reads_go_a_chunk_at_a_time_and_each_answer_is_heard(store):
    """batches.gather keeps at most GATHER_CHUNK reads in kazoo's hands at once (a heartbeat
    queued meanwhile waits behind one chunk, not thousands of reads) and tells the store
    when ZooKeeper last heard from the session (membership.py's V3 counts from it)."""
    _topic(store, 250)
    client = store.client
    in_hand: list[int] = []

    def read(p: int):
        in_hand.append(len(client._queue) + len(client._pending))
        return client.get_async(zn.partition_state_path(TOPIC, p))

    before = store.heard_at
    started = time.monotonic()
    answers = batches.gather(store, [lambda p=p: read(p) for p in range(250)]
                             + [lambda: client.get_async("/absent")])
    assert [zn.PartitionState.decode(a[0]).leader for a in answers[:250]] == [1] * 250
    assert isinstance(answers[-1], NoNodeError)  # an answer: kept, not raised
    assert max(in_hand) < batches.GATHER_CHUNK, max(in_hand)
    assert store.heard_at >= started > before


def test_answers_kazoo_makes_itself_are_not_heard_from_zookeeper(store):
    """A client whose authentication failed gets AuthFailedError from kazoo itself, no
    request sent (kazoo's AUTH_FAILED state, set here as kazoo sets it): such a chunk tells
    the store nothing about when ZooKeeper last heard from the session."""
    from kazoo.exceptions import AuthFailedError
    from kazoo.protocol.states import KeeperState

    client = store.client
    before = store.heard_at
    client._state = KeeperState.AUTH_FAILED
    try:
        answers = batches.gather(store, [lambda: client.get_async("/")] * 3)
    finally:
        client._state = KeeperState.CONNECTED
    assert all(isinstance(a, AuthFailedError) for a in answers)
    assert store.heard_at == before


def test_a_leader_lets_only_a_registered_broker_into_an_isr(store):
    """KIP-841 at the write: the leader's list of registered brokers comes from a watch that
    can trail the state it read, so the registration of every joining broker is a condition
    of the same transaction. Broker 3 lost its session (the controller took it out of the
    ISR); a leader that has not yet heard puts it back nowhere, and the partitions of its
    batch that let in only registered brokers are written."""
    _topic(store)
    member = ClusterMember(store, 2, None)
    member.start("127.0.0.1", 9093, background=False)  # broker 2 registered, 3 is not
    watch = ReplicaWatch(store, 1, lambda view, vouched: None)
    for p in range(PARTITIONS):  # the controller's removal of 3 and 2, read by the leader
        store.client.set(zn.partition_state_path(TOPIC, p),
                         zn.PartitionState(1, 0, (1,), 1).encode(), version=0)
    joins = {0: (3,), 1: (2,), 2: (2, 3), 3: (), 4: (2,)}
    versions = watch.write_isrs([
        IsrWrite(TOPIC, p, zn.PartitionState(1, 0, (1, *joining), 1), 1, joining)
        for p, joining in joins.items()])
    assert versions == [None, 2, None, 2, 2]
    assert {p: _state(store, p)["isr"] for p in joins} == \
        {0: [1], 1: [1, 2], 2: [1], 3: [1], 4: [1, 2]}
    member.close()
