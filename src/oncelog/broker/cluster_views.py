"""The cluster and storage views: DescribeCluster, DescribeTopicPartitions (KIP-966),
DescribeLogDirs, and AlterReplicaLogDirs (moving a partition between log directories).

Answered as a one-broker Kafka cluster answers them: this broker is every broker and the
controller; replicas of another log directory's partitions are moved by log_dir_moves.py.
"""

from __future__ import annotations

import logging
import os

from kio.schema.errors import ErrorCode

from ..protocol.api_versions import (
    ALTER_REPLICA_LOG_DIRS,
    DESCRIBE_CLUSTER,
    DESCRIBE_LOG_DIRS,
    DESCRIBE_TOPIC_PARTITIONS,
)
from ..protocol.messages import Request
from ..protocol.schema import build, response_module
from . import acl_operations
from .api_meta import NO_THROTTLE, partition_fields
from .log_dirs import directory_bytes, volume_bytes
from .log_limits import log_safe
from .topics import INTERNAL_TOPICS

log = logging.getLogger(__name__)

ENDPOINT_BROKERS = 1  # DescribeCluster's endpoint_type (KIP-919): 1 brokers, 2 controllers
ENDPOINT_CONTROLLERS = 2
# Kafka's max.request.partition.size.limit: the most partitions one DescribeTopicPartitions
# answer holds, whatever the request asks.
MAX_RESPONSE_PARTITIONS = 2000


# --- DescribeCluster ---------------------------------------------------------------------

def handle_describe_cluster(broker, request: Request):
    mod = response_module(DESCRIBE_CLUSTER, request.api_version)
    body = request.body
    asked = getattr(body, "endpoint_type", ENDPOINT_BROKERS)
    if asked != ENDPOINT_BROKERS:
        # Kafka's answers: v0 knows no endpoint types; a controller endpoint is not ours.
        if request.api_version == 0:
            error = ErrorCode.invalid_request
        elif asked == ENDPOINT_CONTROLLERS:
            error = ErrorCode.mismatched_endpoint_type
        else:
            error = ErrorCode.unsupported_endpoint_type
        message = (f"the request was sent to a broker endpoint but asks for endpoint type "
                   f"{asked}" if asked == ENDPOINT_CONTROLLERS
                   else f"unsupported endpoint type {asked}")
        log.info("%s: DescribeCluster refused: %s", request.peer, message)
        return build(mod.DescribeClusterResponse, throttle_time=NO_THROTTLE, error_code=error,
                     error_message=message, endpoint_type=ENDPOINT_BROKERS,
                     cluster_id=broker.cluster_id, controller_id=-1, brokers=(),
                     cluster_authorized_operations=acl_operations.OMITTED)
    brokers = (build(mod.DescribeClusterBroker, broker_id=broker.broker_id,
                     host=broker.advertised_host, port=broker.advertised_port, rack=None,
                     is_fenced=False),)
    return build(mod.DescribeClusterResponse, throttle_time=NO_THROTTLE,
                 error_code=ErrorCode.none, error_message=None,
                 endpoint_type=ENDPOINT_BROKERS, cluster_id=broker.cluster_id,
                 controller_id=broker.broker_id, brokers=brokers,
                 cluster_authorized_operations=acl_operations.answer(
                     body.include_cluster_authorized_operations, acl_operations.CLUSTER))


# --- DescribeTopicPartitions (KIP-966) -----------------------------------------------------

def handle_describe_topic_partitions(broker, request: Request):
    """Topics in name order from the cursor on, at most ``response_partition_limit``
    partitions (capped at MAX_RESPONSE_PARTITIONS); ``next_cursor`` says where the next
    page starts, null on the last page. As Kafka pages: once the limit is used up, the next
    topic asked for (known or not) is the cursor, at partition 0."""
    mod = response_module(DESCRIBE_TOPIC_PARTITIONS, request.api_version)
    body = request.body
    topics = broker.topics
    cursor = body.cursor
    all_topics = not body.topics
    wanted = sorted(topics.topics) if all_topics else sorted({t.name for t in body.topics})
    if cursor is not None:
        if not all_topics and cursor.topic_name not in wanted:
            message = f"the cursor's topic {cursor.topic_name!r} is not among the topics asked for"
            log.info("%s: DescribeTopicPartitions refused: %s", request.peer,
                     log_safe(message))
            return build(mod.DescribeTopicPartitionsResponse, throttle_time=NO_THROTTLE,
                         topics=tuple(_unknown_topic(mod, name, ErrorCode.invalid_request)
                                      for name in wanted), next_cursor=None)
        wanted = [name for name in wanted if name >= cursor.topic_name]
    remaining = min(body.response_partition_limit, MAX_RESPONSE_PARTITIONS)
    if remaining < 1:  # Kafka would answer an empty page whose cursor never moves
        remaining = MAX_RESPONSE_PARTITIONS
    results, next_cursor = [], None
    for name in wanted:
        if remaining == 0:
            next_cursor = build(mod.Cursor, topic_name=name, partition_index=0)
            break
        topic = topics.get(name)
        if topic is None:
            results.append(_unknown_topic(mod, name, ErrorCode.unknown_topic_or_partition))
            continue
        start = cursor.partition_index if cursor is not None and name == cursor.topic_name \
            else 0
        page = topic.partitions[max(start, 0):][:remaining]
        remaining -= len(page)
        if page and page[-1].index + 1 < len(topic.partitions):
            next_cursor = build(mod.Cursor, topic_name=name, partition_index=page[-1].index + 1)
        results.append(build(
            mod.DescribeTopicPartitionsResponseTopic, error_code=ErrorCode.none, name=name,
            topic_id=topic.topic_id, is_internal=name in INTERNAL_TOPICS,
            partitions=tuple(build(mod.DescribeTopicPartitionsResponsePartition,
                                   eligible_leader_replicas=None, last_known_elr=None,
                                   **partition_fields(broker, p)) for p in page),
            topic_authorized_operations=acl_operations.TOPIC))
        if next_cursor is not None:
            break
    return build(mod.DescribeTopicPartitionsResponse, throttle_time=NO_THROTTLE,
                 topics=tuple(results), next_cursor=next_cursor)


def _unknown_topic(mod, name: str, error: ErrorCode):
    return build(mod.DescribeTopicPartitionsResponseTopic, error_code=error, name=name,
                 topic_id=None, is_internal=False, partitions=(),
                 topic_authorized_operations=acl_operations.OMITTED)


# --- DescribeLogDirs ---------------------------------------------------------------------

def handle_describe_log_dirs(broker, request: Request):
    mod = response_module(DESCRIBE_LOG_DIRS, request.api_version)
    topics = broker.topics
    asked = request.body.topics
    wanted: dict[str, set[int]] | None = None
    if asked is not None:
        wanted = {}
        for t in asked:
            wanted.setdefault(t.topic, set()).update(t.partitions)

    def shown(partition) -> bool:
        return wanted is None or partition.index in wanted.get(partition.topic, ())

    results = []
    for path, state in topics.log_dirs.items():
        if state.offline:
            results.append(build(mod.DescribeLogDirsResult,
                                 error_code=ErrorCode.kafka_storage_error, log_dir=path,
                                 topics=(), total_bytes=-1, usable_bytes=-1,
                                 is_cordoned=False))
            continue
        rows: dict[str, list] = {}
        for topic in topics.topics.values():
            for p in topic.partitions:
                if p.log_dir is state and shown(p):
                    rows.setdefault(p.topic, []).append(build(
                        mod.DescribeLogDirsPartition, partition_index=p.index,
                        partition_size=directory_bytes(p.dir), offset_lag=0,
                        is_future_key=False))
        for p, size, lag in topics.moves.futures_in(state):
            if shown(p):
                rows.setdefault(p.topic, []).append(build(
                    mod.DescribeLogDirsPartition, partition_index=p.index,
                    partition_size=size, offset_lag=lag, is_future_key=True))
        total, usable = volume_bytes(path)
        results.append(build(
            mod.DescribeLogDirsResult, error_code=ErrorCode.none, log_dir=path,
            topics=tuple(build(mod.DescribeLogDirsTopic, name=name, partitions=tuple(ps))
                         for name, ps in sorted(rows.items())),
            total_bytes=total, usable_bytes=usable, is_cordoned=False))
    return build(mod.DescribeLogDirsResponse, throttle_time=NO_THROTTLE,
                 error_code=ErrorCode.none, results=tuple(results))


# --- AlterReplicaLogDirs -----------------------------------------------------------------

def handle_alter_replica_log_dirs(broker, request: Request):
    """Each partition named is moved into its directory in the background (Kafka answers
    once the move is under way; DescribeLogDirs shows the copy as a future replica)."""
    mod = response_module(ALTER_REPLICA_LOG_DIRS, request.api_version)
    topics = broker.topics
    by_topic: dict[str, list] = {}
    for entry in request.body.dirs:
        target = topics.log_dirs.get(os.path.abspath(entry.path)) \
            if os.path.isabs(entry.path) else None
        for t in entry.topics:
            for index in t.partitions:
                error = _move(broker, request.peer, entry.path, target, t.name, index)
                by_topic.setdefault(t.name, []).append(build(
                    mod.AlterReplicaLogDirPartitionResult, partition_index=index,
                    error_code=error))
    return build(mod.AlterReplicaLogDirsResponse, throttle_time=NO_THROTTLE, results=tuple(
        build(mod.AlterReplicaLogDirTopicResult, topic_name=name, partitions=tuple(results))
        for name, results in by_topic.items()))


def _move(broker, peer: str, path: str, target, topic: str, index: int) -> ErrorCode:
    partition = broker.topics.partition(topic, index)
    if target is None:
        log.info("%s: AlterReplicaLogDirs %s-%d: %s is not one of this broker's log.dirs "
                 "(absolute paths: %s)", peer, log_safe(topic), index, log_safe(path),
                 ", ".join(broker.topics.log_dirs))
        return ErrorCode.log_dir_not_found
    if partition is None:
        log.info("%s: AlterReplicaLogDirs: no partition %s-%d", peer, log_safe(topic),
                 index)
        return ErrorCode.unknown_topic_or_partition
    if target.offline or partition.log_dir.offline:
        log.info("%s: AlterReplicaLogDirs %s-%d to %s: a log directory is offline", peer,
                 log_safe(topic), index, log_safe(path))
        return ErrorCode.kafka_storage_error
    broker.topics.moves.start(partition, target)
    return ErrorCode.none
