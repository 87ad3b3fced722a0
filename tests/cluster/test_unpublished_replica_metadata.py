"""A broker's metadata answers come from its metadata cache (cluster/metadata_cache.py), never
from the local copy its replica manager made of a cluster topic: the replica watch and the
cache read ZooKeeper apart, and the copy, made before the cache published the topic, knows no
leader nor replicas (Metadata then showed leader -1, replicas and ISR [this broker]: the
flaky test_auto_created_topic_gets_default_replication). A topic the broker kept alone
before it joined a cluster is still answered. A Metadata auto-create of a topic another
broker created first, not yet in this broker's cache, answers LEADER_NOT_AVAILABLE as Kafka
does (it answered TOPIC_ALREADY_EXISTS, with no partitions)."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode


def test_a_local_replica_the_cache_has_not_published_is_not_answered(zookeeper, tmp_path):
    from oncelog.broker.config import BrokerConfig
    from oncelog.broker.server import Broker
    from oncelog.broker.topics import TopicError
    from oncelog.cluster import znodes as zn
    from oncelog.cluster.metadata_cache import encode_topic_id
    from oncelog.cluster.replica_watch import TopicView

    alone = Broker(BrokerConfig({"log.dirs": str(tmp_path), "broker.id": "1"}))
    alone.topics.create("alone", 1, 1, {})
    alone.topics.close()
    broker = Broker(BrokerConfig({
        "log.dirs": str(tmp_path), "broker.id": "1", "zookeeper.connect": zookeeper.chroot(),
        "listeners": "PLAINTEXT://127.0.0.1:0"}))
    try:
        # the replica watch's view of a new topic, handed before the cache publishes it
        topic_id = uuid.uuid4()
        assignment = zn.TopicAssignment(encode_topic_id(topic_id), {0: (1, 2, 3), 1: (2, 3, 1)},
                                        {}, {})
        broker.replicas.apply_view({"early": TopicView("early", assignment, {}, {})})
        early = broker.topics.get("early")
        assert early is not None and early.topic_id == topic_id  # the local copy is there
        topics = broker.cluster_topics
        assert topics.get("early") is None
        assert topics.by_id(early.topic_id) is None
        assert "early" not in topics.topics
        assert topics.get("alone") is not None and "alone" in topics.topics

        broker.cluster.start("127.0.0.1", 9, background=False)  # registered: placed on
        broker.cluster_mode.admin.ensure_paths()  # another broker's creation, not yet cached
        broker.cluster_mode.admin.create_topic("taken", zn.TopicAssignment(
            encode_topic_id(uuid.uuid4()), {0: (2, 3, 1)}, {}, {}), {})
        with pytest.raises(TopicError) as refused:
            topics.auto_create("taken")
        assert refused.value.error == ErrorCode.leader_not_available
    finally:
        broker.topics.close()
        broker.cluster.close()
