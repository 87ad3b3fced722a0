"""The seeds' flows and the contract's hard cases, step by step: oncelog's own producer (the
real accumulator, IdempotenceManager and Delivery) against the broker's real rules, through
produce_model.World (test_client_model.py runs the same world through random interleavings).

Seed 000 section 2 (figures 2-5) first, then the cases where the broker cannot vouch for a
batch: a producer it forgot (producer.id.expiration.ms, then producer.id.tombstone.ms) whose
later batch it stored first (rules.py rows 2 and 11, issue 12), a resumed checkpoint whose
batches are cut elsewhere than the process before cut them (row 10 of
client/idempotence.py), and what a new epoch does to the batches not yet acknowledged.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode
from support.produce_model import (
    CACHE_SIZE,
    EXPIRATION,
    REQUEST_TIMEOUT,
    RETRY_BACKOFF,
    TOMBSTONE,
    BrokerPartition,
    Copy,
    Lineage,
    World,
    value_of,
)

from oncelog import KafkaError, OutcomeUnknown
from oncelog.producer_state.manager import StateLimits
from oncelog.producer_state.rules import BatchIdentity

OOS = ErrorCode.out_of_order_sequence_number


def one_partition(**limits: int) -> tuple[World, Lineage]:
    world = World(1, StateLimits(expiration_ms=EXPIRATION, tombstone_ms=TOMBSTONE, **limits),
                  {"batch.num.messages": 1000})
    return world, world.start_lineage()


def make(world: World, app: Lineage, count: int) -> Copy:
    """``count`` records, sent as one batch: the copy on its way."""
    assert app.process is not None
    world.produce(app, count)
    app.process.step()
    copy = world.wire[-1]
    assert len(copy.records) == count
    return copy


def read_all(world: World) -> None:
    while world.answers:
        world.read_answer(0)


def calm(world: World, rounds: int = 100) -> None:
    """No faults until every record has its report (retries wait retry.backoff.ms)."""
    for _ in range(rounds):
        if all(p.settled for p in world.live()):
            break
        for process in world.live():
            process.step()
        while world.wire:
            world.process_copy(world.wire[0])
        read_all(world)
        for process in world.live():
            while process.lookups:
                process.answer_lookup(process.lookups[0])
        world.advance(RETRY_BACKOFF)
    world.check()
    assert all(p.settled for p in world.live())


def time_out(world: World) -> None:
    """request.timeout.ms passes: attempts without an answer are lost to the client."""
    world.advance(REQUEST_TIMEOUT + 1)


def forget(world: World) -> None:
    """Long enough idle for the broker to move the producer to a compact record and drop
    that too."""
    world.advance(EXPIRATION + 1000)
    world.advance(TOMBSTONE + 1000)
    assert world.broker[0].state.forgotten_up_to >= 1000
    assert not list(world.broker[0].state.entries())


def outcome(world: World, app: Lineage, first: int, last: int) -> list:
    """Per record: its offset, or the type of its error."""
    result = []
    for index in range(first, last + 1):
        error, meta = world.reports[value_of(app.number, index)]
        result.append(type(error) if error is not None else meta.offset)
    return result


def stored(world: World) -> list[bytes]:
    return [value for logged in world.broker[0].log for value in logged.records]


def values(app: Lineage, first: int, last: int) -> list[bytes]:
    return [value_of(app.number, i) for i in range(first, last + 1)]


# --- seed 000, section 2: the figures, with the seed's batches --------------------------------

SEED_BATCHES = {"A": 7, "B": 4, "C": 8, "D": 10, "E": 8, "F": 5}  # A/120~114, B/124~121, ...


def seed_world() -> tuple[World, Lineage]:
    """A producer that already stored records 0..113: record index == sequence == offset."""
    world, app = one_partition()
    make(world, app, 114)
    calm(world)
    return world, app


def test_figure_2_success():
    world, app = seed_world()
    for group in ("ABC", "DE"):
        sent = [make(world, app, SEED_BATCHES[name]) for name in group]
        for copy in sent:
            world.process_copy(copy)
        read_all(world)
    world.final_checks()
    assert outcome(world, app, 114, 150) == list(range(114, 151))
    assert stored(world) == values(app, 0, 150)


def test_figure_3_missing_acks_are_answered_with_the_original_offsets():
    world, app = seed_world()
    sent = {name: make(world, app, SEED_BATCHES[name]) for name in "ABCDE"}
    for copy in sent.values():
        world.process_copy(copy)
    world.answers = [a for a in world.answers if a[0] not in (sent["D"], sent["E"])]
    read_all(world)
    time_out(world)  # D and E: retried with their sequences, cached: their offsets
    calm(world)
    world.final_checks()
    assert outcome(world, app, 114, 150) == list(range(114, 151))
    assert stored(world) == values(app, 0, 150)


def test_figure_4_a_missing_batch_is_waited_for_not_bumped_over():
    """C lost on the way: D and E are refused OUT_OF_ORDER (rules.py row 8) and wait behind
    C (client row 5), which is retried with its sequences; all five stored once, in order,
    under the first epoch."""
    world, app = seed_world()
    sent = {name: make(world, app, SEED_BATCHES[name]) for name in "ABCDE"}
    world.wire.remove(sent["C"])
    for copy in list(world.wire):
        world.process_copy(copy)
    assert [a[1] for a in world.answers] == [ErrorCode.none] * 2 + [OOS] * 2
    read_all(world)
    time_out(world)
    calm(world)
    world.final_checks()
    assert outcome(world, app, 114, 150) == list(range(114, 151))
    assert stored(world) == values(app, 0, 150)
    assert {logged.identity.epoch for logged in world.broker[0].log} == {0}


def test_figure_5_a_retry_older_than_the_cache_is_not_stored_twice():
    """Six in flight, A's ACK lost: Kafka answers OUT_OF_ORDER and its client stores A again.
    oncelog's producer never has more than five in flight; the broker answers such a retry
    DUPLICATE_SEQUENCE_NUMBER anyway (rules.py row 9), whoever sends it."""
    partition = BrokerPartition(StateLimits())
    first = 0
    sent = []
    for count in (114, *SEED_BATCHES.values()):
        identity = BatchIdentity(4000, 0, first, first + count - 1)
        sent.append(identity)
        assert partition.state.validate(identity, lambda pid: True).reset is (first == 0)
        partition.state.apply(partition.state.validate(identity, lambda pid: True),
                              first + count - 1, 0, 0)
        first += count
    assert len(partition.state.entry(4000).batches) == CACHE_SIZE  # A has left the cache
    again = partition.state.validate(sent[1], lambda pid: True)
    assert again.error == ErrorCode.duplicate_sequence_number


# --- a forgotten producer: its later batch stored first (issue 12) ----------------------------

def test_a_batch_lost_before_a_forgetting_broker_is_never_reported_delivered():
    """The issue's case. The broker forgot the producer; A's request is lost, B (after it)
    is stored at once (rules.py row 2); A's retry is refused (row 11: before the range it
    stored, so "may never have arrived"). DescribeProducers says the broker holds the epoch
    up to past A: before, the producer took that for "stored" and reported A delivered at
    offset -1, though the log does not hold it. Now A fails: outcome unknown (client row 11).
    """
    world, app = one_partition()
    make(world, app, 3)
    calm(world)
    forget(world)
    a, b = make(world, app, 3), make(world, app, 3)
    world.wire.remove(a)
    world.process_copy(b)
    read_all(world)
    time_out(world)
    calm(world)
    world.final_checks()
    assert outcome(world, app, 0, 8) == [0, 1, 2] + [OutcomeUnknown] * 3 + [3, 4, 5]
    error, _ = world.reports[value_of(app.number, 3)]
    assert "may never have arrived" in str(error) and "got no answer" in str(error)
    assert stored(world) == values(app, 0, 2) + values(app, 6, 8)


def test_a_batch_refused_behind_a_forgetting_broker_fails_as_not_stored():
    """A arrives after B, which the broker took first: A was refused on its only attempt, so
    it is not stored; sent again it would be stored after B (client row 6): it fails, "not
    stored", and the producer goes on in its epoch."""
    world, app = one_partition()
    make(world, app, 3)
    calm(world)
    forget(world)
    a, b = make(world, app, 3), make(world, app, 3)
    world.process_copy(b)
    world.process_copy(a)
    read_all(world)
    make(world, app, 2)
    calm(world)
    world.final_checks()
    assert outcome(world, app, 0, 10) == [0, 1, 2] + [KafkaError] * 3 + [3, 4, 5, 6, 7]
    assert "stored later records of this producer first" in str(
        world.reports[value_of(app.number, 3)][0])
    assert stored(world) == values(app, 0, 2) + values(app, 6, 10)
    assert {logged.identity.epoch for logged in world.broker[0].log} == {0}


def test_a_gap_at_first_sight_waits_for_the_earlier_batch():
    """rules.py row 2c: a producer new to the partition whose later batch arrives first is
    refused until the earlier one is stored; the client waits (row 5)."""
    world, app = one_partition()
    a, b = make(world, app, 5), make(world, app, 5)
    world.process_copy(b)
    world.process_copy(a)
    read_all(world)
    calm(world)
    world.final_checks()
    assert outcome(world, app, 0, 9) == list(range(10))
    assert stored(world) == values(app, 0, 9)


# --- a new epoch (client rows 7 and 14-16) ------------------------------------------------------

def test_a_refused_batch_leaves_a_gap_and_the_next_is_resent_under_a_new_epoch():
    """A refused for good (INVALID_TIMESTAMP): its sequences leave a gap, so B, refused
    OUT_OF_ORDER (row 2c) and not stored, goes again from sequence 0 of a new epoch (rows
    9b, 7, 16)."""
    world, app = one_partition()
    a, b = make(world, app, 3), make(world, app, 3)
    world.broker_fails(a, ErrorCode.invalid_timestamp)
    world.process_copy(b)
    read_all(world)
    calm(world)
    world.final_checks()
    assert outcome(world, app, 0, 5) == [KafkaError] * 3 + [0, 1, 2]
    assert [(logged.identity.epoch, logged.identity.first_seq)
            for logged in world.broker[0].log] == [(1, 0)]


def test_a_new_epoch_fails_what_may_be_stored_and_what_would_be_stored_out_of_order():
    """At the new epoch B may be stored (its request was lost): it is not sent again (row
    14); A, refused, is not stored, but under the new epoch it would be stored after B: it
    fails, not stored (row 15)."""
    world, app = one_partition()
    a, b, c = make(world, app, 2), make(world, app, 2), make(world, app, 2)
    world.broker_fails(a, ErrorCode.not_leader_or_follower)
    world.wire.remove(b)
    world.broker_fails(c, ErrorCode.invalid_timestamp)
    read_all(world)
    time_out(world)
    calm(world)
    world.final_checks()
    assert outcome(world, app, 0, 5) == [KafkaError] * 2 + [OutcomeUnknown] * 2 + \
        [KafkaError] * 2
    assert stored(world) == []


# --- resuming a checkpoint (seed 001, "Transitivity") -----------------------------------------

def test_a_resumed_batch_straddling_what_the_broker_holds_sends_its_head_alone():
    """The process before stored records 0-2 after its checkpoint; its successor produces
    them again with two more, as one batch 0-4, which the broker refuses (it straddles its
    last sequence, rules.py row 10). DescribeProducers says it holds up to 2; whether it
    holds 0-2 only the broker can say, so 0-2 go as a batch of their own, which it answers
    with their offsets (cached), and 3-4 after them (client row 10)."""
    world, app = one_partition()
    world.checkpoint(app)
    make(world, app, 3)
    calm(world)
    world.crash_and_resume(app)
    world.produce(app, 2)
    calm(world)
    world.final_checks()
    assert outcome(world, app, 0, 4) == [0, 1, 2, 3, 4]
    assert stored(world) == values(app, 0, 4)
    assert [len(logged.records) for logged in world.broker[0].log] == [3, 2]


def test_a_resumed_producer_stops_when_a_batch_fails():
    """Client row 13: under the resumed identity a record matches the process before's only
    while none is left out, and under a new epoch the broker could not recognise what that
    process stored: the producer stops, every record of unknown outcome."""
    world, app = one_partition()
    world.checkpoint(app)
    make(world, app, 3)
    calm(world)
    world.crash_and_resume(app)
    world.produce(app, 2)
    app.process.step()
    world.broker_fails(world.wire[-1], ErrorCode.invalid_timestamp)
    read_all(world)
    calm(world)
    app.process.step()  # the sender's next turn: a new epoch is due
    world.final_checks()
    assert app.process.delivery.fatal is not None
    assert outcome(world, app, 0, 4) == [OutcomeUnknown] * 5
    assert stored(world) == values(app, 0, 2)


def test_a_resumed_producer_meeting_a_broker_without_its_state_stops():
    """The partition was recreated: the broker holds nothing of the producer and refuses
    its next sequence (rules.py row 2c). The process before may have stored the batch, as
    far as the client can tell: unknown (client row 12), and the producer stops (row 13)."""
    world, app = one_partition()
    make(world, app, 3)
    calm(world)
    world.checkpoint(app)
    world.crash_and_resume(app)
    world.broker[0] = BrokerPartition(world.limits)
    world.scanned[0] = 0
    make(world, app, 2)
    calm(world)
    world.final_checks()
    assert outcome(world, app, 3, 4) == [OutcomeUnknown] * 2
    assert "holds no state of this producer" in str(world.reports[value_of(app.number, 3)][0])
    assert stored(world) == []


# --- what the broker remembers (findings of the earlier broker-only model) --------------------

def test_a_producer_back_from_its_compact_record_keeps_where_its_range_starts():
    """Row 7 on a compact record once began a fresh range at that batch, so the retry of an
    earlier, stored batch was refused OUT_OF_ORDER (row 11) and stored again."""
    world = World(1, StateLimits(max_producers=1, expiration_ms=EXPIRATION,
                                 tombstone_ms=TOMBSTONE), {"batch.num.messages": 1000})
    app, other = world.start_lineage(), world.start_lineage()
    first = make(world, app, 2)
    world.process_copy(first)  # stored; the answer is lost below
    world.answers.clear()
    make(world, other, 1)
    calm_only(world, other)
    partition = world.broker[0]
    assert partition.state.tombstone(first.identity.producer_id) is not None
    for how in ("live", "clean", "snapshot+log", "log"):
        if how != "live":
            partition.restart(how, world.now)
        again = partition.state.validate(first.identity, lambda pid: True)
        assert again.error == ErrorCode.duplicate_sequence_number, how
    time_out(world)
    calm(world)
    world.final_checks()
    assert outcome(world, app, 0, 1) == [-1, -1]  # DUPLICATE_SEQUENCE_NUMBER: offset unknown
    assert stored(world) == values(app, 0, 1) + values(other, 0, 0)


def calm_only(world: World, app: Lineage) -> None:
    assert app.process is not None
    app.process.step()
    for copy in [c for c in world.wire if c.process is app.process]:
        world.process_copy(copy)
    read_all(world)


def test_a_rebuilt_state_keeps_the_gap_a_forgotten_producer_left_in_the_log():
    """Replay once ran a producer's stored range on from 0 across the gap that a row-2
    append left in the log, so after a restart the missing batches were "duplicates"."""
    world, app = one_partition()
    make(world, app, 100)
    calm(world)
    world.broker[0].take_snapshot()
    forget(world)
    held_up, late = make(world, app, 50), make(world, app, 5)
    world.wire.remove(held_up)
    world.process_copy(late)  # row 2
    partition = world.broker[0]
    for how in ("live", "clean", "snapshot+log", "log"):
        if how != "live":
            partition.restart(how, world.now)
        assert partition.state.entry(late.identity.producer_id).start_seq == 150, how
        again = partition.state.validate(held_up.identity, lambda pid: True)
        assert again.error == OOS, how  # row 11
