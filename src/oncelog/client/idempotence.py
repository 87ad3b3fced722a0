"""The idempotent producer's client-side rules: every sequence-number decision lives here.

This file knows nothing of sockets, threads or which broker answers; the sender feeds it
batches and answers, and it says what to do. It follows seeds 002 and 003 (Kafka's
TransactionManager) and KIP-360, and it holds one rule Kafka's client does not: a batch
whose outcome is unknown (sent, no answer) is never sent again under a new epoch, because
the broker could not recognise it there and would store it twice.

Theory of operation
- The producer id and epoch come from InitProducerId before the first send, or from a
  checkpoint (``resume``).
- A batch gets its sequence numbers when it is drained, from its partition's next sequence,
  and keeps them on every retry.
- At most ``max.in.flight`` (<= 5) batches of a partition are in flight.
- A batch to retry goes back into its queue in sequence order; while a partition has a retry
  queued, only its first unacknowledged batch may be sent (in flight drops to 1 until the
  retries are through).
- Some answers need a new epoch (KIP-360), or a new producer id. Then nothing is sent until
  every request in flight is answered; every partition restarts at sequence 0, and each batch
  not yet acknowledged is resequenced, except those that may already be stored, which fail.

Answer to a batch -> what happens (one function per row group below):

| answer                                                   | action                          |
|----------------------------------------------------------|---------------------------------|
| NONE                                                     | delivered                       |
| DUPLICATE_SEQUENCE_NUMBER                                | delivered (stored before)       |
| OUT_OF_ORDER_SEQUENCE_NUMBER, an earlier batch unacked   | retry in order                  |
| OUT_OF_ORDER_SEQUENCE_NUMBER, first unacked batch        | ask the broker (resolve below)  |
|   it holds this epoch up to within the batch             | send only the rest              |
|   it holds this epoch up to the batch's end or beyond    | delivered (stored before)       |
|   it holds nothing of this epoch, or ends before it      | bump epoch, resequence, retry   |
| UNKNOWN_PRODUCER_ID                                      | new producer id, resequence,    |
|                                                          | retry                           |
| INVALID_PRODUCER_EPOCH, PRODUCER_FENCED                  | fatal: the producer stops       |
| retriable error or no answer, attempts left              | retry in order                  |
| other errors, attempts exhausted, delivery timeout       | fail; a sequenced batch leaves  |
|                                                          | a gap: bump epoch, resequence   |
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from .producer_batch import ProducerBatch

TopicPartition = tuple[str, int]
MAX_EPOCH = 32767
_MAX_SEQUENCE = 0x7FFFFFFF

# Answers after which the batch may still have been appended.
_MAYBE_STORED = frozenset({ErrorCode.request_timed_out,
                           ErrorCode.not_enough_replicas_after_append,
                           ErrorCode.network_exception})
_FATAL = frozenset({ErrorCode.invalid_producer_epoch, ErrorCode.producer_fenced})


class Action(enum.Enum):
    DELIVERED = "delivered"
    RETRY = "retry"
    RESOLVE = "resolve"  # ask the broker how far it holds this producer (DescribeProducers)
    FAIL = "fail"
    FATAL = "fatal"


@dataclass
class PartitionSequences:
    next_sequence: int = 0
    last_acked: int = -1
    in_flight: int = 0
    unacked: list[ProducerBatch] = field(default_factory=list)  # sequence order
    resolving: bool = False


class IdempotenceManager:
    def __init__(self, enabled: bool, max_in_flight: int, retries: int) -> None:
        self.enabled = enabled
        self.max_in_flight = max_in_flight
        self.retries = retries
        self.producer_id = -1
        self.epoch = -1
        self.partitions: dict[TopicPartition, PartitionSequences] = {}
        self.bump_needed = False
        self.new_id_wanted = False  # the bump takes a new producer id, not a new epoch
        self.needs_new_id = False   # bumped: no sends until InitProducerId answers

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

    # --- sending ----------------------------------------------------------------------------

    def may_send(self, batch: ProducerBatch, connection_in_flight: int) -> bool:
        if connection_in_flight >= self.max_in_flight:
            return False
        state = self._partition((batch.topic, batch.partition))
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
        state = self._partition((batch.topic, batch.partition))
        if self.enabled and batch.base_sequence is None:
            batch.stamp(self.producer_id, self.epoch, state.next_sequence)
            state.next_sequence = (state.next_sequence + batch.count) & _MAX_SEQUENCE
            state.unacked.append(batch)
        elif not self.enabled and batch.base_sequence is None:
            batch.base_sequence = -1
            batch.seal()
        state.in_flight += 1
        batch.in_flight = True
        batch.attempts += 1
        batch.maybe_stored = True

    def order(self, batch: ProducerBatch) -> int:
        """Where a batch to retry goes in its queue: by its place among the unacknowledged."""
        state = self._partition((batch.topic, batch.partition))
        try:
            return state.unacked.index(batch)
        except ValueError:
            return -1

    # --- answers ----------------------------------------------------------------------------

    def answered(self, batch: ProducerBatch, error: ErrorCode) -> Action:
        state = self._partition((batch.topic, batch.partition))
        state.in_flight -= 1
        batch.in_flight = False
        if error in (ErrorCode.none, ErrorCode.duplicate_sequence_number):
            return self._delivered(state, batch)
        # A definite refusal of this attempt says nothing of an earlier one that went
        # unanswered: once ambiguous, a batch stays maybe-stored until it is settled.
        if error in _MAYBE_STORED:
            batch.ambiguous = True
        batch.maybe_stored = batch.ambiguous
        if not self.enabled:
            return self._retry_or_fail(state, batch, error.retriable)
        if error in _FATAL:
            return Action.FATAL
        if error == ErrorCode.out_of_order_sequence_number:
            return self._out_of_order(state, batch)
        if error == ErrorCode.unknown_producer_id:
            # The broker does not know this id at all (seed 000: an id it never issued, as
            # after resuming a checkpoint against another cluster): a new epoch would not
            # help, a new id does.
            self.bump_needed = self.new_id_wanted = True
            return Action.RETRY
        return self._retry_or_fail(state, batch, error.retriable)

    def lost(self, batch: ProducerBatch) -> Action:
        """No answer: the connection failed or timed out with the batch in flight."""
        state = self._partition((batch.topic, batch.partition))
        state.in_flight -= 1
        batch.in_flight = False
        batch.maybe_stored = batch.ambiguous = True
        return self._retry_or_fail(state, batch, True)

    def _delivered(self, state: PartitionSequences, batch: ProducerBatch) -> Action:
        batch.maybe_stored = batch.ambiguous = False
        if self.enabled and batch in state.unacked:
            state.unacked.remove(batch)
            state.last_acked = batch.last_sequence
        return Action.DELIVERED

    def _out_of_order(self, state: PartitionSequences, batch: ProducerBatch) -> Action:
        if state.unacked and state.unacked[0] is batch:
            # Everything before it was acknowledged, yet the broker expects another sequence:
            # it lost this producer's state, or (after a resume) it holds more of this epoch
            # than the checkpoint said, up to inside this batch. Ask before bumping.
            state.resolving = True
            return Action.RESOLVE
        return Action.RETRY  # an earlier batch is missing: this one was not stored

    def resolved(self, batch: ProducerBatch, held: tuple[int, int] | None) -> int:
        """The broker's (epoch, last sequence) for us on the batch's partition, or None when
        it answered that it holds no state for us: returns how many of the batch's records it
        already holds (all: delivered; some: the caller drops them and sends the rest; none:
        an epoch bump is now needed). A lookup that failed is not an answer: ask again."""
        state = self._partition((batch.topic, batch.partition))
        state.resolving = False
        assert batch.base_sequence is not None
        stored = 0
        if held is not None and held[0] == batch.epoch:
            stored = ((held[1] - batch.base_sequence) & _MAX_SEQUENCE) + 1
            if stored > _MAX_SEQUENCE // 2:  # it ends before the batch: a gap
                stored = 0
            elif stored < batch.count:
                # What the broker holds of this epoch ends before or inside the batch: the
                # rest of it is certainly not stored.
                batch.maybe_stored = batch.ambiguous = False
        if stored == 0:
            self.bump_needed = True
            return 0
        if stored >= batch.count:
            self._delivered(state, batch)
            return batch.count
        state.last_acked = (batch.base_sequence + stored - 1) & _MAX_SEQUENCE
        batch.base_sequence = (batch.base_sequence + stored) & _MAX_SEQUENCE
        return stored

    def _retry_or_fail(self, state: PartitionSequences, batch: ProducerBatch,
                       retriable: bool) -> Action:
        if retriable and batch.attempts <= self.retries:
            return Action.RETRY
        self.give_up(batch)
        return Action.FAIL

    def give_up(self, batch: ProducerBatch) -> None:
        """The batch fails for good (an error, no attempts left, or delivery.timeout.ms)."""
        state = self._partition((batch.topic, batch.partition))
        if self.enabled and batch in state.unacked:
            state.unacked.remove(batch)
            # Its sequences will never be acknowledged: later ones would be out of order.
            self.bump_needed = True

    # --- epoch bump (KIP-360) ---------------------------------------------------------------

    def in_flight(self) -> int:
        return sum(state.in_flight for state in self.partitions.values())

    def quiet(self) -> bool:
        """Nothing in flight and no lookup pending: the moment a bump may happen."""
        return all(state.in_flight == 0 and not state.resolving
                   for state in self.partitions.values())

    def bump(self) -> list[ProducerBatch]:
        """Start a new epoch (call when quiet()); returns the batches to fail because they
        may already be stored under the old one."""
        assert self.quiet()
        doomed = []
        for state in self.partitions.values():
            for batch in state.unacked:
                if batch.maybe_stored:
                    doomed.append(batch)
                else:
                    batch.base_sequence = None  # resequenced when drained again
            state.unacked.clear()
            state.next_sequence = 0
            state.last_acked = -1
        if self.epoch >= MAX_EPOCH or self.new_id_wanted:
            self.needs_new_id = True
        else:
            self.epoch += 1
        self.bump_needed = self.new_id_wanted = False
        return doomed

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
        self.set_identity(producer_id, epoch)
        for tp, seq in sequences.items():
            if not 0 <= seq <= _MAX_SEQUENCE:
                raise ValueError(f"resume: sequence {seq} of {tp[0]}-{tp[1]} is out of range")
            state = self._partition(tp)
            state.next_sequence = seq
            state.last_acked = seq - 1
