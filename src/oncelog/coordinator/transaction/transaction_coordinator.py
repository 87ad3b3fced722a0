"""The transaction coordinator: transactional id -> producer id, epoch and transaction state,
kept in ``__transaction_state`` (txn_records.py) and rebuilt from it on start.

Every decision is a row of the table in txn_rules.py (Kafka's TransactionMetadata and
TransactionCoordinator rules, state x request x epoch x pending x transaction version); this
module only carries them out. One discipline makes the table true under concurrency: an id is
marked *pending* before the first await of any change (the write to ``__transaction_state``
and its fsync, the markers, the completion), and every request on a pending id is answered
by the table's pending rows (CONCURRENT_TRANSACTIONS), so no two requests ever decide on the
same state. A request that finds its id pending first waits, up to ``PENDING_WAIT_S``, for the
step to release it, and is decided on what the step left (the pending rows answer only when
the wait runs out): a transaction begun right after a commit is added once the commit's
markers are in, instead of being refused. librdkafka needs that: after a refused
AddPartitionsToTxn it still sends EndTxn on abort_transaction(), which the completed commit
then answers INVALID_TXN_STATE, a fatal error (librdkafka issue #4849; Kafka answers so too).
A change is written before it is answered or acted on; a write that fails changes nothing in
memory. The steps no client waits for (the fence and abort of a timed-out
or replaced transaction, the markers and the completion) retry a failed write until it is
taken, so nothing is left half done until a restart.

In a cluster the coordinator may lose an id's partition of ``__transaction_state`` and lead
it again while a step of the old lead still runs (a marker round can take 30 s). Every step
carries the ticket of the ownership it began under (ownership.py ``owns``) and reads, writes
or releases the id only while that ownership lasts: the new lead loaded the id back from the
log and runs its own steps on it, so an old step that went on would decide a second time on
the same state (complete a transaction whose markers the new lead is still sending, or
release an id the new lead holds pending).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ...protocol.client_regex import compile_client_regex
from ..group.group_records import MAX_STRING_BYTES, BadRecord
from ..internal_log import (
    KeysByPartition,
    OffsetsLog,
    WriteFailed,
    durable_error,
    partition_for,
)
from ..ownership import Load, Ownership, load_each, load_retrying
from . import txn_records as tr
from . import txn_rules as rules
from .txn_records import TxnState
from .txn_rules import NEW_ID, Decision, Entry

log = logging.getLogger(__name__)
E = ErrorCode
S = TxnState
NO_TIMEOUT_MS = 2**31 - 1  # one broker leads every partition of __transaction_state for good
_RETRY_S = 1.0  # between attempts of a marker or state write nobody waits for
# How long a request on a pending id waits for its release: a marker round with a retry or
# two (_RETRY_S) while a leader moves, well under every client's request timeout (librdkafka
# 60 s, Java 30 s). It holds back only the coordinator's own traffic on the connection:
# librdkafka talks to the coordinator on a connection of its own, and Java's Sender sends
# no produce while a transactional request is in flight.
PENDING_WAIT_S = 5.0

# (producer id, epoch, commit, coordinator epoch, partitions, transaction version, current:
# whether this coordinator still is the transaction's at that coordinator epoch)
#   -> per-partition errors
MarkerWriter = Callable[[int, int, bool, int, list[tuple[str, int]], int, Callable[[], bool]],
                        Awaitable[dict[tuple[str, int], ErrorCode]]]


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class TxnConfig:
    num_partitions: int = 50
    max_timeout_ms: int = 900_000
    id_expiration_ms: int = 7 * 24 * 3600 * 1000
    two_phase_commit: bool = False  # transaction.two.phase.commit.enable (KIP-939)


@dataclass
class TxnOverview:
    transactional_id: str
    producer_id: int
    epoch: int
    state: str
    timeout_ms: int
    start_ms: int
    partitions: list[tuple[str, int]]



def _value(entry: Entry) -> tr.TxnValue:
    by_topic: dict[str, list[int]] = {}
    for topic, p in sorted(entry.partitions):
        by_topic.setdefault(topic, []).append(p)
    return tr.TxnValue(entry.producer_id, entry.epoch, entry.timeout_ms, entry.state,
                       tuple((t, tuple(ps)) for t, ps in by_topic.items()),
                       entry.last_update_ms, entry.start_ms, entry.previous_producer_id,
                       entry.next_producer_id, entry.transaction_version)


def _entry(value: tr.TxnValue) -> Entry:
    return Entry(value.producer_id, value.producer_epoch, value.state, value.timeout_ms,
                 frozenset((t, p) for t, ps in value.partitions for p in ps),
                 value.start_ms, value.last_update_ms, value.previous_producer_id,
                 value.next_producer_id, value.transaction_version)


class RequestFailed(Exception):
    def __init__(self, error: ErrorCode) -> None:
        super().__init__(error.name)
        self.error = error


class TransactionCoordinator:
    def __init__(self, txn_log: OffsetsLog, config: TxnConfig,
                 generate_producer_id: Callable[[], int],
                 partition_exists: Callable[[str, int], bool],
                 write_markers: MarkerWriter,
                 now_ms: Callable[[], int] = _now_ms, owns_all: bool = True) -> None:
        self.log = txn_log
        self.config = config
        self.generate_producer_id = generate_producer_id
        self.partition_exists = partition_exists
        self.write_markers = write_markers
        self.now_ms = now_ms
        self.retry_s = _RETRY_S
        # Every id's Entry; an id whose first record is being written has epoch -1.
        self.txns: dict[str, Entry] = KeysByPartition(self.partition_of)
        # Which partitions of __transaction_state this coordinator serves, at which
        # coordinator epoch (ownership.py): all on one broker, those it leads in a cluster.
        self.ownership = Ownership()
        # One broker (``owns_all``): every partition loading from the start, at epoch 0.
        self._initial = [self.ownership.elect(p, 0) for p in range(config.num_partitions)] \
            if owns_all else []
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self._idle_logged: dict[str, int] = {}  # id -> start of the prepared one logged
        self.pending_wait_s = PENDING_WAIT_S
        # Requests waiting for a pending id's release (``_settled``), woken when it is
        # released or dropped; at most one per request being handled.
        self._waiting: dict[str, dict[asyncio.Future, None]] = {}  # in arrival order

    def partition_of(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.config.num_partitions)

    def _background(self, work) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _known(self, transactional_id: str | None) -> Entry | None:
        """The id's Entry, if its first record is written."""
        entry = self.txns.get(transactional_id or "")
        return None if entry is None or entry.epoch < 0 else entry

    # --- loading --------------------------------------------------------------------------

    async def load_all(self) -> None:
        """One broker: it owns every partition (at coordinator epoch 0), each answering
        COORDINATOR_LOAD_IN_PROGRESS until it is read (a failed load: ownership.py O12).
        In a cluster: nothing (``elect``)."""
        loads, self._initial = self._initial, []
        await load_each(self.ownership, loads, self._load_logged, "__transaction_state")

    def elect(self, partition: int, epoch: int) -> None:
        """This broker leads ``partition`` of __transaction_state at leader ``epoch``
        (ownership.py): its transactional ids are loaded in the background, and ``epoch``
        goes with the markers of their transactions."""
        load = self.ownership.elect(partition, epoch)
        if load is not None:
            log.info("__transaction_state-%d: loading (coordinator epoch %d)", partition, epoch)
            self._background(self._load_logged(load))

    async def _load_logged(self, load: Load) -> None:
        """The load, and its retries while it fails (ownership.py O12-O16)."""
        await load_retrying(self.ownership, load, self._load, self._drop, self._background,
                            "__transaction_state")

    def resign(self, partition: int, epoch: int | None) -> None:
        """This broker no longer leads ``partition``: its ids are dropped (their steps in
        the background stop at their next write: ``_write`` checks the ownership)."""
        if not self.ownership.resign(partition, epoch):
            return
        log.info("__transaction_state-%d: resigned at leader epoch %s, %d ids dropped",
                 partition, epoch, self._drop(partition))

    def _drop(self, partition: int) -> int:
        """The partition's ids dropped (their steps in the background stop at their next
        write); how many."""
        gone = self.txns.keys_of(partition)
        for txn_id in gone:
            del self.txns[txn_id]
            self._wake(txn_id)
        return len(gone)

    async def _load(self, load: Load) -> None:
        partition = load.partition
        values: dict[str, tr.TxnValue | None] = {}
        for i, (key, value, *_rest) in enumerate(self.log.read(partition)):
            if i % 2000 == 1999:
                await asyncio.sleep(0)
            if key is None:
                continue
            try:
                txn_id = tr.read_txn_key(key)
                values[txn_id] = None if value is None else tr.read_txn_value(value)
            except BadRecord as exc:
                log.warning("__transaction_state-%d: skipping a record: %s", partition, exc)
        if not self.ownership.loaded(load):
            log.info("__transaction_state-%d: resigned while loading; the load is dropped",
                     partition)
            return
        for txn_id, value in values.items():
            if value is None or value.state is S.DEAD:
                self.txns.pop(txn_id, None)
                continue
            entry = _entry(value)
            if value.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                # L1: decided before the broker stopped: its markers go out now.
                self.txns[txn_id] = dataclasses.replace(entry, pending=True)
                self._background(self._complete(txn_id, load.ticket))
            elif value.state is S.PREPARE_EPOCH_FENCE:
                self.txns[txn_id] = dataclasses.replace(entry, pending=True)  # L2
                self._background(self._abort_fenced(txn_id, load.ticket))
            else:
                self.txns[txn_id] = entry

    # --- carrying a decision out ----------------------------------------------------------

    async def _settled(self, transactional_id: str) -> ErrorCode | None:
        """``_unavailable``, once the id is not pending: a request meeting a pending id
        waits, up to ``pending_wait_s`` in all, for the step to release it, then is decided
        on what the step left; still pending then, the table's pending rows answer it.
        Woken, it may find the id taken again (another request woken with it, or arriving
        meanwhile, decided first): it waits on, within the same bound."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.pending_wait_s
        while True:
            error = self._unavailable(transactional_id)  # the lead may have moved meanwhile
            entry = self.txns.get(transactional_id)
            left = deadline - loop.time()
            if error is not None or entry is None or not entry.pending or left <= 0:
                return error
            woken = loop.create_future()
            waiting = self._waiting.setdefault(transactional_id, {})
            waiting[woken] = None
            try:
                await asyncio.wait((woken,), timeout=left)
            finally:
                waiting.pop(woken, None)
                # _wake took this one out already: a list there now is newer waiters'
                if not waiting and self._waiting.get(transactional_id) is waiting:
                    del self._waiting[transactional_id]

    def _wake(self, txn_id: str) -> None:
        for woken in self._waiting.pop(txn_id, ()):
            if not woken.done():
                woken.set_result(None)

    def _unavailable(self, transactional_id: str | None) -> ErrorCode | None:
        # An id its record key cannot hold (an int16-length STRING) is refused as the empty
        # one is, before anything is decided or written for it.
        if not transactional_id or (len(transactional_id) > MAX_STRING_BYTES // 4
                                    and len(transactional_id.encode()) > MAX_STRING_BYTES):
            return E.invalid_request
        return self.ownership.error(self.partition_of(transactional_id))

    def _hold(self, txn_id: str) -> Entry | None:
        """Mark the id pending (the caller has decided to change it); None: unknown."""
        entry = self.txns.get(txn_id)
        if entry is not None:
            self.txns[txn_id] = dataclasses.replace(entry, pending=True)
        return entry

    def _release(self, txn_id: str, ticket: int) -> None:
        entry = self.txns.get(txn_id)
        if entry is None or not self.ownership.owns(self.partition_of(txn_id), ticket):
            return  # another lead's (or nobody's) now: not this step's to release
        if entry.epoch < 0:
            del self.txns[txn_id]  # its first record was never written
        else:
            self.txns[txn_id] = dataclasses.replace(entry, pending=False)
        self._wake(txn_id)

    async def _write(self, txn_id: str, entry: Entry, ticket: int) -> None:
        """Write the id's next Entry and take it (still pending) once durable, while the
        partition is still owned since ``ticket`` (the step's own); raises WriteFailed and
        changes nothing when the log does not take it."""
        partition = self.partition_of(txn_id)
        if not self.ownership.owns(partition, ticket):
            raise WriteFailed(E.not_coordinator, f"__transaction_state-{partition} is not "
                                                 f"led here any more")
        durable = self.log.append(partition,
                                  [(tr.txn_key(txn_id), tr.txn_value(_value(entry)))])
        if durable is not None:
            try:
                await durable
            except OSError as exc:
                raise WriteFailed(durable_error(exc), str(exc)) from exc
        if not self.ownership.owns(partition, ticket):  # resigned meanwhile: not ours
            raise WriteFailed(E.not_coordinator, f"__transaction_state-{partition}: "
                                                 f"resigned while the write waited")
        self.txns[txn_id] = dataclasses.replace(entry, pending=True)

    async def _write_until_taken(self, txn_id: str, entry: Entry, ticket: int) -> bool:
        """A step nobody waits for: retried until the log takes it (False: closed, or the
        ownership ``ticket`` is over: another lead goes on from the log)."""
        partition = self.partition_of(txn_id)
        while not self._closed and self.ownership.owns(partition, ticket):
            try:
                await self._write(txn_id, entry, ticket)
                return True
            except WriteFailed as exc:
                log.warning("transactional id %s: writing %s failed: %s; retrying", txn_id,
                            entry.state.label, exc)
                await asyncio.sleep(self.retry_s)
        return False

    async def _carry_out(self, txn_id: str, decision: Decision) -> Decision:
        """Write what ``decision`` writes (the id pending meanwhile), start what follows it;
        the decision once written, with any new producer id filled in."""
        ticket = self.ownership.ticket(self.partition_of(txn_id))  # owned: asked only then
        if decision.then == rules.FENCE:
            self._hold(txn_id)
            self._background(self._fence_and_abort(txn_id, ticket))
            return decision
        if decision.write is None:
            return decision
        entry, new_id = decision.write, -1
        if NEW_ID in (entry.producer_id, entry.next_producer_id):
            new_id = self.generate_producer_id()
            entry = dataclasses.replace(
                entry,
                producer_id=new_id if entry.producer_id == NEW_ID else entry.producer_id,
                next_producer_id=new_id if entry.next_producer_id == NEW_ID else -1)
        if self._hold(txn_id) is None:
            # A new id: held from now on with no record yet, so a second InitProducerId
            # meanwhile is answered CONCURRENT_TRANSACTIONS, not given an id of its own.
            self.txns[txn_id] = dataclasses.replace(entry, epoch=-1, pending=True)
        try:
            await self._write(txn_id, entry, ticket)
        except WriteFailed as exc:
            self._release(txn_id, ticket)
            raise RequestFailed(exc.error) from exc
        if decision.then == rules.MARKERS:
            self._background(self._complete(txn_id, ticket))
        else:
            self._release(txn_id, ticket)
        if decision.producer_id == NEW_ID:
            decision = dataclasses.replace(decision, producer_id=new_id)
        return decision

    # --- InitProducerId -------------------------------------------------------------------

    async def init_producer_id(self, transactional_id: str, timeout_ms: int, producer_id: int,
                               epoch: int) -> tuple[ErrorCode, int, int]:
        """(error, producer id, epoch)."""
        result = await self.init(transactional_id, timeout_ms, producer_id, epoch)
        return result[:3]

    async def init(self, transactional_id: str, timeout_ms: int, producer_id: int, epoch: int,
                   two_phase: bool = False, keep_prepared: bool = False
                   ) -> tuple[ErrorCode, int, int, int, int]:
        """InitProducerId: (error, producer id, epoch, and with ``keep_prepared`` (KIP-939)
        the kept ongoing transaction's producer id and epoch, else -1, -1)."""
        error = self._unavailable(transactional_id)
        if error is not None:
            return error, -1, -1, -1, -1
        if (two_phase or keep_prepared) and not self.config.two_phase_commit:
            return E.transactional_id_authorization_failed, -1, -1, -1, -1
        if two_phase:
            # An external coordinator decides when the transaction ends: no timeout aborts it.
            timeout_ms = NO_TIMEOUT_MS
        elif not 0 < timeout_ms <= self.config.max_timeout_ms:
            return E.invalid_transaction_timeout, -1, -1, -1, -1
        error = await self._settled(transactional_id)
        if error is not None:
            return error, -1, -1, -1, -1
        request = rules.Init(timeout_ms, self.now_ms(), producer_id, epoch, keep_prepared)
        decision = rules.decide(self.txns.get(transactional_id), request)
        try:
            decision = await self._carry_out(transactional_id, decision)
        except RequestFailed as exc:
            return exc.error, -1, -1, -1, -1
        if decision.error is E.none and decision.write is not None:
            log.info("transactional id %s: producer id %d, epoch %d (%s)", transactional_id,
                     decision.producer_id, decision.epoch, decision.row)
        return decision.error, decision.producer_id, decision.epoch, *decision.kept

    def _step_entry(self, txn_id: str, ticket: int) -> Entry | None:
        """The id's Entry for a step begun under ``ticket``; None once that ownership is
        over (resigned before the step ran: the next lead goes on from the log)."""
        if not self.ownership.owns(self.partition_of(txn_id), ticket):
            return None
        return self.txns.get(txn_id)

    async def _fence_and_abort(self, txn_id: str, ticket: int) -> None:
        """X1 then X2: the ongoing transaction's producer is fenced, then it is aborted."""
        entry = self._step_entry(txn_id, ticket)
        if entry is None:
            return
        try:
            await self._write(txn_id, rules.fenced(entry, self.now_ms()), ticket)
        except WriteFailed as exc:
            # Still Ongoing, nothing answered: the next InitProducerId or timeout fences.
            log.warning("transactional id %s: fencing failed: %s", txn_id, exc)
            self._release(txn_id, ticket)
            return
        await self._abort_fenced(txn_id, ticket)

    async def _abort_fenced(self, txn_id: str, ticket: int) -> None:
        entry = self._step_entry(txn_id, ticket)
        if entry is None:
            return
        if await self._write_until_taken(txn_id, rules.abort_fenced(entry, self.now_ms()),
                                         ticket):
            await self._complete(txn_id, ticket)

    # --- AddPartitionsToTxn, AddOffsetsToTxn, verification --------------------------------

    async def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                             partitions: list[tuple[str, int]], wait: bool = True
                             ) -> dict[tuple[str, int], ErrorCode]:
        """``wait``: for a pending id's step (``_settled``); not for the entries of a
        brokers' AddPartitionsToTxn v4, which may name one id many times."""
        error = await self._settled(transactional_id) if wait \
            else self._unavailable(transactional_id)
        if error is not None:
            return dict.fromkeys(partitions, error)
        wanted = frozenset(partitions)
        unknown = {tp for tp in wanted if not self.partition_exists(*tp)}
        decision = rules.decide(self.txns.get(transactional_id),
                                rules.Add(producer_id, epoch, wanted, self.now_ms()))
        if decision.error is E.none and unknown:
            return {tp: E.unknown_topic_or_partition if tp in unknown
                    else E.operation_not_attempted for tp in partitions}
        try:
            decision = await self._carry_out(transactional_id, decision)
        except RequestFailed as exc:
            return dict.fromkeys(partitions, exc.error)
        return dict.fromkeys(partitions, decision.error)

    def verify(self, transactional_id: str | None, producer_id: int, epoch: int,
               topic: str, partition: int) -> ErrorCode:
        """KIP-890 part 1: a transactional batch is appended only when its producer really
        has the partition in an ongoing transaction (AddPartitionsToTxn verify_only). The
        coordinator's answer, as Kafka's gives it (txn_rules V0-V3); how a produce or a
        TxnOffsetCommit is answered for it is broker/txn_verification.py's (P1-P5, W1-W5)."""
        not_served = self.ownership.error(self.partition_of(transactional_id)) \
            if transactional_id else None
        return rules.verify(not_served, self._known(transactional_id), producer_id, epoch,
                            (topic, partition))

    # --- EndTxn ---------------------------------------------------------------------------

    async def end_txn(self, transactional_id: str, producer_id: int, epoch: int, commit: bool,
                      bump_epoch: bool) -> tuple[ErrorCode, int, int]:
        """``bump_epoch``: transaction version 2 (EndTxn v5+), this request's only."""
        error = await self._settled(transactional_id)
        if error is not None:
            return error, -1, -1
        request = rules.End(producer_id, epoch, commit, 2 if bump_epoch else 0, self.now_ms())
        decision = rules.decide(self.txns.get(transactional_id), request)
        try:
            decision = await self._carry_out(transactional_id, decision)
        except RequestFailed as exc:
            return exc.error, -1, -1
        if decision.error is not E.none:
            return decision.error, -1, -1
        return E.none, decision.producer_id, decision.epoch

    async def _complete(self, txn_id: str, ticket: int) -> None:
        """M1-M3: send the markers of a decided transaction, then write its completion."""
        entry = self._step_entry(txn_id, ticket)
        if entry is None:
            return
        commit = entry.state is S.PREPARE_COMMIT
        partitions = sorted(entry.partitions)
        state_partition = self.partition_of(txn_id)
        while partitions and not self._closed and self.ownership.owns(state_partition, ticket):
            # Kafka's coordinatorEpoch: the leader epoch of the id's partition, which
            # fences the markers of a coordinator deposed since.
            coordinator_epoch = self.ownership.epoch(state_partition)

            def current(epoch=coordinator_epoch) -> bool:
                return not self._closed and self.ownership.owns(state_partition, ticket) \
                    and self.ownership.epoch(state_partition) == epoch
            try:
                errors = await self.write_markers(entry.producer_id, entry.epoch, commit,
                                                  coordinator_epoch, partitions,
                                                  entry.transaction_version, current)
            except Exception:
                log.exception("transactional id %s: writing markers failed", txn_id)
                errors = dict.fromkeys(partitions, E.unknown_server_error)
            verdict, partitions = rules.after_markers(
                {tp: errors.get(tp, E.none) for tp in partitions})
            if verdict == rules.STOP:
                log.warning("transactional id %s: markers for %s refused as fenced (%s); "
                            "not sent again (M2)", txn_id, partitions,
                            {tp: errors[tp].name for tp in partitions})
                return
            if partitions:
                log.warning("transactional id %s: markers for %s failed (%s); retrying",
                            txn_id, partitions, errors)
                await asyncio.sleep(self.retry_s)
        if partitions:  # the ownership ended (or closed) with markers unsent: not ours now
            return
        if not await self._write_until_taken(txn_id, rules.completed(entry, self.now_ms()),
                                             ticket):
            return
        self._release(txn_id, ticket)
        done = self.txns[txn_id]
        log.info("transactional id %s: %s (producer id %d, epoch %d)", txn_id,
                 done.state.label, done.producer_id, done.epoch)

    # --- timeouts and expiry --------------------------------------------------------------

    def abort_timed_out(self) -> int:
        """Abort ongoing transactions older than their timeout, fencing their producer. A
        two-phase commit transaction has none (KIP-939: only its external coordinator ends
        it, however long that takes): one open longer than transaction.max.timeout.ms is
        logged instead, once, as it holds read_committed readers of its partitions back."""
        now = self.now_ms()
        count = 0
        for txn_id, entry in list(self.txns.items()):
            if entry.timeout_ms == NO_TIMEOUT_MS:  # two-phase commit: never timed out
                self._log_idle_prepared(txn_id, entry, now)
                continue
            if entry.state is S.ONGOING and not entry.pending \
                    and now - entry.start_ms > entry.timeout_ms:
                log.info("transactional id %s: timed out after %d ms; aborting", txn_id,
                         entry.timeout_ms)
                self._hold(txn_id)
                self._background(self._fence_and_abort(
                    txn_id, self.ownership.ticket(self.partition_of(txn_id))))
                count += 1
        return count

    def _log_idle_prepared(self, txn_id: str, entry: Entry, now: int) -> None:
        if entry.state is not S.ONGOING:
            self._idle_logged.pop(txn_id, None)
            return
        if entry.pending or now - entry.start_ms <= self.config.max_timeout_ms or \
                self._idle_logged.get(txn_id) == entry.start_ms:
            return
        self._idle_logged[txn_id] = entry.start_ms
        log.warning("transactional id %s: a prepared (two-phase commit) transaction open for "
                    "%d s, on %s: read_committed readers of these partitions wait until its "
                    "coordinator ends it (`oncelog transactions find-prepared` lists such "
                    "transactions; a Spark write's: `oncelog spark recover --prefix P`)",
                    txn_id, (now - entry.start_ms) // 1000,
                    ", ".join(f"{t}-{p}" for t, p in sorted(entry.partitions)) or "none yet")

    def expire_ids(self) -> int:
        """Forget transactional ids idle for transactional.id.expiration.ms."""
        now = self.now_ms()
        expired = 0
        for txn_id, entry in list(self.txns.items()):
            if entry.pending or entry.epoch < 0 or entry.state not in (
                    S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
                continue
            if now - entry.last_update_ms < self.config.id_expiration_ms:
                continue
            try:
                self.log.append(self.partition_of(txn_id), [(tr.txn_key(txn_id), None)])
            except WriteFailed as exc:
                log.warning("transactional id %s: expiring failed: %s", txn_id, exc)
                continue
            del self.txns[txn_id]
            expired += 1
        return expired

    # --- describing -----------------------------------------------------------------------

    @staticmethod
    def overview(txn_id: str, entry: Entry) -> TxnOverview:
        return TxnOverview(txn_id, entry.producer_id, entry.epoch, entry.state.label,
                           entry.timeout_ms, entry.start_ms, sorted(entry.partitions))

    def describe(self, transactional_id: str) -> tuple[ErrorCode, TxnOverview | None]:
        error = self._unavailable(transactional_id)
        if error is not None:
            return error, None
        entry = self._known(transactional_id)
        if entry is None:
            return E.transactional_id_not_found, None
        return E.none, self.overview(transactional_id, entry)

    def listing_error(self) -> ErrorCode | None:
        """ListTransactions' error while a partition this broker leads is not loaded
        (ownership.py ``incomplete``), else None."""
        return self.ownership.incomplete(self.config.num_partitions)

    def list(self, states: set[str], producer_ids: set[int], min_duration_ms: int = -1,
             pattern: str | None = None) -> tuple[list[str], list[TxnOverview]]:
        """(unknown state names, the transactions that pass every filter); raises
        InvalidClientRegex for a pattern RE2 refuses (KIP-1152: RE2/J, a full match)."""
        known = {s.label for s in TxnState}
        unknown = sorted(states - known)
        regex = compile_client_regex(pattern) if pattern else None
        now = self.now_ms()
        out = []
        for txn_id, entry in self.txns.items():
            if entry.epoch < 0:
                continue
            if states and entry.state.label not in states:
                continue
            if producer_ids and entry.producer_id not in producer_ids:
                continue
            if min_duration_ms >= 0 and (entry.state is not S.ONGOING
                                         or now - entry.start_ms < min_duration_ms):
                continue
            if regex is not None and not regex.fullmatch(txn_id):
                continue
            out.append(self.overview(txn_id, entry))
        return unknown, out

    def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
