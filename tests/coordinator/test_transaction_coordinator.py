"""The transaction coordinator's decisions, driven directly over a log kept in memory and a
marker writer that records what it is asked: Kafka's transaction states, fencing, epochs,
timeouts and state rebuilt from the records."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode as E
from support.group_coordinator_helpers import MemoryOffsetsLog
from support.transaction_coordinator_helpers import Markers, coordinator, run

from oncelog.coordinator.internal_log import WriteFailed
from oncelog.coordinator.transaction import txn_records as tr
from oncelog.coordinator.transaction.transaction_coordinator import (
    TransactionCoordinator,
)
from oncelog.coordinator.transaction.txn_records import TxnState as S


async def settled(c: TransactionCoordinator) -> None:
    for _ in range(100):
        if not any(m.pending for m in c.txns.values()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("a transaction stayed pending")


@given(st.text(max_size=10), st.integers(0, 2**62), st.integers(0, 32767),
       st.sampled_from(list(S)), st.lists(st.tuples(st.text(max_size=5),
                                                     st.lists(st.integers(0, 99), max_size=3)
                                                     .map(tuple)), max_size=3).map(tuple))
def test_records_round_trip(txn_id, pid, epoch, state, partitions):
    value = tr.TxnValue(pid, epoch, 60000, state, partitions, 5, 4, -1, pid, 2)
    assert tr.read_txn_value(tr.txn_value(value)) == value
    assert tr.read_txn_key(tr.txn_key(txn_id)) == txn_id


def test_commit_writes_markers_then_completes_and_fences_nothing_else():
    async def scenario():
        markers = Markers()
        c = coordinator(markers=markers)
        await c.load_all()
        error, pid, epoch = await c.init_producer_id("tx", 60000, -1, -1)
        assert (error, epoch) == (E.none, 0)
        assert await c.add_partitions("tx", pid, epoch, [("t", 0), ("u", 0)]) == \
            {("t", 0): E.none, ("u", 0): E.none}
        assert c.verify("tx", pid, epoch, "t", 0) is E.none
        assert c.verify("tx", pid, epoch, "t", 1) is E.invalid_txn_state
        assert c.verify("tx", pid, epoch - 1, "t", 0) is E.invalid_producer_epoch
        assert (await c.end_txn("tx", pid, epoch, True, bump_epoch=False))[0] is E.none
        await settled(c)
        assert markers.written == [(pid, 0, True, [("t", 0), ("u", 0)])]
        assert c.txns["tx"].state is S.COMPLETE_COMMIT
        # A retried EndTxn whose answer was lost is answered the same.
        assert (await c.end_txn("tx", pid, epoch, True, bump_epoch=False))[0] is E.none
        assert (await c.end_txn("tx", pid, epoch, False, bump_epoch=False))[0] is \
            E.invalid_txn_state
        c.close()
    run(scenario())


def test_a_new_instance_fences_the_old_and_aborts_its_transaction():
    async def scenario():
        markers = Markers()
        c = coordinator(markers=markers)
        await c.load_all()
        _, pid, epoch = await c.init_producer_id("tx", 60000, -1, -1)
        await c.add_partitions("tx", pid, epoch, [("t", 1)])
        error, _, _ = await c.init_producer_id("tx", 60000, -1, -1)
        assert error is E.concurrent_transactions  # the old transaction is being aborted
        await settled(c)
        assert markers.written == [(pid, 1, False, [("t", 1)])]
        error, pid2, epoch2 = await c.init_producer_id("tx", 60000, -1, -1)
        assert (error, pid2, epoch2) == (E.none, pid, 2)
        # The zombie: every call is fenced.
        assert (await c.add_partitions("tx", pid, epoch, [("t", 0)]))[("t", 0)] is \
            E.producer_fenced
        assert (await c.end_txn("tx", pid, epoch, True, bump_epoch=False))[0] is \
            E.producer_fenced
        assert c.verify("tx", pid, epoch, "t", 1) is E.invalid_producer_epoch
        c.close()
    run(scenario())


def test_transaction_version_2_bumps_the_epoch_at_every_end():
    async def scenario():
        c = coordinator()
        await c.load_all()
        _, pid, epoch = await c.init_producer_id("tx", 60000, -1, -1)
        await c.add_partitions("tx", pid, epoch, [("t", 0)])
        error, pid2, epoch2 = await c.end_txn("tx", pid, epoch, True, bump_epoch=True)
        assert (error, pid2, epoch2) == (E.none, pid, epoch + 1)
        await settled(c)
        # The retry of the same EndTxn (its answer lost) gets the new epoch again.
        assert await c.end_txn("tx", pid, epoch, True, bump_epoch=True) == \
            (E.none, pid, epoch + 1)
        # A delayed write of the finished transaction is fenced.
        assert c.verify("tx", pid, epoch, "t", 0) is E.invalid_producer_epoch
        c.close()
    run(scenario())


def test_errors_of_bad_requests():
    async def scenario():
        c = coordinator(max_timeout_ms=1000)
        await c.load_all()
        assert (await c.init_producer_id("", 100, -1, -1))[0] is E.invalid_request
        assert (await c.init_producer_id("tx", 5000, -1, -1))[0] is \
            E.invalid_transaction_timeout
        _, pid, epoch = await c.init_producer_id("tx", 1000, -1, -1)
        assert (await c.end_txn("tx", pid, epoch, True, bump_epoch=False))[0] is \
            E.invalid_txn_state  # no transaction
        assert (await c.add_partitions("tx", pid, epoch, [("t", 0), ("nope", 0)])) == \
            {("t", 0): E.operation_not_attempted, ("nope", 0): E.unknown_topic_or_partition}
        assert (await c.add_partitions("tx", pid + 1, epoch, [("t", 0)]))[("t", 0)] is \
            E.invalid_producer_id_mapping
        assert (await c.add_partitions("other", pid, epoch, [("t", 0)]))[("t", 0)] is \
            E.invalid_producer_id_mapping
        assert c.describe("missing")[0] is E.transactional_id_not_found
        c.close()
    run(scenario())


def test_timed_out_transactions_are_aborted_and_their_producer_fenced():
    async def scenario():
        clock = [1_000_000]
        markers = Markers()
        c = coordinator(markers=markers, clock=clock)
        await c.load_all()
        _, pid, epoch = await c.init_producer_id("tx", 1000, -1, -1)
        await c.add_partitions("tx", pid, epoch, [("t", 0)])
        assert c.abort_timed_out() == 0
        clock[0] += 1001
        assert c.abort_timed_out() == 1
        await settled(c)
        assert markers.written == [(pid, 1, False, [("t", 0)])]
        assert (await c.end_txn("tx", pid, epoch, True, bump_epoch=False))[0] is \
            E.producer_fenced
        c.close()
    run(scenario())


def test_state_is_rebuilt_and_decided_transactions_are_finished_after_a_restart():
    async def scenario():
        store = MemoryOffsetsLog()

        class Stuck(Markers):
            async def __call__(self, *args):
                await asyncio.sleep(3600)  # the broker dies before the markers are out

        c = coordinator(store, markers=Stuck())
        await c.load_all()
        _, pid, epoch = await c.init_producer_id("tx", 60000, -1, -1)
        await c.add_partitions("tx", pid, epoch, [("t", 0)])
        await c.end_txn("tx", pid, epoch, False, bump_epoch=False)
        await c.init_producer_id("idle", 60000, -1, -1)
        c.close()
        markers = Markers()
        again = coordinator(store, markers=markers)
        await again.load_all()
        await settled(again)
        assert markers.written == [(pid, epoch, False, [("t", 0)])]
        assert again.txns["tx"].state is S.COMPLETE_ABORT
        assert again.txns["idle"].state is S.EMPTY
        unknown, listed = again.list({"Ongoing", "Nonsense"}, set())
        assert unknown == ["Nonsense"] and listed == []
        assert [t.transactional_id for t in again.list(set(), set(), pattern="id.*")[1]] \
            == ["idle"]
        again.close()
    run(scenario())


def test_two_phase_commit_keeps_a_prepared_transaction_for_the_next_instance():
    async def scenario():
        clock = [1_000_000]
        markers = Markers()
        refused = coordinator(clock=clock)
        await refused.load_all()
        assert (await refused.init("tx", 60000, -1, -1, two_phase=True))[0] is \
            E.transactional_id_authorization_failed
        refused.close()
        c = coordinator(markers=markers, clock=clock, two_phase_commit=True)
        await c.load_all()
        error, pid, epoch, *_ = await c.init("tx", 60000, -1, -1, two_phase=True)
        assert error is E.none
        await c.add_partitions("tx", pid, epoch, [("t", 0)])
        clock[0] += 10**9
        assert c.abort_timed_out() == 0  # an external coordinator decides, not a timeout
        # The application restarts and finds its prepared transaction.
        assert await c.init("tx", 60000, -1, -1, two_phase=True, keep_prepared=True) == \
            (E.none, pid, epoch + 1, pid, epoch)
        assert c.txns["tx"].state is S.ONGOING and markers.written == []
        assert (await c.end_txn("tx", pid, epoch, True, bump_epoch=False))[0] is \
            E.producer_fenced  # the old instance
        assert (await c.end_txn("tx", pid, epoch + 1, True, bump_epoch=False))[0] is E.none
        await settled(c)
        assert markers.written == [(pid, epoch + 1, True, [("t", 0)])]
        c.close()
    run(scenario())


def test_verification_while_loading_is_retriable():
    """The coordinator answers as Kafka's (txn_rules V0); the produce's mapping of it to
    NOT_ENOUGH_REPLICAS is broker/txn_verification.py's."""
    async def scenario():
        c = coordinator()
        assert c.verify("tx", 1, 0, "t", 0) is E.coordinator_load_in_progress
        await c.load_all()
        assert c.verify("tx", 1, 0, "t", 0) is E.invalid_producer_id_mapping
        c.close()
    run(scenario())


class FailingLog(MemoryOffsetsLog):
    """Fails the next ``failures`` appends with ``fail_with``, as a full or broken disk under
    ``__transaction_state`` answers (the partition's own all-or-nothing append is proven in
    test_storage_faults.py; this is what the coordinator does with the error)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0

    def append(self, partition, records):
        if self.failures:
            self.failures -= 1
            raise WriteFailed(E.kafka_storage_error, "injected")
        return super().append(partition, records)


def _snapshot(c: TransactionCoordinator) -> dict:
    return {t: (m.producer_id, m.epoch, m.state, sorted(m.partitions), m.pending)
            for t, m in c.txns.items()}


def test_a_failed_state_write_changes_nothing_and_the_transaction_goes_on():
    async def scenario():
        store = FailingLog()
        markers = Markers()
        c = coordinator(store, markers=markers)
        await c.load_all()
        store.failures = 1
        assert (await c.init_producer_id("tx", 60000, -1, -1))[0] is E.kafka_storage_error
        assert "tx" not in c.txns or c.txns["tx"].state is S.EMPTY
        _, pid, epoch = await c.init_producer_id("tx", 60000, -1, -1)
        await c.add_partitions("tx", pid, epoch, [("t", 0)])
        before, written = _snapshot(c), len(store.partitions[c.partition_of("tx")])
        store.failures = 1
        assert await c.add_partitions("tx", pid, epoch, [("t", 1)]) == \
            {("t", 1): E.kafka_storage_error}
        assert c.verify("tx", pid, epoch, "t", 1) is E.invalid_txn_state  # not added
        store.failures = 1
        assert (await c.end_txn("tx", pid, epoch, True, bump_epoch=False))[0] is \
            E.kafka_storage_error
        assert _snapshot(c) == before and markers.written == []
        assert len(store.partitions[c.partition_of("tx")]) == written
        # The disk is back: the same calls succeed, and a failure of the completion record
        # (after the markers) is retried until it is written.
        assert await c.add_partitions("tx", pid, epoch, [("t", 1)]) == {("t", 1): E.none}

        class FailCompletion(Markers):
            async def __call__(self, *args, **kwargs):
                store.failures = 1  # the CompleteCommit write that follows fails once
                return await super().__call__(*args, **kwargs)

        c.write_markers = FailCompletion()
        assert (await c.end_txn("tx", pid, epoch, True, bump_epoch=False))[0] is E.none
        for _ in range(300):
            if not c.txns["tx"].pending:
                break
            await asyncio.sleep(0.01)
        assert c.txns["tx"].state is S.COMPLETE_COMMIT and not c.txns["tx"].pending
        assert c.write_markers.written == [(pid, epoch, True, [("t", 0), ("t", 1)])]
        c.close()
        # What was written is what a restarted coordinator rebuilds.
        again = coordinator(store)
        await again.load_all()
        assert _snapshot(again) == _snapshot(c)
        again.close()
    run(scenario())
