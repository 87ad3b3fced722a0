"""The idempotent producer's client-side rules: every sequence decision lives in this file.

This file knows nothing of sockets, threads or which broker answers: the sender (through
delivery.py) tells it what was sent and what came back, and it says what becomes of each
batch. It is the client's half of a contract whose broker half is producer_state/rules.py:
hold the two tables side by side.

The contract. A batch is reported delivered only when the broker said it is stored: an
offset, or DUPLICATE_SEQUENCE_NUMBER for that batch. When the client cannot know, the batch
fails with an OutcomeUnknown error that says so and why; when it knows the broker did not
store it, the error says that. Nothing is reported delivered that the log does not hold,
nothing is dropped without an error, nothing is stored twice.

What the client knows of a batch B not yet acknowledged:
- not stored: B was never sent, or every attempt was refused by an answer the broker gives
  before it appends (``_REFUSED``);
- maybe stored: an attempt is in flight, or one got no answer (a lost connection, a request
  timeout), or one was answered with an error that does not say B was refused (a timeout
  after the append, KAFKA_STORAGE_ERROR, UNKNOWN_SERVER_ERROR, ...), or B's sequences
  continue a resumed checkpoint (seed 001, "Transitivity": the process that took it may
  have sent them before it stopped). A refusal of a later attempt says nothing of an earlier
  one: once maybe stored, B stays so until the broker answers for it.

Theory of operation (seeds 000, 002, 003; KIP-360)
- The producer id and epoch come from InitProducerId before the first send, or from a
  checkpoint (``resume``).
- A batch gets its sequence numbers when it is drained, from its partition's next sequence,
  and keeps them on every retry.
- At most ``max.in.flight`` (<= 5, the broker's cache) batches of a partition are in flight.
- A batch to retry goes back into its queue in sequence order; while a partition has a retry
  queued, only its first unacknowledged batch may be sent (in flight drops to 1 until the
  retries are through).
- Some answers need a new epoch (KIP-360) or a new producer id. Then nothing is sent until
  every request in flight is answered and no lookup is pending; every partition restarts at
  sequence 0, and rows 13-16 say what becomes of each batch not yet acknowledged. A batch
  that may be stored is never sent under another epoch or id: the broker could not
  recognise it there and would store it twice (Kafka's client does, seed 000 figure 5).

The answer to a batch B (f..l: its sequences) -> what happens; one function per row group:

| #  | answer                                                  | outcome                           |
|----|---------------------------------------------------------|-----------------------------------|
| 1  | NONE, with an offset                                    | delivered at that offset          |
| 2  | DUPLICATE_SEQUENCE_NUMBER                               | delivered, offset unknown (-1)    |
| 3  | INVALID_PRODUCER_EPOCH, PRODUCER_FENCED                 | fatal: the producer stops         |
| 4  | UNKNOWN_PRODUCER_ID: nothing of this id is stored here  | not stored; a new producer id     |
|    | (it was never issued, or its records are all deleted)   | (rows 13-16)                      |
| 5  | OUT_OF_ORDER_SEQUENCE_NUMBER, an earlier batch unacked  | retry in order (behind it)        |
| 6  | OOS, B first unacked, not stored, a later batch acked   | fail: not stored                  |
| 7  | OOS, B first unacked, not stored                        | a new epoch (rows 13-16)          |
| 8  | OOS, B first unacked, maybe stored                      | ask DescribeProducers (10-12)     |
| 9  | no answer or a retriable error, attempts and time left  | retry in order                    |
| 9b | anything else; attempts or delivery.timeout.ms run out  | fail; a sequenced B leaves a gap  |
|    |                                                         | in its partition: a new epoch     |

What DescribeProducers says of the partition (rows 10-12; for B as in row 8):

| 10 | it holds B's epoch up to inside B: k records of it      | split: B's first k records go as  |
|    |                                                         | a batch of their own, the rest    |
|    |                                                         | after it (each answered 1-9)      |
| 11 | it holds B's epoch up to B's end or beyond              | fail: outcome unknown             |
| 12 | anything else, or no answer within delivery.timeout.ms  | fail: outcome unknown; a new epoch|

A producer still the (producer id, epoch) of a checkpoint it resumed:

| 13 | a batch fails, or a new epoch or producer id is needed  | fatal: the producer stops, every  |
|    |                                                         | batch fails, outcome unknown      |

A new epoch or producer id otherwise, for each batch B not yet acknowledged, per partition:

| 14 | B maybe stored                                          | fail: outcome unknown             |
| 15 | B not stored, a later batch stored or maybe stored      | fail: not stored                  |
| 16 | B not stored                                            | resequenced from 0, sent again    |

A transactional producer (transactions.py) never changes its epoch or producer id within a
transaction: the coordinator knows the transaction under the one it began with.

| 17 | rows 4, 7 (a new producer id or epoch), in a transaction| fail; the transaction must be     |
|    |                                                         | aborted, then a new epoch         |
| 3t | INVALID_PRODUCER_EPOCH, in a transaction (KIP-588)      | fail; the transaction must be     |
|    |                                                         | aborted (PRODUCER_FENCED: row 3)  |

After the abort every partition restarts at sequence 0 under the new epoch (``restart``),
from InitProducerId or from the EndTxn answer (KIP-890 part 2): nothing of the transaction
is left to send.

A batch that fails is always told which: "outcome unknown" (OutcomeUnknown) when it is
maybe stored, "not stored" otherwise. While a producer is still the (producer id, epoch)
of a checkpoint it resumed, every batch counts as maybe stored, sent or not (unless the
broker answers for it): the application produces again what it produced after the
checkpoint, and the process before may have stored any of it.

Why rows 6-8 and 10-12 are what they are. OUT_OF_ORDER for the first unacknowledged batch
means the broker's memory of this producer does not run up to B while the client's does
(everything before B was acknowledged). On the broker (rules.py) that is row 2c or 5 (it
holds nothing of this epoch here), 8 (a gap), 10 (B straddles its last sequence) or 11 (B is
older than the first batch it stored of this epoch: it had forgotten this producer,
producer.id.expiration.ms and then producer.id.tombstone.ms, and took a later batch first,
KIP-360). Row 11 is the one that matters: B may be stored, or may never have arrived, and
DescribeProducers cannot tell which, as it says where the stored range ends but not where
it begins. So:
- B not stored: nothing of it is in the log and nothing can put it there (no attempt is
  left unanswered). When a later batch is acknowledged (row 6) the broker's range runs on
  past B: resending B, under any epoch, would store it after records produced after it, so
  it fails, "not stored", and the partition goes on without a new epoch. Otherwise (row 7)
  a new epoch lets it be sent again from sequence 0.
- B maybe stored: "the broker holds up to the batch's end" (row 11) is exactly what a
  forgotten producer's batch meets. The client once took it for "stored" and reported
  records delivered that the log did not hold (issue 12); it is "unknown".
- Row 10: the broker's last sequence l' is inside B. Are f..l' stored? Only if its stored
  range begins at or before f, which DescribeProducers does not say either. So the client
  asks the broker about exactly those records: they go as a batch of their own, which the
  broker answers with their offset (rules row 6), DUPLICATE_SEQUENCE_NUMBER (row 9: within
  the stored range) or OUT_OF_ORDER (row 11: before it, so unknown, rows 8 and 11 here).
  The rest, l'+1..l, lies past the broker's last sequence, where nothing of this epoch is
  stored: it is sent after them. This happens after a resume, when the process before cut
  its batches elsewhere.
- A failure in rows 6 and 11 leaves no gap: the broker's range runs on past B, so the next
  batches continue this epoch. In row 12 the client does not know, and starts a new one.
- Row 13: a resumed producer is recognised by the broker only as the (producer id, epoch)
  it resumed: under any other, what the application produces again (the records after its
  checkpoint) would be stored a second time if the process before had stored them, and the
  client cannot tell those records from new ones. And under it, a record only matches the
  process before's record of the same sequence as long as none is left out: a batch that
  fails before it got its sequences (delivery.timeout.ms in its queue) would hand them to
  the next records, which the broker would then answer as duplicates of other records. So
  once a batch fails, or a new epoch or id is needed, it stops, and the application resumes
  again from its checkpoint (or starts afresh, without resume, accepting that risk).

What this relies on: the broker dedups a retry only while it remembers the producer. Once
it has forgotten it (producer.id.expiration.ms of idleness, then producer.id.tombstone.ms
for the compact record), it takes a batch at any sequence (rules row 2), so an attempt that
reaches it later than that is stored again whatever the client does. Kafka's documentation
of producer.id.expiration.ms says as much ("the same or higher than delivery.timeout.ms can
help prevent expiration during retries and protect against message duplication"); here,
keep the two broker settings together above delivery.timeout.ms plus request.timeout.ms,
and above the time a copy job takes to resume its checkpoint after a crash.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol.sequences import HALF, SEQUENCE_SPACE, advance, is_ahead, sequence_distance
from ..network.connection import KafkaError, OutcomeUnknown
from ..topic_partition import TopicPartition
from .producer_batch import ProducerBatch

MAX_EPOCH = 32767

# Answers the broker gives before it appends: an attempt answered so was not stored. Any
# other error (a timeout after the append, a storage error, an unknown server error, one
# this list does not know) leaves the batch maybe stored.
_REFUSED = frozenset({
    ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available,
    ErrorCode.unknown_topic_or_partition, ErrorCode.fenced_leader_epoch,
    ErrorCode.unknown_leader_epoch, ErrorCode.corrupt_message, ErrorCode.invalid_record,
    ErrorCode.message_too_large, ErrorCode.record_list_too_large, ErrorCode.invalid_timestamp,
    ErrorCode.invalid_required_acks, ErrorCode.not_enough_replicas,
    ErrorCode.topic_authorization_failed, ErrorCode.cluster_authorization_failed,
    ErrorCode.transactional_id_authorization_failed, ErrorCode.out_of_order_sequence_number,
    ErrorCode.unknown_producer_id, ErrorCode.invalid_producer_epoch, ErrorCode.producer_fenced,
    ErrorCode.invalid_txn_state, ErrorCode.unsupported_for_message_format,
    ErrorCode.unsupported_version, ErrorCode.invalid_topic_exception,
})
_STORED = frozenset({ErrorCode.none, ErrorCode.duplicate_sequence_number})
_FATAL = frozenset({ErrorCode.invalid_producer_epoch, ErrorCode.producer_fenced})

RESUMED = ("its sequences continue a resumed checkpoint, and the process that took it may "
           "have sent them before it stopped")


class Outcome(enum.Enum):
    DELIVERED = "delivered"
    RETRY = "retry"  # back into its queue in sequence order, same epoch and sequences
    NEW_EPOCH = "new epoch"  # back into its queue; rows 13-16 decide at the bump
    NEW_ID = "new producer id"  # likewise, under a new producer id
    LOOKUP = "lookup"  # ask DescribeProducers, then rows 10-12
    SPLIT = "split"  # send the first ``records`` records as a batch of their own
    FAIL = "fail"
    FATAL = "fatal"


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    row: str
    why: str = ""  # for FAIL and FATAL: what the error says
    records: int = 0  # for SPLIT
    gap: bool = True  # for FAIL: the partition's sequences now have a gap (a new epoch)


# Rows 1 and 2, the produce path's common case: made once, not per answer.
_DELIVERED = Verdict(Outcome.DELIVERED, "1")
_DELIVERED_BEFORE = Verdict(Outcome.DELIVERED, "2")


# --- the rules, one function per row group ----------------------------------------------------

def judge_answer(error: ErrorCode, *, idempotent: bool, first_unacked: bool,
                 maybe_stored: bool, later_acked: bool, attempts_left: bool,
                 time_left: bool, transactional: bool = False) -> Verdict:
    """Rows 1-9b (and 3t): an answer (NONE for a batch acks=0 sends blind) or, as
    NETWORK_EXCEPTION, none; ``maybe_stored`` counts this answer in."""
    if error == ErrorCode.none:
        return _DELIVERED
    if error == ErrorCode.duplicate_sequence_number:
        return _DELIVERED_BEFORE
    if idempotent:
        if transactional and error == ErrorCode.invalid_producer_epoch:
            return Verdict(Outcome.FAIL, "3t", "the producer's epoch is not the partition's "
                           "(the coordinator may have aborted the transaction): abort it")
        if error in _FATAL:
            return Verdict(Outcome.FATAL, "3", "the broker fenced this producer: another "
                           "one took its producer id with a newer epoch")
        if error == ErrorCode.unknown_producer_id:
            return Verdict(Outcome.NEW_ID, "4")
        if error == ErrorCode.out_of_order_sequence_number:
            if not first_unacked:
                return Verdict(Outcome.RETRY, "5")
            if maybe_stored:
                return Verdict(Outcome.LOOKUP, "8")
            if later_acked:
                return Verdict(Outcome.FAIL, "6", "the broker stored later records of this "
                               "producer first (it had forgotten the producer), so it takes "
                               "these no more: sent again they would be stored after records "
                               "produced after them", gap=False)
            return Verdict(Outcome.NEW_EPOCH, "7")
    if error.retriable and attempts_left and time_left:
        return Verdict(Outcome.RETRY, "9")
    return Verdict(Outcome.FAIL, "9b", "the broker refused it" if not error.retriable
                   else "delivery.timeout.ms expired" if not time_left
                   else "retries exhausted")


def judge_lookup(batch: ProducerBatch, held: tuple[int, int] | None) -> Verdict:
    """Rows 10-12: the partition's (epoch, last sequence) for this producer, from
    DescribeProducers, or None when it lists none; for a maybe-stored batch refused
    OUT_OF_ORDER while first unacknowledged."""
    assert batch.base_sequence is not None
    if held is not None and held[0] == batch.epoch:
        covered = sequence_distance(batch.base_sequence, held[1]) + 1
        if covered < batch.count:
            return Verdict(Outcome.SPLIT, "10", records=covered)
        if covered <= HALF:
            return Verdict(Outcome.FAIL, "11", f"the broker holds this producer's epoch up to "
                           f"sequence {held[1]}, past this batch ({batch.base_sequence}.."
                           f"{batch.last_sequence}), yet did not take it as stored: the "
                           "batch is older than the first one the partition stored since "
                           "it forgot this producer, so it may be stored or may never have "
                           "arrived", gap=False)
        said = f"holds this producer's epoch only up to sequence {held[1]}, before it"
    elif held is None:
        said = "holds no state of this producer"
    else:
        said = f"holds this producer under epoch {held[0]}, not {batch.epoch}"
    return Verdict(Outcome.FAIL, "12", f"refused OUT_OF_ORDER_SEQUENCE_NUMBER and the broker "
                   f"{said} (DescribeProducers): it cannot say whether it stored the batch")


RESUMED_STOPS = ("the producer continues a resumed checkpoint, and a batch failed or it needed "
                 "a new epoch or producer id: its records would no longer match those of "
                 "the process before, which the broker may hold, so it stops (resume again "
                 "from the checkpoint, or start without resume)")


def judge_bump(continues_checkpoint: bool, maybe_stored: bool,
               later_maybe_stored: bool) -> Verdict:
    """Rows 13-16: a batch not yet acknowledged when the epoch or producer id would change
    (for a producer that continues a checkpoint, a failed batch leads here too)."""
    if continues_checkpoint:
        return Verdict(Outcome.FATAL, "13", RESUMED_STOPS)
    if maybe_stored:
        return Verdict(Outcome.FAIL, "14", "the producer needed a new epoch, and under it the "
                       "broker could not recognise this batch as stored: it is not sent again")
    if later_maybe_stored:
        return Verdict(Outcome.FAIL, "15", "the producer needed a new epoch, and later records "
                       "of this partition are or may be stored: sent again this batch would "
                       "be stored after them")
    return Verdict(Outcome.RETRY, "16")


def may_be_stored_after(error: ErrorCode) -> bool:
    """Whether an attempt answered ``error`` may have been stored (any error the broker does
    not give before appending)."""
    return error not in _REFUSED and error not in _STORED


# --- the state --------------------------------------------------------------------------------

@dataclass
class PartitionSequences:
    next_sequence: int = 0
    # The last sequence of the furthest batch of this epoch acknowledged here (rows 6, 14).
    acked_up_to: int | None = None
    in_flight: int = 0
    unacked: list[ProducerBatch] = field(default_factory=list)  # sequence order
    resolving: bool = False  # a DescribeProducers lookup for its first unacked batch


_IN_TRANSACTION = Verdict(Outcome.FAIL, "17", "the producer would need a new epoch or "
                         "producer id, which a transaction cannot change: abort it")


class IdempotenceManager:
    def __init__(self, enabled: bool, max_in_flight: int, retries: int,
                 transactional: bool = False) -> None:
        self.enabled = enabled
        self.transactional = transactional
        self.max_in_flight = max_in_flight
        self.retries = retries
        self.producer_id = -1
        self.epoch = -1
        self.partitions: dict[TopicPartition, PartitionSequences] = {}
        self.bump_needed = False
        self.new_id_wanted = False  # the bump takes a new producer id, not a new epoch
        self.needs_new_id = False   # bumped: no sends until InitProducerId answers
        # (producer id, epoch) of a resumed checkpoint: its sequences may have been sent by
        # the process that took it.
        self.resumed: tuple[int, int] | None = None
        self.stopped = False  # row 13: no new epoch for a resumed producer, it stops

    @property
    def continues_checkpoint(self) -> bool:
        """Still the (producer id, epoch) of a resumed checkpoint: rows 13 and above."""
        return self.resumed is not None and self.resumed == (self.producer_id, self.epoch)

    @property
    def has_identity(self) -> bool:
        return not self.enabled or self.producer_id >= 0

    def set_identity(self, producer_id: int, epoch: int) -> None:
        self.producer_id, self.epoch = producer_id, epoch
        self.needs_new_id = False

    def _partition(self, tp: TopicPartition) -> PartitionSequences:
        state = self.partitions.get(tp)
        if state is None:
            state = self.partitions[tp] = PartitionSequences()
        return state

    def _state_of(self, batch: ProducerBatch) -> PartitionSequences:
        return self._partition((batch.topic, batch.partition))

    # --- sending ----------------------------------------------------------------------------

    def may_send(self, batch: ProducerBatch, connection_in_flight: int) -> bool:
        if connection_in_flight >= self.max_in_flight:
            return False
        state = self._state_of(batch)
        if not self.enabled:
            return state.in_flight < self.max_in_flight
        if self.bump_needed or self.needs_new_id:
            return False
        if state.in_flight >= self.max_in_flight:
            return False
        if state.resolving:
            return False
        if batch.base_sequence is None:
            return True  # nothing to retry is queued ahead of it (retries sit in front)
        return bool(state.unacked) and state.unacked[0] is batch

    def sending(self, batch: ProducerBatch) -> None:
        """The batch goes out now: give it sequences if it has none."""
        state = self._state_of(batch)
        if self.enabled and batch.base_sequence is None:
            batch.stamp(self.producer_id, self.epoch, state.next_sequence, self.transactional)
            state.next_sequence = advance(state.next_sequence, batch.count)
            state.unacked.append(batch)
            if self.continues_checkpoint and batch.ambiguous is None:
                batch.ambiguous = RESUMED
        elif not self.enabled and batch.base_sequence is None:
            batch.base_sequence = -1
            batch.seal()
        state.in_flight += 1
        batch.in_flight = True
        batch.attempts += 1
        batch.maybe_stored = True

    def order(self, batch: ProducerBatch) -> int:
        """Where a batch to retry goes in its queue: by its place among the unacknowledged."""
        state = self._state_of(batch)
        try:
            return state.unacked.index(batch)
        except ValueError:
            return -1

    # --- answers ----------------------------------------------------------------------------

    def answered(self, batch: ProducerBatch, error: ErrorCode, time_left: bool) -> Verdict:
        """Rows 1-9b for an answer to the batch's attempt in flight, applied."""
        state = self._state_of(batch)
        self._landed(state, batch)
        if error not in _STORED:
            if error == ErrorCode.unknown_producer_id and self.enabled:
                batch.ambiguous = None  # row 4: the broker holds nothing of this producer id
            elif may_be_stored_after(error) and batch.ambiguous is None:
                batch.ambiguous = (f"an attempt was answered {error.name.upper()}, which does "
                                   "not say the broker did not store it")
            batch.maybe_stored = batch.ambiguous is not None
        oos = error == ErrorCode.out_of_order_sequence_number  # the facts only it needs
        verdict = judge_answer(
            error, idempotent=self.enabled,
            first_unacked=oos and bool(state.unacked) and state.unacked[0] is batch,
            maybe_stored=batch.maybe_stored, later_acked=oos and self._acked_after(state, batch),
            attempts_left=batch.attempts <= self.retries, time_left=time_left,
            transactional=self.transactional)
        return self._apply(state, batch, verdict)

    def lost(self, batch: ProducerBatch, why: str, sent: bool, time_left: bool) -> Verdict:
        """No answer to the attempt in flight: the connection failed or timed out (``sent``),
        or the request could not even be written (not ``sent``: a refusal, in effect)."""
        state = self._state_of(batch)
        self._landed(state, batch)
        if sent and batch.ambiguous is None:
            batch.ambiguous = f"an attempt got no answer ({why})"
        batch.maybe_stored = batch.ambiguous is not None
        verdict = judge_answer(ErrorCode.network_exception, idempotent=self.enabled,
                               first_unacked=False, maybe_stored=batch.maybe_stored,
                               later_acked=False,
                               attempts_left=batch.attempts <= self.retries,
                               time_left=time_left)
        return self._apply(state, batch, verdict)

    def looked_up(self, batch: ProducerBatch,
                  held: tuple[int, int] | None) -> Verdict | None:
        """Rows 10-12 for the DescribeProducers answer about the batch, applied: a SPLIT is
        for the caller to make (``split``). None when the batch failed meanwhile (its
        delivery timeout, in its queue)."""
        state = self._state_of(batch)
        state.resolving = False
        if batch not in state.unacked:
            return None
        return self._apply(state, batch, judge_lookup(batch, held))

    def lookup_failed(self, batch: ProducerBatch, why: str) -> Verdict | None:
        """Row 12: no answer from DescribeProducers within the delivery timeout."""
        state = self._state_of(batch)
        state.resolving = False
        if batch not in state.unacked:
            return None
        return self._apply(state, batch, Verdict(
            Outcome.FAIL, "12", f"refused OUT_OF_ORDER_SEQUENCE_NUMBER and asking the broker "
            f"what it holds failed until delivery.timeout.ms ({why})"))

    def _landed(self, state: PartitionSequences, batch: ProducerBatch) -> None:
        state.in_flight -= 1
        batch.in_flight = False

    def _acked_after(self, state: PartitionSequences, batch: ProducerBatch) -> bool:
        return (self.enabled and batch.base_sequence is not None
                and state.acked_up_to is not None
                and is_ahead(state.acked_up_to, batch.last_sequence))

    def _apply(self, state: PartitionSequences, batch: ProducerBatch,
               verdict: Verdict) -> Verdict:
        outcome = verdict.outcome
        if self.transactional and outcome in (Outcome.NEW_EPOCH, Outcome.NEW_ID):
            verdict, outcome = _IN_TRANSACTION, Outcome.FAIL  # row 17
        if outcome is Outcome.DELIVERED:
            self._delivered(state, batch)
        elif outcome is Outcome.NEW_EPOCH:
            self.bump_needed = True
        elif outcome is Outcome.NEW_ID:
            # The broker does not know this id at all (seed 000: an id it never issued, as
            # after resuming a checkpoint against another cluster): a new epoch would not
            # help, a new id does.
            self.bump_needed = self.new_id_wanted = True
        elif outcome is Outcome.LOOKUP:
            state.resolving = True
        elif outcome is Outcome.FAIL:
            self.give_up(batch, verdict.gap)
        return verdict

    def _delivered(self, state: PartitionSequences, batch: ProducerBatch) -> None:
        batch.maybe_stored = False
        batch.ambiguous = None
        if self.enabled and batch in state.unacked:
            state.unacked.remove(batch)
            if state.acked_up_to is None or is_ahead(batch.last_sequence, state.acked_up_to):
                state.acked_up_to = batch.last_sequence

    def split(self, batch: ProducerBatch, head: ProducerBatch) -> None:
        """Row 10: ``head`` (made by ``batch.split_head``) takes the batch's first sequences
        and goes first; the batch keeps the rest."""
        state = self._state_of(batch)
        assert batch.base_sequence is not None
        head.stamp(self.producer_id, batch.epoch, batch.base_sequence, self.transactional)
        batch.stamp(self.producer_id, batch.epoch,
                    advance(batch.base_sequence, head.count), self.transactional)
        # Both may be stored as far as the client knows: the head is what the broker is
        # asked about, and the rest's sequences were in the batch's earlier attempts.
        head.maybe_stored = True
        head.ambiguous = batch.ambiguous
        state.unacked.insert(state.unacked.index(batch), head)

    def give_up(self, batch: ProducerBatch, leaves_gap: bool = True) -> None:
        """The batch fails for good (rows 6, 9b, 11, 12, or the delivery timeout in its queue).
        ``leaves_gap``: later sequences would be out of order, so a new epoch is needed. A
        producer that continues a checkpoint then stops (row 13)."""
        state = self._state_of(batch)
        if self.enabled and batch in state.unacked:
            state.unacked.remove(batch)
            if leaves_gap:
                self.bump_needed = True
        if self.continues_checkpoint and not self.stopped:
            self.bump_needed = True

    def failure(self, batch: ProducerBatch, error: ErrorCode, cause: str) -> KafkaError:
        """The error a failed batch reports: says whether it may be stored, and why."""
        unsent_resumed = batch.base_sequence is None and self.continues_checkpoint
        if batch.maybe_stored or unsent_resumed:
            reason = batch.ambiguous or (RESUMED if unsent_resumed
                                         else "an attempt was in flight")
            return OutcomeUnknown(error, f"{cause}; outcome unknown, the broker may have "
                                  f"stored it once: {reason}")
        return KafkaError(error, f"{cause}; not stored")

    # --- epoch bump (KIP-360) ---------------------------------------------------------------

    def in_flight(self) -> int:
        return sum(state.in_flight for state in self.partitions.values())

    def quiet(self) -> bool:
        """Nothing in flight and no lookup pending: the moment a bump may happen."""
        return all(state.in_flight == 0 and not state.resolving
                   for state in self.partitions.values())

    def bump(self) -> list[tuple[ProducerBatch, Verdict]]:
        """Start a new epoch (call when quiet()): rows 13-16. Returns the batches that fail,
        each with its verdict; the others are resequenced when drained again. Row 13 stops
        the producer instead (``stopped``): then every batch fails, queued or not."""
        assert self.quiet()
        failing = []
        stopping = self.continues_checkpoint
        for state in self.partitions.values():
            later = False  # a later batch of the partition is or may be stored
            for batch in reversed(state.unacked):
                verdict = judge_bump(stopping, batch.maybe_stored,
                                     later or self._acked_after(state, batch))
                later = later or batch.maybe_stored
                if verdict.outcome is Outcome.RETRY:
                    batch.base_sequence = None  # resequenced when drained again
                else:
                    failing.append((batch, verdict))
            state.unacked.clear()
            state.next_sequence = 0
            state.acked_up_to = None
        self.bump_needed = False
        failing.reverse()
        if stopping:
            self.stopped = True
            self.new_id_wanted = False
            return failing
        if self.epoch >= MAX_EPOCH or self.new_id_wanted:
            self.needs_new_id = True
        else:
            self.epoch += 1
        self.new_id_wanted = False
        return failing

    def restart(self, producer_id: int, epoch: int) -> None:
        """A transactional producer's new identity (InitProducerId, or the EndTxn answer of
        KIP-890 part 2), between transactions: every partition starts at sequence 0, with
        nothing in flight or unacknowledged left of the transaction before."""
        assert self.quiet()
        self.set_identity(producer_id, epoch)
        for state in self.partitions.values():
            state.unacked.clear()
            state.next_sequence = 0
            state.acked_up_to = None
        self.bump_needed = self.new_id_wanted = False

    # --- checkpoints (seed 001, "Transitivity") ---------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        sequences: dict[str, dict[str, int]] = {}
        for (topic, partition), state in sorted(self.partitions.items()):
            if state.next_sequence:
                sequences.setdefault(topic, {})[str(partition)] = state.next_sequence
        return {"producer_id": self.producer_id, "producer_epoch": self.epoch,
                "sequences": sequences}

    def resume(self, checkpoint: dict[str, Any]) -> None:
        try:
            producer_id = int(checkpoint["producer_id"])
            epoch = int(checkpoint["producer_epoch"])
            sequences = {(str(topic), int(partition)): int(seq)
                         for topic, parts in checkpoint.get("sequences", {}).items()
                         for partition, seq in parts.items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"resume: not a producer checkpoint ({exc!r})") from None
        if producer_id < 0 or not 0 <= epoch <= MAX_EPOCH:
            raise ValueError("resume: the checkpoint has no producer id and epoch")
        for tp, seq in sequences.items():
            if not 0 <= seq < SEQUENCE_SPACE:
                raise ValueError(f"resume: sequence {seq} of {tp[0]}-{tp[1]} is out of range")
        self.set_identity(producer_id, epoch)
        self.resumed = (producer_id, epoch)
        for tp, seq in sequences.items():
            self._partition(tp).next_sequence = seq
