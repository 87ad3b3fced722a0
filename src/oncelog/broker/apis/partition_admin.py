"""Admin requests about partitions: CreatePartitions, DeleteRecords, and the answers of a
one-broker cluster to what needs several (ElectLeaders, AlterPartitionReassignments,
ListPartitionReassignments).

On one broker every partition has its only replica as leader, so a preferred (or unclean)
election is never needed and the only placement a reassignment may ask for is this broker:
both are answered as Kafka answers them for such a cluster, not refused as unsupported.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.api_versions import (
    ALTER_PARTITION_REASSIGNMENTS,
    CREATE_PARTITIONS,
    DELETE_RECORDS,
    ELECT_LEADERS,
    LIST_PARTITION_REASSIGNMENTS,
)
from ...protocol.messages import Request
from ...protocol.schema import build, response_module
from .. import authorize
from ..authorize import Op, Rt
from ..client_quotas import THROTTLING_QUOTA_EXCEEDED_MESSAGE
from ..config import is_compacted
from ..log_limits import log_safe
from ..partition_opening import opened_first
from ..topics import INTERNAL_TOPICS, TopicError
from . import cluster_partitions
from .admin import MAX_PARTITIONS_PER_REQUEST, _duplicates
from .api_meta import NO_THROTTLE

log = logging.getLogger(__name__)

HIGH_WATERMARK = -1  # DeleteRecords: "up to the high watermark"
PREFERRED_ELECTION, UNCLEAN_ELECTION = 0, 1


# --- CreatePartitions --------------------------------------------------------------------------

def handle_create_partitions(broker, request: Request):
    mod = response_module(CREATE_PARTITIONS, request.api_version)
    body = request.body
    duplicates = _duplicates(t.name for t in body.topics)
    if _added(broker, body.topics) > MAX_PARTITIONS_PER_REQUEST:  # as CreateTopics
        log.info("create partitions refused: more than %d partitions in one request",
                 MAX_PARTITIONS_PER_REQUEST)
        return build(mod.CreatePartitionsResponse, throttle_time=NO_THROTTLE, results=tuple(
            build(mod.CreatePartitionsTopicResult, name=name,
                  error_code=ErrorCode.policy_violation,
                  error_message="Excessively large number of partitions per request.")
            for name in dict.fromkeys(t.name for t in body.topics)))
    results = []
    names = {t.name for t in body.topics}
    alterable = authorize.allowed_names(broker, request, Op.ALTER, Rt.TOPIC, names)
    quota = broker.quotas.mutations(request)  # controller_mutation_rate (KIP-599)
    for t in body.topics:
        if t.name in duplicates:
            continue
        if t.name not in alterable:
            results.append(build(mod.CreatePartitionsTopicResult, name=t.name,
                                 error_code=ErrorCode.topic_authorization_failed,
                                 error_message="The topic authorization is failed."))
            continue
        error, message = ErrorCode.none, None
        assignments = None if t.assignments is None else [list(a.broker_ids)
                                                          for a in t.assignments]
        try:
            if not body.validate_only and quota.refused():
                raise TopicError(ErrorCode.throttling_quota_exceeded,
                                 THROTTLING_QUOTA_EXCEEDED_MESSAGE)
            added = _added(broker, (t,))
            (broker.cluster_topics or broker.topics).add_partitions(
                t.name, t.count, assignments, body.validate_only)
            if not body.validate_only:
                quota.done(added)
        except TopicError as exc:
            log.info("create partitions of %r refused: %s", log_safe(t.name), log_safe(exc))
            error, message = exc.error, str(exc)
        results.append(build(mod.CreatePartitionsTopicResult, name=t.name, error_code=error,
                             error_message=message))
    for name in duplicates:  # refused once, as CreateTopics does
        log.info("create partitions of %r refused: named more than once in the "
                 "request", log_safe(name))
        results.append(build(mod.CreatePartitionsTopicResult, name=name,
                             error_code=ErrorCode.invalid_request,
                             error_message="Duplicate topic name."))
    answer = build(mod.CreatePartitionsResponse, throttle_time=quota.throttle_time,
                   results=tuple(results))
    if broker.cluster_mode is not None and not body.validate_only:  # once leaders are elected
        done = {r.name for r in results if r.error_code == ErrorCode.none}
        return broker.cluster_mode.answer_when(broker.cluster_mode.grown, {
            t.name: t.count for t in body.topics if t.name in done}, body.timeout, answer)
    return answer


def _added(broker, topics) -> int:
    """Partitions a CreatePartitions would add, all topics together."""
    total = 0
    for t in topics:
        topic = (broker.cluster_topics or broker.topics).get(t.name)
        if topic is not None:
            total += max(0, t.count - len(topic.partitions))
    return total


# --- DeleteRecords -----------------------------------------------------------------------------

def handle_delete_records(broker, request: Request):
    """A coroutine giving the answer: a log written before a restart is opened first (in a
    worker thread), and the records before each new log start are made durable by a flush
    round (in a worker thread too) before the log start checkpoint names it."""
    names = {t.name for t in request.body.topics}
    deletable = authorize.allowed_names(broker, request, Op.DELETE, Rt.TOPIC, names)
    named = [broker.topics.partition(t.name, p.partition_index)  # authorized first
             for t in request.body.topics if t.name in deletable for p in t.partitions
             if _refusal(broker, t.name, p.partition_index) is None]  # nor opened to refuse
    return opened_first(named, lambda: _delete_records_now(broker, request, deletable))


async def _delete_records_now(broker, request: Request, deletable: set[str]):
    mod = response_module(DELETE_RECORDS, request.api_version)
    topics = []
    for t in request.body.topics:
        results = []
        for p in t.partitions:
            error, low_watermark = \
                await _delete_records(broker, t.name, p.partition_index, p.offset) \
                if t.name in deletable else (ErrorCode.topic_authorization_failed, -1)
            results.append(build(mod.DeleteRecordsPartitionResult,
                                 partition_index=p.partition_index, low_watermark=low_watermark,
                                 error_code=error))
        topics.append(build(mod.DeleteRecordsTopicResult, name=t.name,
                            partitions=tuple(results)))
    return build(mod.DeleteRecordsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


def _refusal(broker, topic: str, index: int) -> tuple[ErrorCode, str] | None:
    """Why DeleteRecords refuses the partition before reading it (None: it does not)."""
    partition = broker.topics.partition(topic, index)
    if partition is None:
        return ErrorCode.unknown_topic_or_partition, "no such topic or partition"
    if topic in INTERNAL_TOPICS:
        return ErrorCode.invalid_topic_exception, \
            f"cannot delete records of internal topic {topic}"
    if partition.replication is not None and not partition.replication.is_leader:
        return ErrorCode.not_leader_or_follower, f"broker {broker.broker_id} does not lead it"
    policy = broker.topics.topic_config(broker.topics.get(topic), "cleanup.policy")
    if is_compacted(policy) and "delete" not in policy.split(","):
        return ErrorCode.policy_violation, \
            f"records can not be deleted due to cleanup.policy={policy}"
    return None


async def _delete_records(broker, topic: str, index: int, offset: int
                          ) -> tuple[ErrorCode, int]:
    """(error, low watermark) of one partition. The response has no message field: the
    reason of a refusal is in the broker's log."""
    def refused(error: ErrorCode, why: str) -> tuple[ErrorCode, int]:
        log.info("delete records of %s-%d before offset %d refused: %s", topic, index, offset,
                 why)
        return error, -1

    refusal = _refusal(broker, topic, index)
    if refusal is not None:
        return refused(*refusal)
    partition = broker.topics.partition(topic, index)
    try:
        hw = partition.high_watermark
        wanted = hw if offset == HIGH_WATERMARK else offset
        if wanted < 0:
            return refused(ErrorCode.offset_out_of_range, f"the offset {offset} is not valid")
        if wanted > hw:
            return refused(ErrorCode.offset_out_of_range,
                           f"the offset {wanted} is larger than the high watermark {hw}")
        return ErrorCode.none, await partition.delete_records_async(wanted)
    except OSError as exc:
        log.error("delete records of %s-%d before offset %d failed: %s", topic, index, offset,
                  exc)
        return ErrorCode.kafka_storage_error, -1


# --- what needs a cluster ----------------------------------------------------------------------

def handle_elect_leaders(broker, request: Request):
    if broker.cluster_mode is not None:
        return cluster_partitions.elect_leaders(broker, request)
    mod = response_module(ELECT_LEADERS, request.api_version)
    body = request.body
    election = getattr(body, "election_type", PREFERRED_ELECTION)
    results = []
    if election not in (PREFERRED_ELECTION, UNCLEAN_ELECTION):
        log.info("elect leaders refused: unknown election type %d", election)
        return build(mod.ElectLeadersResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.invalid_request, replica_election_results=())
    may_alter = authorize.cluster(broker, request, Op.ALTER)
    # All partitions (null): Kafka leaves out those whose leader is already the one wanted,
    # which on one broker is every partition.
    for t in body.topic_partitions or ():
        partitions = []
        for index in t.partitions:
            if not may_alter:
                error, message = ErrorCode.cluster_authorization_failed, None
            elif broker.topics.partition(t.topic, index) is None:
                log.info("elect leaders of %s-%d refused: no such topic or partition",
                         t.topic, index)
                error, message = (ErrorCode.unknown_topic_or_partition,
                                  "The partition does not exist.")
            else:
                error, message = (ErrorCode.election_not_needed,
                                  "Leader election not needed for topic partition: its only "
                                  "replica leads it.")
            partitions.append(build(mod.PartitionResult, partition_id=index, error_code=error,
                                    error_message=message))
        results.append(build(mod.ReplicaElectionResult, topic=t.topic,
                             partition_result=tuple(partitions)))
    return build(mod.ElectLeadersResponse, throttle_time=NO_THROTTLE,
                 error_code=ErrorCode.none if may_alter
                 else ErrorCode.cluster_authorization_failed,
                 replica_election_results=tuple(results))


def handle_alter_partition_reassignments(broker, request: Request):
    if broker.cluster_mode is not None:
        return cluster_partitions.alter_partition_reassignments(broker, request)
    mod = response_module(ALTER_PARTITION_REASSIGNMENTS, request.api_version)
    body = request.body
    topics = []
    may_alter = authorize.cluster(broker, request, Op.ALTER)
    for t in body.topics:
        partitions = []
        for p in t.partitions:
            error, message = _reassignment(broker, t.name, p.partition_index, p.replicas) \
                if may_alter else (ErrorCode.cluster_authorization_failed, None)
            if error != ErrorCode.none:
                log.info("reassignment of %s-%d refused: %s", log_safe(t.name),
                         p.partition_index, log_safe(message))
            partitions.append(build(mod.ReassignablePartitionResponse,
                                    partition_index=p.partition_index, error_code=error,
                                    error_message=message))
        topics.append(build(mod.ReassignableTopicResponse, name=t.name,
                            partitions=tuple(partitions)))
    return build(mod.AlterPartitionReassignmentsResponse, throttle_time=NO_THROTTLE,
                 allow_replication_factor_change=getattr(
                     body, "allow_replication_factor_change", True),
                 error_code=ErrorCode.none if may_alter
                 else ErrorCode.cluster_authorization_failed, error_message=None,
                 responses=tuple(topics))


def _reassignment(broker, topic: str, index: int,
                  replicas: tuple[int, ...] | None) -> tuple[ErrorCode, str | None]:
    if broker.topics.partition(topic, index) is None:
        return ErrorCode.unknown_topic_or_partition, "The partition does not exist."
    if replicas is None:  # a cancellation
        return (ErrorCode.no_reassignment_in_progress,
                f"No ongoing reassignment for partition {topic}-{index}.")
    problem = broker.topics.replicas_problem(list(replicas), f"{topic}-{index}")
    if problem:
        return ErrorCode.invalid_replica_assignment, problem
    return ErrorCode.none, None  # already where it is asked to be


def handle_list_partition_reassignments(broker, request: Request):
    if broker.cluster_mode is not None:
        return cluster_partitions.list_partition_reassignments(broker, request)
    mod = response_module(LIST_PARTITION_REASSIGNMENTS, request.api_version)
    # Reassignments finish the moment they are asked for on one broker: none is ongoing.
    return build(mod.ListPartitionReassignmentsResponse, throttle_time=NO_THROTTLE,
                 error_code=ErrorCode.none if authorize.cluster(broker, request, Op.DESCRIBE)
                 else ErrorCode.cluster_authorization_failed, error_message=None, topics=())


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.DELETE_RECORDS: handle_delete_records,
    apis.CREATE_PARTITIONS: handle_create_partitions,
    apis.ELECT_LEADERS: handle_elect_leaders,
    apis.ALTER_PARTITION_REASSIGNMENTS: handle_alter_partition_reassignments,
    apis.LIST_PARTITION_REASSIGNMENTS: handle_list_partition_reassignments,
}
