"""A replica made leader whose log is not open yet has it opened in a worker
thread first (ReplicaManager._open_first): the role is applied once the log is open, with the
newest state asked for meanwhile, and a state that needs no log (a fence) asked meanwhile
overrides the one held. The real replica manager (apply_state called directly, on a real
ZooKeeper session) and partition, the worker held at the log's first file operation."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from types import SimpleNamespace

from support.txn_storage_helpers import Issued

from oncelog.broker import log_opening
from oncelog.broker.config import BrokerConfig
from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.broker.replica_manager import ReplicaManager
from oncelog.cluster.isr import Role
from oncelog.cluster.znodes import PartitionState
from oncelog.log.disk import OsDisk
from oncelog.log.log import LogConfig
from oncelog.metadata.zookeeper import ZooKeeperStore
from oncelog.producer_state.manager import StateLimits

WAIT_S = 10


class HeldDisk(OsDisk):
    """The real filesystem; the first isdir of ``held`` waits for ``release``."""

    def __init__(self, held: str) -> None:
        self.held: str | None = held
        self.reached = threading.Event()
        self.release = threading.Event()

    def isdir(self, path: str) -> bool:  # type: ignore[override]
        if path == self.held and threading.current_thread() is not threading.main_thread():
            self.held = None
            self.reached.set()
            assert self.release.wait(WAIT_S)
        return os.path.isdir(path)


async def _until(condition) -> None:
    for _ in range(WAIT_S * 100):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never settled")


def test_a_new_role_waits_for_its_log_opened_in_a_worker(zookeeper, tmp_path):
    store = ZooKeeperStore(zookeeper.chroot(), 10_000)
    broker = SimpleNamespace(broker_id=1, topics=SimpleNamespace(topics={}, log_dirs={}),
                             config=BrokerConfig(), cluster=SimpleNamespace(store=store))
    directory = str(tmp_path / "t-0")
    disk = HeldDisk(directory)
    partition = Partition("t", 0, directory, LogConfig(), 1 << 20, StateLimits(), Issued(),
                          log_dir=LogDir(str(tmp_path)), disk=disk, topic_id=uuid.uuid4())

    async def scenario() -> None:
        manager = ReplicaManager(broker)

        def apply(epoch: int, vouched: bool = True) -> Role:
            return manager.apply_state(partition, PartitionState(1, epoch, (1, 2), 1), epoch,
                                       (1, 2), 1, vouched=vouched)

        assert apply(3) is Role.BECOME_LEADER
        assert await asyncio.to_thread(disk.reached.wait, WAIT_S)
        # the loop goes on meanwhile; the replica does not lead before its log is open
        assert partition.replication is None or not partition.replication.is_leader
        assert apply(4) is Role.BECOME_LEADER  # a newer state: the one applied
        disk.release.set()
        await _until(lambda: partition.replication is not None and
                     partition.replication.is_leader)
        assert partition.is_open and partition.replication.leader_epoch == 4
        assert partition.leader_epochs.latest_epoch == 4
        await _until(lambda: not log_opening.busy(directory))

        partition.close()  # its log closed again: a new role opens it again, and a fence
        disk.held, disk.reached, disk.release = directory, threading.Event(), \
            threading.Event()                                    # asked meanwhile wins
        assert apply(5) is Role.BECOME_LEADER
        assert await asyncio.to_thread(disk.reached.wait, WAIT_S)
        assert apply(5, vouched=False) is Role.FENCE
        disk.release.set()
        await _until(lambda: not log_opening.busy(directory))
        await asyncio.sleep(0)
        assert not partition.replication.is_leader

        # A demotion never waits for the log: a leader whose log is being reopened (here
        # by a use after a close; a follower's cut alike) follows at once, so that no
        # request queued behind the reopening appends as the stale leader.
        assert apply(6) is Role.BECOME_LEADER and partition.replication.is_leader
        partition.close()
        disk.held, disk.reached, disk.release = directory, threading.Event(), \
            threading.Event()
        reopening = partition.start_opening()
        assert await asyncio.to_thread(disk.reached.wait, WAIT_S)
        assert manager.apply_state(partition, PartitionState(2, 7, (1, 2), 1), 7, (1, 2),
                                   1) is Role.BECOME_FOLLOWER
        assert not partition.replication.is_leader
        assert partition.replication.leader == 2
        assert manager.apply_state(partition, PartitionState(1, 8, (1, 2), 1), 8, (1, 2),
                                   1) is Role.BECOME_LEADER  # waits for the log again
        assert manager.apply_state(partition, PartitionState(1, 6, (1, 2), 1), 6, (1, 2),
                                   1) is not Role.BECOME_FOLLOWER
        disk.release.set()
        await reopening
        await _until(lambda: partition.replication.is_leader)
        assert partition.replication.leader_epoch == 8  # never the stale state held
        await manager.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        store.close()
        partition.close()
