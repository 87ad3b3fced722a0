"""What one partition of a coordinator's internal topic costs when it moves: resigning it
(and loading it) costs time linear in the keys of that partition, not in every group or
transactional id the coordinator holds in its other partitions (a broker taking over a
third of fifty partitions from a dead one resigns or loads each in turn). Measured as a
ratio side by side in one run: the same partition moved back and forth while the
coordinator holds few or many keys elsewhere."""

from __future__ import annotations

import asyncio
import statistics
import time

from support.group_coordinator_helpers import MemoryOffsetsLog

from oncelog.coordinator.group import group_records as rec
from oncelog.coordinator.group.group_coordinator import GroupConfig, GroupCoordinator
from oncelog.coordinator.internal_log import partition_for
from oncelog.coordinator.transaction import txn_records as tr
from oncelog.coordinator.transaction.transaction_coordinator import (
    TransactionCoordinator,
    TxnConfig,
)
from oncelog.coordinator.transaction.txn_records import TxnState

CYCLES = 30


def keys_in(partition: int, count: int, prefix: str) -> list[str]:
    found, i = [], 0
    while len(found) < count:
        key = f"{prefix}{i}"
        i += 1
        if partition_for(key, 2) == partition:
            found.append(key)
    return found


def group_log(elsewhere: int) -> MemoryOffsetsLog:
    log = MemoryOffsetsLog()
    for partition, count in ((0, 3), (1, elsewhere)):
        log.partitions[partition] = [
            (rec.offset_key(g, "t", 0), rec.offset_value_of(1, -1, "", 0, -1))
            for g in keys_in(partition, count, "g")]
    return log


def txn_log(elsewhere: int) -> MemoryOffsetsLog:
    log = MemoryOffsetsLog()
    for partition, count in ((0, 3), (1, elsewhere)):
        log.partitions[partition] = [
            (tr.txn_key(t), tr.txn_value(tr.TxnValue(7, 0, 60_000, TxnState.EMPTY, (), 0, -1)))
            for t in keys_in(partition, count, "tx")]
    return log


async def settled(condition) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("not settled")


async def moving_partition_0(coordinator) -> float:
    """The median of the seconds spent resigning and loading partition 0 again, over CYCLES
    moves (a pause of the machine in one of them says nothing), the other partition (with
    its keys) held all along."""
    coordinator.elect(1, 0)
    coordinator.elect(0, 0)
    await settled(lambda: coordinator.ownership.error(0) is None
                  and coordinator.ownership.error(1) is None)
    spent = []
    for cycle in range(CYCLES):
        started = time.perf_counter()
        coordinator.resign(0, 2 * cycle + 1)
        coordinator.elect(0, 2 * cycle + 2)
        await settled(lambda: coordinator.ownership.error(0) is None)
        spent.append(time.perf_counter() - started)
    coordinator.close()
    return statistics.median(spent)


def costs(make) -> tuple[float, float]:
    few = asyncio.run(moving_partition_0(make(30)))
    many = asyncio.run(moving_partition_0(make(4_000)))
    return few, many


def test_moving_a_group_partition_costs_its_own_groups_only():
    few, many = costs(lambda n: GroupCoordinator(
        group_log(n), GroupConfig(num_partitions=2), lambda t, p: True, owns_all=False))
    assert many / few < 8, (few, many)


def test_moving_a_transaction_partition_costs_its_own_ids_only():
    ids = iter(range(1000, 2000))
    few, many = costs(lambda n: TransactionCoordinator(
        txn_log(n), TxnConfig(num_partitions=2), lambda: next(ids), lambda t, p: True,
        None, owns_all=False))
    assert many / few < 8, (few, many)
