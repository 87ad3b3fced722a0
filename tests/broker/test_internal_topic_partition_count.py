"""An internal topic's partition count is never guessed while the topic exists
(broker/internal_topics.num_partitions): a broker mapping transactional ids by hash % its
own setting while the others use the topic's count makes two coordinators for one id. Real
ZooKeeper; the broker is the one attribute num_partitions reads."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from kazoo.security import make_digest_acl
from support.zookeepers import store_fixture

from oncelog.broker.internal_topics import num_partitions
from oncelog.cluster import ClusterStartError
from oncelog.cluster import znodes as zn
from oncelog.cluster.topic_admin import TopicAdmin

pytestmark = pytest.mark.xdist_group("zookeeper")

_ID = "AAAAAAAAAAAAAAAAAAAAAA"
LIMIT_S = 60.0


store = store_fixture("internal_topic_partition_count")


def _broker(store):
    return SimpleNamespace(cluster_mode=SimpleNamespace(admin=TopicAdmin(store)))


def _states(store, name: str, count: int) -> None:
    for p in range(count):
        store.client.create(zn.partition_state_path(name, p),
                            zn.PartitionState(1, 0, (1,), 1).encode(), makepath=True)


def _never(_wait):
    raise AssertionError("read again, though the count was there to read")


def test_the_topics_count_and_the_setting_for_a_missing_topic(store):
    store.client.create(zn.topic_path("readable"), zn.TopicAssignment(
        _ID, {p: (1,) for p in range(5)}, {}, {}).encode(), makepath=True)
    assert num_partitions(_broker(store), "readable", 2, LIMIT_S, sleep=_never) == 5
    assert num_partitions(_broker(store), "missing", 2, LIMIT_S, sleep=_never) == 2


def test_an_unreadable_assignment_counts_the_partitions_znodes(store):
    """Before: the broker's setting (2), while the topic has 5 partitions."""
    store.client.create(zn.topic_path("noauth"), zn.TopicAssignment(
        _ID, {p: (1,) for p in range(5)}, {}, {}).encode(), makepath=True)
    _states(store, "noauth", 5)
    store.client.set_acls(zn.topic_path("noauth"),
                          [make_digest_acl("someone-else", "secret", all=True)])
    assert num_partitions(_broker(store), "noauth", 2, LIMIT_S, sleep=_never) == 5


def test_no_count_to_read_waits_and_says_so_once(store, caplog):
    """Neither the assignment (corrupt) nor its partitions (not there yet) tell the count:
    it reads again after each bounded wait, warns once, and answers once they do."""
    store.client.create(zn.topic_path("corrupt"), b"\xff{", makepath=True)
    waits = []

    def sleep(wait):
        waits.append(wait)
        assert len(waits) < 20
        if len(waits) == 4:
            _states(store, "corrupt", 3)

    with caplog.at_level(logging.WARNING, logger="oncelog.broker.internal_topics"):
        assert num_partitions(_broker(store), "corrupt", 2, LIMIT_S, sleep=sleep) == 3
    assert len(waits) == 4 and max(waits) <= 2.0
    said = [r for r in caplog.records if "internal topic corrupt" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]


def test_no_count_within_the_limit_gives_up_saying_why(store, caplog):
    """Still nothing to count when the limit (zookeeper.connection.timeout.ms) is spent: the
    broker cannot start (ClusterStartError, its exit 3), never a wait without end; the last
    wait is cut to what is left of the limit."""
    store.client.create(zn.topic_path("never"), b"\xff{", makepath=True)
    now = [0.0]
    waits = []

    def sleep(wait):
        waits.append(wait)
        now[0] += wait

    with pytest.raises(ClusterStartError, match=r"internal topic never could not be read "
                                                r"from ZooKeeper within 3s"):
        num_partitions(_broker(store), "never", 2, 3.0, sleep=sleep, clock=lambda: now[0])
    assert waits == [0.1, 0.2, 0.5, 1.0, 1.2] and now[0] == pytest.approx(3.0)
