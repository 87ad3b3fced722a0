"""The cluster and storage views: DescribeCluster, DescribeTopicPartitions (KIP-966),
DescribeLogDirs, AlterReplicaLogDirs (moving a partition between log directories),
DescribeQuorum (KIP-595) and ListConfigResources (KIP-1142).

Answered as a one-broker Kafka cluster answers them: this broker is every broker and the
controller; replicas of another log directory's partitions are moved by log_dir_moves.py.
"""

from __future__ import annotations

import logging
import os
import time

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.api_versions import (
    ALTER_REPLICA_LOG_DIRS,
    DESCRIBE_CLUSTER,
    DESCRIBE_LOG_DIRS,
    DESCRIBE_QUORUM,
    DESCRIBE_TOPIC_PARTITIONS,
    LIST_CONFIG_RESOURCES,
)
from ...protocol.messages import Request
from ...protocol.schema import build, response_module
from .. import authorize
from ..authorize import Op, Rt
from ..log_dirs import directory_bytes, volume_bytes
from ..log_limits import log_safe
from ..topics import INTERNAL_TOPICS
from . import acl_operations
from .api_meta import NO_THROTTLE, cluster_operations, partition_fields

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
    brokers = tuple(build(mod.DescribeClusterBroker, broker_id=node, host=host, port=port,
                          rack=rack, is_fenced=False)
                    for node, host, port, rack in broker.cluster_brokers(
                        request.session.listener))
    return build(mod.DescribeClusterResponse, throttle_time=NO_THROTTLE,
                 error_code=ErrorCode.none, error_message=None,
                 endpoint_type=ENDPOINT_BROKERS, cluster_id=broker.cluster_id,
                 controller_id=broker.controller_id(), brokers=brokers,
                 cluster_authorized_operations=cluster_operations(
                     broker, request, body.include_cluster_authorized_operations))


# --- DescribeTopicPartitions (KIP-966) -----------------------------------------------------

def handle_describe_topic_partitions(broker, request: Request):
    """Topics in name order from the cursor on, at most ``response_partition_limit``
    partitions (capped at MAX_RESPONSE_PARTITIONS); ``next_cursor`` says where the next
    page starts, null on the last page. As Kafka pages: once the limit is used up, the next
    topic asked for (known or not) is the cursor, at partition 0."""
    mod = response_module(DESCRIBE_TOPIC_PARTITIONS, request.api_version)
    body = request.body
    topics = broker.cluster_topics or broker.topics
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
    # Describe on each topic: the others left out of all topics, else refused by name
    described = authorize.allowed_names(broker, request, Op.DESCRIBE, Rt.TOPIC, wanted,
                                        quiet=all_topics)
    for name in wanted:
        if name not in described:
            if not all_topics:
                results.append(_unknown_topic(mod, name, ErrorCode.topic_authorization_failed))
            continue
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
            topic_authorized_operations=authorize.operations(broker, request, Rt.TOPIC, name)))
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
    if not authorize.cluster(broker, request, Op.DESCRIBE):
        return build(mod.DescribeLogDirsResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.cluster_authorization_failed, results=())
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
    may_alter = authorize.cluster(broker, request, Op.ALTER)
    for entry in request.body.dirs:
        target = topics.log_dirs.get(os.path.abspath(entry.path)) \
            if os.path.isabs(entry.path) else None
        for t in entry.topics:
            for index in t.partitions:
                error = _move(broker, request.peer, entry.path, target, t.name, index) \
                    if may_alter else ErrorCode.cluster_authorization_failed
                by_topic.setdefault(t.name, []).append(build(
                    mod.AlterReplicaLogDirPartitionResult, partition_index=index,
                    error_code=error))
    return build(mod.AlterReplicaLogDirsResponse, throttle_time=NO_THROTTLE, results=tuple(
        build(mod.AlterReplicaLogDirTopicResult, topic_name=name, partitions=tuple(results))
        for name, results in by_topic.items()))


def _move(broker, peer: str, path: str, target, topic: str, index: int) -> ErrorCode:
    partition = broker.topics.partition(topic, index)
    if target is None:
        log.info("%s: AlterReplicaLogDirs %s-%d: %r is not one of this broker's log.dirs "
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


# --- DescribeQuorum ----------------------------------------------------------------------

METADATA_TOPIC = "__cluster_metadata"


def handle_describe_quorum(broker, request: Request):
    """The metadata quorum of a one-node cluster: this broker is its only voter and its
    leader. Kafka answers a request naming anything but ``__cluster_metadata`` partition 0
    with UNKNOWN_TOPIC_OR_PARTITION for the whole request. This broker keeps its metadata in
    a store, not a log: the quorum's offsets are 0."""
    mod = response_module(DESCRIBE_QUORUM, request.api_version)
    asked = [(t.topic_name, p.partition_index) for t in request.body.topics
             for p in t.partitions]
    if not authorize.cluster(broker, request, Op.DESCRIBE):
        return build(mod.DescribeQuorumResponse,
                     error_code=ErrorCode.cluster_authorization_failed, error_message=None,
                     topics=(), nodes=())
    if asked != [(METADATA_TOPIC, 0)]:
        return build(mod.DescribeQuorumResponse, error_code=ErrorCode.unknown_topic_or_partition,
                     error_message=f"only {METADATA_TOPIC}-0 has a quorum", topics=(),
                     nodes=())
    now = int(time.time() * 1000)
    voter = build(mod.ReplicaState, replica_id=broker.broker_id, replica_directory_id=None,
                  log_end_offset=0, last_fetch_timestamp=now, last_caught_up_timestamp=now)
    partition = build(mod.PartitionData, partition_index=0, error_code=ErrorCode.none,
                      error_message=None, leader_id=broker.broker_id, leader_epoch=1,
                      high_watermark=0, current_voters=(voter,), observers=())
    nodes = () if not hasattr(mod, "Node") else (build(
        mod.Node, node_id=broker.broker_id, listeners=(build(
            mod.Listener, name="PLAINTEXT", host=broker.advertised_host,
            port=broker.advertised_port),)),)
    return build(mod.DescribeQuorumResponse, error_code=ErrorCode.none, error_message=None,
                 topics=(build(mod.TopicData, topic_name=METADATA_TOPIC,
                               partitions=(partition,)),), nodes=nodes)


# --- ListConfigResources -----------------------------------------------------------------

# Kafka's ConfigResource types
TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32


def handle_list_config_resources(broker, request: Request):
    """The resources that have configurations, of the types asked (none: all). v0 was
    ListClientMetricsResources and lists client-metrics subscriptions only; this broker has
    none (it collects no client telemetry), nor group configurations."""
    mod = response_module(LIST_CONFIG_RESOURCES, request.api_version)
    wanted = set(getattr(request.body, "resource_types", ()) or ()) \
        or ({CLIENT_METRICS} if request.api_version == 0
            else {TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP})
    unknown = wanted - {TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP}
    if not authorize.cluster(broker, request, Op.DESCRIBE_CONFIGS):
        return build(mod.ListConfigResourcesResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.cluster_authorization_failed, config_resources=())
    if unknown:
        return build(mod.ListConfigResourcesResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.invalid_request, config_resources=())
    found: list[tuple[str, int]] = []
    if TOPIC in wanted:
        found += [(name, TOPIC) for name in sorted(broker.topics.topics)]
    for kind in (BROKER, BROKER_LOGGER):
        if kind in wanted:
            found.append((str(broker.broker_id), kind))
    return build(mod.ListConfigResourcesResponse, throttle_time=NO_THROTTLE,
                 error_code=ErrorCode.none, config_resources=tuple(
                     build(mod.ConfigResource, resource_name=name, resource_type=kind)
                     for name, kind in found))


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.DESCRIBE_CLUSTER: handle_describe_cluster,
    apis.DESCRIBE_TOPIC_PARTITIONS: handle_describe_topic_partitions,
    apis.DESCRIBE_LOG_DIRS: handle_describe_log_dirs,
    apis.ALTER_REPLICA_LOG_DIRS: handle_alter_replica_log_dirs,
    apis.DESCRIBE_QUORUM: handle_describe_quorum,
    apis.LIST_CONFIG_RESOURCES: handle_list_config_resources,
}
