"""KIP-890 part 1 in cluster mode: a partition leader asks the transactional id's
coordinator, on whichever broker it is, whether a transactional batch's partition is in the
producer's ongoing transaction, before the batch begins a transaction there (Kafka's
AddPartitionsToTxnManager).

The coordinator is the leader of ``__transaction_state-<partition_for(id)>`` in the cluster's
metadata (``coordinator_of``). On this broker it is asked in process
(TransactionCoordinator.verify); elsewhere with AddPartitionsToTxn v4 ``verify_only`` over
the inter-broker channel, once per produce request for all its partitions that need it,
before any of them is appended (``ahead``; the produce's own ``verify`` then reads the
answers, ``__call__``). TxnOffsetCommit asks the same way (``verify``).

One produce verifies one producer: as Kafka, transactional batches of more than one
(producer id, epoch) needing verification in one produce request are refused
INVALID_PRODUCER_ID_MAPPING unasked, so a request costs at most one call to the coordinator
however many producers it names (asked one after the other, a thousand would each wait up
to request.timeout.ms while the coordinator is away).

The coordinator answers as Kafka's does (TransactionCoordinator.verify, txn_rules V0-V3,
the same on the wire to a leader elsewhere); this file alone says how each answer is
answered to the producer (``for_producer``, Kafka's mapping; rows P: what the producer is
told), whichever broker it came from:

    | # | the coordinator's answer                              | the produce is answered   |
    |---|-------------------------------------------------------|---------------------------|
    |P1 | NONE                                                  | appended                  |
    |P2 | no coordinator now (no leader, or no __transaction_   | NOT_ENOUGH_REPLICAS       |
    |   | state yet), no answer (connection lost, timed out:    | (retriable, and no        |
    |   | NETWORK_EXCEPTION), NOT_COORDINATOR,                  |                           |
    |   | COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROG., | metadata refresh)         |
    |   | CONCURRENT_TRANSACTIONS                               |                           |
    |P3 | PRODUCER_FENCED                                       | INVALID_PRODUCER_EPOCH    |
    |P4 | the request refused as a whole: CLUSTER_AUTHORIZATION | INVALID_TXN_STATE         |
    |   | _FAILED                                               |                           |
    |P5 | anything else (INVALID_TXN_STATE, INVALID_PRODUCER_ID | that error                |
    |   | _MAPPING, INVALID_PRODUCER_EPOCH, ...)                |                           |

TxnOffsetCommit reads the same answers (``for_offset_commit``, Kafka's mapping of its group
coordinator's errors): a Kafka client's TxnOffsetCommit handler retries only the coordinator
errors (COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, ...) and
takes anything it does not expect, NOT_ENOUGH_REPLICAS included, as fatal:

    | # | the coordinator's answer                              | TxnOffsetCommit answers   |
    |---|-------------------------------------------------------|---------------------------|
    |W1 | NONE                                                  | the offsets are written   |
    |W2 | P2's, or NOT_ENOUGH_REPLICAS (what an older oncelog    | COORDINATOR_NOT_AVAILABLE |
    |   | coordinator answered for an id it did not serve)      | (retried by every client) |
    |W3 | PRODUCER_FENCED, INVALID_PRODUCER_EPOCH               | PRODUCER_FENCED           |
    |W4 | P4's                                                  | INVALID_TXN_STATE         |
    |W5 | anything else                                         | that error                |

Before anyone asked for a coordinator ``__transaction_state`` may not exist yet: no
coordinator to ask, answered as P2 (Kafka's COORDINATOR_NOT_AVAILABLE, retriable), as is a
partition with no leader now.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from kio.schema.errors import ErrorCode

from ..cluster import znodes as zn
from ..coordinator.internal_log import partition_for
from ..coordinator.transaction.transaction_coordinator import TransactionCoordinator
from ..protocol.api_versions import ADD_PARTITIONS_TO_TXN
from ..protocol.messages import Request
from ..protocol.schema import build, request_module
from .inter_broker import InterBrokerChannel, InterBrokerError
from .topics import TRANSACTION_STATE_TOPIC

log = logging.getLogger(__name__)

E = ErrorCode
TopicPartition = tuple[str, int]
VERIFY_VERSION = 4
_RETRIABLE = (E.network_exception, E.not_coordinator, E.coordinator_not_available,
              E.coordinator_load_in_progress, E.concurrent_transactions)
_Key = tuple[str, int, int, str, int]  # transactional id, producer id, epoch, topic, partition


def for_producer(error: ErrorCode, whole_request: bool = False) -> ErrorCode:
    """Rows P1-P5."""
    if whole_request and error is E.cluster_authorization_failed:
        return E.invalid_txn_state
    if error in _RETRIABLE:
        return E.not_enough_replicas
    if error is E.producer_fenced:
        return E.invalid_producer_epoch
    return error


def for_offset_commit(error: ErrorCode, whole_request: bool = False) -> ErrorCode:
    """Rows W1-W5."""
    if whole_request and error is E.cluster_authorization_failed:
        return E.invalid_txn_state
    if error in _RETRIABLE or error is E.not_enough_replicas:
        return E.coordinator_not_available
    if error in (E.producer_fenced, E.invalid_producer_epoch):
        return E.producer_fenced
    return error


def local_verifier(coordinator: TransactionCoordinator
                   ) -> Callable[[str | None, int, int, str, int], ErrorCode]:
    """The produce's verify (produce.TxnVerifier) with the coordinator on this broker, one
    broker alone: its answer as the producer is answered (P1-P5)."""
    def verify(txn_id: str | None, producer_id: int, epoch: int, topic: str,
               partition: int) -> ErrorCode:
        return for_producer(coordinator.verify(txn_id, producer_id, epoch, topic, partition))
    return verify


def _transactional_batch(records) -> tuple[int, int] | None:
    """(producer id, epoch) of a RecordBatch v2 whose attributes say transactional."""
    if records is None or len(records) < 61 or records[16] != 2 or not records[22] & 0x10:
        return None
    return (int.from_bytes(records[43:51], "big", signed=True),
            int.from_bytes(records[51:53], "big", signed=True))


class TxnVerification:
    def __init__(self, broker, channel: InterBrokerChannel) -> None:
        self.broker = broker
        self.channel = channel
        # key -> (the newest answer, how many produce requests under way hold it): two
        # requests may ask the same (a producer's retry racing its first attempt), and the
        # first to end must not take the other's answer away
        self._answers: dict[_Key, tuple[ErrorCode, int]] = {}

    # --- the produce path ----------------------------------------------------------------

    def __call__(self, txn_id: str | None, producer_id: int, epoch: int, topic: str,
                 partition: int) -> ErrorCode:
        """The produce's verify (produce.TxnVerifier): the answer ``ahead`` fetched, else
        the coordinator on this broker's."""
        answer = self._answers.get((txn_id or "", producer_id, epoch, topic, partition))
        if answer is not None:
            return answer[0]
        return for_producer(self.broker.transactions.verify(txn_id, producer_id, epoch, topic,
                                                            partition))

    def ahead(self, request: Request) -> Coroutine[Any, Any, list[_Key]] | None:
        """For a transactional produce whose coordinator is elsewhere: the verification of
        every partition it would begin a transaction in, to await before the appends
        (its keys, to ``forget`` after); None when nothing is to be asked away."""
        body = request.body
        txn_id = body.transactional_id
        if not txn_id:
            return None
        wanted: dict[tuple[int, int], list[TopicPartition]] = {}
        for topic_data in body.topic_data:
            name = topic_data.name
            if name is None:
                topic = self.broker.topics.by_id(topic_data.topic_id)
                name = None if topic is None else topic.name
            for pdata in topic_data.partition_data:
                identity = _transactional_batch(pdata.records)
                partition = None if identity is None or name is None \
                    else self.broker.topics.partition(name, pdata.index)
                if partition is None or partition.replication is None \
                        or not partition.replication.is_leader:
                    continue
                try:
                    if partition.state.in_transaction(identity[0]):
                        continue  # T3: verified when its transaction began here
                except OSError:
                    continue  # the append answers the disk's error
                wanted.setdefault(identity, []).append((name, pdata.index))
        if not wanted:
            return None
        if len(wanted) > 1:
            return self._refuse(txn_id, wanted)
        coordinator = self.coordinator_of(txn_id)
        if coordinator == self.broker.broker_id:
            return None
        return self._fetch(txn_id, coordinator, wanted)

    async def _fetch(self, txn_id: str, coordinator: int,
                     wanted: dict[tuple[int, int], list[TopicPartition]]) -> list[_Key]:
        keys = []
        for (pid, epoch), tps in wanted.items():
            answers = await self.verify(txn_id, pid, epoch, tps, coordinator)
            for tp, error in answers.items():
                key = (txn_id, pid, epoch, *tp)
                self._hold(key, error)
                keys.append(key)
        return keys

    async def _refuse(self, txn_id: str,
                      wanted: dict[tuple[int, int], list[TopicPartition]]) -> list[_Key]:
        keys = [(txn_id, pid, epoch, *tp) for (pid, epoch), tps in wanted.items()
                for tp in tps]
        for key in keys:
            self._hold(key, E.invalid_producer_id_mapping)
        return keys

    def _hold(self, key: _Key, error: ErrorCode) -> None:
        held = self._answers.get(key)
        self._answers[key] = (error, 1 if held is None else held[1] + 1)

    def forget(self, keys: list[_Key]) -> None:
        for key in keys:
            held = self._answers.get(key)
            if held is None:
                continue
            if held[1] > 1:
                self._answers[key] = (held[0], held[1] - 1)
            else:
                del self._answers[key]

    # --- asking the coordinator ----------------------------------------------------------

    def coordinator_of(self, txn_id: str) -> int | None:
        """The leader of the id's ``__transaction_state`` partition (zn.NO_LEADER: none now,
        or no such topic yet)."""
        image = self.broker.cluster_mode.cache.image.get(TRANSACTION_STATE_TOPIC)
        if image is None or not image.partitions:
            return zn.NO_LEADER
        return image.partitions[partition_for(txn_id, len(image.partitions))].leader

    async def verify(self, txn_id: str, producer_id: int, epoch: int,
                     partitions: list[TopicPartition], coordinator: int | None = None,
                     answer_for=for_producer) -> dict[TopicPartition, ErrorCode]:
        """Each partition's answer for the producer (rows P1-P5; ``answer_for``
        for_offset_commit: for TxnOffsetCommit, W1-W5). ``coordinator`` None: look it up."""
        if coordinator is None:
            coordinator = self.coordinator_of(txn_id)
        if coordinator == self.broker.broker_id:
            local = self.broker.transactions.verify
            return {tp: answer_for(local(txn_id, producer_id, epoch, *tp)) for tp in partitions}
        if coordinator == zn.NO_LEADER:
            return dict.fromkeys(partitions, answer_for(E.coordinator_not_available))
        return await self._ask(coordinator, txn_id, producer_id, epoch, partitions, answer_for)

    async def _ask(self, coordinator: int, txn_id: str, producer_id: int, epoch: int,
                   partitions: list[TopicPartition], answer_for=for_producer
                   ) -> dict[TopicPartition, ErrorCode]:
        mod = request_module(ADD_PARTITIONS_TO_TXN, VERIFY_VERSION)
        by_topic: dict[str, list[int]] = {}
        for topic, index in partitions:
            by_topic.setdefault(topic, []).append(index)
        body = build(mod.AddPartitionsToTxnRequest, transactions=(build(
            mod.AddPartitionsToTxnTransaction, transactional_id=txn_id,
            producer_id=producer_id, producer_epoch=epoch, verify_only=True,
            topics=tuple(build(mod.AddPartitionsToTxnTopic, name=t, partitions=tuple(ps))
                         for t, ps in by_topic.items())),))
        try:
            answer = await self.channel.call(coordinator, ADD_PARTITIONS_TO_TXN,
                                             VERIFY_VERSION, body)
        except InterBrokerError as exc:
            log.info("verifying transactional id %s with broker %d: %s", txn_id,
                     coordinator, exc)
            return dict.fromkeys(partitions, answer_for(E.network_exception))
        if answer.error_code != E.none:
            log.error("verifying transactional id %s: broker %d answered %s", txn_id,
                      coordinator, E(answer.error_code).name)
            return dict.fromkeys(partitions, answer_for(E(answer.error_code), True))
        got = {(t.name, p.partition_index): E(p.partition_error_code)
               for r in answer.results_by_transaction if r.transactional_id == txn_id
               for t in r.topic_results for p in t.results_by_partition}
        # A partition the answer leaves out was not verified: as no answer (P2), never NONE.
        return {tp: answer_for(got.get(tp, E.network_exception)) for tp in partitions}
