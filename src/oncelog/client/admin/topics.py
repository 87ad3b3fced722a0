"""oncelog.Admin's topic and partition calls: CreateTopics, DeleteTopics, CreatePartitions,
ElectLeaders, AlterPartitionReassignments and ListPartitionReassignments."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.schema import build
from ..network.connection import KafkaError
from .base import AdminBase, raise_for


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]


class TopicsAdmin(AdminBase):
    def create_topic(self, name: str, partitions: int = -1, replication_factor: int = -1,
                     configs: dict[str, str] | None = None,
                     assignments: dict[int, list[int]] | None = None,
                     validate_only: bool = False) -> None:
        """``assignments``: partition -> broker ids, instead of a count and a factor."""
        def make(mod, version):
            manual = tuple(build(mod.CreatableReplicaAssignment, partition_index=index,
                                 broker_ids=tuple(ids))
                           for index, ids in sorted((assignments or {}).items()))
            topic = build(mod.CreatableTopic, name=name, num_partitions=partitions,
                          replication_factor=replication_factor, assignments=manual,
                          configs=tuple(build(mod.CreatableTopicConfig, name=k, value=v)
                                        for k, v in (configs or {}).items()))
            return build(mod.CreateTopicsRequest, topics=(topic,), timeout=self._timeout(),
                         validate_only=validate_only)

        response = self.conn.call(apis.CREATE_TOPICS, make)
        for t in response.topics:
            raise_for(t.error_code, getattr(t, "error_message", None))

    def delete_topic(self, name: str) -> None:
        def make(mod, version):
            return build(mod.DeleteTopicsRequest, topic_names=(name,), timeout=self._timeout())

        response = self.conn.call(apis.DELETE_TOPICS, make)
        for t in response.responses:
            raise_for(t.error_code, getattr(t, "error_message", None))

    def create_partitions(self, name: str, count: int,
                          assignments: list[list[int]] | None = None,
                          validate_only: bool = False) -> None:
        """Grow topic ``name`` to ``count`` partitions; ``assignments``: the broker ids of
        each new partition. Raises KafkaError (INVALID_PARTITIONS for no increase)."""
        def make(mod, version):
            manual = None if assignments is None else tuple(
                build(mod.CreatePartitionsAssignment, broker_ids=tuple(ids))
                for ids in assignments)
            return build(mod.CreatePartitionsRequest, topics=(
                build(mod.CreatePartitionsTopic, name=name, count=count, assignments=manual),),
                timeout=self._timeout(), validate_only=validate_only)

        response = self.conn.call(apis.CREATE_PARTITIONS, make)
        for r in response.results:
            raise_for(r.error_code, r.error_message or f"topic {name!r}")

    def elect_leaders(self, partitions: Iterable[tuple[str, int]] | None = None,
                      election_type: int = 0) -> dict[tuple[str, int], KafkaError | None]:
        """ElectLeaders (0: preferred, 1: unclean) of ``partitions`` (None: all of them):
        each partition's error, None when a leader was elected (ELECTION_NOT_NEEDED when the
        leader is already the one wanted)."""
        by_topic = _partitions_by_topic(partitions)

        def make(mod, version):
            wanted = None if by_topic is None else tuple(
                build(mod.TopicPartitions, topic=t, partitions=tuple(ps))
                for t, ps in by_topic.items())
            return build(mod.ElectLeadersRequest, election_type=election_type,
                         topic_partitions=wanted, timeout=self._timeout())

        response = self._controller().call(apis.ELECT_LEADERS, make)
        raise_for(getattr(response, "error_code", ErrorCode.none), "ElectLeaders")
        return {(r.topic, p.partition_id): None if p.error_code == ErrorCode.none
                else KafkaError(p.error_code, p.error_message)
                for r in response.replica_election_results for p in r.partition_result}

    def alter_partition_reassignments(self, reassignments: dict[tuple[str, int],
                                                                list[int] | None]
                                      ) -> dict[tuple[str, int], KafkaError | None]:
        """Move partitions to the broker ids given (None: cancel an ongoing move): each
        partition's error, None when accepted."""
        by_topic: dict[str, list[tuple[int, list[int] | None]]] = {}
        for (topic, partition), replicas in reassignments.items():
            by_topic.setdefault(topic, []).append((partition, replicas))

        def make(mod, version):
            return build(mod.AlterPartitionReassignmentsRequest, timeout=self._timeout(),
                         allow_replication_factor_change=True, topics=tuple(
                             build(mod.ReassignableTopic, name=t, partitions=tuple(
                                 build(mod.ReassignablePartition, partition_index=p,
                                       replicas=None if r is None else tuple(r))
                                 for p, r in parts))
                             for t, parts in by_topic.items()))

        response = self._controller().call(apis.ALTER_PARTITION_REASSIGNMENTS, make)
        raise_for(response.error_code, response.error_message)
        return {(t.name, p.partition_index): None if p.error_code == ErrorCode.none
                else KafkaError(p.error_code, p.error_message)
                for t in response.responses for p in t.partitions}

    def list_partition_reassignments(self, partitions: Iterable[tuple[str, int]] | None = None
                                     ) -> dict[tuple[str, int], PartitionReassignment]:
        """The reassignments under way, of ``partitions`` (None: of all)."""
        by_topic = _partitions_by_topic(partitions)

        def make(mod, version):
            wanted = None if by_topic is None else tuple(
                build(mod.ListPartitionReassignmentsTopics, name=t, partition_indexes=tuple(ps))
                for t, ps in by_topic.items())
            return build(mod.ListPartitionReassignmentsRequest, timeout=self._timeout(),
                         topics=wanted)

        response = self._controller().call(apis.LIST_PARTITION_REASSIGNMENTS, make)
        raise_for(response.error_code, response.error_message)
        return {(t.name, p.partition_index): PartitionReassignment(
                    tuple(p.replicas), tuple(p.adding_replicas), tuple(p.removing_replicas))
                for t in response.topics for p in t.partitions}


def _partitions_by_topic(partitions: Iterable[tuple[str, int]] | None
                         ) -> dict[str, list[int]] | None:
    """(topic, partition) pairs as each topic's partitions; None (all of them) stays None."""
    if partitions is None:
        return None
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return by_topic
