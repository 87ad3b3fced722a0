"""The consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete.

Each handler turns a request of any supported version into a call of the GroupCoordinator
(coordinator/group/group_coordinator.py, where every decision is made) and its result into that
version's response. ``OffsetsTopic`` is where the coordinator's records go: the partitions of
``__consumer_offsets``, through the same append path (and flush policy) as any produce.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from ...coordinator.group.group_coordinator import (
    GroupConfig,
    GroupCoordinator,
    OffsetCommitPartition,
    WriteFailed,
)
from ...coordinator.internal_log import partition_for
from ...protocol import api_versions as apis
from ...protocol.control import read_marker
from ...protocol.messages import Request
from ...protocol.record_batch import InvalidBatch, crc_of, scan_batches
from ...protocol.records import decode_record_fields, encode_batch, now_ms
from ...protocol.schema import build, has_field, response_module
from .. import authorize, group_configs, internal_topics
from ..authorize import Op, Rt
from ..config import BrokerConfig
from ..topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, TopicError, TopicManager
from . import acl_operations
from .api_meta import NO_THROTTLE
from .consumer_groups import TopicImage, consumer_group_config

log = logging.getLogger(__name__)

GROUP_KEY, TRANSACTION_KEY = 0, 1
_READ_CHUNK = 1 << 20
# Kafka's mapping of an append error to what a group request answers.
_APPEND_ERRORS = {
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
    ErrorCode.message_too_large: ErrorCode.message_too_large,
    ErrorCode.record_list_too_large: ErrorCode.message_too_large,
}


def group_config(config: BrokerConfig, num_partitions: int) -> GroupConfig:
    return GroupConfig(
        num_partitions=num_partitions,
        min_session_timeout_ms=config.get("group.min.session.timeout.ms"),
        max_session_timeout_ms=config.get("group.max.session.timeout.ms"),
        initial_rebalance_delay_ms=config.get("group.initial.rebalance.delay.ms"),
        max_size=config.get("group.max.size"),
        offsets_retention_ms=config.get("offsets.retention.minutes") * 60_000,
        offset_metadata_max_bytes=config.get("offset.metadata.max.bytes"),
    )


class InternalTopicLog:
    """A coordinator's log (coordinator.internal_log.OffsetsLog): the partitions of an
    internal topic, created on first use by ``ensure``, written through the same append path
    (and flush policy) as any produce."""

    def __init__(self, topics: TopicManager, name: str, ensure) -> None:
        self.topics = topics
        self.name = name
        self.ensure = ensure

    def num_partitions(self, default: int) -> int:
        topic = self.topics.get(self.name)
        return len(topic.partitions) if topic is not None else default

    def append(self, partition: int, records: list[tuple[bytes, bytes | None]],
               producer: tuple[int, int] | None = None):
        """``producer``: (id, epoch) of the transaction the records belong to."""
        return self.append_at(partition, records, producer)[1]

    def append_at(self, partition: int, records: list[tuple[bytes, bytes | None]],
                  producer: tuple[int, int] | None = None):
        """``append``, also returning the offset of the batch's first record."""
        try:
            topic = self.ensure()
        except TopicError as exc:
            raise WriteFailed(ErrorCode.coordinator_not_available, str(exc)) from None
        target = topic.partitions[partition]
        now = now_ms()
        rows = [(key, value, (), now) for key, value in records]
        batch = encode_batch(rows) if producer is None else encode_batch(
            rows, producer_id=producer[0], producer_epoch=producer[1], transactional=True)
        try:
            result = target.append_records(batch)
        except InvalidBatch as exc:
            raise WriteFailed(_APPEND_ERRORS.get(exc.error, exc.error), str(exc)) from None
        except OSError as exc:
            raise WriteFailed(ErrorCode.not_coordinator, f"writing {target.name}: {exc}") \
                from None
        return result.base_offset, target.durable(result)

    def read(self, partition: int) -> Iterable[LogRecord]:
        """Every record of the partition, oldest first, control records included."""
        topic = self.topics.get(self.name)
        if topic is None or partition >= len(topic.partitions):
            return
        source = topic.partitions[partition]
        if not source.holds_data():
            return
        plog = source.log
        offset = plog.log_start_offset
        while offset < plog.log_end_offset:
            chunk = plog.read(offset, _READ_CHUNK).records
            moved = False
            for pos, header in scan_batches(chunk):
                if header.last_offset < offset:
                    continue
                moved = True
                offset = header.last_offset + 1
                if crc_of(chunk, pos, header.size) != header.crc:
                    log.error("%s: batch at offset %d fails its CRC check; skipped",
                              source.name, header.base_offset)
                    continue
                pid = header.producer_id if header.is_transactional else -1
                try:
                    if header.is_control:
                        # decode_record_fields gives no control records: read the marker.
                        marker = read_marker(chunk, pos)
                        if marker is not None:
                            yield LogRecord(None, None, header.producer_id,
                                            "commit" if marker.commit else "abort",
                                            header.base_offset)
                        continue
                    _, fields = decode_record_fields(chunk, pos)
                except ValueError as exc:
                    log.error("%s: unreadable batch at offset %d: %s", source.name,
                              header.base_offset, exc)
                    continue
                for delta, _, key, value, _ in fields:
                    yield LogRecord(key, value, pid, None, header.base_offset + delta)
            if not moved:
                return


class LogRecord(NamedTuple):
    key: bytes | None
    value: bytes | None
    producer_id: int  # of a transactional batch, else -1
    marker: str | None  # "commit" or "abort" for a control record
    offset: int


def internal_log(broker, config: BrokerConfig, topics: TopicManager, name: str,
                 ensure, partitions_key: str):
    """(the coordinator's log of internal topic ``name``, its partition count): on one
    broker the local topic, created on first use by ``ensure``; in a cluster this broker's
    replica, written while it leads (broker/internal_topics.py)."""
    if broker is None or broker.cluster_mode is None:
        found = InternalTopicLog(topics, name, ensure)
        return found, found.num_partitions(config.get(partitions_key))
    replicated = internal_topics.ReplicatedTopicLog(
        InternalTopicLog(topics, name, internal_topics.local_replica(topics, name)), topics,
        name, config.get("offsets.commit.timeout.ms"))
    limit_ms = config.get("zookeeper.connection.timeout.ms") or \
        config.get("zookeeper.session.timeout.ms")
    return replicated, internal_topics.num_partitions(broker, name, config.get(partitions_key),
                                                      limit_ms / 1000)


def make_coordinator(config: BrokerConfig, topics: TopicManager,
                     broker=None) -> GroupCoordinator:
    """``broker``: the broker in cluster mode (its coordinator owns the partitions it
    leads), else one broker's own."""
    offsets, num_partitions = internal_log(broker, config, topics, OFFSETS_TOPIC,
                                           topics.offsets_topic, "offsets.topic.num.partitions")
    coordinator = GroupCoordinator(offsets, group_config(config, num_partitions),
                                   lambda t, p: topics.partition(t, p) is not None,
                                   consumer_config=consumer_group_config(config),
                                   topic_image=TopicImage(topics),
                                   owns_all=broker is None or broker.cluster_mode is None)
    if broker is not None and broker.cluster_mode is not None:
        coordinator.ownership.named = internal_topics.named_leader(broker, OFFSETS_TOPIC)
    coordinator.consumer_groups.overrides = group_configs.load_all(topics.store)
    return coordinator


# --- FindCoordinator -----------------------------------------------------------------------

def handle_find_coordinator(broker, request: Request):
    mod = response_module(apis.FIND_COORDINATOR, request.api_version)
    body = request.body
    keys = list(body.coordinator_keys) if has_field(type(body), "coordinator_keys") \
        else [body.key]
    key_type = getattr(body, "key_type", GROUP_KEY)
    found = [_find(broker, request, key_type, key) for key in keys]
    if has_field(mod.FindCoordinatorResponse, "coordinators"):
        coordinators = tuple(
            build(mod.Coordinator, key=key, node_id=node, host=host, port=port,
                  error_code=error, error_message=message)
            for key, (error, message, node, host, port) in zip(keys, found, strict=True))
        return build(mod.FindCoordinatorResponse, throttle_time=NO_THROTTLE,
                     coordinators=coordinators)
    error, message, node, host, port = found[0]
    return build(mod.FindCoordinatorResponse, throttle_time=NO_THROTTLE, error_code=error,
                 error_message=message, node_id=node, host=host, port=port)


def _find(broker, request: Request, key_type: int, key: str):
    def refused(error: ErrorCode, message: str):
        return error, message, -1, "", -1

    if key_type == TRANSACTION_KEY:
        if not authorize.allowed(broker, request, Op.DESCRIBE, Rt.TRANSACTIONAL_ID, key):
            return refused(ErrorCode.transactional_id_authorization_failed,
                           ErrorCode.transactional_id_authorization_failed.name)
        if not key:
            return refused(ErrorCode.invalid_request, "the transactional id is empty")
        ensure = broker.topics.transaction_state_topic
        name, count = TRANSACTION_STATE_TOPIC, broker.transactions.config.num_partitions
    elif key_type == GROUP_KEY:
        if not authorize.allowed(broker, request, Op.DESCRIBE, Rt.GROUP, key):
            return refused(ErrorCode.group_authorization_failed,
                           ErrorCode.group_authorization_failed.name)
        if not key:
            return refused(ErrorCode.invalid_group_id, "the group id is empty")
        ensure = broker.topics.offsets_topic
        name, count = OFFSETS_TOPIC, broker.groups.config.num_partitions
    else:
        return refused(ErrorCode.invalid_request, f"unknown coordinator key type {key_type}")
    if broker.cluster_topics is not None:  # the leader of the key's partition
        return internal_topics.find_coordinator(broker, name, partition_for(key, count),
                                                request.session.listener)
    try:
        ensure()
    except TopicError as exc:
        log.warning("creating an internal topic failed: %s", exc)
        return refused(ErrorCode.coordinator_not_available, str(exc))
    return ErrorCode.none, None, broker.broker_id, *broker.endpoint(request.session.listener)


# --- JoinGroup, SyncGroup, Heartbeat, LeaveGroup --------------------------------------------

async def handle_join_group(broker, request: Request):
    v = request.api_version
    mod = response_module(apis.JOIN_GROUP, v)
    body = request.body
    if not authorize.allowed(broker, request, Op.READ, Rt.GROUP, body.group_id):
        return build(mod.JoinGroupResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.group_authorization_failed, generation_id=-1,
                     protocol_type=None, protocol_name=None if v >= 7 else "", leader="",
                     skip_assignment=False, member_id=body.member_id, members=())
    result = await broker.groups.join(
        body.group_id, body.member_id, getattr(body, "group_instance_id", None),
        request.client_id or "", _host(request.peer), _ms(body.session_timeout),
        _ms(getattr(body, "rebalance_timeout", -1)), body.protocol_type,
        [(p.name, p.metadata) for p in body.protocols],
        require_known_member_id=v >= 4, supports_skip_assignment=v >= 9)
    members = tuple(build(mod.JoinGroupResponseMember, member_id=m, group_instance_id=i,
                          metadata=meta) for m, i, meta in result.members)
    return build(mod.JoinGroupResponse, throttle_time=NO_THROTTLE, error_code=result.error,
                 generation_id=result.generation, protocol_type=result.protocol_type,
                 protocol_name=result.protocol if v >= 7 else (result.protocol or ""),
                 leader=result.leader, skip_assignment=result.skip_assignment,
                 member_id=result.member_id, members=members)


def _ms(value: datetime.timedelta | int) -> int:
    """kio gives timeouts as timedeltas."""
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return value


def _host(peer: str) -> str:
    # Kafka shows a member's host as Java prints an InetAddress: "/127.0.0.1".
    return "/" + peer.rsplit(":", 1)[0] if peer else ""


async def handle_sync_group(broker, request: Request):
    mod = response_module(apis.SYNC_GROUP, request.api_version)
    body = request.body
    if not authorize.allowed(broker, request, Op.READ, Rt.GROUP, body.group_id):
        return build(mod.SyncGroupResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.group_authorization_failed, protocol_type=None,
                     protocol_name=None, assignment=b"")
    result = await broker.groups.sync(
        body.group_id, body.generation_id, body.member_id,
        getattr(body, "group_instance_id", None), getattr(body, "protocol_type", None),
        getattr(body, "protocol_name", None),
        [(a.member_id, a.assignment) for a in body.assignments])
    return build(mod.SyncGroupResponse, throttle_time=NO_THROTTLE, error_code=result.error,
                 protocol_type=result.protocol_type, protocol_name=result.protocol,
                 assignment=result.assignment)


def handle_heartbeat(broker, request: Request):
    mod = response_module(apis.HEARTBEAT, request.api_version)
    body = request.body
    if not authorize.allowed(broker, request, Op.READ, Rt.GROUP, body.group_id):
        return build(mod.HeartbeatResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.group_authorization_failed)
    error = broker.groups.heartbeat(body.group_id, body.generation_id, body.member_id,
                                    getattr(body, "group_instance_id", None))
    return build(mod.HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=error)


def handle_leave_group(broker, request: Request):
    mod = response_module(apis.LEAVE_GROUP, request.api_version)
    body = request.body
    if has_field(type(body), "members"):
        leaving = [(m.member_id, m.group_instance_id) for m in body.members]
    else:
        leaving = [(body.member_id, None)]
    if not authorize.allowed(broker, request, Op.READ, Rt.GROUP, body.group_id):
        return build(mod.LeaveGroupResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.group_authorization_failed, members=())
    error, errors = broker.groups.leave(body.group_id, leaving)
    if not has_field(mod.LeaveGroupResponse, "members"):
        if error is ErrorCode.none and errors:
            error = errors[0]
        return build(mod.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=error)
    members = tuple(build(mod.MemberResponse, member_id=m, group_instance_id=i, error_code=e)
                    for (m, i), e in zip(leaving, errors, strict=False))
    return build(mod.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=error,
                 members=members)


# --- OffsetCommit, OffsetFetch, OffsetDelete ------------------------------------------------

def handle_offset_commit(broker, request: Request):
    """Answered at once when the records need no fsync (the usual case: no task per commit),
    else by a coroutine waiting for it."""
    mod = response_module(apis.OFFSET_COMMIT, request.api_version)
    body = request.body
    partitions = [
        OffsetCommitPartition(t.name, p.partition_index, p.committed_offset,
                              getattr(p, "committed_leader_epoch", -1), p.committed_metadata)
        for t in body.topics for p in t.partitions
    ]
    refused = _commit_refused(broker, request, body.group_id, partitions)
    errors, durable = broker.groups.commit_now(
        body.group_id, body.generation_id_or_member_epoch, body.member_id,
        getattr(body, "group_instance_id", None), _ms(getattr(body, "retention_time", -1)),
        [p for p in partitions if p.topic not in refused]) \
        if refused is not ALL_REFUSED else ([], None)
    if refused:
        errors = _merge_refused(partitions, refused, errors)

    def answer(errors: list[ErrorCode]):
        by_topic: dict[str, list] = {}
        for p, error in zip(partitions, errors, strict=True):
            by_topic.setdefault(p.topic, []).append(
                build(mod.OffsetCommitResponsePartition, partition_index=p.partition,
                      error_code=error))
        return build(mod.OffsetCommitResponse, throttle_time=NO_THROTTLE, topics=tuple(
            build(mod.OffsetCommitResponseTopic, name=name, partitions=tuple(parts))
            for name, parts in by_topic.items()))

    if durable is None:
        return answer(errors)

    async def later():
        return answer(await broker.groups.when_durable(body.group_id, errors, durable))
    return later()


# Every partition of the request answered GROUP_AUTHORIZATION_FAILED.
ALL_REFUSED: dict[str, ErrorCode] = {"": ErrorCode.group_authorization_failed}


def _commit_refused(broker, request: Request, group_id: str,
                    partitions: list[OffsetCommitPartition]) -> dict[str, ErrorCode]:
    """Kafka's checks of an OffsetCommit: Read on the group (else ALL_REFUSED), then Read on
    each topic (the topics refused TOPIC_AUTHORIZATION_FAILED)."""
    if broker.authorizer is None:
        return {}
    if not authorize.allowed(broker, request, Op.READ, Rt.GROUP, group_id):
        return ALL_REFUSED
    names = {p.topic for p in partitions}
    return dict.fromkeys(
        names - authorize.allowed_names(broker, request, Op.READ, Rt.TOPIC, names),
        ErrorCode.topic_authorization_failed)


def _merge_refused(partitions: list, refused: dict[str, ErrorCode],
                   errors: list[ErrorCode]) -> list[ErrorCode]:
    if refused is ALL_REFUSED:
        return [ErrorCode.group_authorization_failed] * len(partitions)
    rest = iter(errors)
    return [refused.get(p.topic) or next(rest) for p in partitions]


def handle_offset_fetch(broker, request: Request):
    v = request.api_version
    mod = response_module(apis.OFFSET_FETCH, v)
    body = request.body
    if has_field(type(body), "groups"):
        # v9: a consumer group's member says who it is (KIP-848).
        groups = [(g.group_id, _wanted(g.topics),
                   (getattr(g, "member_id", None), getattr(g, "member_epoch", -1)))
                  for g in body.groups]
        results = []
        for group_id, wanted, member in groups:
            error, topics = _fetched(broker, mod, group_id, wanted, "OffsetFetchResponseTopics",
                                     "OffsetFetchResponsePartitions", member=member,
                                     require_stable=body.require_stable, request=request)
            results.append(build(mod.OffsetFetchResponseGroup, group_id=group_id,
                                 topics=topics, error_code=error))
        return build(mod.OffsetFetchResponse, throttle_time=NO_THROTTLE, groups=tuple(results))
    error, topics = _fetched(broker, mod, body.group_id, _wanted(body.topics),
                             "OffsetFetchResponseTopic", "OffsetFetchResponsePartition",
                             per_partition_error=not has_field(mod.OffsetFetchResponse,
                                                               "error_code"),
                             require_stable=getattr(body, "require_stable", False),
                             request=request)
    return build(mod.OffsetFetchResponse, throttle_time=NO_THROTTLE, topics=topics,
                 error_code=error)


def _wanted(topics) -> list[tuple[str, list[int]]] | None:
    if topics is None:
        return None
    return [(t.name, list(t.partition_indexes)) for t in topics]


def _fetched(broker, mod, group_id: str, wanted, topic_cls: str, partition_cls: str,
             per_partition_error: bool = False, member: tuple[str | None, int] = (None, -1),
             require_stable: bool = False, request: Request | None = None):
    if request is not None and not authorize.allowed(broker, request, Op.DESCRIBE, Rt.GROUP,
                                                     group_id):
        error, offsets = ErrorCode.group_authorization_failed, []
    else:
        error, offsets = broker.groups.fetch(group_id, wanted, *member)
    if error is not ErrorCode.none and per_partition_error and wanted:
        offsets = [(t, p, None) for t, parts in wanted for p in parts]
    hidden: set[str] = set()
    if request is not None and broker.authorizer is not None and offsets:
        # Offsets only of topics the caller may describe: the others are left out of an
        # answer for all topics, and answered TOPIC_AUTHORIZATION_FAILED when named.
        names = {topic for topic, _, _ in offsets}
        hidden = names - authorize.allowed_names(broker, request, Op.DESCRIBE, Rt.TOPIC,
                                                 names, quiet=wanted is None)
        if wanted is None:
            offsets = [o for o in offsets if o[0] not in hidden]
    # KIP-447: with require_stable, a partition with offsets of an undecided transaction
    # answers UNSTABLE_OFFSET_COMMIT (the client retries) rather than an offset soon stale.
    unstable = broker.groups.unstable(group_id) if require_stable else set()
    by_topic: dict[str, list] = {}
    for topic, partition, value in offsets:
        waiting = (topic, partition) in unstable
        if waiting or topic in hidden:
            value = None
        by_topic.setdefault(topic, []).append(build(
            getattr(mod, partition_cls), partition_index=partition,
            committed_offset=value.offset if value else -1,
            committed_leader_epoch=value.leader_epoch if value else -1,
            metadata=value.metadata if value else "",
            error_code=ErrorCode.unstable_offset_commit if waiting
            else ErrorCode.topic_authorization_failed if topic in hidden
            else error if per_partition_error else ErrorCode.none))
    topics = tuple(build(getattr(mod, topic_cls), name=name, partitions=tuple(parts))
                   for name, parts in by_topic.items())
    return error, topics


async def handle_offset_delete(broker, request: Request):
    mod = response_module(apis.OFFSET_DELETE, request.api_version)
    body = request.body
    wanted = [(t.name, [p.partition_index for p in t.partitions]) for t in body.topics]
    if not authorize.allowed(broker, request, Op.DELETE, Rt.GROUP, body.group_id):
        return build(mod.OffsetDeleteResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.group_authorization_failed, topics=())
    names = {name for name, _ in wanted}
    denied = names - authorize.allowed_names(broker, request, Op.READ, Rt.TOPIC, names)
    error, results = await broker.groups.delete_offsets(
        body.group_id, [w for w in wanted if w[0] not in denied])
    results = list(results) + [(name, index, ErrorCode.topic_authorization_failed)
                               for name, parts in wanted if name in denied for index in parts]
    by_topic: dict[str, list] = {}
    for topic, partition, perror in results:
        by_topic.setdefault(topic, []).append(
            build(mod.OffsetDeleteResponsePartition, partition_index=partition,
                  error_code=perror))
    return build(mod.OffsetDeleteResponse, throttle_time=NO_THROTTLE, error_code=error,
                 topics=tuple(build(mod.OffsetDeleteResponseTopic, name=name,
                                    partitions=tuple(parts))
                              for name, parts in by_topic.items()))


# --- ListGroups, DescribeGroups, DeleteGroups -----------------------------------------------

def handle_list_groups(broker, request: Request):
    mod = response_module(apis.LIST_GROUPS, request.api_version)
    body = request.body
    overviews = broker.groups.list_groups(set(getattr(body, "states_filter", ()) or ()),
                                          set(getattr(body, "types_filter", ()) or ()))
    if not authorize.cluster(broker, request, Op.DESCRIBE, quiet=True):
        # Cluster Describe shows every group, else those the caller may describe
        overviews = [g for g in overviews if authorize.allowed(
            broker, request, Op.DESCRIBE, Rt.GROUP, g.group_id, quiet=True)]
    groups = tuple(build(mod.ListedGroup, group_id=g.group_id, protocol_type=g.protocol_type,
                         group_state=g.state, group_type=g.group_type) for g in overviews)
    # A partition not loaded yet: the groups listed are not all (Kafka answers them with
    # COORDINATOR_LOAD_IN_PROGRESS).
    error = broker.groups.listing_error() or ErrorCode.none
    return build(mod.ListGroupsResponse, throttle_time=NO_THROTTLE, error_code=error,
                 groups=groups)


def handle_describe_groups(broker, request: Request):
    v = request.api_version
    mod = response_module(apis.DESCRIBE_GROUPS, v)
    body = request.body
    described = []
    for group_id in body.groups:
        if not authorize.allowed(broker, request, Op.DESCRIBE, Rt.GROUP, group_id):
            error, group = ErrorCode.group_authorization_failed, None
        else:
            error, group = broker.groups.describe(group_id)
        if group is None:
            if error is ErrorCode.group_id_not_found and v < 6:
                error = ErrorCode.none  # older versions show an unknown group as Dead
            described.append(build(
                mod.DescribedGroup, error_code=error,
                error_message=None if error is ErrorCode.none else error.name,
                group_id=group_id, group_state="Dead", protocol_type="", protocol_data="",
                members=(), authorized_operations=acl_operations.OMITTED))
            continue
        stable = group.state.value == "Stable"
        members = tuple(build(
            mod.DescribedGroupMember, member_id=m.member_id,
            group_instance_id=m.group_instance_id, client_id=m.client_id,
            client_host=m.client_host,
            member_metadata=m.metadata(group.protocol) if stable else b"",
            member_assignment=m.assignment if stable else b"")
            for m in group.members.values())
        described.append(build(
            mod.DescribedGroup, error_code=ErrorCode.none, error_message=None,
            group_id=group_id, group_state=group.state.value,
            protocol_type=group.protocol_type or "",
            protocol_data=(group.protocol or "") if stable else "", members=members,
            # asked for only: each operation costs an authorization
            authorized_operations=authorize.operations(broker, request, Rt.GROUP, group_id)
            if getattr(body, "include_authorized_operations", False)
            else acl_operations.OMITTED))
    return build(mod.DescribeGroupsResponse, throttle_time=NO_THROTTLE,
                 groups=tuple(described))


async def handle_delete_groups(broker, request: Request):
    mod = response_module(apis.DELETE_GROUPS, request.api_version)
    results = []
    for group_id in dict.fromkeys(request.body.groups_names):
        if not authorize.allowed(broker, request, Op.DELETE, Rt.GROUP, group_id):
            error = ErrorCode.group_authorization_failed
        else:
            error = await broker.groups.delete_group(group_id)
        results.append(build(mod.DeletableGroupResult, group_id=group_id, error_code=error))
    return build(mod.DeleteGroupsResponse, throttle_time=NO_THROTTLE, results=tuple(results))


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.FIND_COORDINATOR: handle_find_coordinator,
    apis.OFFSET_COMMIT: handle_offset_commit,
    apis.OFFSET_FETCH: handle_offset_fetch,
    apis.JOIN_GROUP: handle_join_group,
    apis.HEARTBEAT: handle_heartbeat,
    apis.LEAVE_GROUP: handle_leave_group,
    apis.SYNC_GROUP: handle_sync_group,
    apis.DESCRIBE_GROUPS: handle_describe_groups,
    apis.LIST_GROUPS: handle_list_groups,
    apis.DELETE_GROUPS: handle_delete_groups,
    apis.OFFSET_DELETE: handle_offset_delete,
}
