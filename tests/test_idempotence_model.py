"""A model check of idempotent producing: several producers, one partition, a bad network.

The broker is the real ProducerStateManager in front of a list standing for the log; the
producers behave like Kafka's idempotent clients (seeds 000, 002, 003): sequences are assigned
when a batch is made and never change on a retry, up to K batches are unacknowledged at once
(K from 1 to 10: more than the broker's 5 cached batches is where Kafka stores duplicates, seed
000 figure 5), DUPLICATE_SEQUENCE_NUMBER counts as delivered (Java, librdkafka), and
OUT_OF_ORDER_SEQUENCE_NUMBER for the oldest unacknowledged batch bumps the epoch and
resequences from 0 (KIP-360); any other batch just waits to be retried. A producer whose
batches are all acknowledged may also start a new epoch, so that old copies meet rows 3-5.

The network loses requests and responses, delivers both in any order, and can bring back any
copy ever sent (a retry may reach the broker long after newer batches were stored, or after a
new epoch). The broker restarts from a snapshot of its current state, from its newest snapshot
plus the log after it, or from the log alone, and must come back remembering the same things.

After every step: nothing is stored twice, every acknowledged record is stored, each producer's
records are stored in the order it made them, a Duplicate answer points at exactly the batch
that was retried, and a batch sent when all earlier ones were acknowledged is never refused
OUT_OF_ORDER_SEQUENCE_NUMBER (so the KIP-360 bump above is never needed here: the broker
forgets no producer it has stored, and that refusal would mean it had lost a batch).
Producers are moved out to compact records (max_producers 1 or 2), and in some runs one
producer resumes where a partition that forgot it (row 2) sees its sequences wrap at 2^31.

One known limit is steered around, not modelled: a partition that knows nothing of a producer
it may have forgotten accepts its batch at any sequence (rules.py row 2, KIP-360), so if the
producer's earlier batches are still on their way the later one is stored first, and the
earlier ones come back under a new epoch (row 11): nothing lost, but out of order, as in
Kafka. The network below therefore takes only the batch that opens an epoch to a partition
that knows nothing of a producer it may have forgotten; the tests at the end show the case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from kio.schema.errors import ErrorCode

from oncelog.producer_state import snapshot
from oncelog.producer_state.manager import ProducerStateManager, StateLimits
from oncelog.producer_state.rules import (
    SEQUENCE_SPACE,
    Append,
    BatchIdentity,
    Duplicate,
    Refuse,
)

CACHE = 5  # batches the broker remembers per producer, Kafka's hard-coded 5
NOW = 1_700_000_000_000
FIRST_PID = 1000
HIGHEST_ISSUED = 10**6  # every producer of the model was issued before any restart


def every_pid_issued(pid: int) -> bool:
    return True


# --- the wire ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """One copy of a batch on its way to the broker."""

    producer_id: int
    epoch: int
    first_seq: int
    records: tuple[int, ...]  # record ids, numbered by the producer in the order it made them
    opens_epoch: bool  # the producer's first batch of this epoch
    sent_as_oldest: bool  # every earlier batch was acknowledged when this copy was sent

    @property
    def identity(self) -> BatchIdentity:
        last = (self.first_seq + len(self.records) - 1) % SEQUENCE_SPACE
        return BatchIdentity(self.producer_id, self.epoch, self.first_seq, last)


@dataclass(frozen=True)
class Stored:
    """The broker appended the batch at these offsets."""

    base_offset: int
    last_offset: int


Answer = Stored | Duplicate | Refuse


# --- the broker -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Logged:
    request: Request
    base_offset: int
    timestamp: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + len(self.request.records) - 1


class Broker:
    """One partition: a list of batches for the log and the real ProducerStateManager."""

    def __init__(self, limits: StateLimits | None = None) -> None:
        self.limits = limits or StateLimits(batches_to_retain=CACHE)
        self.state = ProducerStateManager(self.limits)
        self.log: list[Logged] = []
        self.end = 0
        self.now = NOW
        self.snapshots: list[bytes] = []
        # The log once began with batches retention has deleted since: a rebuild from the log
        # alone then cannot know who wrote there, as Partition._load_snapshot says.
        self.beginning_deleted = False

    def produce(self, request: Request) -> Answer:
        """validate, then append and apply, exactly as Partition.append_records does."""
        self.now += 1
        decision = self.state.validate(request.identity, every_pid_issued)
        if not isinstance(decision, Append):
            return decision
        logged = Logged(request, self.end, self.now)
        self.log.append(logged)
        self.end += len(request.records)
        self.state.apply(decision, logged.last_offset, self.now, self.now)
        return Stored(logged.base_offset, logged.last_offset)

    def knows(self, producer_id: int) -> bool:
        return (self.state.entry(producer_id) is not None
                or self.state.tombstone(producer_id) is not None)

    def batch_at(self, base_offset: int) -> Logged | None:
        for logged in self.log:
            if logged.base_offset == base_offset:
                return logged
        return None

    def take_snapshot(self) -> None:
        """What a segment roll does: keep the state as of the current log end."""
        self.snapshots.append(snapshot.of_state(self.end, self.state))

    def restart(self, how: str) -> None:
        """A new manager: from a snapshot now, the newest snapshot and the log after, or the log."""
        state = ProducerStateManager(self.limits)
        start = 0
        image = snapshot.of_state(self.end, self.state) if how == "clean" else None
        if how == "snapshot+log" and self.snapshots:
            image = self.snapshots[-1]
        if image is not None:
            snap = snapshot.decode(image)
            state.load(snap.entries, snap.tombstones, snap.forgotten_up_to)
            start = snap.offset
        elif self.beginning_deleted:
            state.forget_everyone(HIGHEST_ISSUED)
        for logged in self.log:
            if logged.base_offset >= start:
                state.replay(logged.request.identity, logged.last_offset, logged.timestamp,
                             self.now)
        self.state = state

    def remembered(self) -> tuple[list, list]:
        """What judges the next batch, in recency order; not when it was last active."""
        return ([(e.producer_id, e.epoch, e.start_seq, e.batches, e.last_timestamp)
                 for e in self.state.entries()],
                [(t.producer_id, t.epoch, t.start_seq, t.last_seq, t.last_offset)
                 for t in self.state.tombstones()])


# --- the producers ----------------------------------------------------------------------------

@dataclass(eq=False)
class Batch:
    records: tuple[int, ...]
    epoch: int
    first_seq: int


@dataclass(eq=False)
class Producer:
    """An idempotent client's view of one partition."""

    producer_id: int
    max_in_flight: int
    epoch: int = 0
    epoch_first_seq: int = 0  # the sequence this epoch began at (0 but for a resumed producer)
    next_seq: int = 0
    next_record: int = 0
    unacked: list[Batch] = field(default_factory=list)  # oldest first
    acked: list[int] = field(default_factory=list)
    bump_pending: bool = False  # the oldest batch was refused OUT_OF_ORDER: new epoch due

    def new_batch(self, count: int) -> Batch:
        records = tuple(range(self.next_record, self.next_record + count))
        self.next_record += count
        batch = Batch(records, self.epoch, self.next_seq)
        self.next_seq = (self.next_seq + count) % SEQUENCE_SPACE
        self.unacked.append(batch)
        return batch

    def request(self, batch: Batch) -> Request:
        return Request(self.producer_id, batch.epoch, batch.first_seq, batch.records,
                       opens_epoch=batch.first_seq == self.epoch_first_seq,
                       sent_as_oldest=batch is self.unacked[0])

    def on_answer(self, request: Request, answer: Answer) -> str:
        """React as Kafka's clients do; returns what happened, for the tests to look at."""
        batch = next((b for b in self.unacked if b.records == request.records), None)
        if batch is None or (batch.epoch, batch.first_seq) != (request.epoch, request.first_seq):
            return "stale"  # an answer to a copy already settled, or sent before a new epoch
        if isinstance(answer, Stored | Duplicate) or (
                answer.error == ErrorCode.duplicate_sequence_number):
            self.unacked.remove(batch)
            self.acked.extend(batch.records)
            return "acked"
        if answer.error == ErrorCode.out_of_order_sequence_number:
            # Only the first in-flight batch proves a gap. Java asks "is it the next sequence
            # after the last acknowledged one?" when the answer comes, which on one TCP
            # connection is also how things stood when the broker judged it. On this network
            # an answer can overtake the acknowledgement of an earlier batch, so the question
            # is asked of the moment the copy was sent.
            if batch is self.unacked[0] and request.sent_as_oldest:
                self.bump_pending = True
                return "bump"
            return "retry later"
        raise AssertionError(f"the current batch {request.identity} was refused: {answer}")

    def bump_epoch(self) -> None:
        """KIP-360: a new epoch, every unacknowledged batch resequenced from 0."""
        self.epoch += 1
        self.epoch_first_seq = self.next_seq = 0
        for batch in self.unacked:
            batch.epoch, batch.first_seq = self.epoch, self.next_seq
            self.next_seq = (self.next_seq + len(batch.records)) % SEQUENCE_SPACE
        self.bump_pending = False


# --- the machine ------------------------------------------------------------------------------

PICK = st.integers(min_value=0, max_value=1 << 16)  # an index, taken modulo the list it picks from


class IdempotenceModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.broker = Broker()
        self.producers: list[Producer] = []
        self.requests: list[Request] = []  # in the network, in no particular order
        self.sent: list[Request] = []  # every copy ever sent
        self.responses: list[tuple[Request, Answer]] = []
        self.duplicates: list[tuple[Request, Duplicate]] = []  # every Duplicate answered
        self.gaps_claimed: list[tuple[Request, Refuse]] = []  # OUT_OF_ORDER for in-order data
        # what the invariants have seen so far (the log only grows)
        self.scanned = 0
        self.offset_of: dict[tuple[int, int], int] = {}
        self.stored_twice: list[tuple[int, int]] = []
        self.last_record: dict[int, int] = {}
        self.out_of_order: list[tuple[int, int, int]] = []
        self.duplicates_checked = 0
        self.acked_checked: dict[int, int] = {}

    @initialize(k=st.integers(1, 10), producers=st.integers(1, 3),
                max_producers=st.sampled_from([1, 2, 100_000]),
                resumed=st.booleans())
    def start(self, k: int, producers: int, max_producers: int, resumed: bool) -> None:
        event(f"max in flight {'> cache' if k > CACHE else '<= cache'}")
        self.broker = Broker(StateLimits(batches_to_retain=CACHE, max_producers=max_producers))
        self.producers = [Producer(FIRST_PID + i, k) for i in range(producers)]
        if resumed:
            # A producer that wrote here long ago (in segments deleted since) and was forgotten
            # (its compact record dropped) resumes near the top of the sequence space (row 2):
            # its sequences wrap from 2^31-1 to 0 a few batches later.
            first = self.producers[0]
            first.epoch_first_seq = first.next_seq = SEQUENCE_SPACE - 7
            self.broker.state.forgotten_up_to = first.producer_id
            self.broker.beginning_deleted = True

    # --- helpers ------------------------------------------------------------------------------

    def _producer(self, producer_id: int) -> Producer:
        return self.producers[producer_id - FIRST_PID]

    def _can_send(self, p: Producer) -> bool:
        return not p.bump_pending and len(p.unacked) < p.max_in_flight

    def _drained(self, p: Producer) -> bool:
        return (all(r.producer_id != p.producer_id for r in self.requests)
                and all(r.producer_id != p.producer_id for r, _ in self.responses))

    def _send(self, request: Request) -> None:
        self.requests.append(request)
        self.sent.append(request)

    def _deliverable(self) -> list[int]:
        # Steer around the hole of row 2 (see the module docstring).
        state = self.broker.state
        return [i for i, r in enumerate(self.requests)
                if r.opens_epoch or self.broker.knows(r.producer_id)
                or r.producer_id > state.forgotten_up_to]

    # --- the producers ------------------------------------------------------------------------

    @precondition(lambda self: any(self._can_send(p) for p in self.producers))
    @rule(pick=PICK, count=st.integers(1, 10))
    def send_new_batch(self, pick: int, count: int) -> None:
        ready = [p for p in self.producers if self._can_send(p)]
        producer = ready[pick % len(ready)]
        self._send(producer.request(producer.new_batch(count)))

    @precondition(lambda self: any(p.unacked and not p.bump_pending for p in self.producers))
    @rule(pick=PICK, which=PICK)
    def retry_a_batch(self, pick: int, which: int) -> None:
        """Any unacknowledged batch, old or new, as it was first sent."""
        waiting = [p for p in self.producers if p.unacked and not p.bump_pending]
        producer = waiting[pick % len(waiting)]
        batch = producer.unacked[which % len(producer.unacked)]
        self._send(producer.request(batch))

    @precondition(lambda self: any(p.bump_pending and self._drained(p) for p in self.producers))
    @rule(pick=PICK)
    def bump_epoch_after_out_of_order(self, pick: int) -> None:
        """Once nothing of the producer is on the wire, as Java's client waits for."""
        due = [p for p in self.producers if p.bump_pending and self._drained(p)]
        due[pick % len(due)].bump_epoch()
        event("epoch bumped after OUT_OF_ORDER_SEQUENCE_NUMBER")

    def _idle(self) -> list[Producer]:
        return [p for p in self.producers if not p.unacked and p.next_seq != p.epoch_first_seq]

    @precondition(lambda self: self._idle())
    @rule(pick=PICK)
    def new_epoch_while_idle(self, pick: int) -> None:
        """Everything sent in this epoch acknowledged, a new epoch (a transactional client's
        after an abort, or KIP-360's after a batch timed out): old copies meet rows 3-5."""
        idle = self._idle()
        idle[pick % len(idle)].bump_epoch()

    # --- the network --------------------------------------------------------------------------

    def _deliver(self, index: int, answered: bool = True) -> None:
        request = self.requests.pop(index)
        tombstoned = self.broker.state.tombstone(request.producer_id) is not None
        answer = self.broker.produce(request)
        event(f"broker answered {type(answer).__name__}"
              + (f" {answer.error.name}" if isinstance(answer, Refuse) else "")
              + (" (compact record)" if tombstoned else ""))
        if isinstance(answer, Duplicate):
            self.duplicates.append((request, answer))
        if (isinstance(answer, Refuse) and request.sent_as_oldest
                and answer.error == ErrorCode.out_of_order_sequence_number):
            self.gaps_claimed.append((request, answer))
        if answered:
            self.responses.append((request, answer))

    @precondition(lambda self: self._deliverable())
    @rule(pick=PICK)
    def deliver_request(self, pick: int) -> None:
        deliverable = self._deliverable()
        self._deliver(deliverable[pick % len(deliverable)])

    @precondition(lambda self: self._deliverable())
    @rule(answered=st.booleans())
    def deliver_all_in_order(self, answered: bool) -> None:
        """A calm spell, or (unanswered) a connection that drops after the broker did its work."""
        while deliverable := self._deliverable():
            self._deliver(deliverable[0], answered)

    @precondition(lambda self: self.sent)
    @rule(pick=PICK)
    def an_old_copy_turns_up(self, pick: int) -> None:
        """Any copy ever sent, however long ago and whatever became of its batch since."""
        self.requests.append(self.sent[pick % len(self.sent)])

    @precondition(lambda self: self.requests)
    @rule(pick=PICK)
    def lose_request(self, pick: int) -> None:
        self.requests.pop(pick % len(self.requests))

    @precondition(lambda self: self.responses)
    @rule(pick=PICK)
    def deliver_response(self, pick: int) -> None:
        request, answer = self.responses.pop(pick % len(self.responses))
        outcome = self._producer(request.producer_id).on_answer(request, answer)
        event(f"producer: {outcome}")

    @precondition(lambda self: self.responses)
    @rule(pick=PICK)
    def lose_response(self, pick: int) -> None:
        self.responses.pop(pick % len(self.responses))

    # --- the broker ---------------------------------------------------------------------------

    @rule()
    def take_snapshot(self) -> None:
        self.broker.take_snapshot()

    @rule(how=st.sampled_from(["clean", "snapshot+log", "log"]))
    def restart_broker(self, how: str) -> None:
        before = self.broker.remembered()
        self.broker.restart(how)
        # Nothing was forgotten, so however it was rebuilt the state must be the one it had.
        assert self.broker.remembered() == before, how

    # --- invariants ---------------------------------------------------------------------------

    def _scan_log(self) -> None:
        for logged in self.broker.log[self.scanned:]:
            pid = logged.request.producer_id
            for i, record in enumerate(logged.request.records):
                key = (pid, record)
                if key in self.offset_of:
                    self.stored_twice.append(key)
                self.offset_of.setdefault(key, logged.base_offset + i)
                if record <= self.last_record.get(pid, -1):
                    self.out_of_order.append((pid, self.last_record[pid], record))
                self.last_record[pid] = record
        self.scanned = len(self.broker.log)

    @invariant()
    def nothing_is_stored_twice(self) -> None:
        self._scan_log()
        assert not self.stored_twice, f"(producer, record) stored twice: {self.stored_twice}"

    @invariant()
    def every_acknowledged_record_is_stored(self) -> None:
        self._scan_log()
        for p in self.producers:
            # The log only grows: what was stored when it was acknowledged stays stored.
            fresh = p.acked[self.acked_checked.get(p.producer_id, 0):]
            missing = [r for r in fresh if (p.producer_id, r) not in self.offset_of]
            assert not missing, f"producer {p.producer_id}: acknowledged, not stored: {missing}"
            self.acked_checked[p.producer_id] = len(p.acked)

    @invariant()
    def each_producer_is_stored_in_order(self) -> None:
        self._scan_log()
        assert not self.out_of_order, f"(producer, before, after): {self.out_of_order}"

    @invariant()
    def a_duplicate_points_at_the_retried_batch(self) -> None:
        for request, answer in self.duplicates[self.duplicates_checked:]:
            logged = self.broker.batch_at(answer.base_offset)
            assert logged is not None, f"{answer} points at no batch start"
            assert logged.last_offset == answer.last_offset, (answer, logged)
            assert logged.request.producer_id == request.producer_id, (answer, logged)
            assert logged.request.records == request.records, (request, answer, logged)
        self.duplicates_checked = len(self.duplicates)


    @invariant()
    def no_gap_is_claimed_before_in_order_data(self) -> None:
        """A copy sent when every earlier batch was acknowledged follows what the broker has:
        OUT_OF_ORDER there would cost the client an epoch bump (and, in Kafka, a duplicate)."""
        assert not self.gaps_claimed, self.gaps_claimed


IdempotenceModel.TestCase.settings = settings(
    derandomize=True, database=None, max_examples=1000, stateful_step_count=80, deadline=None)
test_idempotence_model = IdempotenceModel.TestCase


# --- seed 000, section 2: the figures with their batches ---------------------------------------

PID = 4000
SEED_BATCHES = {"A": (114, 120), "B": (121, 124), "C": (125, 132), "D": (133, 142),
                "E": (143, 150), "F": (151, 155)}


def seed_producer(broker: Broker, max_in_flight: int) -> tuple[Producer, Callable[[str], Request]]:
    """A producer that already stored sequences 0..113, so record id == sequence == offset."""
    producer = Producer(PID, max_in_flight)
    first = producer.request(producer.new_batch(114))
    assert producer.on_answer(first, broker.produce(first)) == "acked"
    made: dict[str, Request] = {}

    def make(name: str) -> Request:
        first_seq, last_seq = SEED_BATCHES[name]
        assert producer.next_seq == first_seq
        made[name] = producer.request(producer.new_batch(last_seq - first_seq + 1))
        return made[name]

    return producer, make


def stored_records(broker: Broker) -> list[int]:
    return [r for logged in broker.log for r in logged.request.records]


def test_figure_2_success():
    broker = Broker()
    producer, make = seed_producer(broker, max_in_flight=5)
    for group in ("ABC", "DE"):
        sent = [make(name) for name in group]
        answers = [broker.produce(r) for r in sent]
        for name, request, answer in zip(group, sent, answers, strict=True):
            assert answer == Stored(*SEED_BATCHES[name])
            assert producer.on_answer(request, answer) == "acked"
    assert stored_records(broker) == list(range(151))
    assert producer.acked == list(range(151)) and not producer.unacked


def test_figure_3_missing_acks_are_answered_with_the_original_offsets():
    broker = Broker()
    producer, make = seed_producer(broker, max_in_flight=5)
    sent = {name: make(name) for name in "ABCDE"}
    for name in "ABC":
        assert producer.on_answer(sent[name], broker.produce(sent[name])) == "acked"
    for name in "DE":
        broker.produce(sent[name])  # stored; the ACK is lost
    for name in "DE":  # after request.timeout.ms, the same batches again
        answer = broker.produce(sent[name])
        assert answer == Duplicate(*SEED_BATCHES[name])
        assert producer.on_answer(sent[name], answer) == "acked"
    assert stored_records(broker) == list(range(151))
    assert not producer.unacked


def test_figure_4_missing_record_is_refused_until_the_gap_is_filled():
    broker = Broker()
    producer, make = seed_producer(broker, max_in_flight=5)
    sent = {name: make(name) for name in "ABCDE"}
    for name in "AB":
        assert producer.on_answer(sent[name], broker.produce(sent[name])) == "acked"
    # C is lost on the way; D and E find the gap
    for name in "DE":
        answer = broker.produce(sent[name])
        assert isinstance(answer, Refuse)
        assert answer.error == ErrorCode.out_of_order_sequence_number
        assert producer.on_answer(sent[name], answer) == "retry later"  # C is the oldest
    assert broker.end == 125
    for name in "CDE":  # retried in order, with their original sequences
        answer = broker.produce(sent[name])
        assert answer == Stored(*SEED_BATCHES[name])
        assert producer.on_answer(sent[name], answer) == "acked"
    assert stored_records(broker) == list(range(151))


def test_figure_4_as_the_seed_tells_it_new_epoch_from_the_batch_after_the_last_ack():
    broker = Broker()
    producer, make = seed_producer(broker, max_in_flight=5)
    sent = {name: make(name) for name in "ABCDE"}
    for name in "AB":
        assert producer.on_answer(sent[name], broker.produce(sent[name])) == "acked"
    for name in "DE":
        assert broker.produce(sent[name]).error == ErrorCode.out_of_order_sequence_number
    producer.bump_epoch()  # epoch 1; C, D, E now 0-7, 8-17, 18-25
    for batch in list(producer.unacked):
        request = producer.request(batch)
        assert request.epoch == 1
        assert producer.on_answer(request, broker.produce(request)) == "acked"
    assert stored_records(broker) == list(range(151))
    for name in "DE":  # an old copy turning up now is fenced, and the client ignores it
        answer = broker.produce(sent[name])
        assert answer.error == ErrorCode.invalid_producer_epoch
        assert producer.on_answer(sent[name], answer) == "stale"
    assert broker.end == 151


def test_figure_5_retry_older_than_the_cache_is_not_stored_twice():
    """Six in flight, A's ACK lost: Kafka answers OUT_OF_ORDER and the client stores A again."""
    broker = Broker()
    producer, make = seed_producer(broker, max_in_flight=6)
    sent = {name: make(name) for name in "ABCDEF"}
    assert broker.produce(sent["A"]) == Stored(114, 120)  # the ACK is lost
    for name in "BCDEF":
        assert producer.on_answer(sent[name], broker.produce(sent[name])) == "acked"
    cached = [(b.first_seq, b.last_seq) for b in broker.state.entry(PID).batches]
    assert cached == [SEED_BATCHES[name] for name in "BCDEF"]  # A has left the cache
    answer = broker.produce(sent["A"])
    assert isinstance(answer, Refuse)
    assert answer.error == ErrorCode.duplicate_sequence_number
    assert producer.on_answer(sent["A"], answer) == "acked"
    assert not producer.unacked and not producer.bump_pending and producer.epoch == 0
    assert stored_records(broker) == list(range(156))  # A once, nothing after F


# --- where a producer's stored range starts (rules.py rows 2-2c and 11) -----------------------

def test_a_gap_at_first_sight_waits_for_the_earlier_batch():
    """Row 2c: the model's first finding, when any first sequence was taken at first sight."""
    broker = Broker()
    producer = Producer(PID, max_in_flight=2)
    early = producer.request(producer.new_batch(5))  # sequences 0-4: held up on the way
    late = producer.request(producer.new_batch(5))  # 5-9: first at a partition new to PID
    assert producer.on_answer(late, broker.produce(late)) == "retry later"
    for request in (early, late):
        assert producer.on_answer(request, broker.produce(request)) == "acked"
    assert stored_records(broker) == list(range(10))


def test_a_forgotten_producer_back_mid_stream_loses_nothing():
    """Row 2 then row 11: the partition cannot know 0-4 never came, so 5-9 is stored first
    and 0-4 is sent again under a new epoch, as with Kafka: out of order, but not lost."""
    broker = Broker()
    broker.state.forgotten_up_to = PID  # its compact record was dropped long ago
    producer = Producer(PID, max_in_flight=2)
    early = producer.request(producer.new_batch(5))
    late = producer.request(producer.new_batch(5))
    assert producer.on_answer(late, broker.produce(late)) == "acked"
    assert producer.on_answer(early, broker.produce(early)) == "bump"
    producer.bump_epoch()
    again = producer.request(producer.unacked[0])
    assert (again.epoch, again.first_seq) == (1, 0)
    assert producer.on_answer(again, broker.produce(again)) == "acked"
    assert stored_records(broker) == [5, 6, 7, 8, 9, 0, 1, 2, 3, 4]


def test_a_producer_back_from_its_compact_record_keeps_where_its_range_starts():
    """A model finding: row 7 on a compact record began a fresh range at that batch, so the
    retry of an earlier, stored batch was answered OUT_OF_ORDER (row 11) and stored again."""
    broker = Broker(StateLimits(batches_to_retain=CACHE, max_producers=1))
    producer, other = Producer(PID, 3), Producer(PID + 1, 3)
    first = producer.request(producer.new_batch(2))
    assert broker.produce(first) == Stored(0, 1)  # the answer is lost
    moved_out = other.request(other.new_batch(1))
    assert other.on_answer(moved_out, broker.produce(moved_out)) == "acked"
    assert broker.state.tombstone(PID) is not None
    second = producer.request(producer.new_batch(2))
    assert producer.on_answer(second, broker.produce(second)) == "acked"
    assert broker.state.entry(PID).start_seq == 0
    for how in ("live", "clean", "snapshot+log", "log"):
        if how != "live":
            broker.restart(how)
        answer = broker.produce(first)  # the retry of 0-1
        assert answer.error == ErrorCode.duplicate_sequence_number, how
    assert producer.on_answer(first, answer) == "acked"
    assert stored_records(broker) == [0, 1, 0, 2, 3]  # PID's 0-1 and 2-3, the other's 0


def test_a_rebuilt_state_keeps_the_gap_a_forgotten_producer_left_in_the_log():
    """A model finding: replay ran a producer's stored range on from 0 across the gap that a
    row-2 append left in the log, so after a restart the missing batches were "duplicates"."""
    broker = Broker(StateLimits(batches_to_retain=CACHE, expiration_ms=1000, tombstone_ms=1000))
    producer = Producer(PID, max_in_flight=3)
    first = producer.request(producer.new_batch(100))  # 0-99
    assert producer.on_answer(first, broker.produce(first)) == "acked"
    broker.take_snapshot()
    held_up = producer.request(producer.new_batch(50))  # 100-149: never arrives
    late = producer.request(producer.new_batch(5))  # 150-154
    broker.state.expire(broker.now + 2000)  # idle: a compact record
    broker.state.expire(broker.now + 4000)  # and then not even that
    assert broker.state.forgotten_up_to == PID
    assert producer.on_answer(late, broker.produce(late)) == "acked"  # row 2
    for how in ("live", "clean", "snapshot+log", "log"):
        if how != "live":
            broker.restart(how)
        assert broker.state.entry(PID).start_seq == 150, how
        answer = broker.state.validate(held_up.identity, every_pid_issued)
        assert answer.error == ErrorCode.out_of_order_sequence_number, how  # row 11
