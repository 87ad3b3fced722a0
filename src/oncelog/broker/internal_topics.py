"""The coordinators' internal topics in cluster mode (only with ``zookeeper.connect``).

As in Kafka, ``__consumer_offsets`` and ``__transaction_state`` are cluster topics: created
in ZooKeeper by the first broker that needs one (FindCoordinator, or a Metadata asking for
it) through ClusterTopics' conditional write, replicated by the replica manager like any
topic; the coordinator of a group (a transactional id) is the leader of its partition.

- ``find_coordinator``: FindCoordinator's answer, the current leader of the key's partition
  from the metadata cache; COORDINATOR_NOT_AVAILABLE while the topic is being created or
  the partition has no live leader.
- ``on_leadership``: the replica manager's hook; a change of this broker's role for an
  internal partition goes to its coordinator (elect at the leader epoch, resign), whose
  ownership table (coordinator/ownership.py) decides what follows.
- ``ReplicatedTopicLog``: a coordinator's writes with acks=all: refused NOT_COORDINATOR by a
  broker that does not lead the partition, COORDINATOR_NOT_AVAILABLE when the ISR is below
  min.insync.replicas (Kafka maps NOT_ENOUGH_REPLICAS so for coordinator writes), and
  durable only once the high watermark passes the batch; a lead lost while it waits is
  NOT_COORDINATOR, never a success.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

from kio.schema.errors import ErrorCode

from ..cluster import isr as isr_rules
from ..cluster import znodes as zn
from ..coordinator.internal_log import NotReplicated, WriteFailed
from .partition import mark_retrieved
from .replication import ReplicationError
from .topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, TopicError

log = logging.getLogger(__name__)

# What a coordinator answers for a write the ISR did not take (Kafka's mapping of append
# errors for coordinator writes).
_NOT_REPLICATED = {
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.unknown_topic_or_partition: ErrorCode.not_coordinator,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.request_timed_out: ErrorCode.coordinator_not_available,
}


class ReplicatedTopicLog:
    """An internal topic's log in cluster mode (coordinator.internal_log.OffsetsLog): this
    broker's replica of it (``inner``, an apis.groups.InternalTopicLog that creates
    nothing), written only while this broker leads the partition, durable once the ISR has
    the batch."""

    def __init__(self, inner, topics, name: str, timeout_ms: int) -> None:
        self.inner = inner
        self.topics = topics
        self.name = name
        self.timeout_s = timeout_ms / 1000

    def read(self, partition: int):
        return self.inner.read(partition)

    def append(self, partition: int, records: list[tuple[bytes, bytes | None]],
               producer: tuple[int, int] | None = None):
        return self.append_at(partition, records, producer)[1]

    def append_at(self, partition: int, records: list[tuple[bytes, bytes | None]],
                  producer: tuple[int, int] | None = None):
        topic = self.topics.get(self.name)
        target = topic.partitions[partition] \
            if topic is not None and partition < len(topic.partitions) else None
        replication = None if target is None else target.replication
        if replication is None or not replication.is_leader:
            raise WriteFailed(ErrorCode.not_coordinator,
                              f"{self.name}-{partition} is not led by this broker")
        if isr_rules.acks_all_before(len(replication.isr), replication.min_insync):
            raise WriteFailed(ErrorCode.coordinator_not_available,
                              f"NOT_ENOUGH_REPLICAS: the ISR {list(replication.isr)} of "
                              f"{self.name}-{partition} is smaller than min.insync.replicas "
                              f"{replication.min_insync}")
        base, durable = self.inner.append_at(partition, records, producer)
        replicated = replication.wait_for(base + len(records), self.timeout_s)
        if replicated is None:
            return base, durable
        waited = asyncio.ensure_future(_replicated(durable, replicated))
        waited.add_done_callback(mark_retrieved)  # some writes are not awaited (expiry)
        return base, waited


def local_replica(topics, name: str):
    """The ``ensure`` of the inner log: this broker's replica, never created here (the
    replica manager creates it from ZooKeeper's assignment)."""
    def ensure():
        topic = topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.not_coordinator, f"no replica of {name} here")
        return topic
    return ensure


async def _replicated(durable, replicated) -> None:
    if durable is not None:
        await durable
    try:
        await replicated
    except ReplicationError as exc:
        raise NotReplicated(_NOT_REPLICATED.get(exc.error_code,
                                                ErrorCode.coordinator_not_available),
                            str(exc)) from None


# the waits between reads of an internal topic's partition count that cannot be read
_COUNT_RETRY_S = (0.1, 0.2, 0.5, 1.0, 2.0)


class _NoCount(Exception):
    """Neither the assignment nor the partitions' znodes tell the count."""


def num_partitions(broker, name: str, default: int, limit_s: float, sleep=time.sleep,
                   clock=time.monotonic) -> int:
    """The internal topic's partition count: ZooKeeper's when it exists (a broker whose
    setting differs maps keys as the topic does), else the setting. Never a guess while the
    topic exists: a broker mapping transactional ids (groups) by hash % its own setting while
    the others use the topic's count makes two coordinators for one id. When the assignment
    cannot be read, the children of its ``partitions`` znode are counted; when neither can
    be, or ZooKeeper is away, it reads again after a bounded wait, saying so once per
    change, for at most ``limit_s`` (the broker's ``zookeeper.connection.timeout.ms``, as for
    its first connection): then the broker cannot start (ClusterStartError: it exits saying
    why, as when ZooKeeper cannot be reached at all)."""
    from ..cluster import ClusterStartError
    from ..cluster.unreadable import Unreadable
    from ..metadata.store import MetadataUnavailable

    said = None
    deadline = clock() + limit_s
    for attempt in itertools.count():
        try:
            return _partition_count(broker.cluster_mode.admin, name, default)
        except (Unreadable, MetadataUnavailable, _NoCount) as exc:
            if str(exc) != said:
                said = str(exc)
                log.warning("the partition count of internal topic %s cannot be read from "
                            "ZooKeeper (%s): its coordinator waits for it, reading again",
                            name, said)
        left = deadline - clock()
        if left <= 0:
            raise ClusterStartError(
                f"the partition count of internal topic {name} could not be read from "
                f"ZooKeeper within {limit_s:g}s ({said}); a broker does not guess it (its "
                f"coordinator would map ids unlike its peers')")
        sleep(min(_COUNT_RETRY_S[min(attempt, len(_COUNT_RETRY_S) - 1)], left))
    raise AssertionError("unreachable")


def _partition_count(admin, name: str, default: int) -> int:
    from kazoo.exceptions import NoNodeError

    from ..cluster.topic_admin import TopicMissing
    from ..cluster.unreadable import Unreadable, unreadable

    try:
        assignment, _ = admin.assignment(name)
        return len(assignment.partitions)
    except TopicMissing:
        return default  # it will be created with the setting
    except Unreadable as exc:
        reason = str(exc)
    try:
        children = admin.store.op(admin.zk.get_children_async, zn.partitions_path(name))
    except NoNodeError:
        children = []
    except Exception as exc:
        if (bad := unreadable(exc)) is None:
            raise
        raise _NoCount(f"its assignment: {reason}; its partitions: {bad}") from None
    numbers = sorted(int(c) for c in children if c.isdigit())
    if not numbers or numbers != list(range(len(numbers))) or len(numbers) != len(children):
        raise _NoCount(f"its assignment: {reason}; its partitions znode names "
                       f"{sorted(children)[:10]}")
    return len(numbers)


def on_leadership(broker):
    """The replica manager's hook: (topic, partition, leader?, leader epoch or None when the
    replica is deleted) to the coordinator of that internal topic."""
    def changed(topic: str, partition: int, leader: bool, epoch: int | None) -> None:
        coordinator = broker.groups if topic == OFFSETS_TOPIC else \
            broker.transactions if topic == TRANSACTION_STATE_TOPIC else None
        if coordinator is None:
            return
        if leader and epoch is not None:
            coordinator.elect(partition, epoch)
        else:
            coordinator.resign(partition, epoch)
    return changed


def named_leader(broker, name: str):
    """partition -> the leader epoch at which this broker's metadata cache names it the
    leader of ``name``-partition, else None (ownership.py A1)."""
    me = broker.broker_id

    def named(partition: int) -> int | None:
        topic = broker.cluster_mode.cache.image.get(name)
        if topic is None or partition >= len(topic.partitions):
            return None
        found = topic.partitions[partition]
        return found.leader_epoch if found.leader == me else None
    return named


def find_coordinator(broker, name: str, partition: int, listener: str | None
                     ) -> tuple[ErrorCode, str | None, int, str, int]:
    """(error, message, node, host, port): the leader of ``name``-``partition``."""
    def unavailable(message: str):
        return ErrorCode.coordinator_not_available, message, -1, "", -1

    try:
        topic = broker.cluster_topics.ensure_internal(name)
    except TopicError as exc:
        log.warning("creating the internal topic %s failed: %s", name, exc)
        return unavailable(str(exc))
    if topic is None or partition >= len(topic.partitions):
        return unavailable(f"{name} is being created")
    leader = topic.partitions[partition].leader
    if leader != zn.NO_LEADER:
        for node, host, port, _rack in broker.cluster_brokers(listener):
            if node == leader:
                return ErrorCode.none, None, node, host, port
    return unavailable(f"{name}-{partition} has no live leader")
