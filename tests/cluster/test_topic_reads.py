"""The one reading of topics and partition states from ZooKeeper
(cluster/watched_topics.read_topics and read_states), shared by the controller's picture and
its unwatched reads (ElectLeaders): only an absent znode is read as absence. A znode that
cannot be read through its own fault (an ACL refusal, NoAuth; bytes that are not JSON) marks
its topic or partition alone (cluster/unreadable.py): it is not a topic without overrides,
nor an absent state, and the other topics are read. ZooKeeper away fails the whole read. On
a real ZooKeeper."""

from __future__ import annotations

import pytest
from kazoo.security import make_digest_acl
from kio.schema.errors import ErrorCode
from support.zookeepers import store_fixture

from oncelog.cluster import znodes as zn
from oncelog.cluster.controller import Controller
from oncelog.cluster.leader_election import Ask
from oncelog.cluster.membership import ClusterMember
from oncelog.cluster.topic_admin import TopicAdmin
from oncelog.cluster.watched_topics import WatchedTopics
from oncelog.metadata.store import MetadataUnavailable
from oncelog.metadata.zookeeper import ZooKeeperStore

pytestmark = pytest.mark.xdist_group("zookeeper")


store = store_fixture("topic_reads")


def _topic(store: ZooKeeperStore, name: str, config_acl=None) -> None:
    zk = store.client
    zk.create(zn.topic_path(name), zn.TopicAssignment(
        "AAAAAAAAAAAAAAAAAAAAAA", {0: (1, 2)}, {}, {}).encode(), makepath=True)
    zk.create(zn.partition_state_path(name, 0), zn.PartitionState(1, 0, (1, 2), 1).encode(),
              makepath=True)
    if config_acl is not None:
        zk.ensure_path(zn.topic_config_path("x").rsplit("/", 1)[0])
        zk.create(zn.topic_config_path(name), b'{"version":1,"config":{}}', acl=config_acl)


def test_absent_is_absence_unreadable_is_that_topic_alone(store):
    _topic(store, "plain")
    _topic(store, "locked", [make_digest_acl("someone-else", "secret", all=True)])
    _topic(store, "corrupt")
    store.client.set(zn.partition_state_path("corrupt", 0), b"\xff{")
    controller = Controller(ClusterMember(store, 1, None), lambda: False)
    [plain] = controller.read_topics(["plain"])
    assert plain.configs == {} and plain.has_partitions_node and plain.problem is None
    assert plain.states[0][0].isr == (1, 2)
    assert controller.read_topics(["absent"]) == []
    # Before, the controller's own copy of this read took the refused config for none; then
    # the refusal raised, and every read that held the topic failed with it.
    [locked] = controller.read_topics(["locked"])
    assert locked.problem is not None and "NoAuth" in locked.problem
    [corrupt] = controller.read_topics(["corrupt"])
    assert corrupt.problem is None and 0 in corrupt.bad_states and 0 not in corrupt.states
    TopicAdmin(store).ensure_paths()
    store.client.ensure_path(zn.BROKER_IDS)
    answers, waiting = controller.elect([("plain", 0), ("locked", 0), ("corrupt", 0)],
                                        Ask.PREFERRED)
    assert waiting == []  # no handover: none of them moves a live leader
    assert answers[("plain", 0)][0] == ErrorCode.election_not_needed
    assert answers[("locked", 0)][0] == ErrorCode.unknown_server_error
    assert answers[("corrupt", 0)][0] == ErrorCode.unknown_server_error
    picture = WatchedTopics(store, lambda: None)
    read = {t.name: t for t in picture.read()}
    assert read["plain"].problem is None and read["plain"].states[0][0].leader == 1
    assert "NoAuth" in read["locked"].problem and read["corrupt"].bad_states
    # repaired: read again at the next read (no watch fires for an ACL change)
    store.client.set(zn.partition_state_path("corrupt", 0),
                     zn.PartitionState(2, 3, (2,), 1).encode())
    read = {t.name: t for t in picture.read()}
    assert not read["corrupt"].bad_states and read["corrupt"].states[0][0].leader == 2
    # ZooKeeper away is no topic's fault: the whole read fails
    store.client.stop()
    with pytest.raises(MetadataUnavailable):
        picture.read()
