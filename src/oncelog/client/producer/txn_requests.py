"""The transactional producer's requests to its coordinators: FindCoordinator (key type 1
for the transactional id, 0 for a group), InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, TxnOffsetCommit (to the group's coordinator) and EndTxn.

This module does the I/O, in the sender's event loop; what an answer means and what the
producer's state becomes is transactions.py's (``judge``, TransactionManager). Each call
retries what the rules say to retry until its deadline; one AddPartitionsToTxn is in flight
at a time, as in Kafka's client, and EndTxn waits for it.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.schema import build
from ..network import calls
from ..network.aio_connection import AsyncBrokerConnection
from ..network.connection import KafkaError, KafkaTimeout
from ..topic_partition import OffsetAndMetadata, TopicPartition
from .transactions import (
    TRANSACTION_COORDINATOR,
    TWO_PHASE_FROM,
    Action,
    Api,
    GroupMetadata,
    PreparedTxnState,
    TransactionManager,
    TxnState,
    judge,
)

if TYPE_CHECKING:
    from ..metrics import ProducerMetrics
    from .accumulator import RecordAccumulator
    from .idempotence import IdempotenceManager
    from .producer_config import ProducerConfig


class SenderHost(Protocol):
    """What the transaction requests use of the Sender that owns them (sender.py): its
    config, accumulator, idempotence manager, metrics and clock, a call on the transaction
    coordinator's connection, and waking its loop."""

    config: ProducerConfig
    acc: RecordAccumulator
    idem: IdempotenceManager
    metrics: ProducerMetrics
    clock: Callable[[], float]

    async def _control_call(self, api_key: int, make) -> object: ...

    def _wake(self) -> None: ...


log = logging.getLogger(__name__)

# When several partitions of one answer disagree, the most telling action wins; a partition
# the coordinator did not attempt (OPERATION_NOT_ATTEMPTED) says nothing of its own.
_PRECEDENCE = (Action.FATAL, Action.ABORTABLE_NEW_EPOCH, Action.FIND_COORDINATOR,
               Action.RETRY, Action.ABORTABLE, Action.DONE)


def _worst(api: Api, errors: list[ErrorCode]) -> tuple[Action, ErrorCode]:
    attempted = [e for e in errors if e != ErrorCode.operation_not_attempted] or errors
    judged = [(judge(api, e), e) for e in attempted] or [(Action.DONE, ErrorCode.none)]
    return min(judged, key=lambda item: _PRECEDENCE.index(item[0]))


class TransactionalRequests:
    def __init__(self, sender: SenderHost, txn: TransactionManager) -> None:
        self.sender = sender
        self.txn = txn
        self.config = sender.config
        self.coordinators: dict[tuple[int, str], AsyncBrokerConnection] = {}
        self._adding: asyncio.Task | None = None
        self._ending: asyncio.Task | None = None
        self._initializing: asyncio.Task | None = None

    @property
    def idem(self):
        return self.sender.idem

    # --- coordinators -----------------------------------------------------------------------

    async def _coordinator(self, key_type: int, key: str, deadline: float
                           ) -> AsyncBrokerConnection:
        conn = self.coordinators.get((key_type, key))
        if conn is not None and not conn.closed:
            return conn
        api = Api.FIND_COORDINATOR
        while True:
            try:
                response = await self.sender._control_call(
                    apis.FIND_COORDINATOR, calls.find_coordinator_request(key, key_type))
                found = calls.find_coordinator_result(response)
                error = ErrorCode(found.error)
            except KafkaError as exc:
                if exc.error == ErrorCode.unsupported_version:
                    raise self.txn.fatal(exc) from None
                found, error = None, exc.error
            action = judge(api, error)
            if action is Action.DONE:
                assert found is not None
                conn = await AsyncBrokerConnection.open(
                    found.host, found.port, self.config.client_id, self.config.request_timeout,
                    self.config.security)
                self.coordinators[(key_type, key)] = conn
                log.debug("%s coordinator of %r: node %d at %s:%d",
                          "transaction" if key_type else "group", key, found.node_id,
                          found.host, found.port)
                return conn
            if action not in (Action.RETRY, Action.FIND_COORDINATOR):
                raise self.txn.act(api, action, KafkaError(error, f"FindCoordinator {key!r}"))
            await self._backoff(deadline, api, error)

    def _forget(self, key_type: int, key: str) -> None:
        conn = self.coordinators.pop((key_type, key), None)
        if conn is not None:
            conn.close()

    async def _backoff(self, deadline: float, api: Api, error: ErrorCode) -> None:
        if self.sender.clock() + self.config.retry_backoff >= deadline:
            raise KafkaTimeout(f"{api.value}: not done within the timeout (last answer: "
                               f"{error.name.upper()})")
        await asyncio.sleep(self.config.retry_backoff)

    async def _call(self, api: Api, api_key: int, make: Callable[[Any, int], Any],
                    errors: Callable[[Any], list[ErrorCode]], deadline: float,
                    key_type: int = TRANSACTION_COORDINATOR, key: str | None = None,
                    check_version: Callable[[int], None] | None = None) -> Any:
        """Send ``api`` to the coordinator until the rules say it is done (its answer), or
        raise what they say (abortable or fatal), or KafkaTimeout at ``deadline``."""
        key = self.txn.transactional_id if key is None else key
        while True:
            try:
                conn = await self._coordinator(key_type, key, deadline)
                if check_version is not None:
                    check_version(conn.versions.get(api_key, -1))
                response = await conn.request(api_key, make)
                action, error = _worst(api, errors(response))
            except KafkaError as exc:
                if exc.fatal or exc.abortable:  # the rules acted on it already
                    raise
                if exc.error == ErrorCode.unsupported_version:
                    raise self.txn.fatal(exc) from None
                action, error = Action.FIND_COORDINATOR, exc.error  # no answer
            if action is Action.DONE:
                return response
            if action is Action.FIND_COORDINATOR:
                self._forget(key_type, key)
            if action in (Action.RETRY, Action.FIND_COORDINATOR):
                log.debug("%s: %s, %s", api.value, error.name.upper(), action.value)
                await self._backoff(deadline, api, error)
                continue
            raise self.txn.act(api, action, KafkaError(error, api.value))

    # --- InitProducerId ---------------------------------------------------------------------

    async def init_transactions(self, timeout: float, keep_prepared: bool) -> None:
        """InitProducerId with the transactional id: a shielded task, so that a call that
        timed out can be made again and wait for the same one."""
        if self._initializing is None or self._initializing.done():
            self._initializing = asyncio.get_running_loop().create_task(
                self._init(self.sender.clock() + self.config.max_block, keep_prepared))
        await _wait(self._initializing, timeout)
        self._initializing = None

    async def _init(self, deadline: float, keep_prepared: bool) -> None:
        response = await self._init_producer_id(deadline, keep_prepared, bump=False)
        prepared = None
        ongoing = getattr(response, "ongoing_txn_producer_id", -1)
        if keep_prepared and ongoing >= 0:
            prepared = PreparedTxnState(ongoing, response.ongoing_txn_producer_epoch)
            log.info("transactional id %r: a prepared transaction is kept (%s)",
                     self.txn.transactional_id, prepared)
        self.txn.initialized(prepared)

    async def _init_producer_id(self, deadline: float, keep_prepared: bool,
                                bump: bool) -> Any:
        txn = self.txn

        def make(mod, version):
            # The current producer id and epoch (v3+, KIP-360) tell the coordinator this is
            # the same producer asking for a new epoch, not a new instance.
            return calls.init_producer_id_request(
                mod, txn.transactional_id, datetime.timedelta(milliseconds=txn.timeout_ms),
                self.idem.producer_id, self.idem.epoch, txn.two_phase, keep_prepared)

        def check(version: int) -> None:
            if keep_prepared and version < TWO_PHASE_FROM:
                raise KafkaError(ErrorCode.unsupported_version,
                                 f"keep_prepared_txn needs InitProducerId v6 (KIP-939); the "
                                 f"coordinator speaks v{version}")
            if txn.two_phase and version < TWO_PHASE_FROM:
                raise KafkaError(ErrorCode.unsupported_version,
                                 "transaction.two.phase.commit.enable needs InitProducerId "
                                 f"v6 (KIP-939); the coordinator speaks v{version}")

        response = await self._call(Api.INIT_PRODUCER_ID, apis.INIT_PRODUCER_ID, make,
                                    lambda r: [ErrorCode(r.error_code)], deadline,
                                    check_version=check)
        self.restart(response.producer_id, response.producer_epoch,
                     "epoch bump" if bump else "InitProducerId")
        return response

    def restart(self, producer_id: int, epoch: int, why: str) -> None:
        """A new producer id or epoch: every partition's sequences start at 0 again."""
        bumped = self.idem.producer_id >= 0
        self.idem.restart(producer_id, epoch)
        self.sender.acc.restart_sequences()
        if bumped:
            self.sender.metrics.epoch_bumped()
        log.info("transactional id %r: producer id %d epoch %d (%s)",
                 self.txn.transactional_id, producer_id, epoch, why)

    # --- AddPartitionsToTxn ----------------------------------------------------------------

    def maybe_add_partitions(self) -> None:
        """Start an AddPartitionsToTxn for the partitions batches wait for (the sender calls
        this after each round); one at a time."""
        if self._adding is not None and not self._adding.done():
            return
        partitions = self.txn.take_wanted()
        if partitions:
            self._adding = asyncio.get_running_loop().create_task(
                self._add_partitions(partitions))

    async def _add_partitions(self, partitions: list[TopicPartition]) -> None:
        txn = self.txn
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)

        def make(mod, version):
            topics = tuple(build(mod.AddPartitionsToTxnTopic, name=topic,
                                 partitions=tuple(parts))
                           for topic, parts in sorted(by_topic.items()))
            return build(mod.AddPartitionsToTxnRequest,
                         v3_and_below_transactional_id=txn.transactional_id,
                         v3_and_below_producer_id=self.idem.producer_id,
                         v3_and_below_producer_epoch=self.idem.epoch,
                         v3_and_below_topics=topics)

        def errors(response) -> list[ErrorCode]:
            return [ErrorCode(p.partition_error_code)
                    for t in response.results_by_topic_v3_and_below
                    for p in t.results_by_partition]

        try:
            await self._call(Api.ADD_PARTITIONS, apis.ADD_PARTITIONS_TO_TXN, make, errors,
                             self.sender.clock() + self.config.delivery_timeout)
        except KafkaError as exc:
            txn.partitions_not_added(partitions)
            if not (exc.fatal or exc.abortable):
                txn.abortable(exc)
            log.warning("AddPartitionsToTxn %s: %s", partitions, exc)
        except Exception as exc:  # a bug must not leave the batches waiting forever
            txn.partitions_not_added(partitions)
            txn.abortable(KafkaError(ErrorCode.unknown_server_error, repr(exc)))
            log.exception("AddPartitionsToTxn")
        else:
            txn.partitions_added(partitions)
            log.debug("added %s to the transaction", partitions)
        finally:
            self.sender._wake()

    async def _partitions_settled(self) -> None:
        adding = self._adding
        if adding is not None and not adding.done():
            await asyncio.shield(adding)

    # --- offsets (KIP-447) ------------------------------------------------------------------

    async def send_offsets(self, offsets: dict[TopicPartition, OffsetAndMetadata],
                           group: GroupMetadata, timeout: float) -> None:
        deadline = self.sender.clock() + timeout
        txn = self.txn

        def add(mod, version):
            return build(mod.AddOffsetsToTxnRequest, transactional_id=txn.transactional_id,
                         producer_id=self.idem.producer_id, producer_epoch=self.idem.epoch,
                         group_id=group.group_id)

        await self._call(Api.ADD_OFFSETS, apis.ADD_OFFSETS_TO_TXN, add,
                         lambda r: [ErrorCode(r.error_code)], deadline)
        txn.offsets_added()

        def commit(mod, version):
            topics = calls.committed_topics(mod.TxnOffsetCommitRequestTopic,
                                            mod.TxnOffsetCommitRequestPartition, offsets)
            return build(mod.TxnOffsetCommitRequest, transactional_id=txn.transactional_id,
                         group_id=group.group_id, producer_id=self.idem.producer_id,
                         producer_epoch=self.idem.epoch, generation_id=group.generation_id,
                         member_id=group.member_id,
                         group_instance_id=group.group_instance_id, topics=topics)

        await self._call(Api.TXN_OFFSET_COMMIT, apis.TXN_OFFSET_COMMIT, commit,
                         lambda r: [ErrorCode(p.error_code) for t in r.topics
                                    for p in t.partitions],
                         deadline, key_type=calls.COORDINATOR_GROUP, key=group.group_id)

    # --- EndTxn -----------------------------------------------------------------------------

    async def end_transaction(self, commit: bool, timeout: float) -> None:
        """EndTxn (when the coordinator knows of the transaction), then a new epoch where
        needed: a shielded task, so that a commit or abort that timed out can be called
        again and wait for the same one."""
        if self._ending is None or self._ending.done():
            self._ending = asyncio.get_running_loop().create_task(
                self._end(commit, self.sender.clock() + max(timeout, self.config.max_block)))
        await _wait(self._ending, timeout)
        self._ending = None

    async def _end(self, commit: bool, deadline: float) -> None:
        txn = self.txn
        await self._partitions_settled()
        if commit and txn.state is TxnState.ABORTABLE_ERROR:
            assert txn.error is not None
            raise txn.error
        new_identity = None
        if txn.started:
            def make(mod, version):
                return build(mod.EndTxnRequest, transactional_id=txn.transactional_id,
                             producer_id=self.idem.producer_id,
                             producer_epoch=self.idem.epoch, committed=commit)

            response = await self._call(Api.END_TXN, apis.END_TXN, make,
                                        lambda r: [ErrorCode(r.error_code)], deadline)
            # KIP-890 part 2: the coordinator bumped the epoch and says so (v5+).
            producer_id = getattr(response, "producer_id", -1)
            epoch = getattr(response, "producer_epoch", -1)
            if producer_id >= 0 and epoch >= 0:
                new_identity = (producer_id, epoch)
        if new_identity is not None:
            self.restart(*new_identity, "EndTxn")
        elif not commit and (txn.new_epoch_needed or self.idem.bump_needed):
            await self._init_producer_id(deadline, keep_prepared=False, bump=True)
        txn.new_epoch_needed = False
        txn.completed()

    def close(self) -> None:
        for task in (self._adding, self._ending, self._initializing):
            if task is not None:
                task.cancel()
        for conn in self.coordinators.values():
            conn.close()
        self.coordinators.clear()


async def _wait(task: asyncio.Task, timeout: float | None) -> None:
    """Wait for a shielded ``task`` up to ``timeout``; it goes on after a timeout."""
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout)
    except TimeoutError:
        raise KafkaTimeout(f"not done within {timeout}s; call again to wait for it") from None
