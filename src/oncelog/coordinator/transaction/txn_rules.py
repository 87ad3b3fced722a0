"""Every decision of the transaction coordinator lives in this file.

It knows nothing of logs, markers or clocks: ``decide`` is given what the coordinator holds for
one transactional id (an Entry, or nothing) and one request, and answers with one Decision:
the answer to send and, when the request changes something, the Entry to write to
``__transaction_state`` first. TransactionCoordinator (transaction_coordinator.py) applies it:
it marks the id *pending* before it writes, so no other request decides on the same state
while the write waits for its fsync, takes the written Entry only once it is durable (a write
that fails changes nothing), and answers only then.

Names as in Kafka's TransactionMetadata: e = the id's producer epoch, pid its producer id,
prev/next its previous and next producer ids, last = the epoch a KIP-360 InitProducerId
bumped from (kept in memory only, as Kafka's lastProducerEpoch). "Exhausted": e >= 32766
(no bump is handed to a client past 32766; 32767 is the coordinator's own, for the markers
of the transaction that exhausted the epoch). Requests name (P, E): their producer id and
epoch. TV: the transaction version of the request that ends the transaction: 2 for EndTxn v5
and later (KIP-890 part 2: every end bumps the epoch), else 0; taken from each EndTxn, never
kept for the next transaction. "Prepare*" is PrepareCommit / PrepareAbort, "Complete*"
CompleteCommit / CompleteAbort, "Idle" is Empty or Complete*. "pending": a step of the
coordinator holds the id; a request meeting it waits (the coordinator's PENDING_WAIT_S) and is
decided on what the step left, so the pending rows answer only a step still running then.

InitProducerId (its requests carry an optional (P, E), KIP-360):

    | #   | state / condition                               | answer, then what is written    |
    |-----|-------------------------------------------------|---------------------------------|
    | I1  | pending                                         | CONCURRENT_TRANSACTIONS         |
    | I2  | unknown id                                      | NONE (new pid, 0); Empty        |
    | I3  | (P, E) named, P != pid and not (P == prev and   | PRODUCER_FENCED                 |
    |     | E exhausted)                                    |                                 |
    | I4  | Prepare* or PrepareEpochFence                   | CONCURRENT_TRANSACTIONS         |
    | I5  | Ongoing, keep_prepared (KIP-939), e exhausted   | PRODUCER_FENCED                 |
    | I6  | Ongoing, keep_prepared                          | NONE (pid, e+1, kept pid, e);   |
    |     |                                                 | Ongoing at e+1                  |
    | I7  | Ongoing                                         | CONCURRENT_TRANSACTIONS; the    |
    |     |                                                 | fence (X1) starts               |
    | I8  | Idle, e exhausted, E not named or E == e        | NONE (new pid, 0); Empty, prev  |
    |     |                                                 | = pid                           |
    | I9  | Idle, E named, E != e, E == last                | NONE (pid, e): a retry          |
    | I10 | Idle, E named, E != e                           | PRODUCER_FENCED                 |
    | I11 | Idle                                            | NONE (pid, e+1); Empty, last =  |
    |     |                                                 | E named ? e : -1                |

AddPartitionsToTxn and AddOffsetsToTxn (partitions that do not exist are refused before,
UNKNOWN_TOPIC_OR_PARTITION for them, OPERATION_NOT_ATTEMPTED for the rest):

    | #   | state / condition                               | answer, then what is written    |
    |-----|-------------------------------------------------|---------------------------------|
    | A1  | unknown id or P != pid                          | INVALID_PRODUCER_ID_MAPPING     |
    | A2  | E != e, or e == 32767 (no client holds it)      | PRODUCER_FENCED                 |
    | A3  | pending, or Prepare* or PrepareEpochFence       | CONCURRENT_TRANSACTIONS         |
    | A4  | Ongoing, every partition already in it          | NONE                            |
    | A5  | Ongoing                                         | NONE; Ongoing with the union    |
    | A6  | Idle                                            | NONE; Ongoing, started now      |

EndTxn with TV 0 (v0-v4: the epoch stays):

    | #   | state / condition                               | answer, then what is written    |
    |-----|-------------------------------------------------|---------------------------------|
    | E1  | unknown id or P != pid                          | INVALID_PRODUCER_ID_MAPPING     |
    | E2  | E != e                                          | PRODUCER_FENCED                 |
    | E3  | pending (Prepare* and PrepareEpochFence always  | CONCURRENT_TRANSACTIONS         |
    |     | are: their markers or abort are under way)      |                                 |
    | E4  | Ongoing                                         | NONE (pid, e); Prepare* at e,   |
    |     |                                                 | TV 0; markers (M1)              |
    | E5  | Complete* of the same outcome (a retry)         | NONE (pid, e)                   |
    | E6  | otherwise                                       | INVALID_TXN_STATE               |

EndTxn with TV 2 (v5+: each end bumps the epoch). A retry of an end already decided
carries the epoch before the bump: "bump-retry" is P == pid and E + 1 == e; "overflow-retry"
is P == prev, E == 32766, e == 0 (the end that exhausted the epoch moved to a new pid); both
only when the transaction was decided by a TV 2 end (its written TV is 2). Without that last
condition (Kafka has none) a zombie at e-1 whose successor got e from InitProducerId and ended
with TV 0 would be handed e, the live producer's own epoch (the model test found it).
Both are read from the written state, so a retry is recognised after a restart too. As in
Kafka, a fence's bump (X1) looks the same: the fenced producer's EndTxn v5 abort of the
transaction the fence aborted is answered as its retry (F3), with e, which the new instance's
InitProducerId then fences again (e+1 is never handed to anyone else):

    | #   | state / condition                               | answer, then what is written    |
    |-----|-------------------------------------------------|---------------------------------|
    | F1  | pending (Prepare* always is: its markers are    | CONCURRENT_TRANSACTIONS         |
    |     | under way, so a retry of its end lands here)    |                                 |
    | F2  | unknown id, or P != pid and not overflow-retry  | INVALID_PRODUCER_ID_MAPPING     |
    | F3  | Complete* and a retry of the same outcome,      | NONE (pid, e)                   |
    |     | e < 32767                                       |                                 |
    | F4  | a retry of the other outcome                    | INVALID_TXN_STATE               |
    |     | (a retry at e == 32767 ends here or in F5: only |                                 |
    |     | a fence reaches 32767, and its producer stays   |                                 |
    |     | fenced)                                         |                                 |
    | F5  | E != e                                          | PRODUCER_FENCED                 |
    | F6  | e == 32767 (no client holds it)                 | PRODUCER_FENCED                 |
    | F7  | Ongoing, or Idle and abort                      | Prepare* at e+1, TV 2, last =   |
    |     |                                                 | e; markers (M1); see F8         |
    | F8  |  ... e exhausted                                | Prepare* at 32767, next = new   |
    |     |                                                 | pid; answer NONE (new pid, 0)   |
    |     |  ... else                                       | answer NONE (pid, e+1)          |
    | F9  | otherwise (Empty or CompleteCommit, commit)     | INVALID_TXN_STATE               |

The coordinator's own steps (no client asks; each runs while the id is pending, and a
failed write is retried until it is taken, so nothing is left half done without a restart):

    | #   | step                                            | what is written                 |
    |-----|-------------------------------------------------|---------------------------------|
    | X1  | fence: Ongoing aborted (I7, the timeout)        | PrepareEpochFence at e+1 (on    |
    |     |                                                 | failure: not pending, Ongoing;  |
    |     |                                                 | the next I7 / timeout retries)  |
    | X2  | after X1                                        | PrepareAbort at the same epoch, |
    |     |                                                 | then markers (M1)               |
    | M1  | markers of Prepare*: (pid, e, TV) to every      | Complete*, no partitions; with  |
    |     | partition (e is 32767 after F8), until each     | next set: pid = next, e = 0,    |
    |     | partition took it or is gone                    | prev = pid, next = -1           |
    | M2  | a round of M1: a partition refused its marker   | nothing; no marker is sent      |
    |     | as fenced (INVALID_PRODUCER_EPOCH,              | again and the id stays pending: |
    |     | TRANSACTION_COORDINATOR_FENCED)                 | a newer coordinator (or         |
    |     |                                                 | producer epoch) has moved on    |
    | M3  | a round of M1: otherwise, a partition neither   | nothing; those partitions again |
    |     | took it nor is gone                             | a second later, while this      |
    |     |                                                 | broker is still the id's        |
    |     |                                                 | coordinator at the coordinator  |
    |     |                                                 | epoch the markers carry         |
    | L1  | loaded Prepare*                                 | pending; M1 resumes             |
    | L2  | loaded PrepareEpochFence                        | pending; X2 resumes             |

M2 is Kafka's (its TransactionMarkerRequestCompletionHandler stops sending then): a deposed
coordinator's markers carry an older coordinator epoch than its successor's, and resending
them forever would only be refused forever; its successor completes the transaction from the
log (L1). ``after_markers`` decides M1-M3 for one round's answers.

Produce-time verification (KIP-890 part 1, ``verify``) reads the same Entry: V0 the id's
partition not served here: ownership.py's answer (NOT_COORDINATOR or
COORDINATOR_LOAD_IN_PROGRESS, as Kafka's coordinator answers a verification it cannot make);
V1 unknown id or P != pid: INVALID_PRODUCER_ID_MAPPING; V2 E < e: INVALID_PRODUCER_EPOCH;
V3 not Ongoing, E != e or the partition not in the transaction: INVALID_TXN_STATE; else NONE.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from .txn_records import TxnState

E = ErrorCode
S = TxnState
MAX_EPOCH = 32767
NEW_ID = -2  # a Decision's "a producer id not issued yet": the coordinator generates it

_PREPARE = (S.PREPARE_COMMIT, S.PREPARE_ABORT)
_COMPLETE = (S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
_IDLE = (S.EMPTY, *_COMPLETE)
_BUSY = (*_PREPARE, S.PREPARE_EPOCH_FENCE)

TopicPartition = tuple[str, int]


def exhausted(epoch: int) -> bool:
    return epoch >= MAX_EPOCH - 1


@dataclass(frozen=True)
class Entry:
    """What the coordinator holds for one transactional id (all but ``last_epoch`` and
    ``pending`` is what ``__transaction_state`` holds)."""

    producer_id: int
    epoch: int
    state: TxnState
    timeout_ms: int
    partitions: frozenset[TopicPartition] = frozenset()
    start_ms: int = -1
    last_update_ms: int = -1
    previous_producer_id: int = -1
    next_producer_id: int = -1
    transaction_version: int = 0
    last_epoch: int = -1
    pending: bool = False

    def to(self, state: TxnState, **changes) -> Entry:
        return dataclasses.replace(self, state=state, **changes)


@dataclass(frozen=True)
class Init:
    timeout_ms: int
    now_ms: int
    producer_id: int = -1
    epoch: int = -1
    keep_prepared: bool = False


@dataclass(frozen=True)
class Add:
    producer_id: int
    epoch: int
    partitions: frozenset[TopicPartition]
    now_ms: int


@dataclass(frozen=True)
class End:
    producer_id: int
    epoch: int
    commit: bool
    version: int  # 2: EndTxn v5+ (KIP-890 part 2), else 0
    now_ms: int


FENCE, ABORT_FENCED, MARKERS = "fence", "abort-fenced", "markers"


@dataclass(frozen=True)
class Decision:
    """``write``: the Entry written (durably) before the answer; ``then``: the step that
    follows it while the id stays pending (MARKERS, or FENCE started in the background)."""

    row: str
    error: ErrorCode
    producer_id: int = -1
    epoch: int = -1
    write: Entry | None = None
    then: str | None = None
    kept: tuple[int, int] = (-1, -1)  # KIP-939: the kept transaction's (pid, epoch)


def _answer(row: str, error: ErrorCode) -> Decision:
    return Decision(row, error)


def decide(entry: Entry | None, request: Init | Add | End) -> Decision:
    if isinstance(request, Init):
        return decide_init(entry, request)
    if isinstance(request, Add):
        return decide_add(entry, request)
    if request.version >= 2:
        return decide_end_v2(entry, request)
    return decide_end_v0(entry, request)


def decide_init(entry: Entry | None, r: Init) -> Decision:
    named = r.producer_id >= 0
    if entry is not None and entry.pending:
        return _answer("I1", E.concurrent_transactions)
    if entry is None:
        fresh = Entry(NEW_ID, 0, S.EMPTY, r.timeout_ms, last_update_ms=r.now_ms)
        return Decision("I2", E.none, NEW_ID, 0, write=fresh)
    if named and r.producer_id != entry.producer_id and not (
            r.producer_id == entry.previous_producer_id and exhausted(r.epoch)):
        return _answer("I3", E.producer_fenced)
    if entry.state in _BUSY:
        return _answer("I4", E.concurrent_transactions)
    if entry.state is S.ONGOING and r.keep_prepared:
        if exhausted(entry.epoch):
            return _answer("I5", E.producer_fenced)  # the kept transaction keeps its id
        kept = entry.to(S.ONGOING, epoch=entry.epoch + 1, timeout_ms=r.timeout_ms,
                        last_update_ms=r.now_ms, last_epoch=-1)
        return Decision("I6", E.none, entry.producer_id, entry.epoch + 1, write=kept,
                        kept=(entry.producer_id, entry.epoch))
    if entry.state is S.ONGOING:
        return Decision("I7", E.concurrent_transactions, then=FENCE)
    idle = dict(timeout_ms=r.timeout_ms, partitions=frozenset(), start_ms=-1,
                last_update_ms=r.now_ms, next_producer_id=-1)
    if exhausted(entry.epoch) and (not named or r.epoch == entry.epoch):
        rotated = entry.to(S.EMPTY, producer_id=NEW_ID, epoch=0,
                           previous_producer_id=entry.producer_id,
                           last_epoch=entry.epoch if named else -1, **idle)
        return Decision("I8", E.none, NEW_ID, 0, write=rotated)
    if named and r.epoch != entry.epoch:
        if r.epoch == entry.last_epoch:
            return Decision("I9", E.none, entry.producer_id, entry.epoch)
        return _answer("I10", E.producer_fenced)
    bumped = entry.to(S.EMPTY, epoch=entry.epoch + 1,
                      last_epoch=entry.epoch if named else -1, **idle)
    return Decision("I11", E.none, entry.producer_id, entry.epoch + 1, write=bumped)


def decide_add(entry: Entry | None, r: Add) -> Decision:
    if entry is None or r.producer_id != entry.producer_id:
        return _answer("A1", E.invalid_producer_id_mapping)
    if r.epoch != entry.epoch or entry.epoch >= MAX_EPOCH:
        return _answer("A2", E.producer_fenced)
    if entry.pending or entry.state in _BUSY:
        return _answer("A3", E.concurrent_transactions)
    if entry.state is S.ONGOING:
        if r.partitions <= entry.partitions:
            return _answer("A4", E.none)
        grown = entry.to(S.ONGOING, partitions=entry.partitions | r.partitions,
                         last_update_ms=r.now_ms)
        return Decision("A5", E.none, write=grown)
    started = entry.to(S.ONGOING, partitions=r.partitions, start_ms=r.now_ms,
                       last_update_ms=r.now_ms)
    return Decision("A6", E.none, write=started)


def _prepared(entry: Entry, r: End, epoch: int, next_id: int = -1) -> Entry:
    return entry.to(S.PREPARE_COMMIT if r.commit else S.PREPARE_ABORT, epoch=epoch,
                    next_producer_id=next_id, transaction_version=r.version,
                    last_epoch=entry.epoch if r.version >= 2 else entry.last_epoch,
                    last_update_ms=r.now_ms,
                    start_ms=entry.start_ms if entry.state is S.ONGOING else r.now_ms)


def decide_end_v0(entry: Entry | None, r: End) -> Decision:
    if entry is None or r.producer_id != entry.producer_id:
        return _answer("E1", E.invalid_producer_id_mapping)
    if r.epoch != entry.epoch:
        return _answer("E2", E.producer_fenced)
    if entry.pending or entry.state in _BUSY:
        return _answer("E3", E.concurrent_transactions)
    if entry.state is S.ONGOING:
        return Decision("E4", E.none, entry.producer_id, entry.epoch,
                        write=_prepared(entry, r, entry.epoch), then=MARKERS)
    same = r.commit == (entry.state in (S.COMPLETE_COMMIT, S.PREPARE_COMMIT))
    if entry.state in _COMPLETE and same:
        return Decision("E5", E.none, entry.producer_id, entry.epoch)
    return _answer("E6", E.invalid_txn_state)


def decide_end_v2(entry: Entry | None, r: End) -> Decision:
    if entry is not None and (entry.pending or entry.state in _BUSY):
        return _answer("F1", E.concurrent_transactions)
    tv2 = entry is not None and entry.transaction_version >= 2
    overflow_retry = tv2 and r.producer_id == entry.previous_producer_id \
        and r.epoch == MAX_EPOCH - 1 and entry.epoch == 0
    if entry is None or (r.producer_id != entry.producer_id and not overflow_retry):
        return _answer("F2", E.invalid_producer_id_mapping)
    bump_retry = tv2 and r.producer_id == entry.producer_id and r.epoch + 1 == entry.epoch
    same = r.commit == (entry.state in (S.COMPLETE_COMMIT, S.PREPARE_COMMIT))
    retry = entry.state in _COMPLETE and (bump_retry or overflow_retry)
    if retry and same and entry.state in _COMPLETE and entry.epoch < MAX_EPOCH:
        return Decision("F3", E.none, entry.producer_id, entry.epoch)
    if retry and not same:
        return _answer("F4", E.invalid_txn_state)
    if r.epoch != entry.epoch or r.producer_id != entry.producer_id:
        return _answer("F5", E.producer_fenced)
    if entry.epoch >= MAX_EPOCH:
        return _answer("F6", E.producer_fenced)
    if entry.state is S.ONGOING or (entry.state in _IDLE and not r.commit):
        if exhausted(entry.epoch):
            return Decision("F8", E.none, NEW_ID, 0, then=MARKERS,
                            write=_prepared(entry, r, MAX_EPOCH, NEW_ID))
        return Decision("F7", E.none, entry.producer_id, entry.epoch + 1, then=MARKERS,
                        write=_prepared(entry, r, entry.epoch + 1))
    return _answer("F9", E.invalid_txn_state)


# --- the coordinator's own steps ----------------------------------------------------------

def fenced(entry: Entry, now_ms: int) -> Entry:
    """X1: an ongoing transaction's epoch bumped, so its producer can write no more."""
    return entry.to(S.PREPARE_EPOCH_FENCE, epoch=entry.epoch + 1, last_update_ms=now_ms,
                    last_epoch=-1)


def abort_fenced(entry: Entry, now_ms: int) -> Entry:
    """X2."""
    return entry.to(S.PREPARE_ABORT, last_update_ms=now_ms)


def completed(entry: Entry, now_ms: int) -> Entry:
    """M1, once every marker is written: the epoch that exhausted moves to the next id."""
    done = S.COMPLETE_COMMIT if entry.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
    if entry.next_producer_id >= 0:
        return entry.to(done, producer_id=entry.next_producer_id, epoch=0,
                        previous_producer_id=entry.producer_id, next_producer_id=-1,
                        partitions=frozenset(), last_update_ms=now_ms)
    return entry.to(done, partitions=frozenset(), last_update_ms=now_ms)


MARKER_FENCED = (E.invalid_producer_epoch, E.transaction_coordinator_fenced)
MARKER_DONE = (E.none, E.unknown_topic_or_partition)  # taken, or its topic is gone
COMPLETE, STOP, AGAIN = "complete", "stop", "again"


def after_markers(errors: dict[TopicPartition, ErrorCode]
                  ) -> tuple[str, list[TopicPartition]]:
    """M1-M3 for a round's answer per partition: (COMPLETE, []), (STOP, the partitions
    refused as fenced) or (AGAIN, the partitions to send to again)."""
    fenced_out = sorted(tp for tp, e in errors.items() if e in MARKER_FENCED)
    if fenced_out:
        return STOP, fenced_out  # M2
    left = sorted(tp for tp, e in errors.items() if e not in MARKER_DONE)
    return (AGAIN, left) if left else (COMPLETE, [])  # M3, M1


def verify(not_served: ErrorCode | None, entry: Entry | None, producer_id: int, epoch: int,
           partition: TopicPartition) -> ErrorCode:
    """V0-V3; ``not_served``: ownership.py's error for the id's partition."""
    if not_served is not None:
        return not_served  # V0
    if entry is None or entry.producer_id != producer_id:
        return E.invalid_producer_id_mapping
    if epoch < entry.epoch:
        return E.invalid_producer_epoch
    if entry.state is not S.ONGOING or epoch != entry.epoch \
            or partition not in entry.partitions:
        return E.invalid_txn_state
    return E.none
