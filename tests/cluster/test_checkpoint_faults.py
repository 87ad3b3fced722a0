"""Disk faults on the replication checkpoints (issue 23), on a MemoryDisk that fails on demand.

- ``leader-epoch-checkpoint``, written as a follower appends the leader's batches
  (``Partition.append_as_follower``): a write running out of space (ENOSPC), an I/O error
  (EIO), a failed fsync, a failed rename or a failed fsync of the directory. Kafka takes the
  log directory offline when a checkpoint cannot be written (the epochs on disk would no
  longer say where each epoch of the log starts, and a restart would truncate by them), and
  so does oncelog: the append answers the directory's offline error, the partition answers
  KAFKA_STORAGE_ERROR until a restart, the file holds what it held before (or, after a
  failed fsync of the directory, possibly the new entries: never a torn file), the cache in
  memory is never ahead of it, and a restart recovers from what is on disk.
- The same checkpoint written by a replica made leader (ReplicaManager.apply_state, row B4):
  the same one function takes the directory offline; the view's apply goes on (the error does
  not escape it), and the replica leads nothing.
- ``replication-offset-checkpoint`` (the high watermark): the write fails with the file as it
  was, and the next checkpoint writes it again (the replica manager retries each interval; an
  older high watermark on disk is safe, a restart only truncates more and fetches it again).
- Whatever fault and whatever a power cut keeps afterwards, each checkpoint parses as its
  old or its new content.
"""

from __future__ import annotations

import asyncio
import errno
import random
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.broker.config import BrokerConfig
from oncelog.broker.log_dirs import LogDir, LogDirOffline
from oncelog.broker.partition import Partition
from oncelog.broker.replica_manager import ReplicaManager
from oncelog.broker.replication import HW_CHECKPOINT_FILE
from oncelog.cluster.isr import Role
from oncelog.cluster.znodes import PartitionState
from oncelog.log import offset_checkpoint
from oncelog.log.disk import read_file, replace_file
from oncelog.log.leader_epoch import LEADER_EPOCH_CHECKPOINT_FILE, LeaderEpochCache, parse
from oncelog.log.log import LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.metadata.zookeeper import ZooKeeperStore
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.record_batch import scan_batches
from oncelog.protocol.records import encode_batch

DIR = "/data/t-0"
HW_FILE = f"/data/{HW_CHECKPOINT_FILE}"  # one per log directory


def write_hw_checkpoint(disk, high_watermark):
    offset_checkpoint.write(disk, HW_FILE, {("t", 0): high_watermark, ("u", 3): 7})


def read_hw_checkpoint(disk):
    entries = offset_checkpoint.read(disk, HW_FILE)
    assert entries.get(("u", 3), 7) == 7  # the other partitions of the directory stay whole
    return entries.get(("t", 0), 0)


NOW = int(time.time() * 1000)
# (operation, errno, bytes a failing write takes first): each way writing a checkpoint fails
FAULTS = [("write", errno.ENOSPC, 7), ("write", errno.EIO, 0), ("fsync", errno.EIO, 0),
          ("rename", errno.EIO, 0), ("fsync_dir", errno.EIO, 0)]


class Issued:
    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < 1000

    def highest_claimed(self) -> int:
        return 999


def open_partition(disk: MemoryDisk) -> Partition:
    return Partition("t", 0, DIR, LogConfig(), 1 << 20, StateLimits(), Issued(),
                     log_dir=LogDir("/data"), disk=disk)


def leader_batches(epochs: list[int]) -> bytes:
    """What a leader's Fetch answer carries: one idempotent batch of two records per entry,
    at offsets 0, 2, 4, ..., stamped with that leader epoch."""
    leader_disk = MemoryDisk()
    leader = Partition("t", 0, "/leader/t-0", LogConfig(), 1 << 20, StateLimits(), Issued(),
                       log_dir=LogDir("/leader"), disk=leader_disk)
    for i, epoch in enumerate(epochs):
        leader.leader_epoch = epoch
        leader.append_records(encode_batch([(None, b"r%d" % j, (), NOW) for j in (2 * i,
                                                                                 2 * i + 1)],
                                           producer_id=7, producer_epoch=0,
                                           base_sequence=2 * i))
    return bytes(leader.log.read(0, 1 << 30).records)


def epochs_on_disk(disk: MemoryDisk) -> list[tuple[int, int]]:
    return parse(read_file(disk, f"{DIR}/{LEADER_EPOCH_CHECKPOINT_FILE}").decode())


@pytest.mark.parametrize(("op", "error", "partial"), FAULTS)
def test_a_failed_leader_epoch_checkpoint_takes_the_log_dir_offline(op, error, partial):
    records = leader_batches([0, 0, 1, 1])
    first_epoch_1 = next(p for p, h in scan_batches(records) if h.partition_leader_epoch == 1)
    disk = MemoryDisk()
    follower = open_partition(disk)
    assert follower.append_as_follower(records[:first_epoch_1]) == first_epoch_1
    assert epochs_on_disk(disk) == [(0, 0)]
    suffix = LEADER_EPOCH_CHECKPOINT_FILE + ("" if op == "fsync_dir" else ".tmp")
    disk.fail(op, error, partial, path_suffix="" if op == "fsync_dir" else suffix)
    with pytest.raises(LogDirOffline):
        follower.append_as_follower(records[first_epoch_1:])
    assert follower.log_dir.offline
    on_disk = epochs_on_disk(disk)
    if op == "fsync_dir":  # renamed, not known durable: old or new, whole
        assert on_disk in ([(0, 0)], [(0, 0), (1, 4)])
    else:
        assert on_disk == [(0, 0)]  # as before the fault
    assert follower.leader_epochs.entries == on_disk[:len(follower.leader_epochs.entries)]
    assert not disk.exists(f"{DIR}/{LEADER_EPOCH_CHECKPOINT_FILE}.tmp")
    # a restart recovers from the disk: the log and the epochs it recorded agree, and the
    # follower takes the rest of the leader's log
    disk.crash()
    disk.clear_faults()
    again = open_partition(disk)
    kept = again.log.log_end_offset
    assert [e for e, start in again.leader_epochs.entries if start < kept] == \
        [e for e, _ in again.leader_epochs.entries]
    rest = b"".join(bytes(records[p:p + h.size]) for p, h in scan_batches(records)
                    if h.base_offset >= kept)
    if again.leader_epochs.latest_epoch == 0 and kept > 4:
        again.truncate_to(4)  # as OffsetForLeaderEpoch would: epoch 0 ends at 4
        rest = records[first_epoch_1:]
    again.append_as_follower(rest)
    assert again.log.log_end_offset == 8
    assert again.leader_epochs.entries == [(0, 0), (1, 4)]


@pytest.fixture(scope="module")
def replica_manager(zookeeper):
    """Broker 1's replica manager (never started: apply_state is called directly) on a real
    ZooKeeper session; the broker around it holds only what apply_state reads."""
    store = ZooKeeperStore(zookeeper.chroot(), 10_000)
    broker = SimpleNamespace(broker_id=1, topics=SimpleNamespace(topics={}, log_dirs={}),
                             config=BrokerConfig(), cluster=SimpleNamespace(store=store))
    yield ReplicaManager(broker)
    store.close()


@pytest.mark.parametrize(("op", "error", "partial"), FAULTS)
def test_a_failed_leader_epoch_checkpoint_of_a_new_leader_takes_the_log_dir_offline(
        replica_manager, op, error, partial):
    disk = MemoryDisk()
    partition = open_partition(disk)
    assert partition.append_as_follower(leader_batches([0, 0])) > 0
    disk.fail(op, error, partial,
              path_suffix="" if op == "fsync_dir" else LEADER_EPOCH_CHECKPOINT_FILE + ".tmp")
    role = replica_manager.apply_state(partition, PartitionState(1, 1, (1, 2), 1), 3, (1, 2),
                                       1)
    assert role is Role.BECOME_LEADER
    assert partition.log_dir.offline
    # it leads nothing (Produce: NOT_LEADER_OR_FOLLOWER) until the controller moves the
    # leadership away; a later state of epoch 1 is no news
    assert not partition.replication.is_leader
    assert partition.replication.leader_epoch == 1
    on_disk = epochs_on_disk(disk)
    assert on_disk in ([(0, 0)], [(0, 0), (1, 4)]) if op == "fsync_dir" else on_disk == [(0, 0)]


@pytest.mark.parametrize(("op", "error", "partial"), FAULTS)
def test_a_failed_high_watermark_checkpoint_is_written_again(op, error, partial):
    disk = MemoryDisk()
    disk.makedirs(DIR)
    write_hw_checkpoint(disk, 10)
    disk.fail(op, error, partial,
              path_suffix="" if op == "fsync_dir" else HW_CHECKPOINT_FILE + ".tmp")
    with pytest.raises(OSError):
        write_hw_checkpoint(disk, 20)
    assert read_hw_checkpoint(disk) in ((10, 20) if op == "fsync_dir" else (10,))
    assert not disk.exists(f"{HW_FILE}.tmp")
    write_hw_checkpoint(disk, 20)  # the next interval's checkpoint
    disk.power_loss(random.Random(0))
    assert read_hw_checkpoint(disk) == 20


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(FAULTS), st.integers(0, 2**32 - 1))
def test_no_fault_and_no_power_cut_tears_a_checkpoint(fault, seed):
    op, error, partial = fault
    disk = MemoryDisk()
    disk.makedirs(DIR)
    cache = LeaderEpochCache(DIR, disk)
    cache.assign(0, 0)
    write_hw_checkpoint(disk, 3)
    disk.fsync_dir(DIR)
    for name in (LEADER_EPOCH_CHECKPOINT_FILE, HW_CHECKPOINT_FILE):
        disk.fail(op, error, partial, path_suffix="" if op == "fsync_dir" else name + ".tmp")
    with pytest.raises(OSError):
        cache.assign(1, 5)
    with pytest.raises(OSError):
        write_hw_checkpoint(disk, 9)
    disk.power_loss(random.Random(seed))
    assert LeaderEpochCache(DIR, disk).entries in ([(0, 0)], [(0, 0), (1, 5)])
    assert read_hw_checkpoint(disk) in (3, 9)


def test_high_watermarks_are_one_file_per_log_directory_read_back_once(zookeeper):
    """Every partition of a directory in one checkpoint file (a file and its fsyncs per
    directory per interval, not per partition), read back by the next start; an entry is
    taken once, so a topic deleted and made again under the same name starts from 0."""
    disk = MemoryDisk()
    partitions = [Partition("t", i, f"/data/t-{i}", LogConfig(), 1 << 20, StateLimits(),
                            Issued(), log_dir=LogDir("/data"), disk=disk) for i in range(3)]
    records = leader_batches([0, 0])
    store = ZooKeeperStore(zookeeper.chroot(), 10_000)

    def replica_manager() -> ReplicaManager:
        topics = SimpleNamespace(topics={}, log_dirs={},
                                 get={"t": SimpleNamespace(partitions=partitions)}.get)
        manager = ReplicaManager(SimpleNamespace(
            broker_id=1, topics=topics, config=BrokerConfig(),
            cluster=SimpleNamespace(store=store)))
        manager._replicas.add("t")
        return manager

    async def checkpoint(manager: ReplicaManager) -> None:
        manager.checkpoint_high_watermarks()
        await manager._hw_writing

    try:
        first = replica_manager()
        for partition in partitions:
            partition.append_as_follower(records)
            first.apply_state(partition, PartitionState(1, 0, (1,), 1), 0, (1,), 1)
        for i, partition in enumerate(partitions):
            partition.replication.high_watermark = i + 1
        asyncio.run(checkpoint(first))
        path = f"/data/{HW_CHECKPOINT_FILE}"
        assert offset_checkpoint.read(disk, path) == {("t", 0): 1, ("t", 1): 2, ("t", 2): 3}
        assert not any(disk.exists(f"/data/t-{i}/{HW_CHECKPOINT_FILE}") for i in range(3))

        # A restart: partitions 1 and 2 stay closed (leaderless, say); the file, written
        # whole, keeps their high watermarks when only partition 0 moves.
        for partition in partitions:
            partition.replication = None
        for partition in partitions[1:]:
            partition.close()
        second = replica_manager()
        for partition in partitions:
            second._no_leader_yet(partition)
        assert [p.replication.high_watermark for p in partitions] == [1, 2, 3]
        assert second._hw_checkpointed(partitions[0]) == 0  # taken once
        partitions[0].replication.high_watermark = 4
        asyncio.run(checkpoint(second))
        assert offset_checkpoint.read(disk, path) == {("t", 0): 4, ("t", 1): 2, ("t", 2): 3}
        assert not partitions[1].is_open and not partitions[2].is_open
    finally:
        store.close()


def test_an_offset_checkpoint_that_does_not_parse_is_read_as_empty():
    disk = MemoryDisk()
    disk.makedirs("/data")
    path = "/data/replication-offset-checkpoint"
    offset_checkpoint.write(disk, path, {("a.b-c", 0): 5, ("t", 12): 0})
    assert offset_checkpoint.read(disk, path) == {("a.b-c", 0): 5, ("t", 12): 0}
    whole = read_file(disk, path)
    for broken in (whole[:-1], whole[:len(whole) // 2], b"1\n0\n", b"0\n3\nt 0 1\n", b"x"):
        offset_checkpoint.write(disk, path, {})
        replace_file(disk, path, broken)
        assert offset_checkpoint.read(disk, path) == {}
