"""The one reading of topics and partition states from ZooKeeper
(cluster/watched_topics.read_topics and read_states), shared by the controller's picture and
its unwatched reads (ElectLeaders): only an absent znode is read as absence. Any other
failure raises and the read is tried again: a config znode the broker may not read is not a
topic without overrides. On a real ZooKeeper, the failure an ACL refusal (NoAuth)."""

from __future__ import annotations

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl

from oncelog.cluster import znodes as zn
from oncelog.cluster.controller import Controller
from oncelog.cluster.membership import ClusterMember
from oncelog.cluster.watched_topics import WatchedTopics
from oncelog.metadata.zookeeper import ZooKeeperStore

pytestmark = pytest.mark.xdist_group("zookeeper")


@pytest.fixture
def store(zookeeper):
    opened = ZooKeeperStore(zookeeper.chroot("topic_reads"), 5000)
    yield opened
    opened.close()


def _topic(store: ZooKeeperStore, name: str, config_acl=None) -> None:
    zk = store.client
    zk.create(zn.topic_path(name), zn.TopicAssignment(
        "AAAAAAAAAAAAAAAAAAAAAA", {0: (1, 2)}, {}, {}).encode(), makepath=True)
    zk.create(zn.partition_state_path(name, 0), zn.PartitionState(1, 0, (1, 2), 1).encode(),
              makepath=True)
    if config_acl is not None:
        zk.ensure_path(zn.topic_config_path("x").rsplit("/", 1)[0])
        zk.create(zn.topic_config_path(name), b'{"version":1,"config":{}}', acl=config_acl)


def test_absent_is_absence_and_any_other_failure_raises(store):
    _topic(store, "plain")
    _topic(store, "locked", [make_digest_acl("someone-else", "secret", all=True)])
    controller = Controller(ClusterMember(store, 1, None), lambda: False)
    [plain] = controller.read_topics(["plain"])
    assert plain.configs == {} and plain.has_partitions_node
    assert plain.states[0][0].isr == (1, 2)
    assert controller.read_topics(["absent"]) == []
    # Before, the controller's own copy of this read took the refused config for none.
    with pytest.raises(NoAuthError):
        controller.read_topics(["locked"])
    picture = WatchedTopics(store, lambda: None)
    with pytest.raises(NoAuthError):
        picture.read()
