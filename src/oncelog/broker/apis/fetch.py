"""Fetch (with long polling) and ListOffsets: the read side, served from segment bytes.

Isolation (KIP-98): a read_committed Fetch (``isolation_level`` 1) returns batches only below
the partition's last stable offset (the first offset of its earliest open transaction), and
the aborted transactions (producer id, first offset) with data in the range it returns, so
that the consumer drops their records; every Fetch answers the last stable offset. A
read_committed ListOffsets for the latest offset answers the last stable offset, and a
lookup by timestamp finds nothing from there on.

Fetch v13+ names topics by id (KIP-516): an id no topic has is UNKNOWN_TOPIC_ID for each of
its partitions. From v16 a partition answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH
carries the leader, and the answer the brokers' endpoints (KIP-951).

Cluster mode (broker/replica_manager.py): only the leader serves a partition
(NOT_LEADER_OR_FOLLOWER elsewhere); a follower's Fetch (its replica id set) reads up to the
log end and tells the replica manager where the follower is, a consumer's up to the high
watermark (an offset between the high watermark and the log end is answered empty, not out of
range: a new leader's high watermark may trail the old one's). One broker alone leads every
partition it has at epoch 0, with the high watermark at the log end.

ListOffsets' special timestamps: -1 latest, -2 earliest, -3 the record with the largest
timestamp (v7, KIP-734), -4 the earliest offset in local storage (v8, KIP-405) and -5 the
latest offset in tiered storage (v9, KIP-1005). Without tiered storage the local log is the
whole log (-4 answers the log start offset) and nothing is tiered (-5 answers offset -1 with
leader epoch -1), as Kafka answers when remote storage is off. v10's timeout bounds a remote
lookup: there is none.

OffsetForLeaderEpoch (KIP-101, KIP-320: a consumer checks that the log it read was not
truncated under it, a follower where to truncate): in cluster mode the partition's leader
epoch cache answers (log/leader_epoch.py). One broker alone: every partition has had one
leader, this broker, at epoch 0, from the log's start; epoch 0 ends at the log end offset,
any other epoch asked for is unknown (-1, -1), as Kafka's cache answers an epoch above its
latest.

The ``current_leader_epoch`` a client sends with Fetch (v9+), ListOffsets (v4+) and
OffsetForLeaderEpoch is checked as Kafka checks it (KIP-320, cluster/isr.py's
epoch_problem): -1 is no check, below the partition's leader epoch FENCED_LEADER_EPOCH,
above it UNKNOWN_LEADER_EPOCH.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kio.schema.errors import ErrorCode

from ...cluster import isr as isr_rules
from ...log.regions import fetch_records
from ...protocol import api_versions as apis
from ...protocol.api_versions import FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH
from ...protocol.messages import Request
from ...protocol.records import decode_batch
from ...protocol.schema import build, response_module
from .. import authorize
from ..authorize import Op, Rt
from ..partition_opening import open_all, opened_first
from .api_meta import NO_THROTTLE

log = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5
READ_COMMITTED = 1
LEADER_EPOCH = 0  # of every partition: one broker, never a new leader
NO_EPOCH = -1
LEADER_HINTS_FROM = 16  # KIP-951
_LEADER_HINTED = (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch)


async def handle_fetch(broker, request: Request):
    body = request.body
    mod = response_module(FETCH, request.api_version)
    max_wait = body.max_wait.total_seconds()
    deadline = time.monotonic() + max_wait
    allowance = broker.quotas.fetch_allowance(request)  # a consumer quota's window
    denied = _fetch_denied(broker, request)
    # A log written before a restart is recovered in worker threads, not on the loop.
    await open_all(_named(broker, body, request.api_version, denied))
    while True:
        responses, total, errors, partitions = _read_all(broker, mod, body, request.api_version,
                                                         allowance, denied)
        remaining = deadline - time.monotonic()
        if total >= body.min_bytes or errors or remaining <= 0 or not partitions:
            break
        waiters = [p.waiter() for p in partitions]
        try:
            await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        # Another request may have started an opening meanwhile (a first write, a
        # follower's truncation): the re-read waits for it rather than being refused.
        await open_all(_named(broker, body, request.api_version, denied),
                       timeout=max(0.0, deadline - time.monotonic()))
    hinted = request.api_version >= LEADER_HINTS_FROM and any(
        p.error_code in _LEADER_HINTED for t in responses for p in t.partitions)
    nodes = tuple(build(mod.NodeEndpoint, node_id=node, host=host, port=port, rack=rack)
                  for node, host, port, rack in broker.cluster_brokers(request.session.listener)
                  ) if hinted else ()
    return build(mod.FetchResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                 session_id=0, responses=tuple(responses), node_endpoints=nodes)


def _named(broker, body, version: int, denied: set[str] | None):
    """The partitions a Fetch names that exist here and it may read (one refused for its
    role, this broker not its leader, is not opened for nothing)."""
    if denied is None:
        return
    replica_id = _replica_id(body, version)
    for topic_req in body.topics:
        name = _name_of(broker, getattr(topic_req, "topic_id", None)) if version >= 13 \
            else topic_req.topic
        if name is not None and name not in denied:
            for preq in topic_req.partitions:
                partition = broker.topics.partition(name, preq.partition)
                if partition is not None and not _role_problem(
                        partition, getattr(preq, "current_leader_epoch", NO_EPOCH),
                        replica_id):
                    yield partition


def _fetch_denied(broker, request: Request) -> set[str] | None:
    """The topics answered TOPIC_AUTHORIZATION_FAILED (None: all): Topic Read for a consumer,
    Cluster ClusterAction for a follower (a replica id of 0 or more), as Kafka decides."""
    if broker.authorizer is None:
        return set()
    body = request.body
    state = getattr(body, "replica_state", None)
    replica_id = state.replica_id if state is not None else getattr(body, "replica_id", -1)
    if replica_id >= 0:
        return set() if authorize.cluster(broker, request, Op.CLUSTER_ACTION) else None
    names = {t.topic for t in body.topics} if request.api_version < 13 else {
        n for t in body.topics if (n := _name_of(broker, getattr(t, "topic_id", None)))}
    return names - authorize.allowed_names(broker, request, Op.READ, Rt.TOPIC, names)


def _read_all(broker, mod, body, version: int, allowance: int,
              denied: set[str] | None = frozenset()):
    committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
    replica_id = _replica_id(body, version)
    budget = min(body.max_bytes, broker.config.get("fetch.max.bytes"), allowance)  # as Kafka
    total = 0
    errors = False
    partitions = []
    responses = []
    for topic_req in body.topics:
        results = []
        # v13+ names topics by id only (an all-zero id reads as None: no topic has it)
        topic_id = getattr(topic_req, "topic_id", None) if version >= 13 else None
        name = _name_of(broker, topic_id) if version >= 13 else topic_req.topic
        for preq in topic_req.partitions:
            partition = None if name is None else broker.topics.partition(name, preq.partition)
            error = ErrorCode.none
            records = b""
            hw = lso = start = -1
            aborted: tuple = ()
            if name is None:
                error = ErrorCode.unknown_topic_id
            elif denied is None or name in denied:
                error = ErrorCode.topic_authorization_failed
            elif partition is None:
                error = ErrorCode.unknown_topic_or_partition
            elif (fenced := _role_problem(partition, getattr(preq, "current_leader_epoch",
                                                             NO_EPOCH), replica_id)):
                error = fenced
            else:
                try:
                    plog = partition.log
                    end = plog.log_end_offset
                    hw = partition.high_watermark
                    lso = partition.last_stable_offset
                    start = plog.log_start_offset
                    readable = end if replica_id >= 0 else lso if committed else hw
                    # Between the high watermark and the log end: nothing yet, not out of
                    # range (a new leader's high watermark may trail the old one's).
                    if not start <= preq.fetch_offset <= end:
                        error = ErrorCode.offset_out_of_range
                    elif replica_id >= 0 and partition.replication is not None:
                        # where the follower's log ends (only a fetch in range says so)
                        broker.replicas.follower_fetched(partition, replica_id,
                                                         preq.fetch_offset)
                        hw = partition.high_watermark
                    if error == ErrorCode.none and preq.fetch_offset < readable and \
                            budget > 0:
                        limit = min(preq.partition_max_bytes, budget)
                        # bytes, or a region of the segment file sent with sendfile, cut
                        # at what this reader may see (high watermark, LSO, log end)
                        records, upper = fetch_records(plog, preq.fetch_offset, limit,
                                                       total == 0, readable)
                        if committed:
                            aborted = tuple(
                                build(mod.AbortedTransaction, producer_id=a.producer_id,
                                      first_offset=a.first_offset)
                                for a in partition.aborted_transactions(preq.fetch_offset,
                                                                        upper))
                        budget -= len(records)
                        total += len(records)
                    partitions.append(partition)
                except OSError as exc:
                    log.error("fetch from %s-%d failed: %s", name, preq.partition, exc)
                    error, records, hw, lso, start = ErrorCode.kafka_storage_error, b"", -1, -1, -1
                    aborted = ()
            if error != ErrorCode.none:
                errors = True
                log.info("fetch from %s-%d at offset %d refused: %s (log start %d, high "
                         "watermark %d)", name or topic_id, preq.partition, preq.fetch_offset,
                         error.name, start, hw)
            leader = {"current_leader": build(mod.LeaderIdAndEpoch,
                                              **_leader_hint(broker, partition))} \
                if error in _LEADER_HINTED and version >= LEADER_HINTS_FROM else {}
            results.append(build(
                mod.PartitionData, partition_index=preq.partition, error_code=error,
                high_watermark=hw, last_stable_offset=lso, log_start_offset=start,
                aborted_transactions=None if error != ErrorCode.none else aborted,
                preferred_read_replica=-1, records=records, **leader,
            ))
        responses.append(build(mod.FetchableTopicResponse, topic=name, topic_id=topic_id,
                               partitions=tuple(results)))
    return responses, total, errors, partitions


def _replica_id(body, version: int) -> int:
    """The fetching follower's broker id, -1 for a consumer (v15+: in replica_state)."""
    if version >= 15:
        state = getattr(body, "replica_state", None)
        return -1 if state is None else int(state.replica_id)
    return int(getattr(body, "replica_id", -1))


def _role_problem(partition, asked_epoch: int, replica_id: int = -1) -> ErrorCode | None:
    """NOT_LEADER_OR_FOLLOWER where this broker does not lead the partition, else what the
    leader epoch the request names makes of it (cluster/isr.py's epoch_problem)."""
    replication = partition.replication
    if replication is None:
        return epoch_problem(asked_epoch)
    if not replication.is_leader:
        return ErrorCode.not_leader_or_follower
    return epoch_problem(asked_epoch, replication.leader_epoch)


def _leader_hint(broker, partition) -> dict:
    replication = None if partition is None else partition.replication
    if replication is None:
        return {"leader_id": broker.broker_id, "leader_epoch": LEADER_EPOCH}
    return {"leader_id": replication.leader, "leader_epoch": replication.leader_epoch}


def _name_of(broker, topic_id) -> str | None:
    topic = broker.topics.by_id(topic_id)
    return None if topic is None else topic.name


def handle_list_offsets(broker, request: Request):
    """The answer; a coroutine giving it when a partition named must be opened first (in a
    worker thread: a log written before a restart is recovered)."""
    names = {t.name for t in request.body.topics}
    denied = names - authorize.allowed_names(broker, request, Op.DESCRIBE, Rt.TOPIC, names)
    named = [broker.topics.partition(t.name, p.partition_index)  # authorized first
             for t in request.body.topics if t.name not in denied for p in t.partitions
             if _readable_here(broker, t.name, p.partition_index, p)]
    return opened_first(named, lambda: _list_offsets(broker, request, denied))


def _readable_here(broker, topic: str, index: int, preq) -> bool:
    """The partition exists and its role lets this broker answer for it (else nothing is
    opened for the refusal)."""
    partition = broker.topics.partition(topic, index)
    return partition is not None and not _role_problem(
        partition, getattr(preq, "current_leader_epoch", NO_EPOCH))


def _list_offsets(broker, request: Request, denied: set[str]):
    mod = response_module(LIST_OFFSETS, request.api_version)
    committed = getattr(request.body, "isolation_level", 0) == READ_COMMITTED
    topics = []
    for topic_req in request.body.topics:
        results = []
        for preq in topic_req.partitions:
            if topic_req.name in denied:
                results.append(build(mod.ListOffsetsPartitionResponse,
                                     partition_index=preq.partition_index,
                                     error_code=ErrorCode.topic_authorization_failed,
                                     timestamp=-1, offset=-1, leader_epoch=-1))
                continue
            try:
                # The role first: a partition refused for it is not read (nor opened).
                partition = broker.topics.partition(topic_req.name, preq.partition_index)
                fenced = None if partition is None else _role_problem(
                    partition, getattr(preq, "current_leader_epoch", NO_EPOCH))
                error, timestamp, offset = (fenced, -1, -1) if fenced else _list_offset(
                    broker, topic_req.name, preq.partition_index, preq.timestamp, committed)
            except OSError as exc:
                log.error("list offsets of %s-%d failed: %s", topic_req.name,
                          preq.partition_index, exc)
                error, timestamp, offset = ErrorCode.kafka_storage_error, -1, -1
            results.append(build(mod.ListOffsetsPartitionResponse,
                                 partition_index=preq.partition_index, error_code=error,
                                 timestamp=timestamp, offset=offset,
                                 leader_epoch=0 if offset >= 0 else -1))
        topics.append(build(mod.ListOffsetsTopicResponse, name=topic_req.name,
                            partitions=tuple(results)))
    return build(mod.ListOffsetsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


def _list_offset(broker, topic: str, index: int, timestamp: int,
                 committed: bool = False) -> tuple[ErrorCode, int, int]:
    partition = broker.topics.partition(topic, index)
    if partition is None:
        return ErrorCode.unknown_topic_or_partition, -1, -1
    plog = partition.log
    if timestamp == EARLIEST_TIMESTAMP:
        return ErrorCode.none, -1, plog.log_start_offset
    if timestamp == LATEST_TIMESTAMP:
        return ErrorCode.none, -1, (partition.last_stable_offset if committed
                                    else partition.high_watermark)
    if timestamp == EARLIEST_LOCAL_TIMESTAMP:
        return ErrorCode.none, -1, plog.log_start_offset
    if timestamp == LATEST_TIERED_TIMESTAMP:
        return ErrorCode.none, -1, -1
    found = _by_timestamp(plog, timestamp)
    if committed and found[2] >= partition.last_stable_offset:
        return ErrorCode.none, -1, -1  # not readable by a read_committed consumer yet
    return found


def _by_timestamp(plog, timestamp: int) -> tuple[ErrorCode, int, int]:
    if timestamp == MAX_TIMESTAMP:
        return _max_timestamp(plog)
    if timestamp < 0:
        return ErrorCode.invalid_request, -1, -1  # other special values are not supported
    found = plog.offset_for_timestamp(timestamp)
    if found is None:
        return ErrorCode.none, -1, -1
    base_offset, _ = found
    start = plog.log_start_offset  # records below it (DeleteRecords) are not answered
    # A compacted batch may keep a max timestamp no record in it has any more (an emptied
    # batch keeps its old one, as Kafka's does): the record is then in a later batch.
    for header in plog.headers_from(max(base_offset, start)):
        if header.max_timestamp < timestamp or not header.records_count:
            continue
        _, records = decode_batch(plog.batch_at(header.base_offset))
        for record in records:
            if record.timestamp >= timestamp and record.offset >= start:
                return ErrorCode.none, record.timestamp, record.offset
    return ErrorCode.none, -1, -1


def _max_timestamp(plog) -> tuple[ErrorCode, int, int]:
    best_ts, best_segment = -1, None
    for segment in plog.segments:
        if segment.max_timestamp > best_ts:
            best_ts, best_segment = segment.max_timestamp, segment
    if best_segment is None:
        return ErrorCode.none, -1, -1
    _, records = decode_batch(plog.batch_at(best_segment.offset_of_max_timestamp))
    for record in records:
        if record.timestamp == best_ts:
            return ErrorCode.none, record.timestamp, record.offset
    return ErrorCode.none, best_ts, best_segment.offset_of_max_timestamp


def handle_offset_for_leader_epoch(broker, request: Request):
    """The answer; a coroutine giving it when a log written before a restart must be
    opened first (in a worker thread)."""
    names = {t.topic for t in request.body.topics}
    denied = set() if authorize.cluster(broker, request, Op.CLUSTER_ACTION, quiet=True) else \
        names - authorize.allowed_names(broker, request, Op.DESCRIBE, Rt.TOPIC, names)
    named = [broker.topics.partition(t.topic, p.partition)  # authorized first
             for t in request.body.topics if t.topic not in denied for p in t.partitions
             if _readable_here(broker, t.topic, p.partition, p)]
    return opened_first(named, lambda: _offsets_for_leader_epoch(broker, request, denied))


def _offsets_for_leader_epoch(broker, request: Request, denied: set[str]):
    mod = response_module(OFFSET_FOR_LEADER_EPOCH, request.api_version)
    topics = []
    for topic_req in request.body.topics:
        results = []
        for preq in topic_req.partitions:
            if topic_req.topic in denied:
                results.append(build(mod.EpochEndOffset,
                                     error_code=ErrorCode.topic_authorization_failed,
                                     partition=preq.partition, leader_epoch=NO_EPOCH,
                                     end_offset=-1))
                continue
            error, epoch, end = _epoch_end(broker, topic_req.topic, preq.partition,
                                           getattr(preq, "current_leader_epoch", NO_EPOCH),
                                           preq.leader_epoch)
            results.append(build(mod.EpochEndOffset, error_code=error,
                                 partition=preq.partition, leader_epoch=epoch, end_offset=end))
        topics.append(build(mod.OffsetForLeaderTopicResult, topic=topic_req.topic,
                            partitions=tuple(results)))
    return build(mod.OffsetForLeaderEpochResponse, throttle_time=NO_THROTTLE,
                 topics=tuple(topics))


def _epoch_end(broker, topic: str, index: int, current: int,
               asked: int) -> tuple[ErrorCode, int, int]:
    partition = broker.topics.partition(topic, index)
    if partition is None:
        return ErrorCode.unknown_topic_or_partition, NO_EPOCH, -1
    if fenced := _role_problem(partition, current):
        return fenced, NO_EPOCH, -1
    try:
        if partition.replication is not None:  # the leader epoch cache's rows Q1-Q4
            return (ErrorCode.none,
                    *partition.leader_epochs.end_offset_for(asked, partition.log.log_end_offset))
        if asked != LEADER_EPOCH:
            return ErrorCode.none, NO_EPOCH, -1
        return ErrorCode.none, LEADER_EPOCH, partition.log.log_end_offset
    except OSError as exc:
        log.error("offset for leader epoch of %s-%d failed: %s", topic, index, exc)
        return ErrorCode.kafka_storage_error, NO_EPOCH, -1


def epoch_problem(current: int, leader_epoch: int = LEADER_EPOCH) -> ErrorCode | None:
    """What the leader epoch a client believes current makes of its request (KIP-320)."""
    return isr_rules.epoch_problem(current, leader_epoch)


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.FETCH: handle_fetch,
    apis.LIST_OFFSETS: handle_list_offsets,
    apis.OFFSET_FOR_LEADER_EPOCH: handle_offset_for_leader_epoch,
}
