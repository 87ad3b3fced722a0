"""ApiVersions, Metadata and FindCoordinator: what a client asks before anything else."""

from __future__ import annotations

import datetime
import logging
import uuid

from kio.schema.errors import ErrorCode

from ...cluster.metadata_cache import PartitionImage
from ...protocol import api_versions as apis
from ...protocol.api_versions import ADVERTISED_VERSIONS, API_VERSIONS_KEY, METADATA
from ...protocol.messages import Request
from ...protocol.schema import build, response_module
from ...security.acls import CLUSTER_NAME, all_operations_field
from .. import authorize
from ..answers import CLOSE_CONNECTION
from ..authorize import Op, Rt
from ..log_limits import RateLimitedLog, log_safe
from ..topics import INTERNAL_TOPICS, TopicError, topic_name_problem
from . import acl_operations

log = logging.getLogger(__name__)
_invalid_names = RateLimitedLog(log)  # librdkafka's suite asks for them thousands of times
_not_vouched = RateLimitedLog(log)

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
    if broker.replicas is not None and broker.replicas.fenced:
        # ZooKeeper silent for half its session timeout, or its session expired (the standing
        # table, cluster/membership.py), its leaderships fenced (cluster/isr.py's B0), and
        # until it reads the states again: no source of metadata. librdkafka asks Metadata
        # only of brokers it is connected to, so an answer naming no leader would be asked
        # again of this broker alone; a closed connection makes it connect to another.
        _not_vouched.log(logging.WARNING, "not vouched", "%s: Metadata refused: broker %d "
                         "cannot vouch for its ZooKeeper session; closing the connection",
                         request.peer, broker.broker_id)
        return CLOSE_CONNECTION
    mod = response_module(METADATA, request.api_version)
    body = request.body
    topics = broker.cluster_topics or broker.topics
    all_topics = body.topics is None or (request.api_version == 0 and not body.topics)
    if all_topics:
        wanted = sorted(topics.topics)
    else:
        wanted = [t.name if t.name is not None or getattr(t, "topic_id", None) is None
                  else t.topic_id for t in body.topics]  # v10+: by id (KIP-516)
    auto_create = getattr(body, "allow_auto_topic_creation", True) and \
        broker.config.get("auto.create.topics.enable")
    ops_asked = getattr(body, "include_topic_authorized_operations", False)
    topic_ops = acl_operations.OMITTED
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
            by_id: uuid.UUID | None = name
            name = topic.name
        else:
            by_id = None
        if broker.authorizer is not None:
            refusal = _metadata_refusal(broker, request, mod, name, by_id, all_topics,
                                        auto_create)
            if refusal is not None:
                if refusal is not _LEFT_OUT:
                    results.append(refusal)
                continue
            if ops_asked:
                topic_ops = authorize.operations(broker, request, Rt.TOPIC, name)
        elif ops_asked:
            topic_ops = all_operations_field(Rt.TOPIC)
        results.append(_metadata_topic(broker, mod, name, auto_create, topic_ops))
    brokers = tuple(build(mod.MetadataResponseBroker, node_id=node, host=host, port=port,
                          rack=rack) for node, host, port, rack in broker.cluster_brokers(
                              request.session.listener, departed=True))
    return build(mod.MetadataResponse, throttle_time=NO_THROTTLE, brokers=brokers,
                 cluster_id=broker.cluster_id, controller_id=broker.controller_id(),
                 topics=tuple(results), error_code=ErrorCode.none,
                 cluster_authorized_operations=cluster_operations(
                     broker, request, getattr(body, "include_cluster_authorized_operations",
                                              False)))


def cluster_operations(broker, request: Request, asked: bool) -> int:
    """The cluster's authorized operations field: omitted unless asked, none without Cluster
    Describe (as Kafka answers Metadata and DescribeCluster)."""
    if not asked:
        return acl_operations.OMITTED
    if not authorize.cluster(broker, request, Op.DESCRIBE, quiet=True):
        return 0
    return authorize.operations(broker, request, Rt.CLUSTER, CLUSTER_NAME)


_LEFT_OUT = object()  # a topic left out of an answer for all topics


def _metadata_refusal(broker, request: Request, mod, name: str, by_id: uuid.UUID | None,
                      all_topics: bool, auto_create: bool):
    """Kafka's Metadata checks of one topic, None when it is answered as usual: without
    Describe it is left out of an answer for all topics, else TOPIC_AUTHORIZATION_FAILED (by
    id: without its name); a missing topic auto-created needs Create on the cluster or on
    it, else TOPIC_AUTHORIZATION_FAILED."""
    refused = build(mod.MetadataResponseTopic, error_code=ErrorCode.topic_authorization_failed,
                    name=None if by_id is not None and request.api_version >= 12 else
                    "" if by_id is not None else name,
                    topic_id=by_id or uuid.UUID(int=0), is_internal=False, partitions=(),
                    topic_authorized_operations=acl_operations.OMITTED)
    if not authorize.allowed(broker, request, Op.DESCRIBE, Rt.TOPIC, name, quiet=all_topics):
        return _LEFT_OUT if all_topics else refused
    if auto_create and broker.topics.get(name) is None and not topic_name_problem(name) \
            and not authorize.cluster(broker, request, Op.CREATE, quiet=True) \
            and not authorize.allowed(broker, request, Op.CREATE, Rt.TOPIC, name):
        return refused
    return None


def _metadata_topic(broker, mod, name: str | None, auto_create: bool, topic_ops: int):
    topics = broker.cluster_topics or broker.topics
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
                # In cluster mode LEADER_NOT_AVAILABLE is the answer while leaders are elected
                log.log(logging.INFO if exc.error == ErrorCode.leader_not_available
                        else logging.WARNING, "auto-creating topic %r: %s", log_safe(name),
                        log_safe(exc))
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
    fetch answer KAFKA_STORAGE_ERROR. In cluster mode, as the cluster's metadata has it."""
    if isinstance(partition, PartitionImage):
        return broker.cluster_mode.partition_fields(partition)
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
