"""The transaction APIs: InitProducerId with a transactional id, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, TxnOffsetCommit, DescribeTransactions, ListTransactions.

Each handler turns a request of any supported version into a call of the
TransactionCoordinator (coordinator/transaction/transaction_coordinator.py) or, for
TxnOffsetCommit, the GroupCoordinator, and the result into that version's response.
"""

from __future__ import annotations

import datetime
import logging

from kio.schema.errors import ErrorCode

from ...coordinator.group.group_coordinator import OffsetCommitPartition
from ...coordinator.transaction.transaction_coordinator import TransactionCoordinator, TxnConfig
from ...protocol import api_versions as apis
from ...protocol.client_regex import InvalidClientRegex
from ...protocol.messages import Request
from ...protocol.schema import build, has_field, response_module
from .. import authorize, internal_topics
from ..authorize import Op, Rt
from ..config import BrokerConfig
from ..topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, TopicError, TopicManager
from ..txn_marker_sender import MarkerSender
from ..txn_verification import for_offset_commit
from .api_meta import NO_THROTTLE
from .groups import _ms, internal_log
from .txn_markers import write_markers as append_markers

log = logging.getLogger(__name__)

# KIP-588: PRODUCER_FENCED from these versions on; older clients know INVALID_PRODUCER_EPOCH.
_FENCED_FROM = {apis.INIT_PRODUCER_ID: 4, apis.ADD_PARTITIONS_TO_TXN: 2,
                apis.ADD_OFFSETS_TO_TXN: 2, apis.END_TXN: 2, apis.TXN_OFFSET_COMMIT: 3}


def _for_version(request: Request, error: ErrorCode) -> ErrorCode:
    if error is ErrorCode.producer_fenced and \
            request.api_version < _FENCED_FROM.get(request.api_key, 0):
        return ErrorCode.invalid_producer_epoch
    return error


def make_transaction_coordinator(broker, config: BrokerConfig,
                                 topics: TopicManager) -> TransactionCoordinator:
    # In a cluster: this broker's replica of __transaction_state, its partitions owned
    # while led here (broker/internal_topics.py).
    cluster = broker.cluster_mode is not None
    txn_log, num_partitions = internal_log(
        broker if cluster else None, config, topics, TRANSACTION_STATE_TOPIC,
        topics.transaction_state_topic, "transaction.state.log.num.partitions")
    txn_config = TxnConfig(
        num_partitions=num_partitions,
        max_timeout_ms=config.get("transaction.max.timeout.ms"),
        id_expiration_ms=config.get("transactional.id.expiration.ms"),
        two_phase_commit=config.get("transaction.two.phase.commit.enable"),
    )

    # In cluster mode each marker goes to its partition's leader, wherever it is.
    sender = None if broker.inter_broker is None else MarkerSender(broker, broker.inter_broker)

    async def write_markers(producer_id: int, epoch: int, commit: bool, coordinator_epoch: int,
                            partitions: list[tuple[str, int]], transaction_version: int,
                            current=lambda: True):
        # The markers in __consumer_offsets decide their offsets as they are appended
        # (txn_markers.append_markers). ``current``: still the transaction's coordinator
        # at ``coordinator_epoch`` (a deposed one stops sending).
        if sender is not None:
            return await sender.write(producer_id, epoch, commit, coordinator_epoch,
                                      partitions, transaction_version, running=current)
        return await append_markers(broker, producer_id, epoch, commit, coordinator_epoch,
                                    partitions, transaction_version=transaction_version)

    def partition_exists(topic: str, index: int) -> bool:
        # in cluster mode the cluster's topics, not only the replicas kept here
        known = (broker.cluster_topics or topics).get(topic)
        return known is not None and 0 <= index < len(known.partitions)

    coordinator = TransactionCoordinator(txn_log, txn_config, broker.producer_ids.generate,
                                         partition_exists, write_markers, owns_all=not cluster)
    if cluster:
        coordinator.ownership.named = internal_topics.named_leader(broker,
                                                                   TRANSACTION_STATE_TOPIC)
    return coordinator


async def init_transactional_producer(broker, request: Request, answer):
    body = request.body
    error, *rest = await broker.transactions.init(
        body.transactional_id, _ms(body.transaction_timeout),
        getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1),
        two_phase=getattr(body, "enable2_pc", False),
        keep_prepared=getattr(body, "keep_prepared_txn", False))
    return answer(_for_version(request, error), *rest)


async def handle_add_partitions_to_txn(broker, request: Request):
    mod = response_module(apis.ADD_PARTITIONS_TO_TXN, request.api_version)
    body = request.body
    coordinator = broker.transactions

    async def results_of(txn_id, producer_id, epoch, topics, verify_only, wait=True):
        wanted = [(t.name, p) for t in topics for p in t.partitions]
        refused = None if verify_only else _add_refused(broker, request, txn_id, wanted)
        if refused is not None:
            errors = refused
        elif verify_only:
            errors = {tp: coordinator.verify(txn_id, producer_id, epoch, *tp) for tp in wanted}
        else:
            errors = await coordinator.add_partitions(txn_id, producer_id, epoch, wanted,
                                                      wait=wait)
        by_topic: dict[str, list] = {}
        for (topic, index), error in errors.items():
            by_topic.setdefault(topic, []).append(build(
                mod.AddPartitionsToTxnPartitionResult, partition_index=index,
                partition_error_code=_for_version(request, error)))
        return tuple(build(mod.AddPartitionsToTxnTopicResult, name=name,
                           results_by_partition=tuple(parts))
                     for name, parts in by_topic.items())

    if has_field(type(body), "transactions"):  # v4+: several transactions (brokers only)
        if not authorize.cluster(broker, request, Op.CLUSTER_ACTION):
            return build(mod.AddPartitionsToTxnResponse, throttle_time=NO_THROTTLE,
                         error_code=ErrorCode.cluster_authorization_failed,
                         results_by_transaction=())
        results = []
        for txn in body.transactions:
            topic_results = await results_of(txn.transactional_id, txn.producer_id,
                                             txn.producer_epoch, txn.topics, txn.verify_only,
                                             wait=False)
            results.append(build(mod.AddPartitionsToTxnResult,
                                 transactional_id=txn.transactional_id,
                                 topic_results=topic_results))
        return build(mod.AddPartitionsToTxnResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.none, results_by_transaction=tuple(results))
    topic_results = await results_of(body.v3_and_below_transactional_id,
                                     body.v3_and_below_producer_id,
                                     body.v3_and_below_producer_epoch,
                                     body.v3_and_below_topics, False)
    return build(mod.AddPartitionsToTxnResponse, throttle_time=NO_THROTTLE,
                 results_by_topic_v3_and_below=topic_results)


def _add_refused(broker, request: Request, txn_id: str,
                 wanted: list[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode] | None:
    """AddPartitionsToTxn (v0-v3, from clients) as Kafka authorizes it, None when allowed:
    Write on the transactional id, else every partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
    Write on each topic, else TOPIC_AUTHORIZATION_FAILED for its partitions, an unknown one
    UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED."""
    if broker.authorizer is None:
        return None
    if not authorize.allowed(broker, request, Op.WRITE, Rt.TRANSACTIONAL_ID, txn_id):
        return dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
    names = {topic for topic, _ in wanted}
    denied = names - authorize.allowed_names(broker, request, Op.WRITE, Rt.TOPIC, names)
    if not denied:
        return None
    return {tp: ErrorCode.topic_authorization_failed if tp[0] in denied
            else ErrorCode.unknown_topic_or_partition if broker.topics.partition(*tp) is None
            else ErrorCode.operation_not_attempted for tp in wanted}


def _txn_refusal(broker, request: Request, txn_id: str, group_id: str | None) -> ErrorCode:
    """Write on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), then Read on the
    group when there is one (GROUP_AUTHORIZATION_FAILED); NONE when both are allowed."""
    if not authorize.allowed(broker, request, Op.WRITE, Rt.TRANSACTIONAL_ID, txn_id):
        return ErrorCode.transactional_id_authorization_failed
    if group_id is not None and not authorize.allowed(broker, request, Op.READ, Rt.GROUP,
                                                      group_id):
        return ErrorCode.group_authorization_failed
    return ErrorCode.none


async def handle_add_offsets_to_txn(broker, request: Request):
    mod = response_module(apis.ADD_OFFSETS_TO_TXN, request.api_version)
    body = request.body
    refusal = _txn_refusal(broker, request, body.transactional_id, body.group_id)
    if refusal is not ErrorCode.none:
        error = refusal
    elif not body.group_id:
        error = ErrorCode.invalid_group_id
    else:
        # The group's partition of __consumer_offsets joins the transaction: its marker is
        # what makes the offsets of TxnOffsetCommit count.
        try:
            if broker.cluster_topics is not None:
                # a cluster's topic: created here when no FindCoordinator has yet
                if broker.cluster_topics.ensure_internal(OFFSETS_TOPIC) is None:
                    raise TopicError(ErrorCode.coordinator_not_available,
                                     f"{OFFSETS_TOPIC} is being created")
            else:
                broker.topics.offsets_topic()
        except Exception as exc:
            log.warning("AddOffsetsToTxn: %s", exc)
            error = ErrorCode.coordinator_not_available
        else:
            partition = broker.groups.partition_of(body.group_id)
            errors = await broker.transactions.add_partitions(
                body.transactional_id, body.producer_id, body.producer_epoch,
                [(OFFSETS_TOPIC, partition)])
            error = errors[OFFSETS_TOPIC, partition]
    return build(mod.AddOffsetsToTxnResponse, throttle_time=NO_THROTTLE,
                 error_code=_for_version(request, error))


async def handle_end_txn(broker, request: Request):
    mod = response_module(apis.END_TXN, request.api_version)
    body = request.body
    refusal = _txn_refusal(broker, request, body.transactional_id, None)
    if refusal is not ErrorCode.none:
        return build(mod.EndTxnResponse, throttle_time=NO_THROTTLE, error_code=refusal,
                     producer_id=-1, producer_epoch=-1)
    error, producer_id, epoch = await broker.transactions.end_txn(
        body.transactional_id, body.producer_id, body.producer_epoch, body.committed,
        bump_epoch=request.api_version >= 5)
    return build(mod.EndTxnResponse, throttle_time=NO_THROTTLE,
                 error_code=_for_version(request, error), producer_id=producer_id,
                 producer_epoch=epoch)


async def handle_txn_offset_commit(broker, request: Request):
    mod = response_module(apis.TXN_OFFSET_COMMIT, request.api_version)
    body = request.body
    partitions = [
        OffsetCommitPartition(t.name, p.partition_index, p.committed_offset,
                              getattr(p, "committed_leader_epoch", -1), p.committed_metadata)
        for t in body.topics for p in t.partitions
    ]
    refusal = _txn_refusal(broker, request, body.transactional_id, body.group_id)
    names = {p.topic for p in partitions}
    denied = names - authorize.allowed_names(broker, request, Op.READ, Rt.TOPIC, names) \
        if refusal is ErrorCode.none else names
    allowed = [p for p in partitions if p.topic not in denied]
    offsets_partition = (OFFSETS_TOPIC, broker.groups.partition_of(body.group_id)
                         if body.group_id else 0)
    if broker.txn_verification is None:
        verified = for_offset_commit(broker.transactions.verify(
            body.transactional_id, body.producer_id, body.producer_epoch, *offsets_partition))
    else:  # cluster mode: the transaction's coordinator may be on another broker
        verified = (await broker.txn_verification.verify(
            body.transactional_id, body.producer_id, body.producer_epoch,
            [offsets_partition], answer_for=for_offset_commit))[offsets_partition]
    if refusal is not ErrorCode.none:
        errors = [refusal] * len(partitions)
    elif verified is not ErrorCode.none:
        # AddOffsetsToTxn must come first; a zombie's epoch is fenced here too.
        errors = [ErrorCode.topic_authorization_failed if p.topic in denied else verified
                  for p in partitions]
    else:
        # a topic not allowed is answered TOPIC_AUTHORIZATION_FAILED, the others committed
        committed = iter(await broker.groups.txn_commit(
            body.transactional_id, body.group_id, body.producer_id, body.producer_epoch,
            getattr(body, "generation_id", -1), getattr(body, "member_id", ""),
            getattr(body, "group_instance_id", None), allowed) if allowed else ())
        errors = [ErrorCode.topic_authorization_failed if p.topic in denied
                  else next(committed) for p in partitions]
    by_topic: dict[str, list] = {}
    for p, error in zip(partitions, errors, strict=True):
        by_topic.setdefault(p.topic, []).append(build(
            mod.TxnOffsetCommitResponsePartition, partition_index=p.partition,
            error_code=_for_version(request, error)))
    return build(mod.TxnOffsetCommitResponse, throttle_time=NO_THROTTLE, topics=tuple(
        build(mod.TxnOffsetCommitResponseTopic, name=name, partitions=tuple(parts))
        for name, parts in by_topic.items()))


def _instant(ms: int) -> datetime.datetime:
    """kio writes TransactionStartTimeMs from a datetime; -1 (no transaction) stays -1."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


def handle_describe_transactions(broker, request: Request):
    mod = response_module(apis.DESCRIBE_TRANSACTIONS, request.api_version)
    states = []
    for txn_id in request.body.transactional_ids:
        if not authorize.allowed(broker, request, Op.DESCRIBE, Rt.TRANSACTIONAL_ID, txn_id):
            error, txn = ErrorCode.transactional_id_authorization_failed, None
        else:
            error, txn = broker.transactions.describe(txn_id)
        if txn is None:
            states.append(build(mod.TransactionState, error_code=error, transactional_id=txn_id,
                                transaction_state="", transaction_timeout=datetime.timedelta(0),
                                transaction_start_time=_instant(-1), producer_id=-1,
                                producer_epoch=-1, topics=()))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, index in txn.partitions:
            by_topic.setdefault(topic, []).append(index)
        # only the topics the caller may describe
        shown = authorize.allowed_names(broker, request, Op.DESCRIBE, Rt.TOPIC, by_topic,
                                        quiet=True)
        by_topic = {t: ps for t, ps in by_topic.items() if t in shown}
        states.append(build(
            mod.TransactionState, error_code=ErrorCode.none, transactional_id=txn_id,
            transaction_state=txn.state,
            transaction_timeout=datetime.timedelta(milliseconds=txn.timeout_ms),
            transaction_start_time=_instant(txn.start_ms), producer_id=txn.producer_id,
            producer_epoch=txn.epoch,
            topics=tuple(build(mod.TopicData, topic=t, partitions=tuple(ps))
                         for t, ps in by_topic.items())))
    return build(mod.DescribeTransactionsResponse, throttle_time=NO_THROTTLE,
                 transaction_states=tuple(states))


def handle_list_transactions(broker, request: Request):
    mod = response_module(apis.LIST_TRANSACTIONS, request.api_version)
    body = request.body
    error = broker.transactions.listing_error()
    if error is not None:  # a partition not loaded yet: the list would miss its ids
        return build(mod.ListTransactionsResponse, throttle_time=NO_THROTTLE,
                     error_code=error, unknown_state_filters=(), transaction_states=())
    try:
        unknown, txns = broker.transactions.list(
            set(body.state_filters), set(body.producer_id_filters),
            getattr(body, "duration_filter", -1),
            getattr(body, "transactional_id_pattern", None))
    except InvalidClientRegex as exc:
        log.info("ListTransactions: invalid transactional_id_pattern: %s", exc)
        return build(mod.ListTransactionsResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.invalid_regular_expression,
                     unknown_state_filters=(), transaction_states=())
    return build(mod.ListTransactionsResponse, throttle_time=NO_THROTTLE,
                 error_code=ErrorCode.none, unknown_state_filters=tuple(unknown),
                 transaction_states=tuple(
                     build(mod.TransactionState, transactional_id=t.transactional_id,
                           producer_id=t.producer_id, transaction_state=t.state)
                     for t in txns if authorize.allowed(
                         broker, request, Op.DESCRIBE, Rt.TRANSACTIONAL_ID, t.transactional_id,
                         quiet=True)))


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.ADD_PARTITIONS_TO_TXN: handle_add_partitions_to_txn,
    apis.ADD_OFFSETS_TO_TXN: handle_add_offsets_to_txn,
    apis.END_TXN: handle_end_txn,
    apis.TXN_OFFSET_COMMIT: handle_txn_offset_commit,
    apis.DESCRIBE_TRANSACTIONS: handle_describe_transactions,
    apis.LIST_TRANSACTIONS: handle_list_transactions,
}
