"""The requests of a consumer's group membership and the readers of their answers:
JoinGroup, SyncGroup, Heartbeat and LeaveGroup (the classic protocol), ConsumerGroupHeartbeat
(KIP-848). Each call comes as a request maker (sent with conn.send_only or conn.call) and a
reader of its answer into the plain values of group_membership.py and
consumer_group_membership.py, which decide what they mean."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode

from ...protocol.schema import build
from . import consumer_group_membership as cgm
from . import group_membership as membership
from .consumer_protocol import PROTOCOL_TYPE


def join_group_request(join: membership.JoinGroup):
    def make(mod, version):
        protocols = tuple(build(mod.JoinGroupRequestProtocol, name=name, metadata=metadata)
                          for name, metadata in join.protocols)
        return build(mod.JoinGroupRequest, group_id=join.group_id,
                     session_timeout=datetime.timedelta(milliseconds=join.session_timeout_ms),
                     rebalance_timeout=datetime.timedelta(
                         milliseconds=join.rebalance_timeout_ms),
                     member_id=join.member_id, group_instance_id=join.instance_id,
                     protocol_type=PROTOCOL_TYPE, protocols=protocols, reason=join.reason)

    return make


def join_group_result(response) -> membership.JoinResult:
    return membership.JoinResult(
        response.error_code, response.generation_id, response.protocol_name,
        response.leader, response.member_id,
        tuple((m.member_id, getattr(m, "group_instance_id", None), m.metadata)
              for m in response.members),
        getattr(response, "skip_assignment", False))


def sync_group_request(sync: membership.SyncGroup):
    def make(mod, version):
        assignments = tuple(build(mod.SyncGroupRequestAssignment, member_id=member_id,
                                  assignment=assignment)
                            for member_id, assignment in sync.assignments)
        return build(mod.SyncGroupRequest, group_id=sync.group_id,
                     generation_id=sync.generation, member_id=sync.member_id,
                     group_instance_id=sync.instance_id, protocol_type=PROTOCOL_TYPE,
                     protocol_name=sync.protocol_name, assignments=assignments)

    return make


def sync_group_result(response) -> membership.SyncResult:
    return membership.SyncResult(response.error_code, response.assignment or b"")


def heartbeat_request(beat: membership.Heartbeat):
    def make(mod, version):
        return build(mod.HeartbeatRequest, group_id=beat.group_id,
                     generation_id=beat.generation, member_id=beat.member_id,
                     group_instance_id=beat.instance_id)

    return make


def leave_group_request(leave: membership.LeaveGroup):
    def make(mod, version):
        # v3+ names a batch of members (KIP-345); we leave alone.
        member = build(mod.MemberIdentity, member_id=leave.member_id, group_instance_id=None,
                       reason=leave.reason) if hasattr(mod, "MemberIdentity") else None
        return build(mod.LeaveGroupRequest, group_id=leave.group_id,
                     member_id=leave.member_id, members=(member,))

    return make


def leave_group_error(response) -> ErrorCode:
    if response.error_code != ErrorCode.none:
        return response.error_code
    for member in getattr(response, "members", ()):
        if member.error_code != ErrorCode.none:
            return member.error_code
    return ErrorCode.none


def consumer_group_heartbeat_request(beat: cgm.ConsumerHeartbeat):
    def make(mod, version):
        owned = None
        if beat.owned is not None:
            owned = tuple(build(mod.TopicPartitions, topic_id=topic_id, partitions=partitions)
                          for topic_id, partitions in beat.owned)
        return build(mod.ConsumerGroupHeartbeatRequest, group_id=beat.group_id,
                     member_id=beat.member_id, member_epoch=beat.member_epoch,
                     instance_id=beat.instance_id, rack_id=None,
                     rebalance_timeout=datetime.timedelta(milliseconds=beat.rebalance_timeout_ms),
                     subscribed_topic_names=beat.subscribed_topic_names,
                     subscribed_topic_regex=beat.subscribed_topic_regex,
                     server_assignor=beat.server_assignor, topic_partitions=owned)

    return make


def consumer_group_heartbeat_result(response) -> cgm.HeartbeatResult:
    assignment = None
    if response.assignment is not None:
        assignment = {t.topic_id: frozenset(int(p) for p in t.partitions)
                      for t in response.assignment.topic_partitions}
    interval = response.heartbeat_interval
    if isinstance(interval, datetime.timedelta):
        interval = int(interval.total_seconds() * 1000)
    return cgm.HeartbeatResult(response.error_code, response.error_message, response.member_id,
                               response.member_epoch, interval, assignment)
