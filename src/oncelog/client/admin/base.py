"""What every family of oncelog.Admin's calls stands on: the connections (the bootstrap
server, the other brokers by address, each coordinator by key), the cluster's metadata, and
a call to a coordinator that follows it while it loads or moves.

Must not know: any family's requests beyond Metadata and FindCoordinator.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Self, TypeVar

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.schema import build
from ..network import calls
from ..network.connection import BrokerConnection, KafkaError, connect, parse_bootstrap
from ..network.security import ClientSecurity

RETRY_BACKOFF = 0.1
T = TypeVar("T")
COORDINATOR_MOVING = frozenset({ErrorCode.coordinator_load_in_progress,
                                ErrorCode.coordinator_not_available,
                                ErrorCode.not_coordinator})


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
class ClusterInfo:
    cluster_id: str | None
    brokers: dict[int, tuple[str, int]]
    topics: dict[str, TopicInfo]
    # a named topic the answer left out (missing_ok), with the error it was answered
    topic_errors: dict[str, ErrorCode] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Coordinator:
    node_id: int
    host: str
    port: int


def raise_for(error: ErrorCode, message: str | None = None) -> None:
    if error != ErrorCode.none:
        raise KafkaError(error, message)


def connection_lost(exc: KafkaError) -> bool:
    """A broker that failed to answer (a dead coordinator's connection): the connection is
    closed, and the request is asked again of the key's coordinator, found anew, as Kafka's
    admin client does on a disconnection."""
    return exc.error == ErrorCode.network_exception


# Retriable in Kafka, yet answered at once: a topic that may never be made is not waited
# for (as Kafka's Admin answers it), and a broker whose disk failed keeps the directory
# online here (Kafka takes it offline and moves the leader), so asking again would only
# write again to the disk that just failed.
_FINAL_AT_LEADER = frozenset({ErrorCode.unknown_topic_or_partition,
                              ErrorCode.kafka_storage_error})


def at_leader_again(exc: KafkaError) -> bool:
    """A partition's error its leader, looked up again, may not answer: Kafka's retriable
    errors (a connection lost included) but _FINAL_AT_LEADER."""
    return exc.is_retriable() and exc.error not in _FINAL_AT_LEADER


class AdminBase:
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
        if self._conn is None or self._conn.closed:  # closed: its broker failed, say died
            self._conn = connect(self.bootstrap, self.client_id, self.timeout, self.security)
        return self._conn

    def _bootstrap_call(self, api_key: int, make: Callable[[ModuleType, int], Any]) -> Any:
        """A call any broker answers (Metadata, FindCoordinator), on the bootstrap
        connection; when that fails (its broker died), asked once more of the next bootstrap
        server that answers. None reachable fails at once."""
        try:
            return self.conn.call(api_key, make)
        except KafkaError as exc:
            if not connection_lost(exc):
                raise
        return self.conn.call(api_key, make)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        for conn in self._others.values():
            conn.close()
        self._others.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout)

    def metadata(self, topics: list[str] | None = None, auto_create: bool = False,
                 missing_ok: bool = False) -> ClusterInfo:
        """Brokers and topics; a named topic the broker does not know raises KafkaError,
        unless ``missing_ok`` (then it is left out)."""
        response = self._bootstrap_call(apis.METADATA, _metadata_request(topics, auto_create))
        result = {}
        topic_errors = {}
        for t in response.topics:
            if t.error_code != ErrorCode.none:
                if topics is not None and not missing_ok:
                    raise_for(t.error_code, f"topic {t.name!r}")
                topic_errors[t.name] = ErrorCode(t.error_code)
                continue
            result[t.name] = TopicInfo(t.name, tuple(sorted(
                (PartitionInfo(p.partition_index, p.leader_id, tuple(p.replica_nodes),
                               tuple(p.isr_nodes)) for p in t.partitions),
                key=lambda p: p.index)))
        return ClusterInfo(getattr(response, "cluster_id", None),
                           {b.node_id: (b.host, b.port) for b in response.brokers}, result,
                           topic_errors)

    # --- where a request goes: a partition's leader, every broker, a coordinator -------------

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
            if partition not in leaders:  # the topic's own error (e.g. not authorized)
                errors[topic, partition] = KafkaError(
                    info.topic_errors.get(topic, ErrorCode.unknown_topic_or_partition)
                    if known is None else ErrorCode.unknown_topic_or_partition,
                    f"{topic}-{partition}")
            elif leaders[partition] not in info.brokers:
                errors[topic, partition] = KafkaError(ErrorCode.leader_not_available,
                                                      f"{topic}-{partition}")
            else:
                address = info.brokers[leaders[partition]]
                by_leader.setdefault(address, {})[topic, partition] = value
        return by_leader

    def _leader_call(self, wanted: dict[tuple[str, int], Any],
                     ask: Callable[[BrokerConnection, dict[tuple[str, int], Any]],
                                   dict[tuple[str, int], Any]]
                     ) -> dict[tuple[str, int], Any]:
        """Each partition of ``wanted`` asked of its leader: ``ask(leader's connection, its
        partitions)`` -> (topic, partition) -> the answer, or its KafkaError. As Kafka's
        Admin does, every attempt looks the leaders up afresh, and a partition whose leader
        moved or died (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, its connection lost:
        any retriable error, see at_leader_again) is asked again after RETRY_BACKOFF until
        the admin's timeout; then it keeps its last error."""
        deadline = time.monotonic() + self.timeout
        result: dict[tuple[str, int], Any] = {}
        left = dict(wanted)
        while True:
            try:
                by_leader = self._by_leader(left, result)
            except KafkaError as exc:  # no broker answered Metadata
                if not at_leader_again(exc):
                    raise
                by_leader = {}
                result.update(dict.fromkeys(left, exc))
            for leader, asked in by_leader.items():
                try:
                    result.update(ask(self._broker(*leader), asked))
                except KafkaError as exc:  # the leader's broker died: look it up again
                    if not at_leader_again(exc):
                        raise
                    result.update(dict.fromkeys(asked, exc))
            left = {tp: value for tp, value in left.items()
                    if isinstance(result.get(tp), KafkaError) and at_leader_again(result[tp])}
            if not left or time.monotonic() + RETRY_BACKOFF >= deadline:
                return result
            time.sleep(RETRY_BACKOFF)

    def _each_broker(self, ask: Callable[[int, BrokerConnection], T],
                     covering: str | None = None, only: int | None = None) -> dict[int, T]:
        """``ask(broker id, its connection)`` of every broker the cluster's metadata names
        (``only``: of that one, if named), as Kafka's Admin sends ListTransactions,
        ListGroups, DescribeLogDirs to every broker: broker id -> its answer, returned only
        once every broker named answered, all in one attempt. An attempt that fails
        retriably (a dead broker still named until its ZooKeeper session expires: its
        connection refused; a coordinator loading: COORDINATOR_LOAD_IN_PROGRESS, which
        ``ask`` raises) is made again whole, with fresh metadata, after RETRY_BACKOFF until
        the admin's timeout; then its error is raised. A listing is never answered with a
        broker left out: the caller (the Spark sink's recovery) would take what is missing
        for absent.

        ``covering``: an internal topic whose keys the answers list (__transaction_state,
        __consumer_offsets); the attempt also fails retriably (COORDINATOR_NOT_AVAILABLE)
        unless each of its partitions was led by a broker that answered, as that broker saw
        it just before and just after its answer (the same leader epoch both times: it led
        the partition throughout; and the broker refuses a listing while a partition it
        leads is not loaded, ownership.py ``incomplete``). A partition whose leader died,
        not yet moved, is so waited for until its coordinator moves."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self._each_broker_once(ask, covering, only)
            except KafkaError as exc:
                if not exc.is_retriable() or time.monotonic() + RETRY_BACKOFF >= deadline:
                    raise
            time.sleep(RETRY_BACKOFF)

    def _each_broker_once(self, ask: Callable[[int, BrokerConnection], T],
                          covering: str | None, only: int | None) -> dict[int, T]:
        brokers = self._brokers_by_id()
        answers: dict[int, T] = {}
        partitions, covered = 0, set()
        for node_id, address in brokers.items():
            if only is not None and node_id != only:
                continue
            conn = self._broker(*address)
            if covering is None:
                answers[node_id] = ask(node_id, conn)
                continue
            count, before = _led_by(conn, node_id, covering)
            answers[node_id] = ask(node_id, conn)
            count_after, after = _led_by(conn, node_id, covering)
            partitions = max(partitions, count, count_after)
            covered |= {p for p, epoch in before.items() if after.get(p) == epoch}
        missing = sorted(set(range(partitions)) - covered)
        if missing:
            raise KafkaError(ErrorCode.coordinator_not_available,
                             f"no broker answered as the leader of {covering} partitions "
                             f"{missing}")
        return answers

    def _brokers_by_id(self) -> dict[int, tuple[str, int]]:
        """Every broker the cluster's metadata names: id -> address. Not connected to: one
        of them may be dead (named until its session expires)."""
        return dict(sorted(self.metadata([]).brokers.items()))

    def _broker(self, host: str, port: int) -> BrokerConnection:
        if (host, port) == (self.conn.host, self.conn.port):
            return self.conn
        conn = self._others.get((host, port))
        if conn is None or conn.closed:
            conn = self._others[host, port] = BrokerConnection(host, port, self.client_id,
                                                               self.timeout, self.security)
        return conn

    def _controller(self) -> BrokerConnection:
        """The controller DescribeCluster names: ElectLeaders and the reassignment requests
        go there, as Kafka's Admin sends them (any other broker of a cluster answers
        NOT_CONTROLLER); the bootstrap broker while there is none."""
        response = self.conn.call(apis.DESCRIBE_CLUSTER, lambda mod, version: build(
            mod.DescribeClusterRequest, include_cluster_authorized_operations=False,
            endpoint_type=1, include_fenced_brokers=True))
        raise_for(response.error_code, response.error_message)
        for b in response.brokers:
            if b.broker_id == response.controller_id:
                return self._broker(b.host, b.port)
        return self.conn

    def _find_coordinator(self, key: str, key_type: int) -> Coordinator:
        what = "group" if key_type == calls.COORDINATOR_GROUP else "transactional id"
        deadline = time.monotonic() + self.timeout
        while True:
            found = calls.find_coordinator_result(self._bootstrap_call(
                apis.FIND_COORDINATOR, calls.find_coordinator_request(key, key_type)))
            if found.error == ErrorCode.none:
                return Coordinator(found.node_id, found.host, found.port)
            if found.error not in COORDINATOR_MOVING or time.monotonic() >= deadline:
                raise_for(found.error, found.message or f"{what} {key!r}")
            time.sleep(RETRY_BACKOFF)

    def _coordinator(self, key: str, key_type: int) -> Coordinator:
        """The key's coordinator, found once and kept until it moves."""
        coordinator = self._coordinators.get((key_type, key))
        if coordinator is None:
            coordinator = self._coordinators[key_type, key] = self._find_coordinator(
                key, key_type)
        return coordinator

    def _coordinator_call(self, key: str, key_type: int, api_key: int,
                          make: Callable[[ModuleType, int], Any],
                          error_of: Callable[[Any], ErrorCode],
                          read: Callable[[int, bytes | bytearray], Any] | None = None) -> Any:
        """Send to the key's coordinator; look it up again while it loads or moves. With
        ``read`` the answer's frame is read by it (an answer kio cannot read) instead of
        decoded."""
        deadline = time.monotonic() + self.timeout
        while True:
            coordinator = self._coordinator(key, key_type)
            try:
                conn = self._broker(coordinator.host, coordinator.port)
                response = read(*conn.call_raw(api_key, make)) if read is not None \
                    else conn.call(api_key, make)
            except KafkaError as exc:  # its broker died: the coordinator moves
                if not connection_lost(exc) or time.monotonic() >= deadline:
                    raise
            else:
                if error_of(response) not in COORDINATOR_MOVING or \
                        time.monotonic() >= deadline:
                    return response
            self._coordinators.pop((key_type, key), None)
            time.sleep(RETRY_BACKOFF)


def _metadata_request(topics: list[str] | None, auto_create: bool = False):
    def make(mod, version):
        wanted = None if topics is None else tuple(
            build(mod.MetadataRequestTopic, name=t, topic_id=None) for t in topics)
        if version == 0 and wanted is None:
            wanted = ()
        return build(mod.MetadataRequest, topics=wanted, allow_auto_topic_creation=auto_create,
                     include_topic_authorized_operations=False,
                     include_cluster_authorized_operations=False)

    return make


def _led_by(conn: BrokerConnection, node_id: int, topic: str) -> tuple[int, dict[int, int]]:
    """(how many partitions ``topic`` has, 0 when the broker does not know it; partition ->
    leader epoch of those it names itself the leader of), asked of the broker ``node_id``
    itself: its own metadata, which its coordinator follows."""
    response = conn.call(apis.METADATA, _metadata_request([topic]))
    for t in response.topics:
        if t.name == topic and t.error_code == ErrorCode.none:
            return len(t.partitions), {p.partition_index: p.leader_epoch
                                       for p in t.partitions if p.leader_id == node_id}
    return 0, {}
