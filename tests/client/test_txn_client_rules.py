"""The transactional producer's rules without I/O: the answer table (transactions.judge),
the state machine (TransactionManager) under random call sequences, the read_committed
walk over crafted record sets, the idempotence rows a transaction adds (17, 3t) and the
client metrics."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from support.record_sets import ABORT, COMMIT, control_batch, data_batch

from oncelog.client.metrics import WINDOW, ProducerMetrics, Stat, StatsTimer
from oncelog.client.network.connection import (
    KafkaError,
    ProducerFatalError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionStateError,
)
from oncelog.client.producer.idempotence import IdempotenceManager, Outcome, judge_answer
from oncelog.client.producer.producer_batch import ProducerBatch
from oncelog.client.producer.transactions import (
    Action,
    Api,
    PreparedTxnState,
    TransactionManager,
    TxnState,
    judge,
)
from oncelog.protocol.batches import RecordSetWalk
from oncelog.protocol.records import NONE

E = ErrorCode


# --- the answer table --------------------------------------------------------------------------

@pytest.mark.parametrize("api", list(Api))
def test_every_api_is_done_retried_or_sent_to_find_its_coordinator(api):
    assert judge(api, E.none) is Action.DONE
    for error in (E.not_coordinator, E.coordinator_not_available, E.network_exception,
                  E.request_timed_out):
        assert judge(api, error) is Action.FIND_COORDINATOR
    for error in (E.coordinator_load_in_progress, E.concurrent_transactions):
        assert judge(api, error) is Action.RETRY


@pytest.mark.parametrize("api", list(Api))
def test_fencing_and_authorisation_are_fatal_for_every_api(api):
    for error in (E.producer_fenced, E.invalid_producer_epoch,
                  E.transactional_id_authorization_failed, E.unsupported_for_message_format):
        assert judge(api, error) is Action.FATAL


@pytest.mark.parametrize("api, error, action", [
    (Api.ADD_PARTITIONS, E.unknown_topic_or_partition, Action.RETRY),
    (Api.TXN_OFFSET_COMMIT, E.unknown_topic_or_partition, Action.RETRY),
    (Api.ADD_PARTITIONS, E.invalid_txn_state, Action.FATAL),
    (Api.END_TXN, E.invalid_txn_state, Action.FATAL),
    (Api.INIT_PRODUCER_ID, E.cluster_authorization_failed, Action.FATAL),
    (Api.ADD_PARTITIONS, E.unknown_producer_id, Action.ABORTABLE_NEW_EPOCH),
    (Api.ADD_OFFSETS, E.invalid_producer_id_mapping, Action.ABORTABLE_NEW_EPOCH),
    (Api.END_TXN, E.unknown_producer_id, Action.ABORTABLE_NEW_EPOCH),
    (Api.ADD_PARTITIONS, E.topic_authorization_failed, Action.ABORTABLE),
    (Api.ADD_OFFSETS, E.group_authorization_failed, Action.ABORTABLE),
    (Api.FIND_COORDINATOR, E.group_authorization_failed, Action.ABORTABLE),
    # KIP-447: the consumer's generation moved on; its offsets are refused, the transaction
    # must be aborted and its input read again.
    (Api.TXN_OFFSET_COMMIT, E.illegal_generation, Action.ABORTABLE),
    (Api.TXN_OFFSET_COMMIT, E.unknown_member_id, Action.ABORTABLE),
    (Api.TXN_OFFSET_COMMIT, E.fenced_instance_id, Action.ABORTABLE),
    (Api.TXN_OFFSET_COMMIT, E.transaction_abortable, Action.ABORTABLE),
    (Api.END_TXN, E.invalid_transaction_timeout, Action.FATAL),
    (Api.INIT_PRODUCER_ID, E.invalid_transaction_timeout, Action.FATAL),
])
def test_the_table_rows(api, error, action):
    assert judge(api, error) is action


# --- the state machine -------------------------------------------------------------------------

def _ready() -> TransactionManager:
    txn = TransactionManager("t", 60_000, two_phase=True)
    txn.start_init()
    txn.initialized()
    return txn


def test_produce_is_allowed_only_inside_a_transaction():
    txn = TransactionManager("t", 60_000, two_phase=False)
    with pytest.raises(TransactionStateError):
        txn.check_produce()
    with pytest.raises(TransactionStateError):
        txn.begin()  # before init_transactions
    txn.start_init()
    txn.initialized()
    with pytest.raises(TransactionStateError):
        txn.check_produce()
    txn.begin()
    txn.check_produce()
    with pytest.raises(TransactionStateError):
        txn.begin()  # twice
    with pytest.raises(TransactionStateError):
        txn.prepare(1, 0)  # two-phase commit not enabled


def test_a_failed_batch_makes_the_transaction_abortable_and_commit_refuses():
    txn = _ready()
    txn.begin()
    txn.batch_failed(KafkaError(E.request_timed_out, "lost"))
    assert txn.state is TxnState.ABORTABLE_ERROR and txn.new_epoch_needed
    with pytest.raises(TransactionAbortableError) as raised:
        txn.check_produce()
    assert raised.value.txn_requires_abort() and not raised.value.is_fatal()
    with pytest.raises(TransactionAbortableError):
        txn.start_commit()
    assert isinstance(txn.undrained_error(), TransactionAbortedError)
    assert txn.start_abort()
    assert not txn.start_abort()  # called again after a timeout: the same abort
    txn.completed()
    assert txn.state is TxnState.READY and txn.error is None
    txn.begin()


def test_a_fenced_batch_is_fatal_and_fatal_stays():
    txn = _ready()
    fatal = []
    txn.on_fatal = fatal.append
    txn.begin()
    txn.batch_failed(KafkaError(E.producer_fenced, "newer epoch"))
    assert txn.state is TxnState.FATAL_ERROR and isinstance(fatal[0], ProducerFatalError)
    assert fatal[0].is_fatal() and not fatal[0].is_retriable()
    for call in (txn.check_produce, txn.start_commit, txn.start_abort, txn.begin):
        with pytest.raises(ProducerFatalError):
            call()
    txn.batch_failed(KafkaError(E.request_timed_out))  # nothing moves it any more
    assert txn.state is TxnState.FATAL_ERROR


def test_invalid_producer_epoch_on_a_produce_is_abortable_kip_588():
    txn = _ready()
    txn.begin()
    txn.batch_failed(KafkaError(E.invalid_producer_epoch))
    assert txn.state is TxnState.ABORTABLE_ERROR
    verdict = judge_answer(E.invalid_producer_epoch, idempotent=True, first_unacked=True,
                           maybe_stored=False, later_acked=False, attempts_left=True,
                           time_left=True, transactional=True)
    assert verdict.outcome is Outcome.FAIL and verdict.row == "3t"
    verdict = judge_answer(E.producer_fenced, idempotent=True, first_unacked=True,
                           maybe_stored=False, later_acked=False, attempts_left=True,
                           time_left=True, transactional=True)
    assert verdict.outcome is Outcome.FATAL


def test_partitions_are_added_in_one_request_at_a_time():
    txn = _ready()
    txn.begin()
    a, b, c = ("t", 0), ("t", 1), ("u", 0)
    assert not txn.may_send(a) and not txn.may_send(b)
    assert txn.take_wanted() == [a, b]
    assert not txn.may_send(c) and txn.take_wanted() == []  # one in flight
    txn.partitions_added([a, b])
    assert txn.may_send(a) and txn.started
    assert txn.take_wanted() == [c]
    txn.partitions_not_added([c])
    assert not txn.may_send(c)  # wanted again
    txn.abortable(KafkaError(E.topic_authorization_failed))
    assert txn.take_wanted() == []  # nothing more is added to a transaction to abort


def test_prepared_state_round_trips_kafkas_text_form():
    txn = _ready()
    txn.begin()
    prepared = txn.prepare(42, 7)
    assert str(prepared) == "42:7" and PreparedTxnState.parse("42:7") == prepared
    assert txn.state is TxnState.PREPARED
    with pytest.raises(TransactionStateError):
        txn.check_produce()
    assert txn.start_commit()
    with pytest.raises(ValueError):
        PreparedTxnState.parse("x")


_CALLS = ["begin", "produce", "fail", "fence", "commit", "abort", "complete", "prepare"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_CALLS), max_size=40))
def test_random_call_sequences_keep_kafkas_rules(calls):
    """Whatever the application and the sender do, in any order: produce succeeds only in a
    transaction; an abortable transaction is never committed; fatal is final; and an error
    is raised for every refused call, never a silent change."""
    txn = _ready()
    for call in calls:
        before = txn.state
        try:
            if call == "begin":
                txn.begin()
                assert before is TxnState.READY
            elif call == "produce":
                txn.check_produce()
                assert before is TxnState.IN_TRANSACTION
            elif call == "fail":
                txn.batch_failed(KafkaError(E.request_timed_out))
            elif call == "fence":
                txn.batch_failed(KafkaError(E.producer_fenced))
            elif call == "commit":
                txn.start_commit()
                assert before in (TxnState.IN_TRANSACTION, TxnState.PREPARED,
                                  TxnState.COMMITTING)
            elif call == "abort":
                txn.start_abort()
                assert before in (TxnState.IN_TRANSACTION, TxnState.PREPARED,
                                  TxnState.ABORTABLE_ERROR, TxnState.ABORTING)
            elif call == "complete":
                txn.completed()
            elif call == "prepare":
                txn.prepare(1, 0)
                assert before is TxnState.IN_TRANSACTION
        except TransactionAbortableError:
            assert txn.state is TxnState.ABORTABLE_ERROR
        except ProducerFatalError:
            assert txn.state is TxnState.FATAL_ERROR
        except TransactionStateError:
            assert txn.state is before
        if before is TxnState.FATAL_ERROR:
            assert txn.state is TxnState.FATAL_ERROR
        if before is TxnState.ABORTABLE_ERROR:
            assert txn.state in (TxnState.ABORTABLE_ERROR, TxnState.ABORTING,
                                 TxnState.FATAL_ERROR)


# --- idempotence row 17 ------------------------------------------------------------------------

def test_a_transactional_producer_fails_a_batch_rather_than_change_its_epoch():
    idem = IdempotenceManager(True, 5, 10, transactional=True)
    idem.set_identity(7, 0)
    batch = ProducerBatch("t", 0, 0.0)
    for i in range(3):
        batch.append(1000 + i, None, b"v%d" % i, None)
    batch.closed = True
    batch.build(NONE)
    idem.sending(batch)
    assert batch.data[22] & 0x10  # the transactional attribute, in the header
    verdict = idem.answered(batch, E.out_of_order_sequence_number, time_left=True)
    assert verdict.outcome is Outcome.FAIL and verdict.row == "17"
    assert idem.bump_needed  # after the abort
    idem.restart(7, 1)
    assert idem.epoch == 1 and not idem.bump_needed
    assert idem.partitions[("t", 0)].next_sequence == 0


# --- read_committed ----------------------------------------------------------------------------

def _walk(data: bytes, aborted, position: int = 0) -> tuple[list[bytes], RecordSetWalk]:
    walk = RecordSetWalk(data, position, aborted=aborted)
    out: list = []
    for batch in walk:
        out += [f[3] for f in batch.record_fields()]
    return out, walk


def test_read_committed_leaves_out_aborted_transactions_only():
    log = b"".join([
        data_batch(0, [b"plain"]),
        data_batch(1, [b"p1-a", b"p1-b"], producer_id=1, producer_epoch=0, base_sequence=0,
                   transactional=True),
        data_batch(3, [b"p2-a"], producer_id=2, producer_epoch=0, base_sequence=0,
                   transactional=True),
        control_batch(4, producer_id=1, kind=ABORT),
        data_batch(5, [b"p1-c"], producer_id=1, producer_epoch=1, base_sequence=0,
                   transactional=True),
        control_batch(6, producer_id=2, kind=COMMIT),
        control_batch(7, producer_id=1, kind=COMMIT),
    ])
    values, walk = _walk(log, [(1, 1)])
    assert values == [b"plain", b"p2-a", b"p1-c"]
    assert walk.position == 8
    uncommitted, _ = _walk(log, None)
    assert uncommitted == [b"plain", b"p1-a", b"p1-b", b"p2-a", b"p1-c"]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_read_committed_returns_exactly_the_committed_records(data):
    """Transactions of several producers interleave at random, each committed or aborted;
    the walk with the aborted list (as a broker computes it) returns exactly the records of
    committed transactions and of non-transactional batches, in offset order."""
    producers = data.draw(st.integers(1, 4))
    steps = data.draw(st.lists(st.tuples(st.integers(0, producers), st.booleans()),
                               max_size=30))
    offset = 0
    parts: list[bytes] = []
    open_txn: dict[int, tuple[int, list[bytes]]] = {}
    aborted: list[tuple[int, int]] = []
    expected_by_offset: dict[int, bytes] = {}
    for producer, end in steps:
        if producer == 0:  # a non-transactional record
            value = f"plain-{offset}".encode()
            parts.append(data_batch(offset, [value]))
            expected_by_offset[offset] = value
            offset += 1
        elif end and producer in open_txn:
            first, values = open_txn.pop(producer)
            commit = data.draw(st.booleans())
            parts.append(control_batch(offset, producer_id=producer,
                                       kind=COMMIT if commit else ABORT))
            if commit:
                expected_by_offset.update(values)
            else:
                aborted.append((producer, first))
            offset += 1
        else:
            value = f"p{producer}-{offset}".encode()
            parts.append(data_batch(offset, [value], producer_id=producer, producer_epoch=0,
                                    base_sequence=0, transactional=True))
            first, values = open_txn.get(producer, (offset, []))
            open_txn[producer] = (first, [*values, (offset, value)])
            offset += 1
    for _first, values in open_txn.values():
        expected_by_offset.update(values)  # still open: a broker stops before them (LSO)
    values, walk = _walk(b"".join(parts), aborted)
    assert values == [v for _, v in sorted(expected_by_offset.items())]
    assert walk.position == offset


# --- metrics -----------------------------------------------------------------------------------

def test_stats_rate_average_and_max_over_the_window():
    stat = Stat()
    for t, value in [(0.0, 10), (1.0, 30), (2.0, 20)]:
        stat.record(value, t)
    assert stat.avg(2.0) == 20 and stat.max(2.0) == 30
    assert stat.rate(2.0) == pytest.approx(60 / WINDOW)  # at least one window's span
    assert stat.rate(3 * WINDOW) == 0 and stat.total == 60  # the totals stay


def test_a_duplicate_counts_as_a_record_error_not_a_failure_seed_004():
    now = [0.0]
    metrics = ProducerMetrics(lambda: now[0])
    metrics.batch_sent(5, 100, retry=False)
    metrics.batch_sent(5, 100, retry=True)
    metrics.duplicate(5)
    metrics.epoch_bumped()
    snapshot = metrics.snapshot()
    assert snapshot["record-send-total"] == 10 and snapshot["record-retry-total"] == 5
    assert snapshot["record-error-total"] == 5 and snapshot["record-duplicate-total"] == 5
    assert snapshot["record-error-rate"] > 0 and snapshot["epoch-bump-total"] == 1
    assert snapshot["batch-size-avg"] == 100
    seen: list[str] = []
    now[0] = 10.0
    timer = StatsTimer(metrics, "me", 1000, seen.append)
    timer.maybe_emit()
    now[0] = 11.5
    timer.maybe_emit()
    timer.maybe_emit()
    assert len(seen) == 1
    stats = json.loads(seen[0])
    assert stats["type"] == "producer" and stats["metrics"]["record-error-total"] == 5
