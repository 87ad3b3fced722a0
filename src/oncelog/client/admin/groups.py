"""oncelog.Admin's consumer group calls: ListGroups (every broker), DescribeGroups and
ConsumerGroupDescribe (KIP-848), OffsetFetch, OffsetCommit as a tool commits, DeleteGroups.
Group requests go to the group's coordinator (FindCoordinator); while it loads or moves, a
request is retried until the admin's timeout."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.consumer_protocol import assigned_partitions
from ...protocol.schema import build
from ..network import calls
from ..network.connection import BrokerConnection, KafkaError
from ..topic_partition import SIMPLE_COMMIT, OffsetAndMetadata, TopicPartition
from .base import AdminBase, Coordinator, raise_for

OFFSETS_TOPIC = "__consumer_offsets"


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str | None  # ListGroups v4+
    group_type: str | None  # ListGroups v5+

    @property
    def is_consumer_group(self) -> bool:
        # An empty protocol type: a group that only ever committed offsets (assign() users).
        return self.protocol_type in ("consumer", "")


@dataclass(frozen=True, slots=True)
class MemberInfo:
    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: tuple[tuple[str, int], ...]  # (topic, partition); empty while rebalancing


@dataclass(frozen=True, slots=True)
class GroupInfo:
    group_id: str
    state: str
    protocol_type: str
    protocol: str  # the assignment strategy (classic: while the group is Stable)
    members: tuple[MemberInfo, ...]
    coordinator: Coordinator


class GroupsAdmin(AdminBase):
    def find_group_coordinator(self, group_id: str) -> Coordinator:
        return self._find_coordinator(group_id, calls.COORDINATOR_GROUP)

    def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        """Every group of every broker (ListGroups), optionally only those in ``states``;
        answered once every broker did, as list_transactions (AdminBase._each_broker)."""
        states = tuple(states)

        def ask(node_id: int, conn: BrokerConnection) -> list[GroupListing]:
            if states and conn.version(apis.LIST_GROUPS) < 4:
                raise KafkaError(ErrorCode.unsupported_version,
                                 "the broker cannot filter groups by state (ListGroups v4)")
            response = conn.call(apis.LIST_GROUPS, _list_groups_request(states))
            raise_for(response.error_code, f"ListGroups on broker {node_id}")
            return [GroupListing(g.group_id, g.protocol_type, getattr(g, "group_state", None),
                                 getattr(g, "group_type", None)) for g in response.groups]

        listed = {g.group_id: g for found in
                  self._each_broker(ask, covering=OFFSETS_TOPIC).values() for g in found}
        return sorted(listed.values(), key=lambda g: g.group_id)

    def describe_group(self, group_id: str) -> GroupInfo:
        """DescribeGroups of one group, or ConsumerGroupDescribe for a group of the consumer
        protocol (KIP-848), which DescribeGroups does not know; raises KafkaError
        (GROUP_ID_NOT_FOUND when there is no such group, from DescribeGroups v6; older
        versions describe it as Dead)."""
        response = self._group_call(group_id, apis.DESCRIBE_GROUPS,
                                    _describe_groups_request(group_id),
                                    lambda r: r.groups[0].error_code)
        g = response.groups[0]
        if g.error_code == ErrorCode.group_id_not_found and \
                apis.CONSUMER_GROUP_DESCRIBE in self._broker_of(group_id).versions:
            return self._describe_consumer_group(group_id)
        raise_for(g.error_code, getattr(g, "error_message", None) or f"group {group_id!r}")
        consumer = g.protocol_type in ("consumer", "")
        members = tuple(
            MemberInfo(m.member_id, getattr(m, "group_instance_id", None), m.client_id,
                       m.client_host,
                       tuple(assigned_partitions(m.member_assignment) or ()) if consumer else ())
            for m in g.members)
        return GroupInfo(group_id, g.group_state, g.protocol_type, g.protocol_data, members,
                         self._coordinators[calls.COORDINATOR_GROUP, group_id])

    def _describe_consumer_group(self, group_id: str) -> GroupInfo:
        response = self._group_call(group_id, apis.CONSUMER_GROUP_DESCRIBE,
                                    _consumer_group_describe_request(group_id),
                                    lambda r: r.groups[0].error_code)
        g = response.groups[0]
        raise_for(g.error_code, g.error_message or f"group {group_id!r}")
        members = tuple(
            MemberInfo(m.member_id, m.instance_id, m.client_id, m.client_host,
                       tuple((t.topic_name, p) for t in m.assignment.topic_partitions
                             for p in t.partitions))
            for m in g.members)
        return GroupInfo(group_id, g.group_state, "consumer", g.assignor_name, members,
                         self._coordinators[calls.COORDINATOR_GROUP, group_id])

    def list_group_offsets(self, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        """Every committed offset of the group (OffsetFetch of all topics)."""
        response = self._group_call(group_id, apis.OFFSET_FETCH,
                                    calls.offset_fetch_request(group_id, None),
                                    lambda r: calls.offset_fetch_result(r)[0])
        error, offsets = calls.offset_fetch_result(response)
        raise_for(error, f"group {group_id!r}")
        result = {}
        for tp, (perror, committed) in offsets.items():
            raise_for(perror, f"{tp.topic}-{tp.partition}")
            if committed is not None:
                result[tp] = committed
        return result

    def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        """DeleteGroups: each group's error (NONE, NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND...)."""
        result = {}
        for group_id in dict.fromkeys(group_ids):
            response = self._group_call(group_id, apis.DELETE_GROUPS,
                                        _delete_groups_request(group_id),
                                        lambda r: r.results[0].error_code)
            result[group_id] = response.results[0].error_code
        return result

    def alter_group_offsets(self, group_id: str, offsets: dict[tuple[str, int], int]
                            ) -> dict[TopicPartition, ErrorCode]:
        """Commit offsets for a group as a tool does (OffsetCommit with generation -1 and no
        member id): the coordinator takes them only while the group has no members."""
        if not offsets:
            return {}
        wanted = {TopicPartition(*tp): OffsetAndMetadata(offset, "")
                  for tp, offset in offsets.items()}
        response = self._group_call(
            group_id, apis.OFFSET_COMMIT,
            calls.offset_commit_request(group_id, SIMPLE_COMMIT, wanted),
            lambda r: r.topics[0].partitions[0].error_code)
        return calls.offset_commit_errors(response)

    def _group_call(self, group_id: str, api_key: int, make: Callable[[ModuleType, int], Any],
                    error_of: Callable[[Any], ErrorCode]) -> Any:
        return self._coordinator_call(group_id, calls.COORDINATOR_GROUP, api_key, make,
                                      error_of)

    def _broker_of(self, group_id: str) -> BrokerConnection:
        coordinator = self._coordinators[calls.COORDINATOR_GROUP, group_id]
        return self._broker(coordinator.host, coordinator.port)


def _list_groups_request(states: tuple[str, ...]):
    def make(mod, version):
        return build(mod.ListGroupsRequest, states_filter=states, types_filter=())

    return make


def _describe_groups_request(group_id: str):
    def make(mod, version):
        return build(mod.DescribeGroupsRequest, groups=(group_id,),
                     include_authorized_operations=False)

    return make


def _consumer_group_describe_request(group_id: str):
    def make(mod, version):
        return build(mod.ConsumerGroupDescribeRequest, group_ids=(group_id,),
                     include_authorized_operations=False)

    return make


def _delete_groups_request(group_id: str):
    def make(mod, version):
        return build(mod.DeleteGroupsRequest, groups_names=(group_id,))

    return make
