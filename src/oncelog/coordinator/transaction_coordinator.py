"""The transaction coordinator: transactional id -> producer id, epoch and transaction state,
kept in ``__transaction_state`` (txn_records.py) and rebuilt from it on start.

A transaction's life (Kafka's TransactionState):

- Empty / CompleteCommit / CompleteAbort: no transaction. InitProducerId bumps the epoch
  (fencing older instances); AddPartitionsToTxn / AddOffsetsToTxn -> Ongoing.
- Ongoing: partitions are added. EndTxn -> PrepareCommit / PrepareAbort (written, then
  answered); InitProducerId of a new instance, or the timeout -> the epoch is bumped and the
  transaction aborted (PrepareEpochFence then PrepareAbort).
- PrepareCommit / PrepareAbort: the markers go to every partition (through the same
  WriteTxnMarkers path a cluster uses), then CompleteCommit / CompleteAbort is written.
  Requests meanwhile get CONCURRENT_TRANSACTIONS, which clients retry.

Every change is written before it is answered or acted on; a write that fails changes nothing
in memory. Transaction version 2 (KIP-890 part 2: EndTxn v5 and later) bumps the epoch at the
end of every transaction, so a delayed write of a finished transaction is fenced.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from . import txn_records as tr
from .group_coordinator import OffsetsLog, WriteFailed, partition_for
from .group_records import BadRecord
from .txn_records import TxnState

log = logging.getLogger(__name__)
E = ErrorCode
S = TxnState
MAX_EPOCH = 32767
COORDINATOR_EPOCH = 0
NO_TIMEOUT_MS = 2**31 - 1  # one broker leads every partition of __transaction_state for good
_MARKER_RETRY_S = 1.0

# (producer id, epoch, commit, coordinator epoch, partitions, transaction version)
#   -> per-partition errors
MarkerWriter = Callable[[int, int, bool, int, list[tuple[str, int]], int],
                        Awaitable[dict[tuple[str, int], ErrorCode]]]


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class TxnConfig:
    num_partitions: int = 50
    max_timeout_ms: int = 900_000
    id_expiration_ms: int = 7 * 24 * 3600 * 1000
    two_phase_commit: bool = False  # transaction.two.phase.commit.enable (KIP-939)


@dataclass(eq=False)
class TxnMeta:
    transactional_id: str
    producer_id: int
    epoch: int
    timeout_ms: int
    state: TxnState = S.EMPTY
    partitions: set[tuple[str, int]] = field(default_factory=set)
    start_ms: int = -1
    last_update_ms: int = -1
    previous_producer_id: int = -1
    previous_epoch: int = -1  # the epoch before the last bump (a retried EndTxn carries it)
    next_producer_id: int = -1
    transaction_version: int = 0
    pending: bool = False  # a write or the markers of a state change are under way

    def value(self, state: TxnState | None = None, **changes) -> tr.TxnValue:
        partitions = changes.pop("partitions", self.partitions)
        by_topic: dict[str, list[int]] = {}
        for topic, p in sorted(partitions):
            by_topic.setdefault(topic, []).append(p)
        fields = {
            "producer_id": self.producer_id, "producer_epoch": self.epoch,
            "timeout_ms": self.timeout_ms, "state": state if state is not None else self.state,
            "partitions": tuple((t, tuple(ps)) for t, ps in by_topic.items()),
            "last_update_ms": self.last_update_ms, "start_ms": self.start_ms,
            "previous_producer_id": self.previous_producer_id,
            "next_producer_id": self.next_producer_id,
            "transaction_version": self.transaction_version,
        }
        fields.update(changes)
        return tr.TxnValue(**fields)

    def apply(self, value: tr.TxnValue) -> None:
        self.producer_id, self.epoch = value.producer_id, value.producer_epoch
        self.timeout_ms, self.state = value.timeout_ms, value.state
        self.partitions = {(t, p) for t, ps in value.partitions for p in ps}
        self.last_update_ms, self.start_ms = value.last_update_ms, value.start_ms
        self.previous_producer_id = value.previous_producer_id
        self.next_producer_id = value.next_producer_id
        self.transaction_version = value.transaction_version


@dataclass
class TxnOverview:
    transactional_id: str
    producer_id: int
    epoch: int
    state: str
    timeout_ms: int
    start_ms: int
    partitions: list[tuple[str, int]]


class TransactionCoordinator:
    def __init__(self, txn_log: OffsetsLog, config: TxnConfig,
                 generate_producer_id: Callable[[], int],
                 partition_exists: Callable[[str, int], bool],
                 write_markers: MarkerWriter,
                 now_ms: Callable[[], int] = _now_ms) -> None:
        self.log = txn_log
        self.config = config
        self.generate_producer_id = generate_producer_id
        self.partition_exists = partition_exists
        self.write_markers = write_markers
        self.now_ms = now_ms
        self.txns: dict[str, TxnMeta] = {}
        self.loading: set[int] = set(range(config.num_partitions))
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self._idle_logged: dict[str, int] = {}  # id -> start of the prepared one logged

    def partition_of(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.config.num_partitions)

    def _background(self, work) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- loading --------------------------------------------------------------------------

    async def load_all(self) -> None:
        for partition in range(self.config.num_partitions):
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
            for txn_id, value in values.items():
                if value is None or value.state is S.DEAD:
                    self.txns.pop(txn_id, None)
                    continue
                meta = TxnMeta(txn_id, value.producer_id, value.producer_epoch, value.timeout_ms)
                meta.apply(value)
                self.txns[txn_id] = meta
                if value.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                    # Decided before the broker stopped: its markers go out now.
                    meta.pending = True
                    self._background(self._complete(meta, value.state is S.PREPARE_COMMIT))
                elif value.state is S.PREPARE_EPOCH_FENCE:
                    meta.pending = True
                    self._background(self._abort_fenced(meta))
            self.loading.discard(partition)

    # --- the checks every request shares ------------------------------------------------

    def _unavailable(self, transactional_id: str | None) -> ErrorCode | None:
        if not transactional_id:
            return E.invalid_request
        if self.partition_of(transactional_id) in self.loading:
            return E.coordinator_load_in_progress
        return None

    def _check(self, meta: TxnMeta | None, producer_id: int, epoch: int) -> ErrorCode | None:
        if meta is None or meta.producer_id != producer_id:
            return E.invalid_producer_id_mapping
        if epoch != meta.epoch:
            return E.producer_fenced
        if meta.pending or meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT,
                                          S.PREPARE_EPOCH_FENCE):
            return E.concurrent_transactions
        return None

    async def _write(self, meta: TxnMeta, value: tr.TxnValue) -> None:
        """Write the transaction's next state, then take it; raises WriteFailed."""
        try:
            durable = self.log.append(self.partition_of(meta.transactional_id),
                                      [(tr.txn_key(meta.transactional_id), tr.txn_value(value))])
        except WriteFailed:
            raise
        if durable is not None:
            try:
                await durable
            except OSError as exc:
                raise WriteFailed(E.kafka_storage_error, str(exc)) from exc
        meta.apply(value)

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
        now = self.now_ms()
        meta = self.txns.get(transactional_id)
        if meta is None:
            meta = TxnMeta(transactional_id, self.generate_producer_id(), -1, timeout_ms,
                           last_update_ms=now)
            value = meta.value(S.EMPTY, producer_epoch=0, timeout_ms=timeout_ms)
            try:
                await self._write(meta, value)
            except WriteFailed as exc:
                return exc.error, -1, -1, -1, -1
            self.txns[transactional_id] = meta
            log.info("transactional id %s: producer id %d, epoch 0", transactional_id,
                     meta.producer_id)
            return E.none, meta.producer_id, 0, -1, -1
        if meta.pending:
            return E.concurrent_transactions, -1, -1, -1, -1
        if producer_id >= 0 and not (
                (producer_id == meta.producer_id and epoch == meta.epoch)
                or (producer_id == meta.previous_producer_id and epoch == meta.previous_epoch)):
            # KIP-360: a producer recovering names its id and epoch; any other is a zombie.
            return E.producer_fenced, -1, -1, -1, -1
        if meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE):
            return E.concurrent_transactions, -1, -1, -1, -1
        if meta.state is S.ONGOING and keep_prepared:
            return await self._keep_prepared(meta, timeout_ms)
        if meta.state is S.ONGOING:
            # A new instance: the old one's transaction is aborted under a bumped epoch; the
            # caller retries once that is done.
            meta.pending = True
            self._background(self._fence_and_abort(meta, timeout_ms))
            return E.concurrent_transactions, -1, -1, -1, -1
        new_id, new_epoch = self._next_epoch(meta)
        value = meta.value(S.EMPTY, producer_id=new_id, producer_epoch=new_epoch,
                           timeout_ms=timeout_ms, partitions=set(), start_ms=-1,
                           last_update_ms=now,
                           previous_producer_id=meta.producer_id)
        previous_epoch = meta.epoch
        try:
            await self._write(meta, value)
        except WriteFailed as exc:
            return exc.error, -1, -1, -1, -1
        meta.previous_epoch = previous_epoch
        log.info("transactional id %s: producer id %d, epoch %d", transactional_id, new_id,
                 new_epoch)
        return E.none, new_id, new_epoch, -1, -1

    async def _keep_prepared(self, meta: TxnMeta, timeout_ms: int
                             ) -> tuple[ErrorCode, int, int, int, int]:
        """KIP-939: a new instance takes over a prepared transaction instead of aborting it.
        The epoch is bumped (the old instance is fenced) and the transaction stays open for
        the new one to commit or abort with EndTxn."""
        if meta.epoch + 1 >= MAX_EPOCH:
            return E.producer_fenced, -1, -1, -1, -1  # the kept transaction keeps its id
        kept = (meta.producer_id, meta.epoch)
        previous_epoch = meta.epoch
        try:
            await self._write(meta, meta.value(S.ONGOING, producer_epoch=meta.epoch + 1,
                                               timeout_ms=timeout_ms,
                                               last_update_ms=self.now_ms()))
        except WriteFailed as exc:
            return exc.error, -1, -1, -1, -1
        meta.previous_epoch = previous_epoch
        log.info("transactional id %s: prepared transaction kept for epoch %d",
                 meta.transactional_id, meta.epoch)
        return E.none, meta.producer_id, meta.epoch, *kept

    def _next_epoch(self, meta: TxnMeta) -> tuple[int, int]:
        """The epoch after this one; a new producer id when the epoch would overflow."""
        if meta.epoch + 1 >= MAX_EPOCH:
            return self.generate_producer_id(), 0
        return meta.producer_id, meta.epoch + 1

    async def _fence_and_abort(self, meta: TxnMeta, timeout_ms: int | None = None) -> None:
        new_id, new_epoch = self._next_epoch(meta)
        now = self.now_ms()
        try:
            await self._write(meta, meta.value(S.PREPARE_EPOCH_FENCE, producer_id=new_id,
                                               producer_epoch=new_epoch, last_update_ms=now,
                                               previous_producer_id=meta.producer_id))
        except WriteFailed as exc:
            log.warning("transactional id %s: fencing failed: %s", meta.transactional_id, exc)
            meta.pending = False
            return
        await self._abort_fenced(meta)

    async def _abort_fenced(self, meta: TxnMeta) -> None:
        try:
            await self._write(meta, meta.value(S.PREPARE_ABORT, last_update_ms=self.now_ms()))
        except WriteFailed as exc:
            log.warning("transactional id %s: aborting failed: %s", meta.transactional_id, exc)
            meta.pending = False
            return
        await self._complete(meta, commit=False)

    # --- AddPartitionsToTxn, AddOffsetsToTxn, verification --------------------------------

    async def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                             partitions: list[tuple[str, int]]
                             ) -> dict[tuple[str, int], ErrorCode]:
        error = self._unavailable(transactional_id)
        meta = self.txns.get(transactional_id)
        if error is None:
            error = self._check(meta, producer_id, epoch)
        if error is not None:
            return dict.fromkeys(partitions, error)
        unknown = [tp for tp in partitions if not self.partition_exists(*tp)]
        if unknown:
            return {tp: E.unknown_topic_or_partition if tp in unknown
                    else E.operation_not_attempted for tp in partitions}
        wanted = set(partitions)
        if meta.state is S.ONGOING and wanted <= meta.partitions:
            return dict.fromkeys(partitions, E.none)
        now = self.now_ms()
        start = meta.start_ms if meta.state is S.ONGOING else now
        value = meta.value(S.ONGOING, partitions=meta.partitions | wanted if
                           meta.state is S.ONGOING else wanted, start_ms=start,
                           last_update_ms=now)
        meta.pending = True
        try:
            await self._write(meta, value)
        except WriteFailed as exc:
            return dict.fromkeys(partitions, exc.error)
        finally:
            meta.pending = False
        return dict.fromkeys(partitions, E.none)

    def verify(self, transactional_id: str | None, producer_id: int, epoch: int,
               topic: str, partition: int) -> ErrorCode:
        """KIP-890 part 1: a transactional batch is appended only when its producer really
        has the partition in an ongoing transaction (AddPartitionsToTxn verify_only)."""
        if transactional_id and self.partition_of(transactional_id) in self.loading:
            # Not known yet (a restart is reading __transaction_state): a retriable answer,
            # as Kafka gives a produce whose verification cannot be made now.
            return E.not_enough_replicas
        meta = self.txns.get(transactional_id or "")
        if meta is None or meta.producer_id != producer_id:
            return E.invalid_producer_id_mapping
        if epoch < meta.epoch:
            return E.invalid_producer_epoch
        if meta.state is not S.ONGOING or epoch != meta.epoch \
                or (topic, partition) not in meta.partitions:
            return E.invalid_txn_state
        return E.none

    # --- EndTxn ---------------------------------------------------------------------------

    async def end_txn(self, transactional_id: str, producer_id: int, epoch: int, commit: bool,
                      bump_epoch: bool) -> tuple[ErrorCode, int, int]:
        """``bump_epoch``: transaction version 2 (EndTxn v5+)."""
        error = self._unavailable(transactional_id)
        if error is not None:
            return error, -1, -1
        meta = self.txns.get(transactional_id)
        if meta is None or producer_id not in (meta.producer_id, meta.previous_producer_id):
            return E.invalid_producer_id_mapping, -1, -1
        done = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
        retried = (epoch == meta.previous_epoch and bump_epoch
                   and producer_id in (meta.producer_id, meta.previous_producer_id))
        if retried and meta.state is done and not meta.pending:
            return E.none, meta.producer_id, meta.epoch  # its answer was lost
        if producer_id != meta.producer_id or epoch != meta.epoch:
            return E.producer_fenced, -1, -1
        if meta.pending:
            return E.concurrent_transactions, -1, -1
        preparing = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        if meta.state is preparing:
            return E.concurrent_transactions, -1, -1
        if meta.state is done and not bump_epoch:
            return E.none, meta.producer_id, meta.epoch
        if meta.state is not S.ONGOING and not (bump_epoch and not commit and meta.state in (
                S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)):
            return E.invalid_txn_state, -1, -1
        changes = {"last_update_ms": self.now_ms(),
                   "transaction_version": 2 if bump_epoch else meta.transaction_version}
        previous_epoch = meta.epoch
        if bump_epoch:
            new_id, new_epoch = self._next_epoch(meta)
            changes.update(producer_id=new_id, producer_epoch=new_epoch,
                           previous_producer_id=meta.producer_id)
        meta.pending = True
        try:
            await self._write(meta, meta.value(preparing, **changes))
        except WriteFailed as exc:
            meta.pending = False
            return exc.error, -1, -1
        if bump_epoch:
            meta.previous_epoch = previous_epoch
        self._background(self._complete(meta, commit))
        return E.none, meta.producer_id, meta.epoch

    async def _complete(self, meta: TxnMeta, commit: bool) -> None:
        """Send the markers of a decided transaction, then write its completion."""
        partitions = sorted(meta.partitions)
        while partitions and not self._closed:
            try:
                errors = await self.write_markers(meta.producer_id, meta.epoch, commit,
                                                  COORDINATOR_EPOCH, partitions,
                                                  meta.transaction_version)
            except Exception:
                log.exception("transactional id %s: writing markers failed",
                              meta.transactional_id)
                errors = dict.fromkeys(partitions, E.unknown_server_error)
            # A partition whose topic is gone needs no marker any more.
            partitions = [tp for tp in partitions
                          if errors.get(tp, E.none) not in (E.none, E.unknown_topic_or_partition)]
            if partitions:
                log.warning("transactional id %s: markers for %s failed (%s); retrying",
                            meta.transactional_id, partitions, errors)
                await asyncio.sleep(_MARKER_RETRY_S)
        if self._closed:
            return
        done = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
        while not self._closed:
            try:
                await self._write(meta, meta.value(done, partitions=set(),
                                                   last_update_ms=self.now_ms()))
                break
            except WriteFailed as exc:
                log.warning("transactional id %s: writing %s failed: %s; retrying",
                            meta.transactional_id, done.label, exc)
                await asyncio.sleep(_MARKER_RETRY_S)
        meta.pending = False
        log.info("transactional id %s: %s (producer id %d, epoch %d)", meta.transactional_id,
                 done.label, meta.producer_id, meta.epoch)

    # --- timeouts and expiry --------------------------------------------------------------

    def abort_timed_out(self) -> int:
        """Abort ongoing transactions older than their timeout, fencing their producer. A
        two-phase commit transaction has none (KIP-939: only its external coordinator ends
        it, however long that takes): one open longer than transaction.max.timeout.ms is
        logged instead, once, as it holds read_committed readers of its partitions back."""
        now = self.now_ms()
        count = 0
        for meta in list(self.txns.values()):
            if meta.timeout_ms == NO_TIMEOUT_MS:
                self._log_idle_prepared(meta, now)
                continue
            if meta.state is S.ONGOING and not meta.pending \
                    and now - meta.start_ms > meta.timeout_ms:
                log.info("transactional id %s: timed out after %d ms; aborting",
                         meta.transactional_id, meta.timeout_ms)
                meta.pending = True
                self._background(self._fence_and_abort(meta))
                count += 1
        return count

    def _log_idle_prepared(self, meta: TxnMeta, now: int) -> None:
        if meta.state is not S.ONGOING:
            self._idle_logged.pop(meta.transactional_id, None)
            return
        if meta.pending or now - meta.start_ms <= self.config.max_timeout_ms or \
                self._idle_logged.get(meta.transactional_id) == meta.start_ms:
            return
        self._idle_logged[meta.transactional_id] = meta.start_ms
        log.warning("transactional id %s: a prepared (two-phase commit) transaction open for "
                    "%d s, on %s: read_committed readers of these partitions wait until its "
                    "coordinator ends it (`oncelog transactions find-prepared` lists such "
                    "transactions; a Spark write's: `oncelog spark recover --prefix P`)",
                    meta.transactional_id, (now - meta.start_ms) // 1000,
                    ", ".join(f"{t}-{p}" for t, p in sorted(meta.partitions)) or "none yet")

    def expire_ids(self) -> int:
        """Forget transactional ids idle for transactional.id.expiration.ms."""
        now = self.now_ms()
        expired = 0
        for meta in list(self.txns.values()):
            if meta.pending or meta.state not in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
                continue
            if now - meta.last_update_ms < self.config.id_expiration_ms:
                continue
            try:
                self.log.append(self.partition_of(meta.transactional_id),
                                [(tr.txn_key(meta.transactional_id), None)])
            except WriteFailed as exc:
                log.warning("transactional id %s: expiring failed: %s", meta.transactional_id,
                            exc)
                continue
            del self.txns[meta.transactional_id]
            expired += 1
        return expired

    # --- describing -----------------------------------------------------------------------

    def overview(self, meta: TxnMeta) -> TxnOverview:
        return TxnOverview(meta.transactional_id, meta.producer_id, meta.epoch,
                           meta.state.label, meta.timeout_ms, meta.start_ms,
                           sorted(meta.partitions))

    def describe(self, transactional_id: str) -> tuple[ErrorCode, TxnOverview | None]:
        error = self._unavailable(transactional_id)
        if error is not None:
            return error, None
        meta = self.txns.get(transactional_id)
        if meta is None:
            return E.transactional_id_not_found, None
        return E.none, self.overview(meta)

    def list(self, states: set[str], producer_ids: set[int], min_duration_ms: int = -1,
             pattern: str | None = None) -> tuple[list[str], list[TxnOverview]]:
        """(unknown state names, the transactions that pass every filter)."""
        known = {s.label for s in TxnState}
        unknown = sorted(states - known)
        regex = re.compile(pattern) if pattern else None
        now = self.now_ms()
        out = []
        for meta in self.txns.values():
            if states and meta.state.label not in states:
                continue
            if producer_ids and meta.producer_id not in producer_ids:
                continue
            if min_duration_ms >= 0 and (meta.state is not S.ONGOING
                                         or now - meta.start_ms < min_duration_ms):
                continue
            if regex is not None and not regex.fullmatch(meta.transactional_id):
                continue
            out.append(self.overview(meta))
        return unknown, out

    def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
