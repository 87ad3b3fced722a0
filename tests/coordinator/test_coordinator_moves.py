"""The coordinators taking and giving up partitions of their internal topic (cluster mode's
``elect`` / ``resign``, coordinator/ownership.py), driven directly over a log in memory: a
partition not led here answers NOT_COORDINATOR, one loading COORDINATOR_LOAD_IN_PROGRESS; a
resignation answers the waiting JoinGroups NOT_COORDINATOR and drops the groups; a new
election reads them back; a write not replicated is never a success; the transaction
coordinator's markers carry the partition's leader epoch."""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode as E
from support.group_coordinator_helpers import MemoryOffsetsLog

from oncelog.coordinator.group.group_coordinator import (
    GroupConfig,
    GroupCoordinator,
    OffsetCommitPartition,
)
from oncelog.coordinator.internal_log import NotReplicated
from oncelog.coordinator.transaction.transaction_coordinator import (
    TransactionCoordinator,
    TxnConfig,
)

PROTOCOLS = [("range", b"\x00\x01")]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def group_coordinator(log) -> GroupCoordinator:
    return GroupCoordinator(log, GroupConfig(num_partitions=1, initial_rebalance_delay_ms=0,
                                             min_session_timeout_ms=100),
                            lambda t, p: True, owns_all=False)


async def join(c, member=""):
    return await c.join("g", member, None, "client", "/127.0.0.1", 10_000, 10_000, "consumer",
                        PROTOCOLS, require_known_member_id=False,
                        supports_skip_assignment=True)


async def settled(condition) -> None:
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("not settled")


def test_groups_are_served_only_while_their_partition_is_led_here():
    async def scenario():
        log = MemoryOffsetsLog()
        c = group_coordinator(log)
        assert (await join(c)).error is E.not_coordinator
        c.elect(0, 3)
        assert c.not_served("g") is E.coordinator_load_in_progress
        await settled(lambda: c.not_served("g") is None)
        first = await join(c)
        assert first.error is E.none
        await c.sync("g", first.generation, first.member_id, None, None, None, [])
        assert await c.commit("g", first.generation, first.member_id, None, -1,
                              [OffsetCommitPartition("t", 0, 7, -1, "")]) == [E.none]
        # A second member joins and waits in JoinGroup for the first to rejoin...
        second = asyncio.ensure_future(join(c))
        await asyncio.sleep(0.01)
        assert not second.done()
        c.resign(0, 4)  # ...and is answered NOT_COORDINATOR when the partition goes
        assert (await second).error is E.not_coordinator
        assert "g" not in c.groups
        assert c.fetch("g", None)[0] is E.not_coordinator
        c.elect(0, 3)  # stale: changes nothing
        assert c.not_served("g") is E.not_coordinator
        c.elect(0, 5)  # led here again: read back from the log
        await settled(lambda: c.not_served("g") is None)
        assert c.fetch("g", [("t", [0])])[1][0][2].offset == 7
        c.close()
    run(scenario())


def test_a_resignation_during_a_load_leaves_nothing_loaded():
    async def scenario():
        log = MemoryOffsetsLog()
        writer = group_coordinator(log)
        writer.elect(0, 0)
        await settled(lambda: writer.not_served("g") is None)
        for i in range(2500):  # the loader yields on the way through these
            await writer.commit(f"g{i % 1}", -1, "", None, -1,
                                [OffsetCommitPartition("t", 0, i, -1, "")])
        writer.close()
        c = group_coordinator(log)
        c.elect(0, 1)
        await asyncio.sleep(0)
        c.resign(0, 2)
        await asyncio.sleep(0.01)
        assert not c.groups and c.not_served("g0") is E.not_coordinator
        c.close()
    run(scenario())


def test_a_commit_not_replicated_is_not_a_success():
    class Unreplicated(MemoryOffsetsLog):
        def append_at(self, partition, records, producer=None):
            base, _ = super().append_at(partition, records, producer)

            async def lost():
                raise NotReplicated(E.not_coordinator, "the lead was lost meanwhile")
            return base, lost()

    async def scenario():
        c = group_coordinator(Unreplicated())
        c.elect(0, 0)
        await settled(lambda: c.not_served("g") is None)
        assert await c.commit("g", -1, "", None, -1,
                              [OffsetCommitPartition("t", 0, 1, -1, "")]) == [E.not_coordinator]
        c.close()
    run(scenario())


def test_markers_carry_the_leader_epoch_as_coordinator_epoch():
    async def scenario():
        sent = []

        async def write_markers(pid, epoch, commit, coordinator_epoch, partitions, version,
                                current):
            sent.append(coordinator_epoch)
            return dict.fromkeys(partitions, E.none)

        ids = iter(range(1000, 2000))
        c = TransactionCoordinator(MemoryOffsetsLog(), TxnConfig(num_partitions=1),
                                   lambda: next(ids), lambda t, p: True, write_markers,
                                   owns_all=False)
        assert (await c.init("tx", 10_000, -1, -1))[0] is E.not_coordinator
        c.elect(0, 7)
        await settled(lambda: c.ownership.error(0) is None)
        error, pid, epoch, *_ = await c.init("tx", 10_000, -1, -1)
        assert error is E.none
        assert (await c.add_partitions("tx", pid, epoch, [("t", 0)]))[("t", 0)] is E.none
        assert (await c.end_txn("tx", pid, epoch, True, False))[0] is E.none
        await settled(lambda: sent)
        assert sent == [7]
        c.resign(0, 8)
        assert c.describe("tx")[0] is E.not_coordinator
        c.close()
    run(scenario())


class TxnLog(MemoryOffsetsLog):
    """Records with the producer id of their transaction (key, value, pid, marker, offset)."""

    def append(self, partition, records, producer=None):
        pid = producer[0] if producer is not None else -1
        held = self.partitions.setdefault(partition, [])
        held.extend((k, v, pid, None, len(held) + i) for i, (k, v) in enumerate(records))

    def append_at(self, partition, records, producer=None):
        return len(self.partitions.get(partition, [])), self.append(partition, records, producer)


def test_pending_transactional_offsets_go_with_the_partition_and_come_back_from_the_log():
    async def scenario():
        c = group_coordinator(TxnLog())
        c.elect(0, 0)
        await settled(lambda: c.not_served("g") is None)
        assert await c.txn_commit("tx", "g", 5, 0, -1, "", None,
                                  [OffsetCommitPartition("t", 0, 7, -1, "")]) == [E.none]
        assert c.unstable("g") == {("t", 0)}
        c.resign(0, 1)
        assert not c.unstable("g")  # nothing of the partition stays behind
        c.elect(0, 2)
        await settled(lambda: c.not_served("g") is None)
        assert c.unstable("g") == {("t", 0)}  # read back once, from the log
        c.close()
    run(scenario())
