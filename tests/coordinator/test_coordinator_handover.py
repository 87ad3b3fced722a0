"""A coordinator that loses its partition of ``__transaction_state`` and leads it again while
a step of the old lead is still under way (the markers of a decided transaction, a fence):
the old step ends without touching the id, and the new lead, which loaded the id back from
the log, alone decides what follows (each step goes on only under the ownership it began
in, ownership.py's ticket). Driven over a log in memory, with markers answered by hand."""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode as E
from support.group_coordinator_helpers import MemoryOffsetsLog

from oncelog.coordinator.internal_log import NotReplicated
from oncelog.coordinator.transaction import txn_records as tr
from oncelog.coordinator.transaction.transaction_coordinator import (
    TransactionCoordinator,
    TxnConfig,
)
from oncelog.coordinator.transaction.txn_records import TxnState as S

PARTS = [("t", 0), ("t", 1)]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


async def settled(condition) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("not settled")


class HandAnswered:
    """WriteTxnMarkers rounds that wait until the test answers them."""

    def __init__(self) -> None:
        self.rounds: list[tuple[int, list, asyncio.Future]] = []
        self.markers: list[tuple[int, int, bool]] = []  # (producer id, epoch, commit)

    async def __call__(self, pid, epoch, commit, coordinator_epoch, partitions, version,
                       current):
        self.markers.append((pid, epoch, commit))
        answer = asyncio.get_running_loop().create_future()
        self.rounds.append((coordinator_epoch, sorted(partitions), answer))
        return await answer


def coordinator(log, markers) -> TransactionCoordinator:
    ids = iter(range(1000, 2000))
    c = TransactionCoordinator(log, TxnConfig(num_partitions=1), lambda: next(ids),
                               lambda t, p: True, markers, owns_all=False)
    c.retry_s = 0
    c.pending_wait_s = 0.2  # a step held by the test is not waited out for 5 s
    return c


def states_written(log) -> list[S]:
    return [tr.read_txn_value(v).state for _, v in log.partitions.get(0, []) if v is not None]


def test_markers_of_a_lead_lost_mid_commit_are_finished_by_the_new_lead_alone():
    async def scenario():
        log, markers = MemoryOffsetsLog(), HandAnswered()
        c = coordinator(log, markers)
        c.elect(0, 1)
        await settled(lambda: c.ownership.error(0) is None)
        _, pid, epoch, *_ = await c.init("tx", 10_000, -1, -1)
        assert set((await c.add_partitions("tx", pid, epoch, PARTS)).values()) == {E.none}
        assert (await c.end_txn("tx", pid, epoch, True, False))[0] is E.none
        await settled(lambda: len(markers.rounds) == 1)
        # The lead goes and comes back (epoch 3) while the first round is out: the new
        # lead loads PrepareCommit and sends every marker again at its epoch (L1).
        c.resign(0, 2)
        c.elect(0, 3)
        await settled(lambda: len(markers.rounds) == 2)
        assert markers.rounds[1][0] == 3
        # The old round comes back with one marker not written: the old lead's step ends
        # there; it neither completes the transaction nor releases the id.
        markers.rounds[0][2].set_result({("t", 0): E.none,
                                         ("t", 1): E.not_leader_or_follower})
        for _ in range(20):
            await asyncio.sleep(0)
        entry = c.txns["tx"]
        assert (entry.state, entry.pending) == (S.PREPARE_COMMIT, True), entry
        assert states_written(log).count(S.COMPLETE_COMMIT) == 0
        # The producer's next transaction waits for the new lead's markers...
        assert (await c.add_partitions("tx", pid, epoch, PARTS))[PARTS[0]] \
            is E.concurrent_transactions
        markers.rounds[1][2].set_result(dict.fromkeys(PARTS, E.none))
        await settled(lambda: not c.txns["tx"].pending)
        assert c.txns["tx"].state is S.COMPLETE_COMMIT
        assert states_written(log).count(S.COMPLETE_COMMIT) == 1  # decided once
        # ...and then is not overwritten by anything of the old lead.
        assert set((await c.add_partitions("tx", pid, epoch, PARTS)).values()) == {E.none}
        for _ in range(20):
            await asyncio.sleep(0)
        assert c.txns["tx"].state is S.ONGOING
        c.close()
    run(scenario())


class HeldLog(MemoryOffsetsLog):
    """Appends taken at once; while ``holding``, each one durable only when the test says
    (its future in ``held``)."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = False
        self.held: list[asyncio.Future] = []

    def append(self, partition, records):
        super().append(partition, records)
        if not self.holding:
            return None
        durable = asyncio.get_running_loop().create_future()
        self.held.append(durable)
        return durable


def test_a_write_of_the_old_lead_failing_late_does_not_release_the_new_leads_step():
    async def scenario():
        clock = [1_000_000]
        log, markers = HeldLog(), HandAnswered()
        ids = iter(range(1000, 2000))
        c = TransactionCoordinator(log, TxnConfig(num_partitions=1), lambda: next(ids),
                                   lambda t, p: True, markers, now_ms=lambda: clock[0],
                                   owns_all=False)
        c.pending_wait_s = 0.2  # the fence held by the test is not waited out for 5 s
        c.elect(0, 1)
        await settled(lambda: c.ownership.error(0) is None)
        _, pid, epoch, *_ = await c.init("tx", 10_000, -1, -1)
        assert (await c.add_partitions("tx", pid, epoch, PARTS[:1]))[PARTS[0]] is E.none
        log.holding = True
        # The old lead's AddPartitionsToTxn: written, waiting for the ISR...
        old = asyncio.ensure_future(c.add_partitions("tx", pid, epoch, PARTS))
        await settled(lambda: len(log.held) == 1)
        # ...when the lead goes and comes back: the new lead reads the id back (Ongoing)
        c.resign(0, 2)
        c.elect(0, 3)
        await settled(lambda: c.ownership.error(0) is None)
        # and times the transaction out: its fence is written, waiting for the ISR.
        clock[0] += 20_000
        assert c.abort_timed_out() == 1
        await settled(lambda: len(log.held) == 2)
        assert c.txns["tx"].pending
        # The old write fails (the lead was lost meanwhile): the fence still holds the id.
        log.held[0].set_exception(NotReplicated(E.not_coordinator, "lead lost"))
        assert set((await old).values()) == {E.not_coordinator}
        assert c.txns["tx"].pending
        assert (await c.end_txn("tx", pid, epoch, True, False))[0] \
            is E.concurrent_transactions
        log.holding = False
        log.held[1].set_result(None)
        await settled(lambda: markers.rounds)
        assert c.txns["tx"].state is S.PREPARE_ABORT
        assert S.PREPARE_COMMIT not in states_written(log)
        c.close()
    run(scenario())


def test_an_exhausted_epochs_new_producer_id_survives_the_coordinator_moving_mid_commit():
    """KIP-890 part 2 at epoch 32766: the end moves the transaction to a new producer id
    (F8: PrepareCommit at 32767 with the next id written). The lead is lost before the
    markers are taken; the new lead loads PrepareCommit, sends the markers at 32767 under
    the old id and its own coordinator epoch, and completes with the new id at epoch 0,
    which a retry of the end (old id, 32766) is answered (F3)."""
    async def scenario():
        log, markers = MemoryOffsetsLog(), HandAnswered()
        log.partitions[0] = [(tr.txn_key("tx"), tr.txn_value(tr.TxnValue(
            500, 32766, 60_000, S.ONGOING, (("t", (0, 1)),), 0, 0)))]
        c = coordinator(log, markers)
        c.elect(0, 1)
        await settled(lambda: c.ownership.error(0) is None)
        error, new_id, new_epoch = await c.end_txn("tx", 500, 32766, True, True)
        assert (error, new_epoch) == (E.none, 0) and new_id != 500
        await settled(lambda: len(markers.rounds) == 1)
        c.resign(0, 2)
        markers.rounds[0][2].set_result(dict.fromkeys(PARTS, E.network_exception))
        c.elect(0, 3)
        await settled(lambda: len(markers.rounds) == 2)
        assert markers.rounds[1][0] == 3
        assert markers.markers == [(500, 32767, True)] * 2
        markers.rounds[1][2].set_result(dict.fromkeys(PARTS, E.none))
        await settled(lambda: not c.txns["tx"].pending)
        done = c.txns["tx"]
        assert (done.state, done.producer_id, done.epoch, done.previous_producer_id) == (
            S.COMPLETE_COMMIT, new_id, 0, 500)
        assert await c.end_txn("tx", 500, 32766, True, True) == (E.none, new_id, 0)
        c.close()
    run(scenario())


def test_a_state_write_the_disk_failed_sends_the_producer_to_find_its_coordinator():
    """A write to __transaction_state whose fsync fails (its log directory failing: the
    controller moves the partition's leadership off it) is answered NOT_COORDINATOR, as
    Kafka maps KAFKA_STORAGE_ERROR for coordinator writes: a Java producer takes
    KAFKA_STORAGE_ERROR in InitProducerId, AddPartitionsToTxn or EndTxn as fatal ("Unexpected
    error"), NOT_COORDINATOR makes it find the coordinator again and retry."""
    async def scenario():
        log = HeldLog()
        c = coordinator(log, HandAnswered())
        c.elect(0, 1)
        await settled(lambda: c.ownership.error(0) is None)
        log.holding = True
        init = asyncio.ensure_future(c.init("tx", 10_000, -1, -1))
        await settled(lambda: log.held)
        log.held[0].set_exception(OSError(5, "injected fsync failure"))
        assert (await init)[0] is E.not_coordinator
        c.close()
    run(scenario())
