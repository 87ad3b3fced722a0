"""The producer's client-side idempotence rules (client/idempotence.py), one test per row."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from oncelog.client.idempotence import Action, IdempotenceManager
from oncelog.client.producer_batch import ProducerBatch, encode_headers
from oncelog.protocol.record_batch import read_header
from oncelog.protocol.records import NONE, ZSTD, decode_batch

PID, EPOCH = 42, 3


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


def test_a_retry_keeps_its_sequence_and_goes_alone_first():
    m = manager()
    a, b, c = send(m, batch()), send(m, batch()), send(m, batch())
    assert m.answered(a, ErrorCode.not_leader_or_follower) is Action.RETRY
    assert m.answered(b, ErrorCode.out_of_order_sequence_number) is Action.RETRY
    # Only the first unacknowledged batch may go while retries are queued...
    assert not m.may_send(b, 0)
    assert m.may_send(a, 0)
    m.sending(a)
    assert a.base_sequence == 0 and a.attempts == 2
    assert not m.may_send(b, 0)
    assert m.answered(a, ErrorCode.none) is Action.DELIVERED
    # ...and then the next one.
    assert m.may_send(b, 0)
    assert m.order(b) < m.order(c)


def test_duplicate_sequence_number_is_delivered():
    m = manager()
    a = send(m, batch())
    assert m.answered(a, ErrorCode.duplicate_sequence_number) is Action.DELIVERED
    assert m.partitions[("t", 0)].last_acked == 1


def test_out_of_order_behind_an_unacknowledged_batch_is_a_retry():
    m = manager()
    a, b = send(m, batch()), send(m, batch())
    m.lost(a)
    assert m.answered(b, ErrorCode.out_of_order_sequence_number) is Action.RETRY
    assert not m.bump_needed


def test_out_of_order_for_the_first_unacknowledged_batch_asks_the_broker():
    m = manager()
    a = send(m, batch(4))
    assert m.answered(a, ErrorCode.out_of_order_sequence_number) is Action.RESOLVE
    assert not m.may_send(a, 0)  # nothing goes until the broker has answered


@pytest.mark.parametrize("held, stored, bump", [
    (None, 0, True),                 # no state for us: a new epoch
    ((EPOCH - 1, 10), 0, True),      # another epoch's state: a new epoch
    ((EPOCH, 2), 0, True),           # it ends before the batch (seq 4..7): a gap
    ((EPOCH, 3), 0, True),           # ... right before it, yet it said out of order
    ((EPOCH, 5), 2, False),          # holds 4 and 5 of 4..7: send 6..7
    ((EPOCH, 7), 4, False),          # holds it all: delivered
    ((EPOCH, 90), 4, False),
])
def test_resolving_with_what_the_broker_holds(held, stored, bump):
    m = manager()
    first = send(m, batch(4))
    m.answered(first, ErrorCode.none)
    b = send(m, batch(4))  # sequences 4..7
    m.answered(b, ErrorCode.out_of_order_sequence_number)
    assert m.resolved(b, held) == stored
    assert m.bump_needed == bump
    if 0 < stored < 4:
        assert b.base_sequence == 4 + stored
        assert m.may_send(b, 0)


def test_drop_head_keeps_the_rest_and_reports_the_dropped_as_offset_unknown():
    b = batch(5, codec=ZSTD)
    b.drop_head(2, ZSTD)
    b.stamp(PID, EPOCH, 7)
    header, records = decode_batch(b.data)
    assert [r.value for r in records] == [b"v2", b"v3", b"v4"]
    assert [r.headers for r in records] == [(("h", b"2"),), (("h", b"3"),), (("h", b"4"),)]
    assert (header.base_sequence, header.records_count) == (7, 3)
    b.complete(100)
    assert [b.metadata(i).offset for i in range(5)] == [-1, -1, 100, 101, 102]
    assert [b.metadata(i).timestamp for i in range(5)] == [1000, 1001, 1002, 1003, 1004]


def test_unknown_producer_id_takes_a_new_id():
    m = manager()
    a = send(m, batch())
    assert m.answered(a, ErrorCode.unknown_producer_id) is Action.RETRY
    assert m.bump_needed and m.new_id_wanted
    assert m.bump() == []
    assert m.needs_new_id and not m.may_send(a, 0)
    m.set_identity(PID + 1, 0)
    assert m.may_send(a, 0)


@pytest.mark.parametrize("error", [ErrorCode.invalid_producer_epoch,
                                   ErrorCode.producer_fenced])
def test_fenced_is_fatal(error):
    m = manager()
    assert m.answered(send(m, batch()), error) is Action.FATAL


def test_a_failed_sequenced_batch_leaves_a_gap_that_needs_a_new_epoch():
    m = manager()
    a, b = send(m, batch()), send(m, batch())
    assert m.answered(a, ErrorCode.invalid_record) is Action.FAIL
    assert m.bump_needed
    assert m.answered(b, ErrorCode.out_of_order_sequence_number) is Action.RESOLVE


def test_retries_run_out():
    m = manager(retries=1)
    a = send(m, batch())
    assert m.answered(a, ErrorCode.not_leader_or_follower) is Action.RETRY
    m.sending(a)
    assert m.answered(a, ErrorCode.not_leader_or_follower) is Action.FAIL


def test_bump_fails_what_may_be_stored_and_resequences_the_rest():
    m = manager()
    a, b, c = send(m, batch()), send(m, batch()), send(m, batch(partition=1))
    assert m.lost(a) is Action.RETRY                      # no answer: maybe stored
    assert m.answered(b, ErrorCode.out_of_order_sequence_number) is Action.RETRY
    m.answered(c, ErrorCode.none)
    m.bump_needed = True
    assert m.bump() == [a]
    assert m.epoch == EPOCH + 1
    assert b.base_sequence is None
    send(m, b)
    assert (b.base_sequence, b.epoch) == (0, EPOCH + 1)
    assert m.partitions[("t", 1)].next_sequence == 0


def test_the_last_epoch_takes_a_new_id():
    m = manager()
    m.set_identity(PID, 32767)
    m.bump_needed = True
    m.bump()
    assert m.needs_new_id


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


@pytest.mark.parametrize("bad", [
    {}, {"producer_id": -1, "producer_epoch": 0},
    {"producer_id": 1, "producer_epoch": 40000},
    {"producer_id": 1, "producer_epoch": 0, "sequences": {"t": {"0": -5}}},
    {"producer_id": "x", "producer_epoch": 0},
])
def test_a_bad_checkpoint_is_refused(bad):
    with pytest.raises(ValueError, match="resume"):
        IdempotenceManager(True, 5, 10).resume(bad)


def test_an_unanswered_attempt_keeps_a_batch_maybe_stored():
    """A refusal of the retry says nothing of the attempt that went unanswered: the batch
    must not be resent under a new epoch."""
    m = manager()
    a = send(m, batch())
    m.lost(a)                                         # maybe stored
    m.sending(a)
    assert m.answered(a, ErrorCode.not_leader_or_follower) is Action.RETRY
    assert a.maybe_stored
    m.bump_needed = True
    assert m.bump() == [a]


def test_no_bump_while_the_broker_is_being_asked():
    m = manager()
    a = send(m, batch())
    assert m.answered(a, ErrorCode.out_of_order_sequence_number) is Action.RESOLVE
    m.bump_needed = True
    assert not m.quiet()
    m.resolved(a, None)
    assert m.quiet()
