"""oncelog.Admin: topics over the Kafka protocol, against oncelog or any Kafka broker."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ..protocol import api_versions as apis
from ..protocol.schema import build
from .connection import BrokerConnection, KafkaError, connect

RESOURCE_TOPIC = 2


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    index: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: tuple[PartitionInfo, ...]


@dataclass(frozen=True, slots=True)
class ProducerInfo:
    producer_id: int
    epoch: int
    last_sequence: int
    last_timestamp: int


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    cluster_id: str | None
    brokers: dict[int, tuple[str, int]]
    topics: dict[str, TopicInfo]


def _raise_for(error: ErrorCode, message: str | None = None) -> None:
    if error != ErrorCode.none:
        raise KafkaError(error, message)


class Admin:
    def __init__(self, config: dict[str, str]) -> None:
        self.bootstrap = config.get("bootstrap.servers", "127.0.0.1:9092")
        self.timeout = float(config.get("request.timeout.ms", 30_000)) / 1000
        self.conn: BrokerConnection = connect(self.bootstrap, config.get("client.id", "oncelog"),
                                              self.timeout)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout)

    def metadata(self, topics: list[str] | None = None, auto_create: bool = False) -> ClusterInfo:
        def make(mod, version):
            wanted = None if topics is None else tuple(
                build(mod.MetadataRequestTopic, name=t, topic_id=None) for t in topics)
            if version == 0 and wanted is None:
                wanted = ()
            return build(mod.MetadataRequest, topics=wanted, allow_auto_topic_creation=auto_create,
                         include_topic_authorized_operations=False,
                         include_cluster_authorized_operations=False)

        response = self.conn.call(apis.METADATA, make)
        result = {}
        for t in response.topics:
            if t.error_code != ErrorCode.none:
                if topics is not None:
                    _raise_for(t.error_code, f"topic {t.name!r}")
                continue
            result[t.name] = TopicInfo(t.name, tuple(sorted(
                (PartitionInfo(p.partition_index, p.leader_id, tuple(p.replica_nodes),
                               tuple(p.isr_nodes)) for p in t.partitions),
                key=lambda p: p.index)))
        return ClusterInfo(getattr(response, "cluster_id", None),
                           {b.node_id: (b.host, b.port) for b in response.brokers}, result)

    def create_topic(self, name: str, partitions: int = -1, replication_factor: int = -1,
                     configs: dict[str, str] | None = None) -> None:
        def make(mod, version):
            topic = build(mod.CreatableTopic, name=name, num_partitions=partitions,
                          replication_factor=replication_factor, assignments=(),
                          configs=tuple(build(mod.CreatableTopicConfig, name=k, value=v)
                                        for k, v in (configs or {}).items()))
            return build(mod.CreateTopicsRequest, topics=(topic,), timeout=self._timeout(),
                         validate_only=False)

        response = self.conn.call(apis.CREATE_TOPICS, make)
        for t in response.topics:
            _raise_for(t.error_code, getattr(t, "error_message", None))

    def delete_topic(self, name: str) -> None:
        def make(mod, version):
            return build(mod.DeleteTopicsRequest, topic_names=(name,), timeout=self._timeout())

        response = self.conn.call(apis.DELETE_TOPICS, make)
        for t in response.responses:
            _raise_for(t.error_code, getattr(t, "error_message", None))

    def describe_topic_configs(self, name: str) -> dict[str, tuple[str | None, bool]]:
        """config name -> (value, is_default)."""
        def make(mod, version):
            resource = build(mod.DescribeConfigsResource, resource_type=RESOURCE_TOPIC,
                             resource_name=name, configuration_keys=None)
            return build(mod.DescribeConfigsRequest, resources=(resource,),
                         include_synonyms=False, include_documentation=False)

        response = self.conn.call(apis.DESCRIBE_CONFIGS, make)
        result = {}
        for res in response.results:
            _raise_for(res.error_code, res.error_message)
            for c in res.configs:
                is_default = getattr(c, "is_default", None)
                if is_default is None:
                    is_default = getattr(c, "config_source", 5) == 5
                result[c.name] = (c.value, bool(is_default))
        return result

    def describe_producers(self, topic: str,
                           partitions: list[int]) -> dict[int, list[ProducerInfo]]:
        """DescribeProducers (KIP-664): the idempotent producers each partition remembers."""
        def make(mod, version):
            return build(mod.DescribeProducersRequest, topics=(
                build(mod.TopicRequest, name=topic, partition_indexes=tuple(partitions)),))

        response = self.conn.call(apis.DESCRIBE_PRODUCERS, make)
        result = {}
        for t in response.topics:
            for p in t.partitions:
                _raise_for(p.error_code, p.error_message or f"{topic}-{p.partition_index}")
                result[p.partition_index] = [
                    ProducerInfo(s.producer_id, s.producer_epoch, s.last_sequence,
                                 s.last_timestamp)
                    for s in p.active_producers
                ]
        return result
