"""OffsetFetch answers only offsets whose records are durable (offset_rules O7-O9), driven
in process over tests/support/group_model_helpers.ModelLog, whose writes wait until the test
makes them durable or fails them (an fsync failing, a write not replicated).

Kafka keeps a commit aside until its append succeeded (GroupMetadata's pendingOffsetCommits
and pendingTransactionalOffsetCommits); an offset served before its write failed would go
backwards for the clients once the write is gone (a failover, a truncation)."""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode as E
from support.group_model_helpers import ModelLog

from oncelog.coordinator.group.group_coordinator import (
    GroupConfig,
    GroupCoordinator,
    OffsetCommitPartition,
)


def _coordinator(log: ModelLog) -> GroupCoordinator:
    return GroupCoordinator(log, GroupConfig(num_partitions=1, initial_rebalance_delay_ms=0),
                            lambda t, p: t == "t")


def _at(offset: int) -> list[OffsetCommitPartition]:
    return [OffsetCommitPartition("t", 0, offset, -1, "")]


def _fetched(c: GroupCoordinator) -> int | None:
    error, offsets = c.fetch("g", [("t", [0])])
    assert error is E.none
    ((_, _, value),) = offsets
    return value.offset if value is not None else None


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_plain_commit_is_served_only_once_its_write_is_durable():
    async def scenario():
        log = ModelLog()
        c = _coordinator(log)
        await c.load_all()
        assert await c.commit("g", -1, "", None, -1, _at(5)) == [E.none]

        log.hold = True
        failing = asyncio.ensure_future(c.commit("g", -1, "", None, -1, _at(7)))
        await _settle()
        assert not failing.done()
        assert _fetched(c) == 5  # the write of 7 is not durable yet
        log.held.pop().set_exception(OSError("injected fsync failure"))
        assert await failing == [E.not_coordinator]
        assert _fetched(c) == 5  # its write failed: 7 was never the committed offset

        durable = asyncio.ensure_future(c.commit("g", -1, "", None, -1, _at(9)))
        await _settle()
        assert _fetched(c) == 5
        log.held.pop().set_result(None)
        assert await durable == [E.none]
        assert _fetched(c) == 9  # served by the time the commit is answered
        c.close()
    _run(scenario)


def test_a_newer_commit_durable_first_is_not_replaced_by_an_older_one():
    async def scenario():
        log = ModelLog()
        c = _coordinator(log)
        await c.load_all()
        log.hold = True
        first = asyncio.ensure_future(c.commit("g", -1, "", None, -1, _at(3)))
        second = asyncio.ensure_future(c.commit("g", -1, "", None, -1, _at(4)))
        await _settle()
        older, newer = log.held
        newer.set_result(None)
        assert await second == [E.none]
        assert _fetched(c) == 4
        older.set_result(None)
        assert await first == [E.none]
        assert _fetched(c) == 4  # the older record's offset loses (O8 compares positions)
        c.close()
    _run(scenario)


def test_a_transactions_offsets_whose_write_failed_are_dropped():
    async def scenario():
        log = ModelLog()
        c = _coordinator(log)
        await c.load_all()
        assert await c.commit("g", -1, "", None, -1, _at(5)) == [E.none]

        log.hold = True
        failing = asyncio.ensure_future(
            c.txn_commit("tx", "g", 1, 0, -1, "", None, _at(8)))
        await _settle()
        assert _fetched(c) == 5 and c.unstable("g") == {("t", 0)}
        log.held.pop().set_exception(OSError("injected fsync failure"))
        assert await failing == [E.not_coordinator]
        assert c.unstable("g") == set()  # nothing of that transaction is pending any more
        log.marker(1, True)
        c.complete_txn(0, 1, True)
        assert _fetched(c) == 5  # the commit marker finds nothing to make visible

        held = asyncio.ensure_future(c.txn_commit("tx", "g", 2, 0, -1, "", None, _at(11)))
        await _settle()
        log.held.pop().set_result(None)
        assert await held == [E.none]
        assert _fetched(c) == 5 and c.unstable("g") == {("t", 0)}  # until its marker
        log.marker(2, False)
        c.complete_txn(0, 2, False)
        assert _fetched(c) == 5 and c.unstable("g") == set()  # aborted: dropped

        log.hold = False
        assert await c.txn_commit("tx", "g", 3, 0, -1, "", None, _at(12)) == [E.none]
        assert _fetched(c) == 5
        log.marker(3, True)
        c.complete_txn(0, 3, True)
        assert _fetched(c) == 12
        c.close()
    _run(scenario)
