"""The consumer group APIs of the new protocol (KIP-848): ConsumerGroupHeartbeat and
ConsumerGroupDescribe.

Each handler turns a request into a call of the ConsumerGroupCoordinator
(coordinator/group/consumer_coordinator.py; the decisions are in
coordinator/group/consumer_group.py) and its answer into the response of the request's
version. ``TopicImage`` is what the coordinator sees of the topics: name -> (topic id,
partition count), read live.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator, Mapping

from kio.schema.errors import ErrorCode

from ...coordinator.group.consumer_group import ConsumerGroupConfig, HeartbeatRequest
from ...coordinator.group.consumer_records import Assignment
from ...protocol import api_versions as apis
from ...protocol.messages import Request
from ...protocol.schema import build, response_module
from .. import authorize
from ..authorize import Op, Rt
from ..config import BrokerConfig
from ..topics import TopicManager
from . import acl_operations
from .api_meta import NO_THROTTLE

CONSUMER_MEMBER = 1  # ConsumerGroupDescribe v1's member_type of a consumer-protocol member
CLASSIC_MEMBER = 0  # ... and of a classic member of a consumer group (online migration)


class TopicImage(Mapping[str, tuple[uuid.UUID, int]]):
    """The broker's topics as the consumer group coordinator reads them."""

    def __init__(self, topics: TopicManager) -> None:
        self.topics = topics

    def __getitem__(self, name: str) -> tuple[uuid.UUID, int]:
        topic = self.topics.topics[name]
        return topic.topic_id, len(topic.partitions)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.topics.topics))

    def __len__(self) -> int:
        return len(self.topics.topics)

    def name_of(self, topic_id: uuid.UUID) -> str:
        for name, topic in self.topics.topics.items():
            if topic.topic_id == topic_id:
                return name
        return ""


def consumer_group_config(config: BrokerConfig) -> ConsumerGroupConfig:
    return ConsumerGroupConfig(
        session_timeout_ms=config.get("group.consumer.session.timeout.ms"),
        heartbeat_interval_ms=config.get("group.consumer.heartbeat.interval.ms"),
        max_size=config.get("group.consumer.max.size"),
        assignors=tuple(config.get("group.consumer.assignors").split(",")),
        migration_policy=config.get("group.consumer.migration.policy"),
    )


def _ms(value: datetime.timedelta | int) -> int:
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return value


def _host(peer: str) -> str:
    return "/" + peer.rsplit(":", 1)[0] if peer else ""


async def handle_consumer_group_heartbeat(broker, request: Request):
    v = request.api_version
    mod = response_module(apis.CONSUMER_GROUP_HEARTBEAT, v)
    body = request.body
    if not authorize.allowed(broker, request, Op.READ, Rt.GROUP, body.group_id):
        return build(mod.ConsumerGroupHeartbeatResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.group_authorization_failed, error_message=None,
                     member_id=None, member_epoch=0, heartbeat_interval=datetime.timedelta(0),
                     assignment=None)
    owned: Assignment | None = None
    if body.topic_partitions is not None:
        owned = {}
        for t in body.topic_partitions:
            if t.topic_id is not None:
                owned[t.topic_id] = owned.get(t.topic_id, frozenset()) | frozenset(t.partitions)
    answer = await broker.groups.consumer_groups.heartbeat(HeartbeatRequest(
        group_id=body.group_id, member_id=body.member_id, member_epoch=body.member_epoch,
        instance_id=body.instance_id, rack_id=body.rack_id,
        rebalance_timeout_ms=_ms(body.rebalance_timeout),
        subscribed_topic_names=(tuple(body.subscribed_topic_names)
                                if body.subscribed_topic_names is not None else None),
        subscribed_topic_regex=getattr(body, "subscribed_topic_regex", None),
        server_assignor=body.server_assignor, owned=owned,
        client_id=request.client_id or "", client_host=_host(request.peer), version=v))
    assignment = None
    if answer.assignment is not None:
        assignment = build(mod.Assignment, topic_partitions=tuple(
            build(mod.TopicPartitions, topic_id=topic_id, partitions=tuple(sorted(parts)))
            for topic_id, parts in sorted(answer.assignment.items())))
    return build(mod.ConsumerGroupHeartbeatResponse, throttle_time=NO_THROTTLE,
                 error_code=answer.error, error_message=answer.message,
                 member_id=answer.member_id, member_epoch=answer.member_epoch,
                 heartbeat_interval=datetime.timedelta(milliseconds=answer.heartbeat_interval_ms),
                 assignment=assignment)


def handle_consumer_group_describe(broker, request: Request):
    mod = response_module(apis.CONSUMER_GROUP_DESCRIBE, request.api_version)
    coordinator = broker.groups.consumer_groups
    image: TopicImage = coordinator.image
    names: dict[uuid.UUID, str] = {}

    def topic_name(topic_id: uuid.UUID) -> str:
        if topic_id not in names:
            names[topic_id] = image.name_of(topic_id) if isinstance(image, TopicImage) else ""
        return names[topic_id]

    def assignment(a: Assignment):
        return build(mod.Assignment, topic_partitions=tuple(
            build(mod.TopicPartitions, topic_id=t, topic_name=topic_name(t),
                  partitions=tuple(sorted(ps)))
            for t, ps in sorted(a.items()) if ps))

    # groups the caller may not describe first, as Kafka answers them
    allowed = authorize.allowed_names(broker, request, Op.DESCRIBE, Rt.GROUP,
                                      request.body.group_ids)
    described = [build(mod.DescribedGroup, error_code=ErrorCode.group_authorization_failed,
                       error_message=None, group_id=g, group_state="", group_epoch=-1,
                       assignment_epoch=-1, assignor_name="", members=(),
                       authorized_operations=acl_operations.OMITTED)
                 for g in request.body.group_ids if g not in allowed]
    for d in coordinator.describe([g for g in request.body.group_ids if g in allowed]):
        group = d.group
        if group is None:
            described.append(build(
                mod.DescribedGroup, error_code=d.error, error_message=d.message,
                group_id=d.group_id, group_state="Dead" if d.error is not ErrorCode.none
                else "", group_epoch=-1, assignment_epoch=-1, assignor_name="", members=(),
                authorized_operations=acl_operations.OMITTED))
            continue
        members = tuple(build(
            mod.Member, member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
            member_epoch=m.member_epoch, client_id=m.client_id, client_host=m.client_host,
            subscribed_topic_names=m.subscribed_topic_names,
            subscribed_topic_regex=m.subscribed_topic_regex,
            assignment=assignment(m.assigned),
            target_assignment=assignment(group.target.get(m.member_id, {})),
            member_type=CLASSIC_MEMBER if m.classic is not None else CONSUMER_MEMBER)
            for m in group.members.values())
        described.append(build(
            mod.DescribedGroup, error_code=ErrorCode.none, error_message=None,
            group_id=group.group_id, group_state=group.state.value,
            group_epoch=group.group_epoch, assignment_epoch=group.assignment_epoch,
            assignor_name=d.assignor, members=members,
            # asked for only: each operation costs an authorization
            authorized_operations=authorize.operations(broker, request, Rt.GROUP,
                                                       group.group_id)
            if getattr(request.body, "include_authorized_operations", False)
            else acl_operations.OMITTED))
    return build(mod.ConsumerGroupDescribeResponse, throttle_time=NO_THROTTLE,
                 groups=tuple(described))


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.CONSUMER_GROUP_HEARTBEAT: handle_consumer_group_heartbeat,
    apis.CONSUMER_GROUP_DESCRIBE: handle_consumer_group_describe,
}
