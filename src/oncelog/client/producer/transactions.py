"""The transactional producer's client-side rules: every transaction decision lives in this
file (KIP-98, KIP-360, KIP-447, KIP-588, KIP-890, KIP-939).

It knows nothing of sockets, threads or which broker answers: txn_requests.py sends the
coordinator requests and asks ``judge`` what each answer means; the sender asks
``may_send`` before a batch goes out and tells ``batch_failed`` when one fails; the
producer's calls go through the transitions below. A lock guards the state, which the
caller's thread and the sender's both change.

States (Kafka's TransactionManager's; PREPARED is two-phase commit's, KIP-939):

| state           | how it is entered                            | what the application may do   |
|-----------------|----------------------------------------------|-------------------------------|
| UNINITIALIZED   | a new producer                               | init_transactions             |
| INITIALIZING    | init_transactions (retried until it answers) | init_transactions again       |
| READY           | InitProducerId answered; a transaction ended | begin_transaction             |
| IN_TRANSACTION  | begin_transaction                            | produce, send_offsets, commit,|
|                 |                                              | abort, prepare (2PC)          |
| PREPARED        | prepare_transaction (2PC); init_transactions | commit, abort,                |
|                 | with keep_prepared_txn finding one           | complete_transaction          |
| COMMITTING      | commit_transaction                           | commit again (after a timeout)|
| ABORTING        | abort_transaction                            | abort again (after a timeout) |
| ABORTABLE_ERROR | a batch failed, or a coordinator answered an | abort_transaction             |
|                 | abortable error (table below)                |                               |
| FATAL_ERROR     | fenced, not authorised, ... (table below)    | close (every call raises)     |

What a coordinator's answer means (``judge``; the rows are Kafka's clients' handling):

| answer                                               | APIs                       | action   |
|------------------------------------------------------|----------------------------|----------|
| NONE                                                 | all                        | done     |
| NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,          | all                        | look up  |
| REQUEST_TIMED_OUT, no answer (connection lost)       |                            | again    |
| COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS| all                        | retry    |
| UNKNOWN_TOPIC_OR_PARTITION                           | AddPartitions, TxnOffsetCommit | retry|
| PRODUCER_FENCED, INVALID_PRODUCER_EPOCH              | all                        | fatal    |
| TRANSACTIONAL_ID_AUTHORIZATION_FAILED                | all                        | fatal    |
| UNSUPPORTED_FOR_MESSAGE_FORMAT, UNSUPPORTED_VERSION  | all                        | fatal    |
| CLUSTER_AUTHORIZATION_FAILED                         | InitProducerId             | fatal    |
| INVALID_TXN_STATE                                    | AddPartitions, EndTxn      | fatal    |
| UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_ID_MAPPING     | AddPartitions, AddOffsets, | abortable|
|                                                      | EndTxn                     | new epoch|
| GROUP_AUTHORIZATION_FAILED                           | FindCoordinator (a group)  | abortable|
| anything else: TOPIC_ / GROUP_AUTHORIZATION_FAILED,  | AddPartitions, AddOffsets, | abortable|
| UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,               | TxnOffsetCommit            |          |
| FENCED_INSTANCE_ID (KIP-447: the group moved on),    |                            |          |
| TRANSACTION_ABORTABLE, OPERATION_NOT_ATTEMPTED, ...  |                            |          |
| anything else                                        | InitProducerId, EndTxn,    | fatal    |
|                                                      | FindCoordinator            |          |

A batch that fails in a transaction (``batch_failed``): PRODUCER_FENCED,
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED, UNSUPPORTED_VERSION are
fatal; anything else makes the transaction abortable (INVALID_PRODUCER_EPOCH on a produce
too, KIP-588: the coordinator may have bumped the epoch to abort a timed-out transaction;
if this producer really is fenced, its EndTxn says so). Its sequences may leave a gap, so
after the abort the epoch is bumped (InitProducerId with the current producer id and epoch,
KIP-360) unless the EndTxn answer already gave a new one (KIP-890 part 2: the coordinator
bumps the epoch at the end of every transaction and EndTxn v5+ returns it; every partition
then starts again at sequence 0).

A transaction starts on the coordinator with its first AddPartitionsToTxn or
AddOffsetsToTxn; one that added nothing ends without an EndTxn (as Kafka's client does). A
partition is added before the first batch to it goes out (``may_send``); the partitions
waiting are added together in one request, one request at a time.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ..network.connection import (
    KafkaError,
    ProducerFatalError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionStateError,
)
from ..topic_partition import TopicPartition

TRANSACTION_COORDINATOR = 1  # FindCoordinator key type
TWO_PHASE_FROM = 6  # InitProducerId's first version with two-phase commit (KIP-939)


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"
    INITIALIZING = "initializing"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    PREPARED = "prepared"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "abortable error"
    FATAL_ERROR = "fatal error"


class Api(enum.Enum):
    FIND_COORDINATOR = "FindCoordinator"
    INIT_PRODUCER_ID = "InitProducerId"
    ADD_PARTITIONS = "AddPartitionsToTxn"
    ADD_OFFSETS = "AddOffsetsToTxn"
    TXN_OFFSET_COMMIT = "TxnOffsetCommit"
    END_TXN = "EndTxn"


class Action(enum.Enum):
    DONE = "done"
    RETRY = "retry"
    FIND_COORDINATOR = "find the coordinator and retry"
    ABORTABLE = "abortable"
    ABORTABLE_NEW_EPOCH = "abortable, then a new epoch"
    FATAL = "fatal"


_FIND = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_not_available,
                   ErrorCode.network_exception})
_RETRY = frozenset({ErrorCode.coordinator_load_in_progress, ErrorCode.concurrent_transactions})
_FATAL = frozenset({ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch,
                    ErrorCode.transactional_id_authorization_failed,
                    ErrorCode.unsupported_for_message_format, ErrorCode.unsupported_version})
_NEW_EPOCH = frozenset({ErrorCode.unknown_producer_id, ErrorCode.invalid_producer_id_mapping})
_IN_TRANSACTION = frozenset({Api.ADD_PARTITIONS, Api.ADD_OFFSETS, Api.TXN_OFFSET_COMMIT})
# What a failed batch makes fatal; anything else makes the transaction abortable.
_FATAL_BATCH = frozenset({ErrorCode.producer_fenced,
                          ErrorCode.transactional_id_authorization_failed,
                          ErrorCode.cluster_authorization_failed, ErrorCode.unsupported_version})


def judge(api: Api, error: ErrorCode) -> Action:
    """What a coordinator's answer ``error`` to ``api`` means (the table above);
    NETWORK_EXCEPTION or REQUEST_TIMED_OUT stand for no answer at all."""
    if error == ErrorCode.none:
        return Action.DONE
    if error in _FIND or error == ErrorCode.request_timed_out:
        # A request that timed out may still be worked on: asking again is safe, as each of
        # these requests means the same the second time.
        return Action.FIND_COORDINATOR
    if error in _RETRY:
        return Action.RETRY
    if error == ErrorCode.unknown_topic_or_partition and api in (Api.ADD_PARTITIONS,
                                                                 Api.TXN_OFFSET_COMMIT):
        return Action.RETRY
    if error in _FATAL:
        return Action.FATAL
    if error == ErrorCode.cluster_authorization_failed and api is Api.INIT_PRODUCER_ID:
        return Action.FATAL
    if error == ErrorCode.invalid_txn_state and api in (Api.ADD_PARTITIONS, Api.END_TXN):
        return Action.FATAL
    if error in _NEW_EPOCH and api in (Api.ADD_PARTITIONS, Api.ADD_OFFSETS, Api.END_TXN):
        return Action.ABORTABLE_NEW_EPOCH
    if api in _IN_TRANSACTION:
        return Action.ABORTABLE
    if api is Api.FIND_COORDINATOR and error == ErrorCode.group_authorization_failed:
        return Action.ABORTABLE
    return Action.FATAL


@dataclass(frozen=True)
class PreparedTxnState:
    """A prepared transaction's producer id and epoch (KIP-939): what an external
    coordinator keeps, and hands to complete_transaction() of this producer or of the next
    instance with its transactional id. ``str()`` is Kafka's serialised form, "id:epoch"."""

    producer_id: int = -1
    epoch: int = -1

    def __str__(self) -> str:
        return f"{self.producer_id}:{self.epoch}" if self.producer_id >= 0 else ""

    @classmethod
    def parse(cls, text: str) -> PreparedTxnState:
        if not text:
            return cls()
        try:
            producer_id, epoch = (int(part) for part in text.split(":"))
        except ValueError:
            raise ValueError(f"not a prepared transaction state: {text!r}") from None
        return cls(producer_id, epoch)


@dataclass(frozen=True)
class GroupMetadata:
    """What TxnOffsetCommit needs of a consumer's group (KIP-447), from
    Consumer.consumer_group_metadata(): the coordinator refuses a commit by a member that
    is no longer in the generation that gave it its partitions."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class TransactionManager:
    def __init__(self, transactional_id: str, timeout_ms: int, two_phase: bool) -> None:
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.two_phase = two_phase
        self.lock = threading.RLock()
        self.state = TxnState.UNINITIALIZED
        self.error: KafkaError | None = None  # what put it in ABORTABLE_ERROR / FATAL_ERROR
        self.added: set[TopicPartition] = set()     # in the transaction on the coordinator
        self.adding: set[TopicPartition] = set()    # AddPartitionsToTxn in flight
        self.wanted: set[TopicPartition] = set()    # batches wait for them to be added
        self.started = False  # the coordinator knows of this transaction: EndTxn ends it
        self.new_epoch_needed = False  # after the abort (KIP-360), unless EndTxn gave one
        self.prepared: PreparedTxnState | None = None
        self.on_fatal: Callable[[KafkaError], None] = lambda error: None
        self.on_abortable: Callable[[], None] = lambda: None

    def __repr__(self) -> str:
        return f"TransactionManager({self.transactional_id!r}, {self.state.value})"

    # --- the application's calls ------------------------------------------------------------

    def _refuse(self, what: str) -> None:
        if self.state is TxnState.FATAL_ERROR:
            assert self.error is not None
            raise self.error
        raise TransactionStateError(f"{what} is not allowed while the producer is "
                                    f"{self.state.value}")

    def start_init(self) -> None:
        with self.lock:
            if self.state not in (TxnState.UNINITIALIZED, TxnState.INITIALIZING):
                self._refuse("init_transactions()")
            self.state = TxnState.INITIALIZING

    def initialized(self, prepared: PreparedTxnState | None = None) -> None:
        """InitProducerId answered: READY, or PREPARED when it kept a prepared transaction."""
        with self.lock:
            if self.state is TxnState.FATAL_ERROR:
                return
            self._clear()
            self.prepared = prepared
            if prepared is not None:
                self.started = True
            self.state = TxnState.READY if prepared is None else TxnState.PREPARED

    def begin(self) -> None:
        with self.lock:
            if self.state is not TxnState.READY:
                self._refuse("begin_transaction()")
            self._clear()
            self.state = TxnState.IN_TRANSACTION

    def check_produce(self) -> None:
        """produce() in this state: fine, or raises (the error that made the transaction
        abortable, the fatal one, or a state error)."""
        state = self.state
        if state is TxnState.IN_TRANSACTION:
            return
        with self.lock:
            if self.state is TxnState.ABORTABLE_ERROR:
                assert self.error is not None
                raise TransactionAbortableError(self.error.error,
                                                f"the transaction must be aborted: {self.error}")
            if self.state is not TxnState.IN_TRANSACTION:
                self._refuse("produce()")

    def check_offsets(self) -> None:
        self.check_produce()

    def prepare(self, producer_id: int, epoch: int) -> PreparedTxnState:
        """prepare_transaction(), once everything produced in the transaction is stored."""
        with self.lock:
            if not self.two_phase:
                raise TransactionStateError("prepare_transaction() needs "
                                            "transaction.two.phase.commit.enable=true")
            self.check_produce()
            self.state = TxnState.PREPARED
            self.prepared = PreparedTxnState(producer_id, epoch)
            return self.prepared

    def start_commit(self) -> bool:
        """commit_transaction(): False when it is a retry of one under way."""
        with self.lock:
            if self.state is TxnState.COMMITTING:
                return False
            if self.state is TxnState.ABORTABLE_ERROR:
                assert self.error is not None
                raise TransactionAbortableError(
                    self.error.error, f"cannot commit, the transaction must be aborted: "
                    f"{self.error}")
            if self.state not in (TxnState.IN_TRANSACTION, TxnState.PREPARED):
                self._refuse("commit_transaction()")
            self.state = TxnState.COMMITTING
            return True

    def start_abort(self) -> bool:
        """abort_transaction(): False when it is a retry of one under way."""
        with self.lock:
            if self.state is TxnState.ABORTING:
                return False
            if self.state not in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR,
                                  TxnState.PREPARED):
                self._refuse("abort_transaction()")
            self.state = TxnState.ABORTING
            return True

    def completed(self) -> None:
        """EndTxn answered (or nothing needed ending): the next transaction may begin."""
        with self.lock:
            if self.state in (TxnState.COMMITTING, TxnState.ABORTING):
                self._clear()
                self.state = TxnState.READY

    def _clear(self) -> None:
        self.added.clear()
        self.adding.clear()
        self.wanted.clear()
        self.started = False
        self.prepared = None
        self.error = None

    @property
    def ending(self) -> bool:
        return self.state in (TxnState.COMMITTING, TxnState.ABORTING)

    # --- errors -----------------------------------------------------------------------------

    def abortable(self, error: KafkaError, new_epoch: bool = False) -> KafkaError:
        """The transaction can only be aborted now; returns the error to raise. An abortable
        error while aborting leaves the abort to be called again."""
        with self.lock:
            if new_epoch:
                self.new_epoch_needed = True
            if self.state is TxnState.FATAL_ERROR:
                assert self.error is not None
                return self.error
            if not isinstance(error, TransactionAbortableError):
                error = TransactionAbortableError(error.error, str(error))
            if self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING,
                              TxnState.PREPARED, TxnState.ABORTING):
                self.error = error
                self.state = TxnState.ABORTABLE_ERROR
            elif self.state is TxnState.ABORTABLE_ERROR:
                self.error = self.error or error  # the first one says why
        self.on_abortable()
        return error

    def fatal(self, error: KafkaError) -> KafkaError:
        with self.lock:
            if self.state is TxnState.FATAL_ERROR:
                assert self.error is not None
                return self.error
            if not isinstance(error, ProducerFatalError):
                error = ProducerFatalError(error.error, str(error))
            self.error = error
            self.state = TxnState.FATAL_ERROR
        self.on_fatal(error)
        return error

    def act(self, api: Api, action: Action, error: KafkaError) -> KafkaError:
        """Carry out ABORTABLE, ABORTABLE_NEW_EPOCH or FATAL for ``error``: the error to
        raise."""
        if action is Action.FATAL:
            return self.fatal(error)
        if api is Api.INIT_PRODUCER_ID:
            return self.fatal(error)  # nothing to abort: the producer cannot go on
        return self.abortable(error, new_epoch=action is Action.ABORTABLE_NEW_EPOCH)

    def batch_failed(self, error: BaseException) -> None:
        """A batch of the transaction failed (the sender tells): fatal or abortable."""
        if self.state in (TxnState.ABORTING, TxnState.FATAL_ERROR, TxnState.UNINITIALIZED,
                          TxnState.INITIALIZING, TxnState.READY):
            return  # aborting anyway, or nothing of a transaction
        if isinstance(error, TransactionAbortedError):
            return
        code = error.error if isinstance(error, KafkaError) else ErrorCode.unknown_server_error
        kafka_error = error if isinstance(error, KafkaError) else KafkaError(code, str(error))
        if code in _FATAL_BATCH:
            self.fatal(kafka_error)
        else:
            self.abortable(kafka_error, new_epoch=True)

    def undrained_error(self) -> KafkaError | None:
        """What a batch not yet sent fails with: it never goes out once the transaction is
        abortable or being aborted (None: it may be sent)."""
        state = self.state
        if state is TxnState.ABORTABLE_ERROR:
            return TransactionAbortedError(
                ErrorCode.transaction_abortable if self.error is None else self.error.error,
                f"not sent: its transaction must be aborted ({self.error})")
        if state is TxnState.ABORTING:
            return TransactionAbortedError(ErrorCode.transaction_abortable,
                                           "not sent: its transaction was aborted")
        return None

    # --- partitions -------------------------------------------------------------------------

    def may_send(self, tp: TopicPartition) -> bool:
        """Whether a batch of ``tp`` may go out; if not, the partition is wanted (added by
        the next AddPartitionsToTxn)."""
        if tp in self.added:
            return True
        with self.lock:
            if tp not in self.adding and self.state in (TxnState.IN_TRANSACTION,
                                                        TxnState.COMMITTING,
                                                        TxnState.PREPARED):
                self.wanted.add(tp)
        return False

    def take_wanted(self) -> list[TopicPartition]:
        """The partitions to add now (none while an AddPartitionsToTxn is in flight)."""
        with self.lock:
            if self.adding or not self.wanted or self.state not in (
                    TxnState.IN_TRANSACTION, TxnState.COMMITTING, TxnState.PREPARED):
                return []
            self.adding, self.wanted = self.wanted, set()
            return sorted(self.adding)

    def partitions_added(self, partitions: list[TopicPartition]) -> None:
        with self.lock:
            self.adding.difference_update(partitions)
            self.added.update(partitions)
            self.started = True

    def partitions_not_added(self, partitions: list[TopicPartition]) -> None:
        with self.lock:
            self.adding.difference_update(partitions)

    def offsets_added(self) -> None:
        with self.lock:
            self.started = True
