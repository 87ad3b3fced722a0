"""oncelog.Admin: topics, consumer groups and transactions over the Kafka protocol, against
oncelog or any Kafka broker."""

from __future__ import annotations

import datetime
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.consumer_protocol import assigned_partitions
from ...protocol.schema import build
from ..consumer.group_membership import SIMPLE_COMMIT
from ..network import calls
from ..network.connection import BrokerConnection, KafkaError, connect, parse_bootstrap
from ..network.security import ClientSecurity
from ..producer.transactions import TWO_PHASE_FROM, Action, Api, judge
from ..topic_partition import OffsetAndMetadata, TopicPartition
from . import admin_configs, admin_scram
from .admin_acls import AclAdmin
from .admin_configs import AlterConfigOp, ConfigEntry, ConfigResource

RESOURCE_TOPIC = 2
# Required in InitProducerId; two-phase commit transactions have none (the broker ignores it).
_FENCE_TXN_TIMEOUT = datetime.timedelta(minutes=1)


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
    coordinator_epoch: int = -1  # of the last marker written for this producer; -1: none
    current_txn_start_offset: int = -1  # of its open transaction in the partition; -1: none


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    cluster_id: str | None
    brokers: dict[int, tuple[str, int]]
    topics: dict[str, TopicInfo]


def _raise_for(error: ErrorCode, message: str | None = None) -> None:
    if error != ErrorCode.none:
        raise KafkaError(error, message)


class Admin(AclAdmin):  # the ACL calls: admin_acls.py
    def __init__(self, config: dict[str, str]) -> None:
        self.bootstrap = config.get("bootstrap.servers", "127.0.0.1:9092")
        self.timeout = float(config.get("request.timeout.ms", 30_000)) / 1000
        self.client_id = config.get("client.id", "oncelog")
        parse_bootstrap(self.bootstrap)  # a bad address fails here, as a bad config does
        self.security = ClientSecurity.from_config(config)
        self._conn: BrokerConnection | None = None
        self._others: dict[tuple[str, int], BrokerConnection] = {}  # other brokers, by address
        # (key type, group or transactional id) -> its coordinator
        self._coordinators: dict[tuple[int, str], Coordinator] = {}

    @property
    def conn(self) -> BrokerConnection:
        """The connection to a bootstrap server, opened on first use: as with Kafka's clients,
        making a client does not fail because no broker is up yet."""
        if self._conn is None:
            self._conn = connect(self.bootstrap, self.client_id, self.timeout, self.security)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        for conn in self._others.values():
            conn.close()
        self._others.clear()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout)

    def metadata(self, topics: list[str] | None = None, auto_create: bool = False,
                 missing_ok: bool = False) -> ClusterInfo:
        """Brokers and topics; a named topic the broker does not know raises KafkaError,
        unless ``missing_ok`` (then it is left out)."""
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
                if topics is not None and not missing_ok:
                    _raise_for(t.error_code, f"topic {t.name!r}")
                continue
            result[t.name] = TopicInfo(t.name, tuple(sorted(
                (PartitionInfo(p.partition_index, p.leader_id, tuple(p.replica_nodes),
                               tuple(p.isr_nodes)) for p in t.partitions),
                key=lambda p: p.index)))
        return ClusterInfo(getattr(response, "cluster_id", None),
                           {b.node_id: (b.host, b.port) for b in response.brokers}, result)

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

    # --- configs: DescribeConfigs, AlterConfigs, IncrementalAlterConfigs ----------------------

    def describe_configs(self, resources: Iterable[ConfigResource],
                         keys: Iterable[str] | None = None, include_synonyms: bool = False,
                         include_documentation: bool = False
                         ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        """Every config of each topic or broker (only ``keys`` when given): value, source,
        read_only, sensitive, and on request synonyms and documentation. A resource the broker
        refused raises KafkaError naming it."""
        result = {}
        for conn, group in self._config_brokers(list(resources)).items():
            response = conn.call(apis.DESCRIBE_CONFIGS, admin_configs.describe_request(
                group, keys, include_synonyms, include_documentation))
            for res in response.results:
                resource = admin_configs.resource_of(res)
                _raise_for(res.error_code, f"{resource.type} {resource.name!r}: "
                                           f"{res.error_message or ''}")
                result[resource] = admin_configs.read_entries(res)
        return result

    def incremental_alter_configs(
            self, changes: dict[ConfigResource, list[AlterConfigOp]],
            validate_only: bool = False) -> dict[ConfigResource, KafkaError | None]:
        """Apply SET / DELETE / APPEND / SUBTRACT to each resource, all or nothing per
        resource: None where it was done, the KafkaError (INVALID_CONFIG naming the key, ...)
        where nothing changed."""
        return self._alter(changes, lambda group: admin_configs.incremental_request(
            {r: changes[r] for r in group}, validate_only), apis.INCREMENTAL_ALTER_CONFIGS)

    def alter_configs(self, configs: dict[ConfigResource, dict[str, str]],
                      validate_only: bool = False) -> dict[ConfigResource, KafkaError | None]:
        """AlterConfigs: each resource's overrides become exactly ``configs[resource]``
        (keys left out go back to their defaults); results as incremental_alter_configs."""
        return self._alter(configs, lambda group: admin_configs.alter_request(
            {r: configs[r] for r in group}, validate_only), apis.ALTER_CONFIGS)

    def _alter(self, resources, make_for, api_key: int
               ) -> dict[ConfigResource, KafkaError | None]:
        result: dict[ConfigResource, KafkaError | None] = {}
        for conn, group in self._config_brokers(list(resources)).items():
            response = conn.call(api_key, make_for(group))
            for res in response.responses:
                error, message = admin_configs.outcome(res)
                result[admin_configs.resource_of(res)] = \
                    None if error == ErrorCode.none else KafkaError(error, message)
        return result

    def _config_brokers(self, resources: list[ConfigResource]
                        ) -> dict[BrokerConnection, list[ConfigResource]]:
        """Where each resource is asked: a broker's own configs at that broker, the rest at
        any broker."""
        by_id = dict(self._brokers_by_id()) if any(
            r.type_id == admin_configs.RESOURCE_TYPES["broker"] and r.name
            for r in resources) else {}
        groups: dict[BrokerConnection, list[ConfigResource]] = {}
        for r in resources:
            conn = self.conn
            if r.type_id == admin_configs.RESOURCE_TYPES["broker"] and r.name:
                if not r.name.isdigit() or int(r.name) not in by_id:
                    raise KafkaError(ErrorCode.invalid_request,
                                     f"broker {r.name!r} is not in the cluster")
                conn = by_id[int(r.name)]
            groups.setdefault(conn, []).append(r)
        return groups

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
                                 s.last_timestamp, s.coordinator_epoch,
                                 s.current_txn_start_offset)
                    for s in p.active_producers
                ]
        return result

    # --- partitions: CreatePartitions, DeleteRecords, elections, reassignments ---------------

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
            _raise_for(r.error_code, r.error_message or f"topic {name!r}")

    def delete_records(self, before: dict[tuple[str, int], int]
                       ) -> dict[tuple[str, int], int | KafkaError]:
        """DeleteRecords: move each partition's log start to the offset given (-1: its high
        watermark), asked of its leader. (topic, partition) -> the log start after it (the
        low watermark), or the partition's error (OFFSET_OUT_OF_RANGE past the high
        watermark)."""
        result: dict[tuple[str, int], int | KafkaError] = {}
        for leader, asked in self._by_leader(before, result).items():
            by_topic: dict[str, list[tuple[int, int]]] = {}
            for (topic, partition), offset in sorted(asked.items()):
                by_topic.setdefault(topic, []).append((partition, offset))

            def make(mod, version, by_topic=by_topic):
                return build(mod.DeleteRecordsRequest, timeout=self._timeout(), topics=tuple(
                    build(mod.DeleteRecordsTopic, name=topic, partitions=tuple(
                        build(mod.DeleteRecordsPartition, partition_index=p, offset=o)
                        for p, o in parts))
                    for topic, parts in by_topic.items()))

            response = self._broker(*leader).call(apis.DELETE_RECORDS, make)
            for t in response.topics:
                for p in t.partitions:
                    result[t.name, p.partition_index] = (
                        p.low_watermark if p.error_code == ErrorCode.none
                        else KafkaError(p.error_code, f"{t.name}-{p.partition_index}"))
        return result

    def _by_leader(self, wanted: dict[tuple[str, int], Any],
                   errors: dict[tuple[str, int], Any]
                   ) -> dict[tuple[str, int], dict[tuple[str, int], Any]]:
        """``wanted`` split by the address of each partition's leader; partitions without
        one get their error in ``errors``."""
        info = self.metadata(sorted({t for t, _ in wanted}), missing_ok=True)
        by_leader: dict[tuple[str, int], dict[tuple[str, int], Any]] = {}
        for (topic, partition), value in wanted.items():
            known = info.topics.get(topic)
            leaders = {p.index: p.leader for p in known.partitions} if known else {}
            if partition not in leaders:
                errors[topic, partition] = KafkaError(ErrorCode.unknown_topic_or_partition,
                                                      f"{topic}-{partition}")
            elif leaders[partition] not in info.brokers:
                errors[topic, partition] = KafkaError(ErrorCode.leader_not_available,
                                                      f"{topic}-{partition}")
            else:
                address = info.brokers[leaders[partition]]
                by_leader.setdefault(address, {})[topic, partition] = value
        return by_leader

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
        _raise_for(getattr(response, "error_code", ErrorCode.none), "ElectLeaders")
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
        _raise_for(response.error_code, response.error_message)
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
        _raise_for(response.error_code, response.error_message)
        return {(t.name, p.partition_index): PartitionReassignment(
                    tuple(p.replicas), tuple(p.adding_replicas), tuple(p.removing_replicas))
                for t in response.topics for p in t.partitions}

    # --- transactions (KIP-664) -------------------------------------------------------------
    # DescribeTransactions goes to the transactional id's coordinator (FindCoordinator key
    # type 1), ListTransactions to every broker, WriteTxnMarkers to the partition's leader.

    def find_transaction_coordinator(self, transactional_id: str) -> Coordinator:
        return self._find_coordinator(transactional_id, COORDINATOR_TRANSACTION)

    def describe_transactions(self, transactional_ids: Iterable[str]
                              ) -> dict[str, TransactionDescription | KafkaError]:
        """Each transactional id's state as its coordinator holds it, or the error
        (TRANSACTIONAL_ID_NOT_FOUND for an id the coordinator does not know)."""
        result: dict[str, TransactionDescription | KafkaError] = {}
        for txn_id in dict.fromkeys(transactional_ids):
            try:
                error, found = self._coordinator_call(
                    txn_id, COORDINATOR_TRANSACTION, apis.DESCRIBE_TRANSACTIONS,
                    _describe_transactions_request(txn_id), lambda r: r[0], raw=True)
            except KafkaError as exc:
                result[txn_id] = exc
                continue
            if error != ErrorCode.none or found is None:
                result[txn_id] = KafkaError(error, f"transactional id {txn_id!r}")
                continue
            coordinator = self._coordinators[COORDINATOR_TRANSACTION, txn_id]
            result[txn_id] = TransactionDescription(txn_id, coordinator.node_id, *found)
        return result

    def list_transactions(self, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
                          duration_ms: int = -1, pattern: str | None = None
                          ) -> dict[int, list[TransactionListing]]:
        """ListTransactions of every broker: broker id -> its transactions that pass every
        filter (states, producer ids, open for at least ``duration_ms``, transactional id
        matching the regular expression ``pattern``)."""
        wanted = _ListFilter(tuple(states), tuple(producer_ids), duration_ms, pattern)
        result: dict[int, list[TransactionListing]] = {}
        for node_id, conn in self._brokers_by_id():
            version = conn.version(apis.LIST_TRANSACTIONS)
            if duration_ms >= 0 and version < 1:
                raise KafkaError(ErrorCode.unsupported_version, "the broker cannot filter "
                                 "transactions by duration (ListTransactions v1)")
            if pattern and version < 2:
                raise KafkaError(ErrorCode.unsupported_version, "the broker cannot filter "
                                 "transactional ids by pattern (ListTransactions v2)")
            response = conn.call(apis.LIST_TRANSACTIONS, _list_transactions_request(wanted))
            _raise_for(response.error_code, f"ListTransactions on broker {node_id}")
            result[node_id] = sorted(
                (TransactionListing(t.transactional_id, node_id, t.producer_id,
                                    t.transaction_state)
                 for t in response.transaction_states),
                key=lambda t: t.transactional_id)
        return result

    def abort_transaction(self, topic: str, partition: int, producer_id: int,
                          producer_epoch: int, coordinator_epoch: int) -> None:
        """Write an ABORT marker of the producer to the partition (WriteTxnMarkers to its
        leader), as Kafka's Admin.abortTransaction does for a hanging transaction."""
        host, port = self._leader(topic, partition)

        def make(mod, version):
            marker = build(mod.WritableTxnMarker, producer_id=producer_id,
                           producer_epoch=producer_epoch, transaction_result=False,
                           coordinator_epoch=coordinator_epoch, transaction_version=0,
                           topics=(build(mod.WritableTxnMarkerTopic, name=topic,
                                         partition_indexes=(partition,)),))
            return build(mod.WriteTxnMarkersRequest, markers=(marker,))

        response = self._broker(host, port).call(apis.WRITE_TXN_MARKERS, make)
        for m in response.markers:
            for t in m.topics:
                for p in t.partitions:
                    _raise_for(p.error_code, f"{t.name}-{p.partition_index}")

    # --- ending others' transactions (KIP-939) -------------------------------------------
    # What a two-phase commit coordinator does with transactions others wrote and prepared:
    # one request per transactional id to its coordinator, pipelined on one connection per
    # coordinator, instead of a producer per id (its thread, connections, InitProducerId).

    def end_transactions(self, ends: Mapping[str, tuple[int, int]], commit: bool
                         ) -> dict[str, ErrorCode]:
        """EndTxn of each transactional id's open transaction with the producer id and
        epoch it was prepared with (``(producer id, epoch)``, as prepare_transaction()
        answered). Retriable answers are asked again until the admin's timeout; each id gets
        its last answer: NONE (ended), PRODUCER_FENCED (the epoch moved on since: another
        instance took the id over), INVALID_TXN_STATE (nothing open)..."""
        def make(txn_id: str):
            producer_id, epoch = ends[txn_id]

            def build_request(mod, version):
                return build(mod.EndTxnRequest, transactional_id=txn_id,
                             producer_id=producer_id, producer_epoch=epoch, committed=commit)

            return build_request

        answers = self._per_transaction(ends, Api.END_TXN, apis.END_TXN, make,
                                        lambda r: r.error_code)
        return {txn_id: a if isinstance(a, ErrorCode) else ErrorCode(a.error_code)
                for txn_id, a in answers.items()}

    def fence_transactions(self, transactional_ids: Iterable[str], keep_prepared: bool = False
                           ) -> dict[str, FencedTransaction | KafkaError]:
        """InitProducerId of each transactional id as a new two-phase commit instance
        (KIP-939; the broker must allow it): fences the instances before it and aborts the
        open transaction (waiting until it is aborted), or with ``keep_prepared`` keeps it
        open for end_transactions() with the new producer id and epoch."""
        def make(txn_id: str):
            def build_request(mod, version):
                if version < TWO_PHASE_FROM:
                    raise KafkaError(ErrorCode.unsupported_version, "two-phase commit "
                                     "needs InitProducerId v6 (KIP-939); the coordinator "
                                     f"speaks v{version}")
                return calls.init_producer_id_request(mod, txn_id, _FENCE_TXN_TIMEOUT,
                                                      two_phase=True,
                                                      keep_prepared=keep_prepared)

            return build_request

        answers = self._per_transaction(transactional_ids, Api.INIT_PRODUCER_ID,
                                        apis.INIT_PRODUCER_ID, make, lambda r: r.error_code)
        result: dict[str, FencedTransaction | KafkaError] = {}
        for txn_id, a in answers.items():
            if isinstance(a, ErrorCode) or a.error_code != ErrorCode.none:
                error = a if isinstance(a, ErrorCode) else ErrorCode(a.error_code)
                result[txn_id] = KafkaError(error, f"InitProducerId {txn_id!r}")
            else:
                result[txn_id] = FencedTransaction(
                    txn_id, a.producer_id, a.producer_epoch,
                    getattr(a, "ongoing_txn_producer_id", -1),
                    getattr(a, "ongoing_txn_producer_epoch", -1))
        return result

    def _per_transaction(self, transactional_ids: Iterable[str], api: Api, api_key: int,
                         make: Callable[[str], Callable[[ModuleType, int], Any]],
                         error_of: Callable[[Any], int]) -> dict[str, Any]:
        """One request per transactional id (``make(id)``) to the id's coordinator, all of a
        coordinator's pipelined; what the producer's rules (transactions.judge) retry is
        asked again until the admin's timeout. id -> the answer, or the ErrorCode of a
        coordinator that could not be found."""
        deadline = time.monotonic() + self.timeout
        left = list(dict.fromkeys(transactional_ids))
        result: dict[str, Any] = {}
        while left:
            by_coordinator: dict[tuple[str, int], list[str]] = {}
            for txn_id in left:
                key = (COORDINATOR_TRANSACTION, txn_id)
                try:
                    if key not in self._coordinators:
                        self._coordinators[key] = self._find_coordinator(
                            txn_id, COORDINATOR_TRANSACTION)
                except KafkaError as exc:
                    result[txn_id] = exc.error
                    continue
                coordinator = self._coordinators[key]
                by_coordinator.setdefault((coordinator.host, coordinator.port),
                                          []).append(txn_id)
            again = []
            for (host, port), txn_ids in by_coordinator.items():
                conn = self._broker(host, port)
                for txn_id in txn_ids:
                    conn.send_only(api_key, make(txn_id))
                for txn_id in txn_ids:
                    response = conn.receive()[1]
                    error = ErrorCode(error_of(response))
                    action = judge(api, error)
                    if action in (Action.RETRY, Action.FIND_COORDINATOR) and \
                            time.monotonic() < deadline:
                        if action is Action.FIND_COORDINATOR:
                            self._coordinators.pop((COORDINATOR_TRANSACTION, txn_id), None)
                        again.append(txn_id)
                    else:
                        result[txn_id] = response
            left = again
            if left:
                time.sleep(_RETRY_BACKOFF)
        return result

    # --- cluster and storage views ------------------------------------------------------------
    # DescribeCluster, DescribeTopicPartitions (KIP-966), DescribeLogDirs and
    # AlterReplicaLogDirs; the log directory calls go to every broker (or the one named).

    def describe_user_scram_credentials(self, users: Iterable[str] | None = None
                                        ) -> dict[str, dict[str, int] | KafkaError]:
        """user -> {mechanism: iterations} (or the broker's error for that user)."""
        return admin_scram.describe(self.conn, users)

    def alter_user_scram_credentials(self, upsertions: Iterable[admin_scram.ScramUpsertion] = (),
                                     deletions: Iterable[tuple[str, str]] = ()
                                     ) -> dict[str, KafkaError | None]:
        """Set or delete SCRAM credentials: user -> None when done, else its error."""
        return admin_scram.alter(self.conn, upsertions, deletions)

    def describe_cluster(self, include_authorized_operations: bool = False) -> ClusterDescription:
        def make(mod, version):
            return build(mod.DescribeClusterRequest,
                         include_cluster_authorized_operations=include_authorized_operations,
                         endpoint_type=1, include_fenced_brokers=True)

        response = self.conn.call(apis.DESCRIBE_CLUSTER, make)
        _raise_for(response.error_code, response.error_message)
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
                _raise_for(t.error_code, f"topic {t.name!r}")
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
        of ``topics``: topic -> partition indexes)."""
        def make(mod, version):
            wanted = None if topics is None else tuple(
                build(mod.DescribableLogDirTopic, topic=name, partitions=tuple(indexes))
                for name, indexes in topics.items())
            return build(mod.DescribeLogDirsRequest, topics=wanted)

        result: dict[int, list[LogDirDescription]] = {}
        for node_id, conn in self._brokers_by_id():
            if broker_id is not None and node_id != broker_id:
                continue
            response = conn.call(apis.DESCRIBE_LOG_DIRS, make)
            _raise_for(getattr(response, "error_code", ErrorCode.none),
                       f"DescribeLogDirs on broker {node_id}")
            result[node_id] = [
                LogDirDescription(
                    d.log_dir, None if d.error_code == ErrorCode.none else d.error_code,
                    tuple(ReplicaInfo(t.name, p.partition_index, p.partition_size,
                                      p.offset_lag, p.is_future_key)
                          for t in d.topics for p in t.partitions),
                    getattr(d, "total_bytes", -1), getattr(d, "usable_bytes", -1))
                for d in response.results]
        return result

    def alter_replica_log_dirs(self, moves: dict[tuple[str, int], str],
                               broker_id: int | None = None) -> dict[tuple[str, int], ErrorCode]:
        """Move each (topic, partition) into the log directory named (an absolute path) on
        ``broker_id`` (the only broker, when None). The broker answers once the move is under
        way; ``describe_log_dirs`` shows the copy as a future replica until it is done."""
        brokers = self._brokers_by_id()
        if broker_id is None:
            if len(brokers) != 1:
                raise ValueError("several brokers: name the one whose directories change")
            broker_id = brokers[0][0]
        conn = dict(brokers).get(broker_id)
        if conn is None:
            raise KafkaError(ErrorCode.broker_not_available, f"no broker {broker_id}")
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

    # --- consumer groups --------------------------------------------------------------------
    # Group requests go to the group's coordinator (FindCoordinator); while it loads or moves,
    # a request is retried until the admin's timeout.

    def find_group_coordinator(self, group_id: str) -> Coordinator:
        return self._find_coordinator(group_id, calls.COORDINATOR_GROUP)

    def _find_coordinator(self, key: str, key_type: int) -> Coordinator:
        what = "group" if key_type == calls.COORDINATOR_GROUP else "transactional id"
        deadline = time.monotonic() + self.timeout
        while True:
            found = calls.find_coordinator_result(
                self.conn.call(apis.FIND_COORDINATOR, _find_coordinator_request(key, key_type)))
            if found.error == ErrorCode.none:
                return Coordinator(found.node_id, found.host, found.port)
            if found.error not in _COORDINATOR_MOVING or time.monotonic() >= deadline:
                _raise_for(found.error, found.message or f"{what} {key!r}")
            time.sleep(_RETRY_BACKOFF)

    def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        """Every group of every broker (ListGroups), optionally only those in ``states``."""
        states = tuple(states)
        listed: dict[str, GroupListing] = {}
        for conn in self._every_broker():
            if states and conn.version(apis.LIST_GROUPS) < 4:
                raise KafkaError(ErrorCode.unsupported_version,
                                 "the broker cannot filter groups by state (ListGroups v4)")
            response = conn.call(apis.LIST_GROUPS, _list_groups_request(states))
            _raise_for(response.error_code, "ListGroups")
            for g in response.groups:
                listed[g.group_id] = GroupListing(g.group_id, g.protocol_type,
                                                  getattr(g, "group_state", None),
                                                  getattr(g, "group_type", None))
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
        _raise_for(g.error_code, getattr(g, "error_message", None) or f"group {group_id!r}")
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
        _raise_for(g.error_code, g.error_message or f"group {group_id!r}")
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
        _raise_for(error, f"group {group_id!r}")
        result = {}
        for tp, (perror, committed) in offsets.items():
            _raise_for(perror, f"{tp.topic}-{tp.partition}")
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

    def list_offsets(self, wanted: dict[tuple[str, int], int], read_committed: bool = False
                     ) -> dict[tuple[str, int], int | KafkaError]:
        """ListOffsets of many partitions, each asked of its leader: (topic, partition) ->
        timestamp (calls.EARLIEST, calls.LATEST or milliseconds) in, offset (-1: no record at
        or after that time) or the partition's error out. ``read_committed``: as a
        read_committed consumer asks (LATEST is then the last stable offset)."""
        if not wanted:
            return {}
        info = self.metadata(sorted({t for t, _ in wanted}), missing_ok=True)
        result: dict[tuple[str, int], int | KafkaError] = {}
        by_leader: dict[int, dict[tuple[str, int], int]] = {}
        for (topic, partition), timestamp in wanted.items():
            known = info.topics.get(topic)
            leaders = {p.index: p.leader for p in known.partitions} if known else {}
            if partition not in leaders:
                result[topic, partition] = KafkaError(ErrorCode.unknown_topic_or_partition,
                                                      f"{topic}-{partition}")
            elif leaders[partition] < 0:
                result[topic, partition] = KafkaError(ErrorCode.leader_not_available,
                                                      f"{topic}-{partition}")
            else:
                by_leader.setdefault(leaders[partition], {})[topic, partition] = timestamp
        for leader, asked in by_leader.items():
            host, port = info.brokers[leader]
            response = self._broker(host, port).call(
                apis.LIST_OFFSETS, _list_offsets_request(asked, int(read_committed)))
            for t in response.topics:
                for p in t.partitions:
                    result[t.name, p.partition_index] = (
                        p.offset if p.error_code == ErrorCode.none
                        else KafkaError(p.error_code, f"{t.name}-{p.partition_index}"))
        return result

    def _group_call(self, group_id: str, api_key: int, make: Callable[[ModuleType, int], Any],
                    error_of: Callable[[Any], ErrorCode]) -> Any:
        return self._coordinator_call(group_id, calls.COORDINATOR_GROUP, api_key, make,
                                      error_of)

    def _coordinator_call(self, key: str, key_type: int, api_key: int,
                          make: Callable[[ModuleType, int], Any],
                          error_of: Callable[[Any], ErrorCode], raw: bool = False) -> Any:
        """Send to the key's coordinator; look it up again while it loads or moves. With
        ``raw`` (DescribeTransactions only) the answer is read by _read_describe_transactions."""
        deadline = time.monotonic() + self.timeout
        while True:
            coordinator = self._coordinators.get((key_type, key))
            if coordinator is None:
                coordinator = self._coordinators[key_type, key] = self._find_coordinator(
                    key, key_type)
            conn = self._broker(coordinator.host, coordinator.port)
            response = _read_describe_transactions(*conn.call_raw(api_key, make)) if raw \
                else conn.call(api_key, make)
            if error_of(response) not in _COORDINATOR_MOVING or time.monotonic() >= deadline:
                return response
            self._coordinators.pop((key_type, key), None)
            time.sleep(_RETRY_BACKOFF)

    def _broker_of(self, group_id: str) -> BrokerConnection:
        coordinator = self._coordinators[calls.COORDINATOR_GROUP, group_id]
        return self._broker(coordinator.host, coordinator.port)

    def _leader(self, topic: str, partition: int) -> tuple[str, int]:
        info = self.metadata([topic])
        leaders = {p.index: p.leader for p in info.topics[topic].partitions}
        if partition not in leaders:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"{topic}-{partition}")
        if leaders[partition] < 0 or leaders[partition] not in info.brokers:
            raise KafkaError(ErrorCode.leader_not_available, f"{topic}-{partition}")
        return info.brokers[leaders[partition]]

    def _brokers_by_id(self) -> list[tuple[int, BrokerConnection]]:
        brokers = self.metadata([]).brokers
        return [(node_id, self._broker(host, port))
                for node_id, (host, port) in sorted(brokers.items())]

    def _controller(self) -> BrokerConnection:
        """The controller DescribeCluster names: ElectLeaders and the reassignment requests
        go there, as Kafka's Admin sends them (any other broker of a cluster answers
        NOT_CONTROLLER); the bootstrap broker while there is none."""
        cluster = self.describe_cluster()
        for b in cluster.brokers:
            if b.node_id == cluster.controller_id:
                return self._broker(b.host, b.port)
        return self.conn

    def _broker(self, host: str, port: int) -> BrokerConnection:
        if (host, port) == (self.conn.host, self.conn.port):
            return self.conn
        conn = self._others.get((host, port))
        if conn is None:
            conn = self._others[host, port] = BrokerConnection(host, port, self.client_id,
                                                               self.timeout, self.security)
        return conn

    def _every_broker(self) -> list[BrokerConnection]:
        brokers = self.metadata([]).brokers.values()
        return [self._broker(host, port) for host, port in brokers] or [self.conn]


# --- cluster and storage views: what the calls return -------------------------------------

# Kafka's AclOperation codes, by the bit each has in an authorized_operations field
_ACL_OPERATIONS = {3: "READ", 4: "WRITE", 5: "CREATE", 6: "DELETE", 7: "ALTER", 8: "DESCRIBE",
                   9: "CLUSTER_ACTION", 10: "DESCRIBE_CONFIGS", 11: "ALTER_CONFIGS",
                   12: "IDEMPOTENT_WRITE", 13: "CREATE_TOKENS", 14: "DESCRIBE_TOKENS",
                   15: "TWO_PHASE_COMMIT"}


def _operations(field: int) -> frozenset[str] | None:
    """The operation names an authorized_operations field holds; None when omitted."""
    if field == -(1 << 31):
        return None
    return frozenset(name for bit, name in _ACL_OPERATIONS.items() if field & (1 << bit))


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


# --- consumer groups: what the calls return, and their requests --------------------------------

_RETRY_BACKOFF = 0.1
_COORDINATOR_MOVING = frozenset({ErrorCode.coordinator_load_in_progress,
                                 ErrorCode.coordinator_not_available,
                                 ErrorCode.not_coordinator})


@dataclass(frozen=True, slots=True)
class Coordinator:
    node_id: int
    host: str
    port: int


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


COORDINATOR_TRANSACTION = 1  # FindCoordinator key type


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    transactional_id: str
    coordinator_id: int
    producer_id: int
    producer_epoch: int
    state: str  # as Kafka spells it: Ongoing, PrepareCommit, CompleteAbort...
    timeout_ms: int
    start_ms: int  # of the ongoing transaction; -1: none
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class FencedTransaction:
    """fence_transactions()' answer for one transactional id: its new producer id and
    epoch, and (``keep_prepared``) the kept open transaction's, or -1, -1 when none was."""

    transactional_id: str
    producer_id: int
    epoch: int
    ongoing_producer_id: int = -1
    ongoing_epoch: int = -1


@dataclass(frozen=True, slots=True)
class TransactionListing:
    transactional_id: str
    coordinator_id: int
    producer_id: int
    state: str


@dataclass(frozen=True, slots=True)
class _ListFilter:
    states: tuple[str, ...]
    producer_ids: tuple[int, ...]
    duration_ms: int
    pattern: str | None


class _Reader:
    """Kafka's flexible encoding, for the one answer kio cannot read."""

    def __init__(self, data: bytes, pos: int) -> None:
        self.data, self.pos = data, pos

    def fixed(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def string(self) -> str:
        size = self.uvarint() - 1
        text = self.data[self.pos:self.pos + max(size, 0)].decode()
        self.pos += max(size, 0)
        return text

    def count(self) -> int:
        return max(self.uvarint() - 1, 0)

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()


def _read_describe_transactions(version: int, frame: bytes | bytearray
                                ) -> tuple[ErrorCode, tuple[Any, ...] | None]:
    """The first state of a DescribeTransactions v0 answer: (error, (producer id, epoch,
    state, timeout ms, start ms, partitions)). kio reads TransactionStartTimeMs as a datetime
    and refuses the -1 Kafka sends when no transaction is ongoing, so it is read here."""
    r = _Reader(frame, 4)
    r.skip_tags()  # response header v1
    r.fixed(">i")  # throttle time
    if r.count() == 0:
        return ErrorCode.unknown_server_error, None
    error = ErrorCode(r.fixed(">h"))
    r.string()  # transactional id
    state = r.string()
    timeout_ms, start_ms = r.fixed(">i"), r.fixed(">q")
    producer_id, epoch = r.fixed(">q"), r.fixed(">h")
    partitions = []
    for _ in range(r.count()):
        topic = r.string()
        partitions += [(topic, r.fixed(">i")) for _ in range(r.count())]
        r.skip_tags()
    return error, (producer_id, epoch, state, timeout_ms, start_ms, tuple(partitions))


def _find_coordinator_request(key: str, key_type: int):
    def make(mod, version):
        # v4+ asks for a batch of keys (KIP-699); we ask for one.
        return build(mod.FindCoordinatorRequest, key=key, key_type=key_type,
                     coordinator_keys=(key,))

    return make


def _describe_transactions_request(transactional_id: str):
    def make(mod, version):
        return build(mod.DescribeTransactionsRequest, transactional_ids=(transactional_id,))

    return make


def _list_transactions_request(wanted: _ListFilter):
    def make(mod, version):
        return build(mod.ListTransactionsRequest, state_filters=wanted.states,
                     producer_id_filters=wanted.producer_ids,
                     duration_filter=wanted.duration_ms,
                     transactional_id_pattern=wanted.pattern)

    return make


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


def _list_offsets_request(wanted: dict[tuple[str, int], int], isolation_level: int = 0):
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for (topic, partition), timestamp in sorted(wanted.items()):
        by_topic.setdefault(topic, []).append((partition, timestamp))

    def make(mod, version):
        topics = tuple(
            build(mod.ListOffsetsTopic, name=topic, partitions=tuple(
                build(mod.ListOffsetsPartition, partition_index=partition,
                      current_leader_epoch=-1, timestamp=timestamp)
                for partition, timestamp in parts))
            for topic, parts in by_topic.items())
        return build(mod.ListOffsetsRequest, replica_id=-1, isolation_level=isolation_level,
                     topics=topics)

    return make


def _partitions_by_topic(partitions: Iterable[tuple[str, int]] | None
                         ) -> dict[str, list[int]] | None:
    """(topic, partition) pairs as each topic's partitions; None (all of them) stays None."""
    if partitions is None:
        return None
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return by_topic
