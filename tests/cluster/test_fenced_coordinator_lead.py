"""A leader of a coordinator's internal partition that is fenced (it cannot vouch for its
ZooKeeper session, role row B0) and then leads again at the same leader epoch (B7): the
fence resigns the coordinator's partition without an epoch (ownership.py O8), so the lead
regained at the same epoch loads it again (O2) and serves it; with the epoch, O1 would take
that election for a repeat and the partition would answer NOT_COORDINATOR for good. The
real replica manager (apply_state called directly, on a real ZooKeeper session), partition
and transaction coordinator, hooked as the broker hooks them (internal_topics.on_leadership)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from kio.schema.errors import ErrorCode as E
from support.group_coordinator_helpers import MemoryOffsetsLog

from oncelog.broker.config import BrokerConfig
from oncelog.broker.internal_topics import on_leadership
from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.broker.replica_manager import ReplicaManager
from oncelog.broker.topics import TRANSACTION_STATE_TOPIC
from oncelog.cluster.isr import Role
from oncelog.cluster.znodes import PartitionState
from oncelog.coordinator.transaction.transaction_coordinator import (
    TransactionCoordinator,
    TxnConfig,
)
from oncelog.log.log import LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.metadata.zookeeper import ZooKeeperStore
from oncelog.producer_state.manager import StateLimits


class Issued:
    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < 1000

    def highest_claimed(self) -> int:
        return 999


async def settled(condition) -> None:
    # In time, not turns of the loop: a replica's log is opened in a worker thread before
    # it leads (ReplicaManager._open_first).
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not settled")


def test_a_fenced_coordinator_leading_again_at_the_same_epoch_serves_its_partition(
        zookeeper):
    store = ZooKeeperStore(zookeeper.chroot(), 10_000)
    broker = SimpleNamespace(broker_id=1, topics=SimpleNamespace(topics={}, log_dirs={}),
                             config=BrokerConfig(), cluster=SimpleNamespace(store=store))

    async def scenario():
        manager = ReplicaManager(broker)
        ids = iter(range(1000, 2000))
        coordinator = TransactionCoordinator(
            MemoryOffsetsLog(), TxnConfig(num_partitions=1), lambda: next(ids),
            lambda t, p: True, None, owns_all=False)
        manager.on_leadership = on_leadership(
            SimpleNamespace(groups=None, transactions=coordinator))
        partition = Partition(TRANSACTION_STATE_TOPIC, 0, "/data/__transaction_state-0",
                              LogConfig(), 1 << 20, StateLimits(), Issued(),
                              log_dir=LogDir("/data"), disk=MemoryDisk())
        state = PartitionState(1, 4, (1, 2), 1)

        def apply(vouched: bool) -> Role:
            return manager.apply_state(partition, state, 3, (1, 2), 1, vouched=vouched)

        assert apply(True) is Role.BECOME_LEADER
        await settled(lambda: coordinator.ownership.error(0) is None)
        assert (await coordinator.init("tx", 10_000, -1, -1))[0] is E.none
        assert apply(False) is Role.FENCE  # B0: the session is not vouched for
        assert coordinator.describe("tx")[0] is E.not_coordinator
        assert apply(True) is Role.BECOME_LEADER  # B7: the same epoch, vouched again
        await settled(lambda: coordinator.ownership.error(0) is None)
        assert coordinator.ownership.epoch(0) == 4
        assert coordinator.describe("tx")[0] is E.none  # read back from the log
        coordinator.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 10))
    finally:
        store.close()
