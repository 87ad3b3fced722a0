"""Every idempotence and transaction decision of a partition lives in this file.

This file does not know about sockets, files, or which broker it runs in. It is given what the
partition remembers of one producer (a ProducerStateEntry, a compact Tombstone, or nothing)
and the header of one incoming batch, and it answers with one Decision: append, duplicate, or
a Kafka error. It never changes anything; ProducerStateManager applies an Append only after
the log took the batch.

Theory of operation (seeds 000, 001, 003): a producer id (PID) is handed out by the cluster,
the epoch fences older incarnations of a producer, and per partition each record carries a
sequence number, 0, 1, 2, ... wrapping from 2^31-1 back to 0. The broker remembers the last N
batches (default 5) of each producer on each partition, so a retry of one of them is answered
with its original offset instead of being stored twice.

Where Kafka loses: a retry older than the cache (more than 5 in flight, seed figure 5) gets
OUT_OF_ORDER_SEQUENCE_NUMBER from Kafka; the client bumps its epoch and stores the batch again.
Here such a batch lies wholly at or below the last sequence, so it is answered
DUPLICATE_SEQUENCE_NUMBER (clients treat that as delivered) and nothing is stored.

The decisions, in the order they are taken (f, l: the batch's first and last sequence;
E: what the partition remembers of the producer; "last": E's last sequence):

    | # | situation                                        | outcome                          |
    |---|--------------------------------------------------|----------------------------------|
    | 1 | PID above every id the cluster ever issued       | UNKNOWN_PRODUCER_ID              |
    | 2 | nothing remembered, but may have been forgotten  | append, whatever f (KIP-360)     |
    |2b | nothing remembered and never forgotten, f == 0   | append                           |
    |2c | nothing remembered and never forgotten, f != 0   | OUT_OF_ORDER_SEQUENCE_NUMBER     |
    | 3 | batch epoch < E.epoch                            | INVALID_PRODUCER_EPOCH (fenced)  |
    | 4 | batch epoch > E.epoch, f == 0                    | append, new epoch, cache cleared |
    | 5 | batch epoch > E.epoch, f != 0                    | OUT_OF_ORDER_SEQUENCE_NUMBER     |
    | 6 | same epoch, (f, l) is one of the cached batches  | duplicate: its original offset   |
    | 7 | same epoch, f == last + 1                        | append                           |
    | 8 | same epoch, f > last + 1 (a gap)                 | OUT_OF_ORDER_SEQUENCE_NUMBER     |
    | 9 | same epoch, f..l wholly within start..last       | DUPLICATE_SEQUENCE_NUMBER        |
    |10 | same epoch, f <= last < l (straddles)            | OUT_OF_ORDER_SEQUENCE_NUMBER     |
    |11 | same epoch, f before start (never seen here)     | OUT_OF_ORDER_SEQUENCE_NUMBER     |

Rows 2-2c, better than Kafka: Kafka accepts any first sequence from a producer it knows
nothing of (KIP-360), because it cannot tell a producer whose state it forgot from one that
never wrote here. Here the partition knows which producer ids it may have forgotten (ids up
to the highest one whose compact record it dropped, or every id when its state was rebuilt
from a log whose start was already deleted). A producer that never wrote here starts at 0; if
its first batch to arrive starts later, an earlier batch is still on its way (delayed or
retried), and Kafka would store the later one first, then answer the earlier one
OUT_OF_ORDER, which librdkafka treats as fatal. Row 2c makes the later one wait instead.

"start" is the first sequence of the current epoch this partition stored: everything from
start to last is known to be in the log (appends are contiguous). Row 2 can make start > 0
(a forgotten producer coming back mid-stream), and a batch from before start may never have
arrived. Answering it "duplicate" would make the client drop it, so row 11 answers what
Kafka answers; oncelog's client then reports it failed, never delivered
(client/producer/idempotence.py).

A tombstone (a producer moved out of memory, keeping epoch, start and last sequence) is
judged by the same rows 3-11 except 6: it has no cached batches, so a retry of its last batch
gets row 9.

Row 7 taken first (``judge_next``): the produce path's common case, a producer with a live
entry here sending its next batch in the same epoch, is judged from three facts the manager
reads straight out of its packed entry (epoch, last sequence, whether (f, l) is cached)
instead of building the entry's objects. It answers only when rows 1-6 cannot apply, so it
is the same decision as ``decide``; otherwise it answers nothing and ``decide`` judges
(tests/producer_state/test_producer_state.py checks the two agree on random states and batches).

An entry may hold no batch at all: a transaction marker with a bumped epoch (KIP-890 part 2)
clears the cache, and a marker for a producer the partition never saw creates one. The next
batch at that epoch must start at sequence 0 (row 7 with "last" = -1; anything else is row 8).

Transactions (Kafka's ProducerAppendInfo, KIP-98 and KIP-890). A partition remembers, per
producer, the first offset of its ongoing transaction here (``txn_first_offset``, -1: none)
and the coordinator epoch of the last marker. Once the rows above say "append", a data batch
is judged again:

    | # | situation                                         | outcome                         |
    |---|---------------------------------------------------|---------------------------------|
    |T1 | a transaction is ongoing, batch not transactional | INVALID_TXN_STATE               |
    |T2 | a transaction is ongoing, batch of a newer epoch  | INVALID_TXN_STATE               |
    |T3 | a transaction is ongoing, same epoch              | append, in that transaction     |
    |T4 | no transaction ongoing, batch transactional       | append, begins one (its offset) |

T2, stricter than Kafka (which lets such a batch join the old transaction): a coordinator
finishes a transaction (markers written everywhere) before it hands out a newer epoch, so a
newer epoch while the old transaction is open here is a stray. T4's batch is appended only
after the coordinator confirmed the transaction includes this partition (KIP-890 part 1, the
partition's ``verify``): no late or stray write opens a transaction nobody will finish.

Markers (control batches COMMIT / ABORT, written for the coordinator; ``decide_marker``):

    | # | situation                                         | outcome                         |
    |---|---------------------------------------------------|---------------------------------|
    |M1 | marker epoch < E.epoch                            | INVALID_PRODUCER_EPOCH          |
    |M2 | transaction version 2, marker epoch == E.epoch,   | INVALID_PRODUCER_EPOCH (a TV2   |
    |   | a transaction ongoing                             | marker carries a bumped epoch)  |
    |M3 | coordinator epoch < the last marker's             | TRANSACTION_COORDINATOR_FENCED  |
    |M4 | otherwise                                         | write: ends the ongoing         |
    |   |                                                   | transaction if any; E.epoch     |
    |   |                                                   | becomes the marker's            |

M4 with no transaction ongoing here is a retry of a marker already written, or a transaction
that wrote nothing here: harmless, accepted as Kafka 4 accepts it (KAFKA-19999 for TV2).
With a bumped epoch the cached batches go (they belong to the old epoch), so the producer's
next transaction starts at sequence 0 and a delayed batch of the finished one is fenced
(row 3). A producer known only by a compact record has no transaction ongoing; M1 and M2
judge it by its epoch.

"Above" and "below" are taken on the circle of 2^31 sequences: f is ahead of last when it is
less than half the circle ahead, so the comparison survives the wrap at 2^31-1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from ..protocol.sequences import NO_SEQUENCE, is_ahead, next_sequence, sequence_distance

NO_TXN = -1  # txn_first_offset of a producer with no transaction ongoing here


@dataclass(frozen=True, slots=True)
class CachedBatch:
    first_seq: int
    last_seq: int
    last_offset: int

    @property
    def base_offset(self) -> int:
        return self.last_offset - sequence_distance(self.first_seq, self.last_seq)


@dataclass(slots=True)
class ProducerStateEntry:
    """What a partition remembers of one producer: its epoch and its last batches."""

    producer_id: int
    epoch: int
    start_seq: int  # first sequence of this epoch stored here: start..last are all in the log
    batches: list[CachedBatch]  # oldest first, at most batches_to_retain; may be empty
    last_timestamp: int  # max timestamp of the last batch, as DescribeProducers shows it
    last_append_ms: int  # broker time of the last append: drives expiration and eviction
    txn_first_offset: int = NO_TXN  # first offset of the transaction ongoing here
    coordinator_epoch: int = -1  # of the last marker written for this producer

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    @property
    def in_transaction(self) -> bool:
        return self.txn_first_offset != NO_TXN


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A producer moved out of memory: enough to judge its next batch by its real sequence."""

    producer_id: int
    epoch: int
    start_seq: int
    last_seq: int
    last_offset: int
    since: int  # when it was moved out (ms): tombstones go after producer.id.tombstone.ms


class BatchIdentity(NamedTuple):
    """The fields of a batch header the rules look at.

    A NamedTuple, not a frozen dataclass: one is built per idempotent batch on the produce
    path, and a frozen dataclass costs twice as much to build.
    """

    producer_id: int
    epoch: int
    first_seq: int
    last_seq: int
    transactional: bool = False


# --- decisions --------------------------------------------------------------------------------

@dataclass(slots=True)
class Append:
    """Append the batch; ``reset`` starts the producer afresh (new epoch or first sight).

    Not frozen, unlike the other decisions: one is built per idempotent batch on the produce
    path, and a frozen dataclass costs twice as much to build. Nothing changes it.
    """

    batch: BatchIdentity
    reset: bool
    begins_txn: bool = False  # row T4: the batch's first offset starts a transaction


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A retry of a cached batch: answer success with the offset it was stored at."""

    base_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class Refuse:
    error: ErrorCode
    message: str


Decision = Append | Duplicate | Refuse


class MarkerIdentity(NamedTuple):
    """What the rules look at of a transaction marker."""

    producer_id: int
    epoch: int
    coordinator_epoch: int
    commit: bool
    transaction_version: int = 0  # WriteTxnMarkers v2's; 2 is KIP-890 part 2


@dataclass(frozen=True, slots=True)
class EndTxn:
    """Write the marker. ``first_offset``: the transaction it ends here (NO_TXN: none, a
    retry or a transaction that wrote nothing to this partition)."""

    marker: MarkerIdentity
    first_offset: int


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker ended here, as the aborted transaction index records it."""

    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    aborted: bool
    last_stable_offset: int  # once it is complete


# --- the rules, one function per row group ----------------------------------------------------

def judge_unissued(batch: BatchIdentity, pid_issued: bool) -> Refuse | None:
    """Row 1: no client may invent an identity."""
    if pid_issued:
        return None
    return Refuse(ErrorCode.unknown_producer_id,
                  f"producer id {batch.producer_id} was never issued by this cluster")


def judge_epoch(batch: BatchIdentity, epoch: int) -> Decision | None:
    """Rows 3-5: an older epoch is fenced; a newer one must start its sequences at 0."""
    if batch.epoch < epoch:
        return Refuse(ErrorCode.invalid_producer_epoch,
                      f"producer {batch.producer_id} epoch {batch.epoch} is fenced by epoch "
                      f"{epoch}")
    if batch.epoch > epoch:
        if batch.first_seq != 0:
            return Refuse(ErrorCode.out_of_order_sequence_number,
                          f"producer {batch.producer_id} new epoch {batch.epoch} must start at "
                          f"sequence 0, not {batch.first_seq}")
        return Append(batch, reset=True)
    return None


def judge_cached(batch: BatchIdentity, batches: list[CachedBatch]) -> Duplicate | None:
    """Row 6: a retry of one of the cached batches, matched on first and last sequence."""
    for cached in batches:
        if cached.first_seq == batch.first_seq and cached.last_seq == batch.last_seq:
            return Duplicate(cached.base_offset, cached.last_offset)
    return None


def judge_sequence(batch: BatchIdentity, start_seq: int, last_seq: int) -> Decision:
    """Rows 7-11, same epoch and not a cached retry. ``last_seq`` NO_SEQUENCE: nothing is
    stored of this epoch yet (after a marker), so only sequence 0 goes on."""
    if last_seq == NO_SEQUENCE:
        if batch.first_seq == 0:
            return Append(batch, reset=False)
        return Refuse(ErrorCode.out_of_order_sequence_number,
                      f"producer {batch.producer_id} epoch {batch.epoch} starts at sequence "
                      f"{batch.first_seq}, not 0")
    expected = next_sequence(last_seq)
    if batch.first_seq == expected:
        return Append(batch, reset=False)
    if is_ahead(batch.first_seq, last_seq):
        return Refuse(ErrorCode.out_of_order_sequence_number,
                      f"producer {batch.producer_id} sent sequence {batch.first_seq}, expected "
                      f"{expected}: a batch in between is missing")
    if is_ahead(batch.last_seq, last_seq):
        return Refuse(ErrorCode.out_of_order_sequence_number,
                      f"producer {batch.producer_id} batch {batch.first_seq}..{batch.last_seq} "
                      f"straddles the last stored sequence {last_seq}")
    if sequence_distance(start_seq, batch.first_seq) > sequence_distance(start_seq, last_seq):
        return Refuse(ErrorCode.out_of_order_sequence_number,
                      f"producer {batch.producer_id} batch {batch.first_seq}..{batch.last_seq} "
                      f"is older than anything stored here of it (from {start_seq}): it may "
                      f"never have arrived")
    return Refuse(ErrorCode.duplicate_sequence_number,
                  f"producer {batch.producer_id} batch {batch.first_seq}..{batch.last_seq} "
                  f"was already stored (last sequence {last_seq}), older than the cache")


def judge_next(batch: BatchIdentity, epoch: int, last_seq: int, cached: bool,
               in_transaction: bool) -> Append | None:
    """Row 7 ahead of the others, for a producer with a live entry (not a tombstone).

    Such a producer was issued (row 1 passes) and is known (rows 2-2c do not apply). With the
    batch's epoch equal to the entry's, rows 3-5 do not apply; with (f, l) not ``cached``, row 6
    does not; then f == last + 1 is row 7. A batch that is transactional exactly when a
    transaction is ongoing is T3 or no transaction at all. Anything else: None, and
    ``decide`` judges it.
    """
    if batch.epoch == epoch and not cached and batch.transactional == in_transaction and \
            last_seq != NO_SEQUENCE and batch.first_seq == next_sequence(last_seq):
        return Append(batch, False)
    return None


def judge_transaction(decision: Decision, known: ProducerStateEntry | Tombstone | None
                      ) -> Decision:
    """Rows T1-T4, for a batch the idempotence rows let through."""
    if not isinstance(decision, Append):
        return decision
    batch = decision.batch
    ongoing = isinstance(known, ProducerStateEntry) and known.in_transaction
    if ongoing:
        assert isinstance(known, ProducerStateEntry)
        if not batch.transactional:
            return Refuse(ErrorCode.invalid_txn_state,
                          f"producer {batch.producer_id} sent a non-transactional batch while "
                          f"its transaction from offset {known.txn_first_offset} is ongoing")
        if batch.epoch != known.epoch:
            return Refuse(ErrorCode.invalid_txn_state,
                          f"producer {batch.producer_id} epoch {batch.epoch} wrote while its "
                          f"transaction of epoch {known.epoch} from offset "
                          f"{known.txn_first_offset} is not ended here")
        return decision
    if batch.transactional:
        decision.begins_txn = True
    return decision


def judge_unknown(batch: BatchIdentity, may_be_forgotten: bool) -> Decision:
    """Rows 2-2c: a producer the partition knows nothing of."""
    if may_be_forgotten or batch.first_seq == 0:
        return Append(batch, reset=True)
    return Refuse(ErrorCode.out_of_order_sequence_number,
                  f"producer {batch.producer_id} never wrote here and starts at sequence "
                  f"{batch.first_seq}, not 0: an earlier batch is still on its way")


def decide(batch: BatchIdentity, known: ProducerStateEntry | Tombstone | None,
           pid_issued: bool, may_be_forgotten: bool = True) -> Decision:
    """The one entry point for a data batch: what to do with ``batch`` given what the
    partition knows."""
    return judge_transaction(_decide_idempotence(batch, known, pid_issued, may_be_forgotten),
                             known)


def _decide_idempotence(batch: BatchIdentity, known: ProducerStateEntry | Tombstone | None,
                        pid_issued: bool, may_be_forgotten: bool) -> Decision:
    refused = judge_unissued(batch, pid_issued)
    if refused is not None:
        return refused
    if known is None:
        return judge_unknown(batch, may_be_forgotten)
    by_epoch = judge_epoch(batch, known.epoch)
    if by_epoch is not None:
        return by_epoch
    if isinstance(known, ProducerStateEntry):
        duplicate = judge_cached(batch, known.batches)
        if duplicate is not None:
            return duplicate
    return judge_sequence(batch, known.start_seq, known.last_seq)


def decide_unsequenced(batch: BatchIdentity, known: ProducerStateEntry | Tombstone | None
                       ) -> Decision:
    """A transactional batch the broker writes itself, without sequences (TxnOffsetCommit's
    offsets in ``__consumer_offsets``, Kafka's AppendOrigin.COORDINATOR): only row 3 (an
    older epoch is fenced) and rows T1-T4 apply."""
    if known is not None and batch.epoch < known.epoch:
        return Refuse(ErrorCode.invalid_producer_epoch,
                      f"producer {batch.producer_id} epoch {batch.epoch} is fenced by epoch "
                      f"{known.epoch}")
    reset = known is None or batch.epoch != known.epoch
    return judge_transaction(Append(batch, reset), known)


def decide_marker(marker: MarkerIdentity, known: ProducerStateEntry | Tombstone | None
                  ) -> EndTxn | Refuse:
    """Rows M1-M4: whether a transaction marker is written, and what it ends."""
    if known is None:
        return EndTxn(marker, NO_TXN)
    ongoing = isinstance(known, ProducerStateEntry) and known.in_transaction
    pid = marker.producer_id
    if marker.epoch < known.epoch:
        return Refuse(ErrorCode.invalid_producer_epoch,
                      f"marker for producer {pid} has epoch {marker.epoch}, older than its "
                      f"epoch {known.epoch} here")
    if marker.transaction_version >= 2 and marker.epoch == known.epoch and ongoing:
        return Refuse(ErrorCode.invalid_producer_epoch,
                      f"transaction version 2 marker for producer {pid} has epoch "
                      f"{marker.epoch}, the epoch of its ongoing transaction: a marker carries "
                      f"the next one")
    if isinstance(known, ProducerStateEntry) and \
            marker.coordinator_epoch < known.coordinator_epoch:
        return Refuse(ErrorCode.transaction_coordinator_fenced,
                      f"marker for producer {pid} from coordinator epoch "
                      f"{marker.coordinator_epoch}, older than {known.coordinator_epoch}")
    return EndTxn(marker, known.txn_first_offset if ongoing else NO_TXN)
