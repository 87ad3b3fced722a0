"""What cannot be read of a topic stays as last read across a reset of the picture (a new
controllership, a new or resumed ZooKeeper session: watched_topics.py reads everything
again): a state znode or an assignment that cannot be read then (cluster/unreadable.py) keeps
its entry and states, and the replica watch keeps handing the state it last handed. And a
broker that cannot vouch for its session fences every replica it leads, whether or not its
last view holds that partition's state (one unreadable state must not keep a leader that ZooKeeper
cut off acknowledging acks=1 writes while another broker is elected). Real ZooKeeper, the
real replica manager with apply_state as the broker calls it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from kazoo.security import make_digest_acl
from support.zookeepers import store_fixture

from oncelog.broker.config import BrokerConfig
from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.broker.replica_manager import ReplicaManager
from oncelog.cluster import znodes as zn
from oncelog.cluster.isr import Role
from oncelog.cluster.replica_watch import ReplicaWatch
from oncelog.cluster.watched_topics import WatchedTopics
from oncelog.log.log import LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.metadata.zookeeper import ZooKeeperStore
from oncelog.producer_state.manager import StateLimits

pytestmark = pytest.mark.xdist_group("zookeeper")

_ID = "AAAAAAAAAAAAAAAAAAAAAA"


store = store_fixture("unreadable_after_reset")


def _topic(store: ZooKeeperStore, name: str) -> None:
    store.client.create(zn.topic_path(name), zn.TopicAssignment(
        _ID, {0: (1, 2)}, {}, {}).encode(), makepath=True)
    store.client.create(zn.partition_state_path(name, 0),
                        zn.PartitionState(1, 3, (1, 2), 1).encode(), makepath=True)


def test_an_unreadable_state_or_assignment_is_kept_across_a_reset(store):
    _topic(store, "state")
    _topic(store, "assigned")
    picture = WatchedTopics(store, lambda: None)
    watch = ReplicaWatch(store, 1, lambda view, vouched: None)
    watch.read_view()
    picture.read()
    store.client.set(zn.partition_state_path("state", 0), b"\xff{")
    store.client.set_acls(zn.topic_path("assigned"),
                          [make_digest_acl("someone-else", "secret", all=True)])
    for reset in (picture.reset, watch.topics.reset):
        reset()  # as a reconnection does
    read = {t.name: t for t in picture.read()}
    # before: the picture started over, and the unreadable state / assignment left an entry
    # with no state (and an empty assignment)
    assert read["state"].bad_states and read["state"].states[0][0].leader_epoch == 3
    assert read["assigned"].problem and read["assigned"].assignment.partitions == {0: (1, 2)}
    assert read["assigned"].states[0][0].leader == 1
    view = watch.read_view()
    assert view["state"].states[0][0].leader_epoch == 3
    assert view["assigned"] is not None and view["assigned"].states[0][0].leader == 1


def test_an_unvouched_fence_fences_a_leadership_missing_from_the_view(zookeeper):
    store = ZooKeeperStore(zookeeper.chroot(), 10_000)
    partition = Partition("t", 0, "/data/t-0", LogConfig(), 1 << 20, StateLimits(), None,
                          log_dir=LogDir("/data"), disk=MemoryDisk())
    topics = SimpleNamespace(topics={}, log_dirs={}, get=lambda name: SimpleNamespace(
        partitions=[partition]) if name == "t" else None)
    cluster = SimpleNamespace(store=store, vouches=True, standing=lambda: SimpleNamespace(
        value="expired"))
    broker = SimpleNamespace(broker_id=1, topics=topics, config=BrokerConfig(),
                             cluster=cluster)

    async def scenario():
        manager = ReplicaManager(broker)
        manager._replicas.add("t")
        assert manager.apply_state(partition, zn.PartitionState(1, 4, (1, 2), 1), 3, (1, 2),
                                   1) is Role.BECOME_LEADER
        for _ in range(500):  # its log is opened in a worker thread first
            if partition.replication is not None and partition.replication.is_leader:
                break
            await asyncio.sleep(0.01)
        assert partition.replication.is_leader
        # the last view holds no state of it (its state znode could not be read)
        manager._last_view = {"t": None}
        cluster.vouches = False
        manager._fence_if_unvouched()
        assert manager.fenced
        assert not partition.replication.is_leader  # before: still leading

    try:
        asyncio.run(asyncio.wait_for(scenario(), 10))
    finally:
        store.close()


def test_a_broker_bounced_while_a_state_was_unreadable_is_dead_there_until_decided(zookeeper):
    """leader_election.py's *live* and X1 through the real controller: the broker bounced
    (registered again, perhaps with a wiped disk) while a partition's state could not be
    read is taken out of that ISR once it can be read; before, the pass that skipped it
    forgot the bounce, and the state read again named it in the ISR, live."""
    from oncelog.cluster.controller import Controller
    from oncelog.cluster.membership import ClusterMember
    from oncelog.cluster.metadata_cache import encode_topic_id
    from oncelog.cluster.topic_admin import TopicAdmin

    connect = zookeeper.chroot("bounced_while_unreadable")
    observer = ZooKeeperStore(connect, 4000)
    members: dict[int, ClusterMember] = {}

    def join(broker: int) -> None:
        members[broker] = ClusterMember(ZooKeeperStore(connect, 4000), broker, None)
        members[broker].start("127.0.0.1", 9000 + broker, background=False)

    try:
        TopicAdmin(observer).ensure_paths()
        for broker in (1, 2, 3):
            join(broker)
        for member in members.values():
            member.pass_once()
        [leading] = [m for m in members.values() if m.is_controller]
        controller = Controller(leading, lambda: False)
        bouncing = next(b for b in (1, 2, 3) if b != leading.broker_id)
        import uuid
        TopicAdmin(observer).create_topic("t", zn.TopicAssignment(
            encode_topic_id(uuid.UUID(int=7)), {0: (1, 2, 3)}, {}, {}), {})

        def settle() -> None:
            for _ in range(8):
                if not controller.pass_once():
                    return
            raise AssertionError("the controller did not settle")

        settle()
        path = zn.partition_state_path("t", 0)
        data, _ = observer.client.get(path)
        assert set(zn.PartitionState.decode(data).isr) == {1, 2, 3}
        observer.client.set(path, b"\xff{")  # unreadable
        members.pop(bouncing).close()
        join(bouncing)  # a new registration: it bounced
        settle()
        observer.client.set(path, data)  # readable again, the ISR still names it
        settle()
        state = zn.PartitionState.decode(observer.client.get(path)[0])
        assert bouncing not in state.isr and state.leader != bouncing, state
        settle()  # paid: it counts live again (the leader adds it back once caught up)
        assert bouncing not in zn.PartitionState.decode(observer.client.get(path)[0]).isr
        controller.close()
    finally:
        for member in members.values():
            member.close()
        observer.close()


def test_a_topic_first_listed_unreadable_gets_its_config_once_readable(store):
    """The metadata cache: a topic listed while its assignment could not be read has its
    config read once the assignment is taken in; before, it kept no overrides, and
    DescribeConfigs answered defaults (IncrementalAlterConfigs would build on none and
    erase cleanup.policy=compact from the znode)."""
    from oncelog.cluster.metadata_cache import MetadataCache

    _topic(store, "compacted")
    store.client.create(zn.topic_config_path("compacted"),
                        b'{"version":1,"config":{"cleanup.policy":"compact"}}',
                        makepath=True)
    store.client.set_acls(zn.topic_path("compacted"),
                          [make_digest_acl("someone-else", "secret", all=True)])
    cache = MetadataCache(store)
    cache.refresh()
    assert cache.image.get("compacted") is None  # never read: out of the picture
    store.client.add_auth("digest", "someone-else:secret")  # readable to this session now
    cache.refresh()
    topic = cache.image.get("compacted")
    assert topic is not None and topic.configs == {"cleanup.policy": "compact"}


def test_a_corrupt_config_change_notification_fails_no_refresh(store):
    """One config_change_<seq> that is not Kafka's JSON: before, every refresh of the
    metadata cache raised on it (a warning every 100 ms, no change published again); now
    every config is read again once, and the refreshes go on."""
    from oncelog.cluster.metadata_cache import MetadataCache

    _topic(store, "changing")
    store.client.create(zn.topic_config_path("changing"), b'{"version":1,"config":{}}',
                        makepath=True)
    cache = MetadataCache(store)
    cache.refresh()
    store.client.create(f"{zn.CONFIG_CHANGES}/config_change_", b"\xff{", sequence=True,
                        makepath=True)
    store.client.set(zn.topic_config_path("changing"),
                     b'{"version":1,"config":{"retention.ms":"-1"}}')
    cache._dirty_changes = True  # as its watch would mark it
    cache.refresh()  # before: raised
    assert cache.image.get("changing").configs == {"retention.ms": "-1"}
    cache.refresh()


def test_an_unreadable_assignment_is_that_topics_error_in_admin_requests(zookeeper, tmp_path):
    """CreatePartitions and AlterPartitionReassignments on a topic whose assignment cannot
    be read answer that topic's error; before, the NoAuth escaped their TopicError
    handlers (the whole request failed)."""
    from kio.schema.errors import ErrorCode

    from oncelog.broker.server import Broker
    from oncelog.broker.topics import TopicError
    from oncelog.cluster.topic_admin import TopicAdmin
    from oncelog.cluster.unreadable import Unreadable

    connect = zookeeper.chroot("admin_unreadable")
    store = ZooKeeperStore(connect, 5000)
    _topic(store, "refused")
    store.client.set_acls(zn.topic_path("refused"),
                          [make_digest_acl("someone-else", "secret", all=True)])
    with pytest.raises(Unreadable):
        TopicAdmin(store).assignment("refused")
    store.close()
    broker = Broker(BrokerConfig({
        "log.dirs": str(tmp_path), "broker.id": "1", "listeners": "PLAINTEXT://127.0.0.1:0",
        "zookeeper.connect": connect}))
    try:
        with pytest.raises(TopicError) as refused:
            broker.cluster_topics.add_partitions("refused", 2)
        assert refused.value.error == ErrorCode.unknown_server_error
        answers = broker.cluster_mode.reassign("refused", {0: (2, 1)})
        assert answers[0][0] == ErrorCode.unknown_server_error
    finally:
        broker.topics.close()
        broker.cluster.close()
