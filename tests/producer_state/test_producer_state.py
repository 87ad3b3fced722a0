"""The idempotence rules, one test per row of the table in producer_state/rules.py."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from oncelog.producer_state import snapshot
from oncelog.producer_state.manager import ProducerStateManager, StateLimits
from oncelog.producer_state.rules import (
    Append,
    BatchIdentity,
    CachedBatch,
    Duplicate,
    ProducerStateEntry,
    Refuse,
    decide,
)
from oncelog.protocol.sequences import SEQUENCE_SPACE, sequence_distance

PID = 4000
NOW = 1_700_000_000_000


def issued(pid: int) -> bool:
    return pid < 10_000


class Partition:
    """A partition reduced to what the rules see: the manager and a log end offset."""

    def __init__(self, limits: StateLimits | None = None) -> None:
        self.state = ProducerStateManager(limits)
        self.end = 0

    def send(self, first: int, count: int, epoch: int = 0, pid: int = PID, now: int = NOW):
        batch = BatchIdentity(pid, epoch, first % SEQUENCE_SPACE,
                              (first + count - 1) % SEQUENCE_SPACE)
        decision = self.state.validate(batch, issued)
        if isinstance(decision, Append):
            self.end += count
            self.state.apply(decision, self.end - 1, now, now)
            return self.end - count
        return decision


def refused(decision, error: ErrorCode) -> bool:
    return isinstance(decision, Refuse) and decision.error == error


# --- row 1 ----------------------------------------------------------------------------------

def test_row1_unissued_producer_id_is_unknown_whatever_its_sequence():
    p = Partition()
    for first in (0, 7):
        assert refused(p.send(first, 3, pid=10**12), ErrorCode.unknown_producer_id)
    assert p.end == 0


# --- rows 2-2c -----------------------------------------------------------------------------

def test_row2_producer_this_partition_may_have_forgotten_is_accepted_at_any_sequence():
    p = Partition()
    p.state.forgotten_up_to = PID  # e.g. its compact record was dropped after a long idle
    assert p.send(42, 3) == 0
    assert p.send(45, 1) == 3


def test_row2b_producer_new_to_the_partition_starts_at_zero():
    p = Partition()
    assert p.send(0, 3) == 0


def test_row2c_producer_new_to_the_partition_starting_later_waits_for_its_first_batch():
    """Sequences 0-4 still on their way, 5-9 arrive first: Kafka would store 5-9, then
    answer 0-4 OUT_OF_ORDER (fatal in librdkafka). Here 5-9 wait for 0-4."""
    p = Partition()
    assert refused(p.send(5, 5), ErrorCode.out_of_order_sequence_number)
    assert p.end == 0
    assert p.send(0, 5) == 0
    assert p.send(5, 5) == 5


def test_dropped_compact_record_marks_the_producer_as_possibly_forgotten():
    p = Partition(StateLimits(max_producers=1, max_tombstones=1))
    for pid in (1, 2, 3):
        p.send(0, 1, pid=pid)  # 1 and then 2 become compact records; 1's is dropped
    assert p.state.forgotten_up_to == 1
    assert p.send(9, 1, pid=1) == 3  # row 2: it may have written here
    assert refused(p.send(9, 1, pid=4), ErrorCode.out_of_order_sequence_number)


# --- rows 3-5 -------------------------------------------------------------------------------

def test_row3_older_epoch_is_fenced():
    p = Partition()
    p.send(0, 1, epoch=3)
    assert refused(p.send(1, 1, epoch=2), ErrorCode.invalid_producer_epoch)


def test_row4_newer_epoch_starting_at_zero_resets_the_producer():
    p = Partition()
    p.send(0, 5)
    assert p.send(0, 2, epoch=1) == 5
    assert p.state.entry(PID).epoch == 1
    assert [(b.first_seq, b.last_seq) for b in p.state.entry(PID).batches] == [(0, 1)]


def test_row5_newer_epoch_not_starting_at_zero_is_out_of_order():
    p = Partition()
    p.send(0, 5)
    assert refused(p.send(5, 1, epoch=1), ErrorCode.out_of_order_sequence_number)


# --- rows 6-10 ------------------------------------------------------------------------------

def test_row6_retry_of_a_cached_batch_gets_its_original_offsets():
    p = Partition()
    offsets = [p.send(first, 4) for first in range(0, 20, 4)]
    for first, offset in zip(range(0, 20, 4), offsets, strict=True):
        assert p.send(first, 4) == Duplicate(offset, offset + 3)
    assert p.end == 20


def test_row7_next_sequence_is_appended():
    p = Partition()
    p.send(0, 3)
    assert p.send(3, 2) == 3


def test_row8_gap_is_out_of_order():
    p = Partition()
    p.send(0, 3)
    assert refused(p.send(4, 2), ErrorCode.out_of_order_sequence_number)


def test_row9_retry_older_than_the_cache_is_a_duplicate_not_stored_again():
    """Seed 000 figure 5: six in flight, the first ACK lost; Kafka stores A twice."""
    p = Partition()
    p.send(0, 114)  # the producer's earlier records: the seed's producer is mid-stream
    batches = [(114, 7), (121, 4), (125, 8), (133, 10), (143, 8), (151, 5)]  # A..F
    for first, count in batches:
        p.send(first, count)
    end = p.end
    assert refused(p.send(114, 7), ErrorCode.duplicate_sequence_number)
    assert p.end == end


def test_row9_partial_batch_below_last_is_a_duplicate_too():
    p = Partition()
    p.send(0, 10)
    assert refused(p.send(2, 3), ErrorCode.duplicate_sequence_number)


def test_row10_batch_straddling_the_last_sequence_is_out_of_order_never_split():
    p = Partition()
    p.send(0, 10)
    assert refused(p.send(8, 5), ErrorCode.out_of_order_sequence_number)
    assert p.end == 10


def test_row11_batch_before_the_first_one_stored_here_is_out_of_order_not_dropped():
    """Sequences 0-4 held up on the way, 5-9 arrive first at a partition new to the producer:
    the late 0-4 were never stored, so a "duplicate" answer would lose them. Refused, they
    stay refused in this epoch, however often they come; oncelog's client reports them failed
    ("not stored", or "outcome unknown" if an attempt went unanswered), never delivered, and
    does not send them under a new epoch, where they would be stored after 5-9
    (client/idempotence.py rows 6, 11 and 15; tests/client/test_idempotence_model.py)."""
    p = Partition()
    p.state.forgotten_up_to = PID
    assert p.send(5, 5) == 0  # row 2: a forgotten producer back mid-stream
    for _ in range(2):
        assert refused(p.send(0, 5), ErrorCode.out_of_order_sequence_number)
        assert refused(p.send(3, 4), ErrorCode.out_of_order_sequence_number)  # the start
    assert isinstance(p.send(5, 5), Duplicate)
    assert refused(p.send(6, 2), ErrorCode.duplicate_sequence_number)  # inside what is stored
    assert p.end == 5


def test_compact_record_keeps_where_the_stored_range_starts():
    p = Partition(StateLimits(max_producers=1))
    p.state.forgotten_up_to = 1
    p.send(10, 5, pid=1)
    p.send(0, 1, pid=2)  # evicts producer 1 to a compact record
    assert p.state.tombstone(1).start_seq == 10
    assert refused(p.send(0, 5, pid=1), ErrorCode.out_of_order_sequence_number)
    assert refused(p.send(10, 5, pid=1), ErrorCode.duplicate_sequence_number)


# --- wrap-around ----------------------------------------------------------------------------

def test_sequences_wrap_at_2_31_minus_1():
    p = Partition()
    p.state.forgotten_up_to = PID
    top = SEQUENCE_SPACE - 3  # the batch holds 2^31-3, 2^31-2, 2^31-1, then 0, 1
    assert p.send(top, 5) == 0
    assert p.state.entry(PID).last_seq == 1
    assert p.send(2, 1) == 5  # continues after the wrap
    assert p.send(top, 5) == Duplicate(0, 4)  # a retry of the batch that wrapped


def test_sequence_just_below_zero_after_wrap_is_below_not_ahead():
    p = Partition()
    p.state.apply(Append(BatchIdentity(PID, 0, SEQUENCE_SPACE - 6, SEQUENCE_SPACE - 3),
                         reset=True), 3, NOW, NOW)
    p.state.apply(Append(BatchIdentity(PID, 0, SEQUENCE_SPACE - 2, 3), reset=False), 9, NOW,
                  NOW)
    assert refused(p.send(SEQUENCE_SPACE - 5, 2), ErrorCode.duplicate_sequence_number)
    assert refused(p.send(9, 1), ErrorCode.out_of_order_sequence_number)


# --- cache size, eviction, expiration -------------------------------------------------------

def test_cache_holds_batches_to_retain():
    p = Partition(StateLimits(batches_to_retain=2))
    for first in range(0, 6, 2):
        p.send(first, 2)
    assert isinstance(p.send(2, 2), Duplicate)
    assert refused(p.send(0, 2), ErrorCode.duplicate_sequence_number)


def test_least_recently_active_producers_are_evicted_to_compact_records():
    p = Partition(StateLimits(max_producers=3))
    for pid in range(1, 5):
        p.send(0, 2, pid=pid, now=NOW + pid)
    assert len(p.state) == 3 and p.state.entry(1) is None
    tomb = p.state.tombstone(1)
    assert (tomb.epoch, tomb.last_seq, tomb.last_offset) == (0, 1, 1)
    # the evicted producer is still judged by its real last sequence
    assert refused(p.send(0, 2, pid=1), ErrorCode.duplicate_sequence_number)
    assert refused(p.send(5, 1, pid=1), ErrorCode.out_of_order_sequence_number)
    assert isinstance(p.send(2, 1, pid=1), int)
    assert p.state.tombstone(1) is None and p.state.entry(1) is not None


def test_idle_producers_expire_to_compact_records_then_go():
    # Idle time is kept in whole seconds (enough for a day-scale expiration).
    p = Partition(StateLimits(expiration_ms=10_000, tombstone_ms=50_000))
    p.send(0, 3, pid=1, now=NOW)
    p.send(0, 3, pid=2, now=NOW + 9_000)
    assert p.state.expire(NOW + 10_000) == (1, 0)
    assert p.state.entry(1) is None and p.state.tombstone(1).last_seq == 2
    assert p.state.entry(2) is not None
    assert p.state.expire(NOW + 60_000) == (1, 1)
    assert p.state.tombstone(1) is None
    assert p.send(17, 1, pid=1) == 6  # forgotten entirely: row 2


def test_validate_changes_nothing_until_apply():
    p = Partition()
    p.send(0, 1)
    before = p.state.entry(PID)
    decision = p.state.validate(BatchIdentity(PID, 0, 1, 1), issued)
    assert isinstance(decision, Append)
    assert p.state.entry(PID) == before


# --- snapshots ------------------------------------------------------------------------------

def test_snapshot_round_trip_keeps_every_cached_batch_and_tombstones():
    p = Partition(StateLimits(max_producers=2))
    for pid in (1, 2, 3):
        for first in range(0, 10, 2):
            p.send(first, 2, pid=pid)
    p.state.forgotten_up_to = 17
    data = snapshot.of_state(p.end, p.state)
    snap = snapshot.decode(data)
    restored = ProducerStateManager(StateLimits(max_producers=2))
    restored.load(snap.entries, snap.tombstones, snap.forgotten_up_to)
    assert snap.offset == p.end
    assert restored.forgotten_up_to == 17
    assert list(restored.entries()) == list(p.state.entries())
    assert list(restored.tombstones()) == list(p.state.tombstones())
    assert len(restored.entry(3).batches) == 5


@pytest.mark.parametrize("damage", [
    lambda d: d[:-1], lambda d: d[:10], lambda d: b"XXXX" + d[4:],
    lambda d: d[:20] + bytes([d[20] ^ 1]) + d[21:], lambda d: d[:4] + b"\x09\x00" + d[6:],
])
def test_damaged_snapshot_is_refused(damage):
    p = Partition()
    p.send(0, 3)
    data = snapshot.of_state(3, p.state)
    with pytest.raises(snapshot.BadSnapshot):
        snapshot.decode(damage(data))


def test_snapshot_loaded_under_a_lower_producer_limit_keeps_the_rest_as_compact_records():
    p = Partition()
    for pid in (1, 2, 3):
        p.send(0, 4, pid=pid)
    snap = snapshot.decode(snapshot.of_state(p.end, p.state))
    smaller = ProducerStateManager(StateLimits(max_producers=2))
    smaller.load(snap.entries, snap.tombstones, snap.forgotten_up_to)
    assert len(smaller) == 2 and smaller.entry(1) is None
    assert smaller.tombstone(1).last_seq == 3  # still judged by its real sequence


# --- the produce path's fast path (rules.judge_next on the packed entry) --------------------

_LAST = SEQUENCE_SPACE - 1
_sequences = st.one_of(st.integers(0, 20), st.integers(_LAST - 20, _LAST),
                       st.integers(0, _LAST))
_cached_batches = st.lists(st.tuples(_sequences, _sequences, st.integers(0, 1 << 40)),
                           min_size=1, max_size=7)


# What _state_and_batch draws from, made once: made inside it, the strategies were built,
# validated and cached again on every draw (a quarter of the test's CPU).
_RETAIN = st.integers(1, 6)
_EPOCH = st.integers(0, 32767)
_KIND = st.sampled_from(["entry", "entry", "entry", "tombstone", "nothing"])
_TXN_FIRST = st.sampled_from([-1, -1, 7])  # a transaction ongoing or not
_FORGOTTEN_UP_TO = st.sampled_from([-1, PID])
_EPOCH_STEP = st.sampled_from([0, 0, 0, -1, 1])  # the batch's epoch: the entry's, or next to it
_HOW = st.sampled_from(["next", "next", "cached", "any"])
_INDEX = [st.sampled_from(range(n)) for n in range(1, 8)]  # _INDEX[n - 1]: one of n
# The batch's last sequence: up to 30 past its first, or any.
_LAST = st.one_of(st.integers(0, 30).map(lambda n: (True, n)),
                  _sequences.map(lambda seq: (False, seq)))


@st.composite
def _state_and_batch(draw):
    """A partition's memory of one producer (a live entry with any cached batches, even
    ones no append could leave, a compact record, or nothing) and a batch aimed at it: mostly
    the next sequence or a cached batch, in the same epoch or next to it."""
    limits = StateLimits(batches_to_retain=draw(_RETAIN))
    state = ProducerStateManager(limits)
    epoch = draw(_EPOCH)
    start = draw(_sequences)
    cached = draw(_cached_batches)
    kind = draw(_KIND)
    txn_first = draw(_TXN_FIRST)
    head = ProducerStateManager.PACKED_HEAD.pack(epoch, start, txn_first, 3, NOW, NOW // 1000)
    entries = [(PID, head + b"".join(ProducerStateManager.PACKED_BATCH.pack(*b)
                                     for b in cached))] if kind == "entry" else []
    tombstones = [(PID, ProducerStateManager.PACKED_TOMBSTONE.pack(
        epoch, start, cached[-1][1], cached[-1][2], NOW))] if kind == "tombstone" else []
    state.load(entries, tombstones, draw(_FORGOTTEN_UP_TO))

    batch_epoch = min(max(epoch + draw(_EPOCH_STEP), 0), 32767)
    how = draw(_HOW)
    if how == "cached":
        first, last, _ = cached[draw(_INDEX[len(cached) - 1])]
    else:
        first = (cached[-1][1] + 1) % SEQUENCE_SPACE if how == "next" else draw(_sequences)
        near, n = draw(_LAST)
        last = (first + n) % SEQUENCE_SPACE if near else n
    return state, BatchIdentity(PID, batch_epoch, first, last, draw(st.booleans()))


@settings(derandomize=True, database=None, max_examples=3000, deadline=None)
@given(_state_and_batch(), st.integers(0, 1 << 40), st.integers(0, 1 << 40))
def test_fast_path_decides_and_applies_as_the_full_rules(state_and_batch, offset, timestamp):
    """validate's shortcut for the next batch (rules.judge_next on the packed bytes) answers
    exactly what rules.decide answers on the unpacked entry, changes nothing, and apply's
    packed update leaves the entry the object model gives."""
    state, batch = state_and_batch
    known = state.entry(PID) or state.tombstone(PID)
    before = (state.packed_entries(), state.packed_tombstones())
    decision = state.validate(batch, issued)
    assert decision == decide(batch, known, True, PID <= state.forgotten_up_to)
    assert (state.packed_entries(), state.packed_tombstones()) == before
    if not isinstance(decision, Append) or decision.reset or state.entry(PID) is None:
        return  # a new entry is built from objects whatever the path: nothing to compare
    entry = state.entry(PID)
    retain = state.limits.batches_to_retain
    txn_first = entry.txn_first_offset
    if decision.begins_txn:
        txn_first = offset - sequence_distance(batch.first_seq, batch.last_seq)
    expected = ProducerStateEntry(
        PID, entry.epoch, entry.start_seq,
        [*entry.batches, CachedBatch(batch.first_seq, batch.last_seq, offset)][-retain:],
        timestamp, NOW // 1000 * 1000, txn_first, entry.coordinator_epoch)
    state.apply(decision, offset, timestamp, NOW)
    assert state.entry(PID) == expected
    assert state.tombstone(PID) is None
