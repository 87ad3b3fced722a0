"""A request that meets its transactional id pending (a step of the coordinator under way:
the markers of a commit, a state write) waits for the step and is decided on what it left,
up to the coordinator's ``pending_wait_s``; only a step still running then is answered
CONCURRENT_TRANSACTIONS. The case that matters is librdkafka's (its issue #4849): a refused
AddPartitionsToTxn right after a commit still makes abort_transaction() send EndTxn, which
the completed commit answers INVALID_TXN_STATE, a fatal error for the producer."""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode as E
from support.txn_coordinator_defects_helpers import HeldLog, Markers, coordinator

from oncelog.coordinator.transaction.txn_records import TxnState as S


class HeldMarkers(Markers):
    """Markers that wait until the test lets them through."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.asked = 0

    async def __call__(self, *args, **kwargs):
        self.asked += 1
        await self.gate.wait()
        return await super().__call__(*args, **kwargs)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


async def committed_with_markers_held(wait_s: float, log: HeldLog | None = None):
    """A coordinator whose id "tx" has just been answered its commit, its markers held."""
    markers = HeldMarkers()
    c = coordinator(log or HeldLog(), markers)
    c.pending_wait_s = wait_s
    await c.load_all()
    _, pid, epoch = await c.init_producer_id("tx", 60000, -1, -1)
    assert await c.add_partitions("tx", pid, epoch, [("t", 0)]) == {("t", 0): E.none}
    assert await c.end_txn("tx", pid, epoch, True, bump_epoch=False) == (E.none, pid, epoch)
    for _ in range(100):
        if markers.asked:
            break
        await asyncio.sleep(0.001)
    assert markers.asked and c.txns["tx"].state is S.PREPARE_COMMIT and c.txns["tx"].pending
    return c, markers, pid, epoch


def test_a_transaction_begun_while_the_commit_s_markers_are_written_is_added_then_aborts():
    """librdkafka's sequence: commit, begin, produce (AddPartitionsToTxn), abort. The
    AddPartitionsToTxn waits for the markers and is added; the abort then ends a
    transaction the coordinator holds, instead of meeting the completed commit."""
    async def scenario():
        c, markers, pid, epoch = await committed_with_markers_held(wait_s=10.0)
        adding = asyncio.ensure_future(c.add_partitions("tx", pid, epoch, [("t", 1)]))
        ending = asyncio.ensure_future(c.end_txn("tx", pid, epoch, False, bump_epoch=False))
        await asyncio.sleep(0.05)
        assert not adding.done() and not ending.done()  # both wait for the markers
        markers.gate.set()
        assert await adding == {("t", 1): E.none}
        # The abort, queued behind the add on its connection, meets the add's own write
        # (or the transaction it began): never the completed commit.
        assert (await ending)[0] in (E.none, E.concurrent_transactions)
        if (await ending)[0] is E.concurrent_transactions:
            assert await c.end_txn("tx", pid, epoch, False, bump_epoch=False) == \
                (E.none, pid, epoch)
        assert markers.written[0][2] is True and markers.written[0][3] == [("t", 0)]
        for _ in range(300):
            if c.txns["tx"].state is S.COMPLETE_ABORT and not c.txns["tx"].pending:
                break
            await asyncio.sleep(0.01)
        assert c.txns["tx"].state is S.COMPLETE_ABORT
        assert markers.written[1][2] is False and markers.written[1][3] == [("t", 1)]
        c.close()
    run(scenario())


def test_a_step_longer_than_the_wait_is_answered_concurrent_transactions():
    async def scenario():
        c, markers, pid, epoch = await committed_with_markers_held(wait_s=0.05)
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert await c.add_partitions("tx", pid, epoch, [("t", 1)]) == \
            {("t", 1): E.concurrent_transactions}
        assert loop.time() - began >= 0.05
        markers.gate.set()
        for _ in range(300):
            if not c.txns["tx"].pending:
                break
            await asyncio.sleep(0.01)
        assert await c.add_partitions("tx", pid, epoch, [("t", 1)]) == {("t", 1): E.none}
        assert not c._waiting  # no waiter is left behind
        c.close()
    run(scenario())


def test_a_request_waiting_when_the_coordinator_resigns_is_answered_not_coordinator():
    async def scenario():
        c, _markers, pid, epoch = await committed_with_markers_held(wait_s=10.0)
        adding = asyncio.ensure_future(c.add_partitions("tx", pid, epoch, [("t", 1)]))
        initing = asyncio.ensure_future(c.init_producer_id("tx", 60000, -1, -1))
        await asyncio.sleep(0.05)
        partition = c.partition_of("tx")
        c.resign(partition, None)
        assert await asyncio.wait_for(adding, 1) == {("t", 1): E.not_coordinator}
        assert (await asyncio.wait_for(initing, 1))[0] is E.not_coordinator
        assert not c._waiting
        c.close()
    run(scenario())


def test_a_waiter_registered_right_after_a_release_is_not_dropped_by_an_older_waiter():
    """A review's find: a woken waiter's clean-up once removed the waiters registered
    after the release (requests meeting the id taken again by one that ran first), so the
    next release woke nobody and they waited the whole bound."""
    async def scenario():
        log = HeldLog()
        c, markers, pid, epoch = await committed_with_markers_held(3.0, log)
        first = asyncio.ensure_future(c.add_partitions("tx", pid, epoch, [("t", 1)]))
        await asyncio.sleep(0.05)
        assert not first.done() and len(c._waiting["tx"]) == 1
        later: list[asyncio.Future] = []
        wake = c._wake

        def wake_then_two_requests_arrive(txn_id):
            wake(txn_id)
            if later or txn_id != "tx":
                return
            # Two requests read off other connections in the same turn of the loop (e.g. a
            # v4 AddPartitionsToTxn naming the id twice, or a producer and its zombie):
            # the first takes the id (its write held), the second meets it pending.
            log.hold = True
            later.append(asyncio.ensure_future(
                c.add_partitions("tx", pid, epoch, [("u", 0)])))
            later.append(asyncio.ensure_future(
                c.end_txn("tx", pid, epoch, False, bump_epoch=False)))
        c._wake = wake_then_two_requests_arrive
        markers.gate.set()
        for _ in range(50):  # the commit completes; the three requests run
            await asyncio.sleep(0)
        taking, ending = later
        assert not ending.done()
        # The end_txn waits for the add's write, among the waiters still
        log.hold = False
        log.release()
        assert await asyncio.wait_for(taking, 1) == {("u", 0): E.none}
        # the add's write is in: the abort is decided now, not pending_wait_s later
        assert await asyncio.wait_for(ending, 0.5) == (E.none, pid, epoch)
        await asyncio.wait_for(first, 1)
        c.close()
    run(scenario())


def test_two_waiters_woken_together_the_second_is_refused_while_its_wait_has_time_left():
    """A review's find: of two requests waiting on one id, the first woken takes it (its
    own write); the second, resumed a moment later, once waited no more and was answered
    CONCURRENT_TRANSACTIONS with most of its wait unused. It waits on within its bound."""
    async def scenario():
        log = HeldLog()
        c, markers, pid, epoch = await committed_with_markers_held(3.0, log)
        one = asyncio.ensure_future(c.add_partitions("tx", pid, epoch, [("t", 1)]))
        two = asyncio.ensure_future(c.add_partitions("tx", pid, epoch, [("u", 0)]))
        await asyncio.sleep(0.05)
        wake = c._wake

        def wake_then_hold_writes(txn_id):
            wake(txn_id)
            if c._wake is wake_then_hold_writes:
                c._wake = wake
                log.hold = True  # the commit is complete; the first's write takes a moment
        c._wake = wake_then_hold_writes
        markers.gate.set()

        async def release_soon():
            await asyncio.sleep(0.1)
            log.hold = False
            log.release()
        releasing = asyncio.ensure_future(release_soon())
        assert await asyncio.wait_for(one, 2) == {("t", 1): E.none}
        assert await asyncio.wait_for(two, 2) == {("u", 0): E.none}
        await releasing
        c.close()
    run(scenario())


def test_the_entries_of_a_brokers_add_partitions_v4_do_not_wait():
    """A v4 AddPartitionsToTxn (brokers only) may name one id many times: its entries are
    answered by the table at once, as before, so one request cannot hold the loop's time
    for each of them."""
    async def scenario():
        c, markers, pid, epoch = await committed_with_markers_held(wait_s=10.0)
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert await c.add_partitions("tx", pid, epoch, [("t", 1)], wait=False) == \
            {("t", 1): E.concurrent_transactions}
        assert loop.time() - began < 1 and not c._waiting
        markers.gate.set()
        c.close()
    run(scenario())
