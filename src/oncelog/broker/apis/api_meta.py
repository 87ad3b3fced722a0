"""ApiVersions, Metadata and FindCoordinator: what a client asks before anything else."""

from __future__ import annotations

import datetime
import logging
import uuid

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.api_versions import ADVERTISED_VERSIONS, API_VERSIONS_KEY, METADATA
from ...protocol.messages import Request
from ...protocol.schema import build, response_module
from ..log_limits import RateLimitedLog, log_safe
from ..topics import INTERNAL_TOPICS, TopicError, topic_name_problem
from . import acl_operations

log = logging.getLogger(__name__)
_invalid_names = RateLimitedLog(log)  # librdkafka's suite asks for them thousands of times

NO_THROTTLE = datetime.timedelta(0)


def api_versions_body(api_version: int, error: ErrorCode = ErrorCode.none):
    mod = response_module(API_VERSIONS_KEY, api_version)
    keys = tuple(
        build(mod.ApiVersion, api_key=key, min_version=lo, max_version=hi)
        for key, lo, hi in ADVERTISED_VERSIONS
    )
    return build(mod.ApiVersionsResponse, error_code=error, api_keys=keys,
                 throttle_time=NO_THROTTLE, supported_features=(),
                 finalized_features_epoch=-1, finalized_features=(), zk_migration_ready=False)


def handle_api_versions(broker, request: Request):
    return api_versions_body(request.api_version)


def unsupported_api_versions_body():
    """KIP-511: a too-new ApiVersions request gets a v0 answer listing what we do support."""
    return api_versions_body(0, ErrorCode.unsupported_version)


def handle_metadata(broker, request: Request):
    mod = response_module(METADATA, request.api_version)
    body = request.body
    topics = broker.topics
    if body.topics is None or (request.api_version == 0 and not body.topics):
        wanted = sorted(topics.topics)
    else:
        wanted = [t.name if t.name is not None or getattr(t, "topic_id", None) is None
                  else t.topic_id for t in body.topics]  # v10+: by id (KIP-516)
    auto_create = getattr(body, "allow_auto_topic_creation", True) and \
        broker.config.get("auto.create.topics.enable")
    topic_ops = acl_operations.answer(
        getattr(body, "include_topic_authorized_operations", False), acl_operations.TOPIC)
    results = []
    for name in wanted:
        if isinstance(name, uuid.UUID):
            topic = topics.by_id(name)
            if topic is None:
                results.append(build(mod.MetadataResponseTopic,
                                     error_code=ErrorCode.unknown_topic_id,
                                     # the answer's name is nullable from v12 only
                                     name=None if request.api_version >= 12 else "",
                                     topic_id=name, is_internal=False, partitions=(),
                                     topic_authorized_operations=topic_ops))
                continue
            name = topic.name
        results.append(_metadata_topic(broker, mod, name, auto_create, topic_ops))
    brokers = tuple(build(mod.MetadataResponseBroker, node_id=node, host=host, port=port,
                          rack=rack) for node, host, port, rack in broker.cluster_brokers())
    return build(mod.MetadataResponse, throttle_time=NO_THROTTLE, brokers=brokers,
                 cluster_id=broker.cluster_id, controller_id=broker.controller_id(),
                 topics=tuple(results), error_code=ErrorCode.none,
                 cluster_authorized_operations=acl_operations.answer(
                     getattr(body, "include_cluster_authorized_operations", False),
                     acl_operations.CLUSTER))


def _metadata_topic(broker, mod, name: str | None, auto_create: bool, topic_ops: int):
    topics = broker.topics
    topic = topics.get(name) if name else None
    error = ErrorCode.none
    if topic is None:
        problem = topic_name_problem(name)
        if problem:
            _invalid_names.log(logging.INFO, "invalid topic name",
                               "metadata request for invalid topic %r refused: %s",
                               log_safe(name), log_safe(problem))
            error = ErrorCode.invalid_topic_exception
        elif auto_create:
            try:
                topic = topics.auto_create(name)
            except TopicError as exc:
                log.warning("auto-creating topic %r failed: %s", log_safe(name), log_safe(exc))
                error = exc.error
        else:
            error = ErrorCode.unknown_topic_or_partition
    partitions = ()
    if topic is not None:
        partitions = tuple(
            build(mod.MetadataResponsePartition, **partition_fields(broker, p))
            for p in topic.partitions
        )
    values = {
        "error_code": error, "name": name or "", "is_internal": name in INTERNAL_TOPICS,
        "partitions": partitions,
        "topic_authorized_operations": topic_ops,
        "topic_id": topic.topic_id if topic is not None else uuid.UUID(int=0),
    }
    return build(mod.MetadataResponseTopic, **values)


def partition_fields(broker, partition) -> dict:
    """A partition as Metadata and DescribeTopicPartitions show it. A partition whose log
    directory failed shows this broker as an offline replica, as Kafka shows it; produce and
    fetch answer KAFKA_STORAGE_ERROR."""
    node = (broker.broker_id,)
    replication = partition.replication
    if replication is not None:  # cluster mode: the state this broker read from ZooKeeper
        leader = replication.leader
        return {"error_code": ErrorCode.none if leader >= 0 else
                ErrorCode.leader_not_available, "partition_index": partition.index,
                "leader_id": leader, "leader_epoch": max(replication.leader_epoch, 0),
                "replica_nodes": replication.replicas or node,
                "isr_nodes": replication.isr or node,
                "offline_replicas": node if partition.log_dir.offline else ()}
    return {"error_code": ErrorCode.none, "partition_index": partition.index,
            "leader_id": broker.broker_id, "leader_epoch": 0, "replica_nodes": node,
            "isr_nodes": node, "offline_replicas": node if partition.log_dir.offline else ()}


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.METADATA: handle_metadata,
    apis.API_VERSIONS_KEY: handle_api_versions,
}
