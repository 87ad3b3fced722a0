"""A coordinator's writes in cluster mode (broker/internal_topics.py ReplicatedTopicLog) over a
real partition of a real TopicManager with its replication state: refused NOT_COORDINATOR off
the leader, COORDINATOR_NOT_AVAILABLE with the ISR below min.insync.replicas, durable only
once the high watermark passes the batch, and NOT_COORDINATOR, never a success, when the
lead is lost while the write waits."""

from __future__ import annotations

import asyncio

import pytest
from kio.schema.errors import ErrorCode
from support.compaction_config_helpers import NoProducers

from oncelog.broker.apis.groups import InternalTopicLog
from oncelog.broker.config import BrokerConfig
from oncelog.broker.internal_topics import ReplicatedTopicLog, local_replica
from oncelog.broker.replication import ReplicaState
from oncelog.broker.topics import OFFSETS_TOPIC, TopicManager
from oncelog.coordinator.internal_log import NotReplicated, WriteFailed
from oncelog.metadata.store import LocalFileStore

RECORD = [(b"k", b"v")]


def replicated(tmp_path, isr=(1, 2), leader=1, min_insync=2):
    config = BrokerConfig({"log.dirs": str(tmp_path / "data"), "broker.id": "1",
                           "offsets.topic.num.partitions": "1"})
    topics = TopicManager(config, LocalFileStore(str(tmp_path / "meta")), NoProducers())
    partition = topics.offsets_topic().partitions[0]
    partition.replication = ReplicaState(1, leader, 0, tuple(isr), (1, 2), 0,
                                         min_insync=min_insync)
    log = ReplicatedTopicLog(InternalTopicLog(topics, OFFSETS_TOPIC,
                                              local_replica(topics, OFFSETS_TOPIC)),
                             topics, OFFSETS_TOPIC, 5000)
    return topics, partition, log


def test_durable_once_the_isr_has_the_batch(tmp_path):
    async def scenario():
        topics, partition, log = replicated(tmp_path)
        base, durable = log.append_at(0, RECORD)
        assert base == 0 and durable is not None
        await asyncio.sleep(0.01)
        assert not durable.done()  # the follower has not fetched it
        partition.replication.follower_fetched(2, 1, partition.log.log_end_offset, 0)
        partition.replication.advance_high_watermark(partition.log.log_end_offset)
        await asyncio.wait_for(durable, 1)
        topics.close()
    asyncio.run(scenario())


def test_a_lead_lost_while_waiting_is_not_coordinator(tmp_path):
    async def scenario():
        topics, partition, log = replicated(tmp_path)
        durable = log.append(0, RECORD)
        partition.replication.fail_waiters(ErrorCode.not_leader_or_follower, "moved")
        with pytest.raises(NotReplicated) as refused:
            await asyncio.wait_for(durable, 1)
        assert refused.value.error == ErrorCode.not_coordinator
        topics.close()
    asyncio.run(scenario())


@pytest.mark.parametrize(("isr", "leader", "error"), [
    ((1,), 1, ErrorCode.coordinator_not_available),  # NOT_ENOUGH_REPLICAS before the append
    ((1, 2), 2, ErrorCode.not_coordinator),  # a follower
])
def test_refused_before_the_append(tmp_path, isr, leader, error):
    async def scenario():
        topics, partition, log = replicated(tmp_path, isr=isr, leader=leader)
        with pytest.raises(WriteFailed) as refused:
            log.append(0, RECORD)
        assert refused.value.error == error
        assert partition.log.log_end_offset == 0  # nothing written
        topics.close()
    asyncio.run(scenario())
