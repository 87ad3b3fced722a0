"""The producer's client-side rules (client/idempotence.py), one test per row of its table."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from oncelog import KafkaError, OutcomeUnknown
from oncelog.client.producer.idempotence import RESUMED, IdempotenceManager, Outcome, judge_lookup
from oncelog.client.producer.producer_batch import ProducerBatch, encode_headers
from oncelog.protocol.record_batch import read_header
from oncelog.protocol.records import NONE, ZSTD, decode_batch

PID, EPOCH = 42, 3
OOS = ErrorCode.out_of_order_sequence_number


def manager(max_in_flight: int = 5, retries: int = 10) -> IdempotenceManager:
    m = IdempotenceManager(True, max_in_flight, retries)
    m.set_identity(PID, EPOCH)
    return m


def batch(records: int = 2, codec: int = NONE, partition: int = 0) -> ProducerBatch:
    b = ProducerBatch("t", partition, 0.0)
    for i in range(records):
        b.append(1000 + i, b"k%d" % i, b"v%d" % i, encode_headers([("h", b"%d" % i)]))
    b.closed = True
    b.build(codec)
    return b


def send(m: IdempotenceManager, b: ProducerBatch) -> ProducerBatch:
    assert m.may_send(b, 0)
    m.sending(b)
    return b


def answer(m: IdempotenceManager, b: ProducerBatch, error: ErrorCode,
           time_left: bool = True) -> tuple[Outcome, str]:
    verdict = m.answered(b, error, time_left)
    return verdict.outcome, verdict.row


def test_sequences_are_assigned_at_drain_and_stamped_in_the_header():
    m = manager()
    a, b = batch(3), batch(2)
    assert a.base_sequence is None
    send(m, a)
    send(m, b)
    header = read_header(b.data)
    assert (a.base_sequence, b.base_sequence) == (0, 3)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (PID, EPOCH, 3)
    decode_batch(b.data)  # still a valid batch, CRC included


def test_at_most_max_in_flight_per_partition():
    m = manager(max_in_flight=5)
    for _ in range(5):
        send(m, batch())
    assert not m.may_send(batch(), 0)
    assert m.may_send(batch(partition=1), 0)
    assert not m.may_send(batch(partition=1), 5)  # the connection's own limit


# --- rows 1-9b: answers -----------------------------------------------------------------------

@pytest.mark.parametrize("error, row", [(ErrorCode.none, "1"),
                                        (ErrorCode.duplicate_sequence_number, "2")])
def test_rows_1_2_what_the_broker_says_is_stored_is_delivered(error, row):
    m = manager()
    a = send(m, batch())
    m.lost(a, "cut", sent=True, time_left=True)  # maybe stored until the broker says
    send(m, a)
    assert answer(m, a, error) == (Outcome.DELIVERED, row)
    assert not a.maybe_stored and a.ambiguous is None
    assert m.partitions[("t", 0)].acked_up_to == 1


@pytest.mark.parametrize("error", [ErrorCode.invalid_producer_epoch,
                                   ErrorCode.producer_fenced])
def test_row_3_fenced_is_fatal(error):
    m = manager()
    assert answer(m, send(m, batch()), error) == (Outcome.FATAL, "3")


def test_row_4_unknown_producer_id_says_nothing_is_stored_and_takes_a_new_id():
    m = manager()
    a = send(m, batch())
    m.lost(a, "cut", sent=True, time_left=True)
    send(m, a)
    assert answer(m, a, ErrorCode.unknown_producer_id) == (Outcome.NEW_ID, "4")
    assert not a.maybe_stored  # no attempt of an id the broker holds nothing of is stored
    assert m.bump_needed and m.new_id_wanted
    assert m.bump() == []
    assert m.needs_new_id and not m.may_send(a, 0)
    m.set_identity(PID + 1, 0)
    assert m.may_send(a, 0)
    m.sending(a)
    assert (a.base_sequence, a.epoch) == (0, 0)


def test_row_5_a_retry_keeps_its_sequence_and_goes_alone_first():
    m = manager()
    a, b, c = send(m, batch()), send(m, batch()), send(m, batch())
    assert answer(m, a, ErrorCode.not_leader_or_follower) == (Outcome.RETRY, "9")
    assert answer(m, b, OOS) == (Outcome.RETRY, "5")
    # Only the first unacknowledged batch may go while retries are queued...
    assert not m.may_send(b, 0)
    assert m.may_send(a, 0)
    m.sending(a)
    assert a.base_sequence == 0 and a.attempts == 2
    assert not m.may_send(b, 0)
    assert answer(m, a, ErrorCode.none)[0] is Outcome.DELIVERED
    # ...and then the next one.
    assert m.may_send(b, 0)
    assert m.order(b) < m.order(c)
    assert not m.bump_needed


def test_row_6_not_stored_behind_a_later_stored_batch_fails_without_a_new_epoch():
    """rules.py rows 2 then 11: the broker forgot the producer and stored the later batch
    first; the earlier one, refused, cannot be stored after it without reordering."""
    m = manager()
    a, b = send(m, batch()), send(m, batch())
    assert answer(m, b, ErrorCode.none)[0] is Outcome.DELIVERED
    verdict = m.answered(a, OOS, True)
    assert (verdict.outcome, verdict.row) == (Outcome.FAIL, "6")
    assert not m.bump_needed and not m.partitions[("t", 0)].unacked
    error = m.failure(a, OOS, verdict.why)
    assert type(error) is KafkaError and error.args[0].endswith("; not stored")
    assert "stored later records of this producer first" in str(error)


def test_row_7_not_stored_first_unacked_takes_a_new_epoch_and_goes_first_under_it():
    m = manager()
    a, b = send(m, batch()), send(m, batch())
    assert answer(m, a, OOS) == (Outcome.NEW_EPOCH, "7")
    assert answer(m, b, OOS) == (Outcome.RETRY, "5")
    assert m.bump_needed and not m.may_send(a, 0)
    assert m.bump() == []
    assert m.epoch == EPOCH + 1 and a.base_sequence is None and b.base_sequence is None
    send(m, a)
    send(m, b)
    assert (a.base_sequence, b.base_sequence, a.epoch) == (0, 2, EPOCH + 1)


@pytest.mark.parametrize("how", ["lost", "timed out", "storage error", "resumed"])
def test_row_8_maybe_stored_first_unacked_asks_the_broker(how):
    m = manager()
    if how == "resumed":
        m.resume({"producer_id": PID, "producer_epoch": EPOCH, "sequences": {"t": {"0": 9}}})
    a = send(m, batch())
    if how == "lost":
        assert m.lost(a, "cut", sent=True, time_left=True).outcome is Outcome.RETRY
        send(m, a)
    elif how != "resumed":
        error = ErrorCode.request_timed_out if how == "timed out" \
            else ErrorCode.kafka_storage_error
        assert answer(m, a, error) == (Outcome.RETRY, "9")
        send(m, a)
    assert answer(m, a, OOS) == (Outcome.LOOKUP, "8")
    assert not m.may_send(a, 0)  # nothing goes until the broker has answered
    assert not m.quiet()


def test_row_9_a_request_never_written_leaves_the_batch_not_stored():
    m = manager()
    a = send(m, batch())
    assert m.lost(a, "closed", sent=False, time_left=True).outcome is Outcome.RETRY
    assert not a.maybe_stored


@pytest.mark.parametrize("error, time_left, retries, why", [
    (ErrorCode.invalid_record, True, 10, "the broker refused it"),
    (ErrorCode.not_leader_or_follower, False, 10, "delivery.timeout.ms expired"),
    (ErrorCode.not_leader_or_follower, True, 0, "retries exhausted"),
])
def test_row_9b_a_failed_sequenced_batch_leaves_a_gap_that_needs_a_new_epoch(
        error, time_left, retries, why):
    m = manager(retries=retries)
    a, b = send(m, batch()), send(m, batch())
    verdict = m.answered(a, error, time_left)
    assert (verdict.outcome, verdict.row, verdict.why) == (Outcome.FAIL, "9b", why)
    assert m.bump_needed
    assert type(m.failure(a, error, why)) is KafkaError  # refused: not stored
    assert answer(m, b, OOS) == (Outcome.NEW_EPOCH, "7")


# --- rows 10-12: what DescribeProducers says ----------------------------------------------------

@pytest.mark.parametrize("held, row, outcome, records, gap", [
    ((EPOCH, 5), "10", Outcome.SPLIT, 2, True),     # holds 4 and 5 of 4..7: ask about them
    ((EPOCH, 4), "10", Outcome.SPLIT, 1, True),
    ((EPOCH, 7), "11", Outcome.FAIL, 0, False),     # up to its end: rules.py row 11
    ((EPOCH, 90), "11", Outcome.FAIL, 0, False),
    ((EPOCH, 3), "12", Outcome.FAIL, 0, True),      # right before it, yet out of order
    ((EPOCH, 1), "12", Outcome.FAIL, 0, True),      # a gap
    ((EPOCH - 1, 10), "12", Outcome.FAIL, 0, True),  # another epoch
    (None, "12", Outcome.FAIL, 0, True),             # no state for us
])
def test_rows_10_to_12_a_maybe_stored_batch_is_delivered_only_on_the_brokers_word(
        held, row, outcome, records, gap):
    m = manager()
    first = send(m, batch(4))
    answer(m, first, ErrorCode.none)
    b = send(m, batch(4))  # sequences 4..7
    m.lost(b, "cut", sent=True, time_left=True)
    send(m, b)
    assert answer(m, b, OOS)[0] is Outcome.LOOKUP
    verdict = m.looked_up(b, held)
    assert (verdict.row, verdict.outcome, verdict.records) == (row, outcome, records)
    assert m.quiet()
    if outcome is Outcome.FAIL:
        assert m.bump_needed == gap
        error = m.failure(b, OOS, verdict.why)
        assert isinstance(error, OutcomeUnknown)
        assert "outcome unknown" in str(error) and "no answer (cut)" in str(error)
        assert not m.partitions[("t", 0)].unacked


def test_row_11_is_the_forgotten_producers_batch_never_reported_delivered():
    """The issue's case: DescribeProducers says the broker holds the epoch past the batch,
    which is what a batch from before the stored range (never arrived) meets."""
    b = batch(4)
    b.stamp(PID, EPOCH, 10)
    assert judge_lookup(b, (EPOCH, 29)).outcome is Outcome.FAIL


def test_row_10_the_head_goes_as_a_batch_of_its_own_and_its_outcome_is_its_records():
    m = manager()
    b = send(m, batch(5, codec=ZSTD))  # 0..4
    m.lost(b, "cut", sent=True, time_left=True)
    send(m, b)
    answer(m, b, OOS)
    assert m.looked_up(b, (EPOCH, 1)).outcome is Outcome.SPLIT
    head = b.split_head(2, ZSTD)
    m.split(b, head)
    assert m.partitions[("t", 0)].unacked == [head, b]
    assert (head.base_sequence, head.count, b.base_sequence, b.count) == (0, 2, 2, 3)
    assert head.maybe_stored and head.ambiguous == b.ambiguous
    _, records = decode_batch(b.data)
    assert [r.value for r in records] == [b"v2", b"v3", b"v4"]
    assert [r.headers for r in records] == [(("h", b"2"),), (("h", b"3"),), (("h", b"4"),)]
    assert read_header(b.data).base_sequence == 2
    assert [r.value for r in decode_batch(head.data)[1]] == [b"v0", b"v1"]
    # The head alone may go first; the rest after it.
    assert m.may_send(head, 0) and not m.may_send(b, 0)
    m.sending(head)
    assert answer(m, head, ErrorCode.duplicate_sequence_number)[0] is Outcome.DELIVERED
    head.complete(-1)
    assert not b.done  # its own records are still on their way
    m.sending(b)
    assert answer(m, b, ErrorCode.none)[0] is Outcome.DELIVERED
    b.complete(100)
    assert b.done
    assert [b.metadata(i).offset for i in range(5)] == [-1, -1, 100, 101, 102]
    assert [b.metadata(i).timestamp for i in range(5)] == [1000, 1001, 1002, 1003, 1004]


def test_row_10_a_head_the_broker_cannot_vouch_for_fails_alone():
    b = batch(5)
    b.stamp(PID, EPOCH, 0)
    head = b.split_head(2, NONE)
    b.complete(50)
    assert not b.done  # settles once its head does
    head.fail(OutcomeUnknown(OOS, "unknown"))
    assert b.done
    assert [type(b.error_of(i)) for i in range(5)] == [OutcomeUnknown] * 2 + [type(None)] * 3
    assert [b.metadata(i).offset for i in range(2, 5)] == [50, 51, 52]
    with pytest.raises(OutcomeUnknown):
        b.outcome(0)


# --- rows 13-15: a new epoch ------------------------------------------------------------------

def test_rows_14_to_16_a_new_epoch_fails_what_may_be_stored_and_what_would_reorder():
    m = manager()
    p0 = [send(m, batch()) for _ in range(4)]       # partition 0: sequences 0..7
    p1 = send(m, batch(partition=1))
    assert answer(m, p0[0], ErrorCode.not_leader_or_follower)[0] is Outcome.RETRY  # refused
    assert m.lost(p0[1], "cut", sent=True, time_left=True).outcome is Outcome.RETRY  # maybe
    assert answer(m, p0[2], OOS)[0] is Outcome.RETRY                                 # refused
    assert answer(m, p0[3], OOS)[0] is Outcome.RETRY
    answer(m, p1, ErrorCode.none)
    never_sent = batch()
    m.bump_needed = True
    failing = m.bump()
    # p0[1] may be stored (row 14); p0[0] is not, but p0[1] after it may be (row 15);
    # p0[2] and p0[3] are not, and nothing after them is: resent (row 16).
    assert [(b, v.row) for b, v in failing] == [(p0[0], "15"), (p0[1], "14")]
    assert m.epoch == EPOCH + 1
    assert p0[2].base_sequence is None and p0[3].base_sequence is None
    for b in (p0[2], p0[3], never_sent):
        send(m, b)
    assert [b.base_sequence for b in (p0[2], p0[3], never_sent)] == [0, 2, 4]
    assert m.partitions[("t", 1)].next_sequence == 0
    assert isinstance(m.failure(p0[1], OOS, failing[1][1].why), OutcomeUnknown)
    assert type(m.failure(p0[0], OOS, failing[0][1].why)) is KafkaError


def test_row_15_an_acknowledged_later_batch_stops_the_resend_too():
    m = manager()
    a, b = send(m, batch()), send(m, batch())
    answer(m, b, ErrorCode.none)
    answer(m, a, ErrorCode.not_leader_or_follower)
    m.bump_needed = True
    assert [(x, v.row) for x, v in m.bump()] == [(a, "15")]


def test_the_last_epoch_takes_a_new_id():
    m = manager()
    m.set_identity(PID, 32767)
    m.bump_needed = True
    m.bump()
    assert m.needs_new_id


def test_no_bump_while_the_broker_is_being_asked():
    m = manager()
    a = send(m, batch())
    m.lost(a, "cut", sent=True, time_left=True)
    send(m, a)
    assert answer(m, a, OOS)[0] is Outcome.LOOKUP
    m.bump_needed = True
    assert not m.quiet()
    m.looked_up(a, None)
    assert m.quiet()


def test_an_unanswered_attempt_keeps_a_batch_maybe_stored():
    """A refusal of the retry says nothing of the attempt that went unanswered: the batch
    must not be resent under a new epoch."""
    m = manager()
    a = send(m, batch())
    m.lost(a, "cut", sent=True, time_left=True)
    send(m, a)
    assert answer(m, a, ErrorCode.not_leader_or_follower) == (Outcome.RETRY, "9")
    assert a.maybe_stored
    m.bump_needed = True
    assert [(b, v.row) for b, v in m.bump()] == [(a, "14")]


# --- checkpoints (seed 001) -------------------------------------------------------------------

def test_checkpoint_and_resume():
    m = manager()
    send(m, batch(3))
    send(m, batch(2, partition=4))
    saved = m.checkpoint()
    assert saved == {"producer_id": PID, "producer_epoch": EPOCH,
                     "sequences": {"t": {"0": 3, "4": 2}}}
    again = IdempotenceManager(True, 5, 10)
    again.resume(saved)
    b = send(again, batch())
    assert (b.base_sequence, b.epoch) == (3, EPOCH)
    # Its sequences may have been sent by the process that took the checkpoint.
    assert b.ambiguous == RESUMED
    assert answer(again, b, ErrorCode.not_leader_or_follower)[0] is Outcome.RETRY
    assert b.maybe_stored  # a refusal of this attempt says nothing of the process before
    # Row 13: it does not take a new epoch, it stops; even a batch never sent may be stored.
    assert again.continues_checkpoint
    unsent = batch()
    again.bump_needed = True
    assert [(x, v.row, v.outcome) for x, v in again.bump()] == [(b, "13", Outcome.FATAL)]
    assert again.stopped and again.epoch == EPOCH
    assert isinstance(again.failure(unsent, OOS, "stopped"), OutcomeUnknown)
    # A producer that did not resume says "not stored" of a batch it never sent.
    assert type(manager().failure(unsent, OOS, "stopped")) is KafkaError


def test_row_13_a_resumed_producer_stops_at_its_first_failed_batch():
    """Even one that never got its sequences: the next records would take them, and the
    broker would answer them as duplicates of what the process before sent there."""
    m = IdempotenceManager(True, 5, 10)
    m.resume({"producer_id": PID, "producer_epoch": EPOCH, "sequences": {}})
    expired = batch()
    m.give_up(expired)  # delivery.timeout.ms in its queue, never sent
    assert m.bump_needed and not m.may_send(batch(), 0)
    assert m.bump() == [] and m.stopped
    assert isinstance(m.failure(expired, ErrorCode.request_timed_out, "expired"),
                      OutcomeUnknown)


@pytest.mark.parametrize("bad", [
    {}, {"producer_id": -1, "producer_epoch": 0},
    {"producer_id": 1, "producer_epoch": 40000},
    {"producer_id": 1, "producer_epoch": 0, "sequences": {"t": {"0": -5}}},
    {"producer_id": "x", "producer_epoch": 0},
])
def test_a_bad_checkpoint_is_refused(bad):
    with pytest.raises(ValueError, match="resume"):
        IdempotenceManager(True, 5, 10).resume(bad)
