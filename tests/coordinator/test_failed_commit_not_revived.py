"""A coordinator write that failed to become durable while its log stayed online (the fsync
could not get a descriptor, EMFILE; in a cluster, a write not replicated in time) is still in
the log: the append itself is all or nothing (log/segment.py cuts a failed append back, held
by tests/log/test_log.py's model, faults and crashes included), but this one was appended.
Its offsets are never served (offset_rules O9), and a deletion must write their tombstones
all the same, or a restart reads the record back and a deleted group's offset comes back
(O9's "unsure" partitions, tombstoned by O2 like the ones held).

The coordinator runs in process over the broker's own log of ``__consumer_offsets`` (a
TopicManager on a MemoryDisk, fsync after every message); the restart is a kill -9 (the page
cache keeps what was written)."""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode as E
from support.compaction_config_helpers import NoProducers

from oncelog.broker.apis.groups import make_coordinator
from oncelog.broker.config import BrokerConfig
from oncelog.broker.topics import TopicManager
from oncelog.coordinator.group.group_coordinator import OffsetCommitPartition
from oncelog.log.memory_disk import MemoryDisk
from oncelog.metadata.store import LocalFileStore


def _offset(coordinator, group: str) -> int | None:
    error, ((_, _, value),) = coordinator.fetch(group, [("t", [0])])
    assert error is E.none
    return None if value is None else value.offset


def _at(offset: int) -> list[OffsetCommitPartition]:
    return [OffsetCommitPartition("t", 0, offset, -1, "")]


def _starter(tmp_path, disk: MemoryDisk):
    disk.makedirs("/data")
    config = BrokerConfig({"log.dirs": "/data", "offsets.topic.num.partitions": "1",
                           "log.flush.interval.messages": "1"})
    store = LocalFileStore(str(tmp_path / "meta"))

    async def start():
        topics = TopicManager(config, store, NoProducers(), disk=disk)
        coordinator = make_coordinator(config, topics)
        coordinator.partition_exists = lambda topic, partition: topic == "t"
        await coordinator.load_all()
        return topics, coordinator
    return start


def test_a_deleted_group_does_not_get_back_the_offset_of_a_failed_commit(tmp_path):
    disk = MemoryDisk()
    start = _starter(tmp_path, disk)

    async def scenario() -> None:
        topics, coordinator = await start()
        assert await coordinator.commit("other", -1, "", None, -1, _at(1)) == [E.none]
        disk.max_fds = disk.open_fds  # the fsync's descriptor cannot be had: EMFILE
        assert await coordinator.commit("g", -1, "", None, -1, _at(7)) == [E.not_coordinator]
        disk.max_fds = None
        assert _offset(coordinator, "g") is None  # O9
        assert await coordinator.delete_group("g") is E.none
        coordinator.close()
        topics.close()
        disk.crash()

        topics, coordinator = await start()
        try:
            assert _offset(coordinator, "other") == 1
            assert _offset(coordinator, "g") is None  # before: 7, the failed commit's
        finally:
            coordinator.close()
            topics.close()

    asyncio.run(asyncio.wait_for(scenario(), 20))
