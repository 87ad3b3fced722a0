"""oncelog.Admin's cluster and storage views: DescribeCluster, DescribeTopicPartitions
(KIP-966), DescribeLogDirs and AlterReplicaLogDirs; the log directory calls go to every
broker (or the one named)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.schema import build
from ..network.connection import BrokerConnection, KafkaError
from .base import AdminBase, PartitionInfo, raise_for

# Kafka's AclOperation codes, by the bit each has in an authorized_operations field
ACL_OPERATIONS = {3: "READ", 4: "WRITE", 5: "CREATE", 6: "DELETE", 7: "ALTER", 8: "DESCRIBE",
                  9: "CLUSTER_ACTION", 10: "DESCRIBE_CONFIGS", 11: "ALTER_CONFIGS",
                  12: "IDEMPOTENT_WRITE", 13: "CREATE_TOKENS", 14: "DESCRIBE_TOKENS",
                  15: "TWO_PHASE_COMMIT"}


def _operations(field: int) -> frozenset[str] | None:
    """The operation names an authorized_operations field holds; None when omitted."""
    if field == -(1 << 31):
        return None
    return frozenset(name for bit, name in ACL_OPERATIONS.items() if field & (1 << bit))


@dataclass(frozen=True, slots=True)
class BrokerDescription:
    node_id: int
    host: str
    port: int
    rack: str | None
    fenced: bool = False


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str
    controller_id: int
    brokers: tuple[BrokerDescription, ...]
    authorized_operations: frozenset[str] | None  # None: not asked for


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    topic_id: Any
    is_internal: bool
    partitions: tuple[PartitionInfo, ...]
    authorized_operations: frozenset[str] | None


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    topic: str
    partition: int
    size: int
    offset_lag: int
    is_future: bool


@dataclass(frozen=True, slots=True)
class LogDirDescription:
    path: str
    error: ErrorCode | None  # KAFKA_STORAGE_ERROR for an offline directory
    replicas: tuple[ReplicaInfo, ...]
    total_bytes: int = -1
    usable_bytes: int = -1


class ClusterAdmin(AdminBase):
    def describe_cluster(self, include_authorized_operations: bool = False) -> ClusterDescription:
        def make(mod, version):
            return build(mod.DescribeClusterRequest,
                         include_cluster_authorized_operations=include_authorized_operations,
                         endpoint_type=1, include_fenced_brokers=True)

        response = self.conn.call(apis.DESCRIBE_CLUSTER, make)
        raise_for(response.error_code, response.error_message)
        return ClusterDescription(
            response.cluster_id, response.controller_id,
            tuple(BrokerDescription(b.broker_id, b.host, b.port, b.rack,
                                    getattr(b, "is_fenced", False))
                  for b in sorted(response.brokers, key=lambda b: b.broker_id)),
            _operations(response.cluster_authorized_operations))

    def describe_topic_partitions(self, topics: Iterable[str] = (),
                                  page_size: int = 2000) -> dict[str, TopicDescription]:
        """Every partition of the named topics (all topics when none are named), read page by
        page (``page_size`` partitions each, the broker's cursor between pages); an unknown
        topic raises KafkaError (UNKNOWN_TOPIC_OR_PARTITION)."""
        names = tuple(dict.fromkeys(topics))
        result: dict[str, TopicDescription] = {}
        cursor: tuple[str, int] | None = None
        for _ in range(1_000_000):
            def make(mod, version, cursor=cursor):
                return build(mod.DescribeTopicPartitionsRequest, topics=tuple(
                    build(mod.TopicRequest, name=n) for n in names),
                    response_partition_limit=page_size,
                    cursor=None if cursor is None else build(
                        mod.Cursor, topic_name=cursor[0], partition_index=cursor[1]))

            response = self.conn.call(apis.DESCRIBE_TOPIC_PARTITIONS, make)
            for t in response.topics:
                raise_for(t.error_code, f"topic {t.name!r}")
                before = result.get(t.name)
                partitions = tuple(
                    PartitionInfo(p.partition_index, p.leader_id, tuple(p.replica_nodes),
                                  tuple(p.isr_nodes)) for p in t.partitions)
                result[t.name] = TopicDescription(
                    t.name, t.topic_id, t.is_internal,
                    (before.partitions if before else ()) + partitions,
                    _operations(t.topic_authorized_operations))
            following = response.next_cursor
            if following is None:
                return result
            cursor = (following.topic_name, following.partition_index)
        raise KafkaError(ErrorCode.unknown_server_error, "DescribeTopicPartitions never ended")

    def describe_log_dirs(self, topics: dict[str, Iterable[int]] | None = None,
                          broker_id: int | None = None) -> dict[int, list[LogDirDescription]]:
        """broker id -> its log directories, each with the partitions in it (all, or those
        of ``topics``: topic -> partition indexes): every broker's, or only ``broker_id``'s;
        answered once each broker asked did (AdminBase._each_broker)."""
        def make(mod, version):
            wanted = None if topics is None else tuple(
                build(mod.DescribableLogDirTopic, topic=name, partitions=tuple(indexes))
                for name, indexes in topics.items())
            return build(mod.DescribeLogDirsRequest, topics=wanted)

        def ask(node_id: int, conn: BrokerConnection) -> list[LogDirDescription]:
            response = conn.call(apis.DESCRIBE_LOG_DIRS, make)
            raise_for(getattr(response, "error_code", ErrorCode.none),
                      f"DescribeLogDirs on broker {node_id}")
            return [
                LogDirDescription(
                    d.log_dir, None if d.error_code == ErrorCode.none else d.error_code,
                    tuple(ReplicaInfo(t.name, p.partition_index, p.partition_size,
                                      p.offset_lag, p.is_future_key)
                          for t in d.topics for p in t.partitions),
                    getattr(d, "total_bytes", -1), getattr(d, "usable_bytes", -1))
                for d in response.results]

        return self._each_broker(ask, only=broker_id)

    def alter_replica_log_dirs(self, moves: dict[tuple[str, int], str],
                               broker_id: int | None = None) -> dict[tuple[str, int], ErrorCode]:
        """Move each (topic, partition) into the log directory named (an absolute path) on
        ``broker_id`` (the only broker, when None). The broker answers once the move is under
        way; ``describe_log_dirs`` shows the copy as a future replica until it is done."""
        brokers = self._brokers_by_id()
        if broker_id is None:
            if len(brokers) != 1:
                raise ValueError("several brokers: name the one whose directories change")
            broker_id = next(iter(brokers))
        if broker_id not in brokers:
            raise KafkaError(ErrorCode.broker_not_available, f"no broker {broker_id}")
        conn = self._broker(*brokers[broker_id])
        by_dir: dict[str, dict[str, list[int]]] = {}
        for (topic, index), path in moves.items():
            by_dir.setdefault(path, {}).setdefault(topic, []).append(index)

        def make(mod, version):
            return build(mod.AlterReplicaLogDirsRequest, dirs=tuple(
                build(mod.AlterReplicaLogDir, path=path, topics=tuple(
                    build(mod.AlterReplicaLogDirTopic, name=t, partitions=tuple(ps))
                    for t, ps in topics_.items()))
                for path, topics_ in by_dir.items()))

        response = conn.call(apis.ALTER_REPLICA_LOG_DIRS, make)
        return {(t.topic_name, p.partition_index): ErrorCode(p.error_code)
                for t in response.results for p in t.partitions}
