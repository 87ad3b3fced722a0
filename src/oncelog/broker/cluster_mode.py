"""Cluster mode's part in the broker (only with ``zookeeper.connect``): the metadata cache,
the controller and the admin writes (cluster/), tied to the broker's requests.

``ClusterTopics`` answers the broker's topic requests the way TopicManager answers them on
one broker (the handlers take ``broker.cluster_topics or broker.topics``): topics are read
from the ZooKeeper-fed metadata cache, so every broker answers for the whole cluster, and
created, grown, reconfigured and deleted through ZooKeeper, so every broker sees it. The
internal topics are cluster topics too, created by the broker first needing one
(``ensure_internal``, broker/internal_topics.py says who leads them); a client may not
create, grow or delete them.

Errors, decided here for cluster mode (TopicManager decides them on one broker):

| request            | refused when                                   | error                     |
|--------------------|------------------------------------------------|---------------------------|
| CreateTopics       | replication factor < 1 or above the registered | INVALID_REPLICATION_FACTOR|
|                    | brokers                                        |                           |
| CreateTopics,      | min.insync.replicas above the replication      | INVALID_CONFIG            |
| AlterConfigs       | factor (acks=all could never be answered)      |                           |
| CreateTopics,      | a manual assignment naming an unregistered     | INVALID_REPLICA_ASSIGNMENT|
| CreatePartitions,  | broker, a broker twice, or replica lists of    |                           |
| Alter...Reassign.  | different lengths                              |                           |
| CreatePartitions   | a reassignment of the topic is under way       | REASSIGNMENT_IN_PROGRESS  |
| any write          | ZooKeeper unreachable or not answering         | REQUEST_TIMED_OUT         |
| any write          | the znode changed between our read and write   | INVALID_REQUEST (retry)   |

Controlled shutdown goes through ZooKeeper, not the ControlledShutdown request (Kafka 4's
protocol has none): the stopping broker creates ``/oncelog/controlled_shutdown/<id>``
(ephemeral), the controller moves every leadership it can to another in-sync replica
(leader_election.py, F1 with the broker not eligible), and the broker waits, bounded, until
the controller writes into that znode that every move of its pass landed, or (whichever
comes first) its metadata cache shows it leads nothing another in-sync replica could lead.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from ..cluster import znodes as zn
from ..cluster.departed_brokers import DepartedBrokers
from ..cluster.leader_election import Ask
from ..cluster.metadata_cache import ClusterImage, PartitionImage, encode_topic_id
from ..cluster.placement import Candidate, PlacementError, assign, usable
from ..cluster.unreadable import Unreadable
from ..metadata.store import MetadataUnavailable
from .config import ConfigError
from .log_limits import log_safe
from .topics import (
    INTERNAL_TOPICS,
    MAX_PARTITIONS,
    OFFSETS_TOPIC,
    Topic,
    TopicError,
    _unify,
    check_manual_assignment,
    check_partition_count,
    topic_name_problem,
)

# ElectLeaders waiting for a leader's handover: asked about again this often, and for at
# most this long past H3's bound (the pass that moves it, then the state's read)
_HANDOVER_POLL_S = 0.1
_HANDOVER_MARGIN_S = 5.0

log = logging.getLogger(__name__)

CONTROLLED_SHUTDOWN_TIMEOUT_S = 10.0
_CACHE_POLL_S = 0.1  # how often the cache's picture is looked at while no word comes


def _unreadable(exc: Unreadable) -> str:
    return f"its assignment in ZooKeeper cannot be read: {exc}"


@dataclass
class ClusterTopic(Topic):
    """A topic as the cluster knows it: its partitions are the cache's PartitionImages."""

    replication_factor: int = 1


class ClusterMode:
    def __init__(self, broker) -> None:
        from ..cluster.controller import Controller
        from ..cluster.metadata_cache import MetadataCache
        from ..cluster.topic_admin import TopicAdmin

        self.broker = broker
        self.member = broker.cluster
        self.cache = MetadataCache(self.member.store)
        self.admin = TopicAdmin(self.member.store)
        config = broker.config
        self.controller = Controller(
            self.member, lambda: config.get("unclean.leader.election.enable"),
            lambda: (config.get("auto.leader.rebalance.enable"),
                     config.get("leader.imbalance.check.interval.seconds"),
                     config.get("leader.imbalance.per.broker.percentage")))
        self.controller.known_topic_id = self._known_topic_id
        self.topics = ClusterTopics(self)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: set[asyncio.Event] = set()
        self._started = False
        self._live_of: tuple = ()
        self._live: frozenset[int] = frozenset()
        self._departed = DepartedBrokers()  # what Metadata names besides the registered
        self._observed_of: tuple = ()
        self.cache.add_listener(self._cache_changed)

    def _known_topic_id(self, name: str) -> str | None:
        """The id of topic ``name`` in this broker's metadata cache: its last whole read,
        kept while the assignment is unreadable (an old tool's rewrite without the id).
        Not the local replica's: that may be of an earlier incarnation of the name (deleted
        and made again while this broker was down) or a topic it kept alone before it
        joined; naming the topic with it would make every current replica delete its log.
        On the controller's thread: one read of an image swapped whole."""
        cached = self.cache.image.get(name)
        return encode_topic_id(cached.topic_id) if cached is not None else None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """After the broker registered (ClusterMember.start), on the event loop."""
        self._loop = asyncio.get_running_loop()
        self.member.on_brokers_changed = self._brokers_changed
        self._observe_brokers()
        self.admin.ensure_paths()
        self.cache.start()
        self.controller.start()
        self._started = True

    async def controlled_shutdown(self) -> None:
        if self._started and self.member.registration is not None:
            await asyncio.to_thread(self._controlled_shutdown, CONTROLLED_SHUTDOWN_TIMEOUT_S)
            self._step_down()  # moved or not, it stops now: it acknowledges nothing more

    def _step_down(self) -> None:
        if self.broker.replicas is not None:
            self.broker.replicas.step_down()

    def _controlled_shutdown(self, timeout_s: float) -> None:
        from kazoo.exceptions import NodeExistsError

        me = self.member.broker_id
        started = time.monotonic()
        try:
            self.member.store.op(self.member.zk.create_async,
                                 f"{zn.CONTROLLED_SHUTDOWN}/{me}", b"", ephemeral=True)
        except NodeExistsError:
            pass
        except Exception as exc:
            log.warning("controlled shutdown not asked (ZooKeeper: %r); stopping anyway", exc)
            return
        self.controller.wake()  # when this broker is the controller itself

        def moved(image: ClusterImage) -> bool:
            live = {b.broker_id for b in self.member.brokers}
            return not any(p.leader == me and any(b != me and b in live for b in p.isr)
                           for t in image.topics.values() for p in t.partitions)

        # The controller's word (it writes into our znode once its moves landed) comes
        # before this broker's cache has read every state it wrote; either will do.
        told = threading.Event()

        def controller_told() -> bool:
            try:
                data, _ = self.member.store.op(self.member.zk.get_async,
                                               f"{zn.CONTROLLED_SHUTDOWN}/{me}",
                                               watch=lambda _event: told.set())
            except Exception as exc:  # ZooKeeper away: the cache's picture decides
                log.debug("controlled shutdown: our znode not read: %r", exc)
                return False
            return data == zn.CONTROLLED_SHUTDOWN_MOVED

        deadline = started + timeout_s
        is_told = controller_told()  # and watched from now on
        while not (is_told or moved(self.cache.image)):
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("controlled shutdown: leaderships not all moved within %.0fs; "
                            "stopping anyway", timeout_s)
                return
            if told.wait(min(_CACHE_POLL_S, left)):  # our znode changed: read it again
                told.clear()
                is_told = controller_told()
        if is_told and self._loop is not None:  # before the thread's answer reaches the loop
            self._loop.call_soon_threadsafe(self._step_down)
        log.info("controlled shutdown: broker %d leads no partition another in-sync "
                 "replica could lead (%.2fs)", me, time.monotonic() - started)

    def close(self) -> None:
        self.controller.close()
        self.cache.close()

    # --- the cache's news, on the event loop -------------------------------------------

    def _brokers_changed(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._observe_brokers)

    def _cache_changed(self, names: set[str]) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._apply, names)

    def _apply(self, _names: set[str]) -> None:
        # The local replicas take a changed config from the replica manager, which follows
        # the same znodes; here the requests waiting for the cluster's picture, and whether
        # a departed broker still leads anything (D2 of departed_brokers.py).
        if self._departed.departed:
            self._note_departed_leaders()
        for event in list(self._waiters):
            event.set()

    async def until(self, condition, timeout_s: float) -> bool:
        """Waits (on the event loop) until ``condition(image)``, at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            event = asyncio.Event()
            self._waiters.add(event)
            try:
                if condition(self.cache.image):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except TimeoutError:
                    return condition(self.cache.image)
            finally:
                self._waiters.discard(event)

    # --- what handlers ask -------------------------------------------------------------

    def live(self) -> frozenset[int]:
        """The registered brokers' ids (a set built once per change of the list: Metadata
        asks it for every partition)."""
        brokers = self.member.brokers
        if brokers is not self._live_of:
            self._live_of, self._live = brokers, frozenset(b.broker_id for b in brokers)
        return self._live

    def metadata_brokers(self) -> tuple[zn.BrokerRegistration, ...]:
        """The brokers a Metadata answer names: the registered, and those that left a
        moment ago (cluster/departed_brokers.py: librdkafka must not see a dead leader's
        partitions moved and the leader dropped in one answer)."""
        brokers = self._observe_brokers()
        return self._departed.named(brokers, time.monotonic())

    def _observe_brokers(self) -> tuple[zn.BrokerRegistration, ...]:
        """The registered brokers, a departure among them observed (told by the membership
        pass as soon as the list changes), with whether it was a clean stop and the
        leaders of now (departed_brokers.py)."""
        brokers = self.member.brokers
        if brokers is not self._observed_of:
            self._observed_of = brokers
            self._departed.observe(brokers, time.monotonic(), self.member.left_cleanly)
            if self._departed.departed:
                self._note_departed_leaders()
        return brokers

    def _note_departed_leaders(self) -> None:
        """One walk of the picture, only while some broker is departed (seconds). A
        partition counts for D2 only while a registered broker of its ISR can take it
        over: one it alone held goes to no leader, which races nothing in librdkafka."""
        departed, live = self._departed.departed, self.live()
        leading = {p.leader for t in self.cache.image.topics.values() for p in t.partitions
                   if p.leader in departed and any(b in live for b in p.isr)}
        self._departed.leaders(leading, time.monotonic())

    def partition_fields(self, partition: PartitionImage) -> dict[str, Any]:
        """A broker that cannot vouch for its ZooKeeper session (membership.py's standing
        table) names itself leader of nothing (DescribeTopicPartitions; Metadata it refuses
        altogether): LEADER_NOT_AVAILABLE, where naming itself would send a client's every
        retry back to it until its link to ZooKeeper heals."""
        live = self.live()
        leader = partition.leader
        replicas = self.broker.replicas
        if leader == self.member.broker_id and replicas is not None and replicas.fenced:
            leader = zn.NO_LEADER
        return {"error_code": ErrorCode.leader_not_available if leader == zn.NO_LEADER
                else ErrorCode.none,
                "partition_index": partition.index, "leader_id": leader,
                "leader_epoch": partition.leader_epoch, "replica_nodes": partition.replicas,
                "isr_nodes": partition.isr,
                "offline_replicas": tuple(b for b in partition.replicas if b not in live)}

    async def elect(self, wanted: list[tuple[str, int]] | None, unclean: bool,
                    timeout: datetime.timedelta):
        """ElectLeaders: each partition's (error, message); NOT_CONTROLLER off the
        controller (clients send it to the controller Metadata names). A preferred
        election waiting for its leader's handover (leader_election.py's E4) is asked
        about again, no thread held in between, until it is answered or the request's
        timeout (at most H3's bound and a margin) is up: REQUEST_TIMED_OUT."""
        if not self.member.is_controller:
            return None
        ask = Ask.UNCLEAN if unclean else Ask.PREFERRED
        answers, waiting = await asyncio.to_thread(self.controller.elect, wanted, ask)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(timeout.total_seconds(), 0.0),
                                     self.controller.handover_bound_s + _HANDOVER_MARGIN_S)
        while waiting and loop.time() < deadline:
            await asyncio.sleep(_HANDOVER_POLL_S)  # the leader's ready write, or H3
            more, waiting = await asyncio.to_thread(self.controller.elect, waiting, ask, True)
            answers.update(more)
        for key in waiting:
            answers[key] = (ErrorCode.request_timed_out,
                            "the leader did not hand its leadership over in time")
        return answers

    async def answer_when(self, wait, names, timeout: datetime.timedelta,
                          answer):
        """``answer`` once ``wait(names, timeout_ms)`` is over (a CreateTopics or
        DeleteTopics answer, sent once the controller carried the request out)."""
        await wait(names, int(timeout.total_seconds() * 1000))
        return answer

    async def created(self, names: list[str], timeout_ms: int) -> None:
        """Until every partition of the topics has its state (Kafka answers CreateTopics
        once the new partitions have leaders), bounded by the request's timeout."""
        def ready(image: ClusterImage) -> bool:
            return all((t := image.get(n)) is not None and
                       all(p.state is not None for p in t.partitions) for n in names)

        if names and timeout_ms > 0:
            await self.until(ready, timeout_ms / 1000)

    async def grown(self, counts: dict[str, int], timeout_ms: int) -> None:
        """Until the topics have their new partitions, each with its state."""
        def ready(image: ClusterImage) -> bool:
            return all((t := image.get(n)) is not None and len(t.partitions) >= count and
                       all(p.state is not None for p in t.partitions)
                       for n, count in counts.items())

        if counts and timeout_ms > 0:
            await self.until(ready, timeout_ms / 1000)

    async def deleted(self, names: list[str], timeout_ms: int) -> None:
        if names and timeout_ms > 0:
            await self.until(lambda image: all(image.get(n) is None for n in names),
                             timeout_ms / 1000)

    def reassign(self, topic: str, changes: dict[int, tuple[int, ...] | None]
                 ) -> dict[int, tuple[ErrorCode, str | None]]:
        """AlterPartitionReassignments of one topic's partitions (None: cancel); answered
        once this broker's cache shows what was written (a ListPartitionReassignments that
        follows sees it)."""
        from ..cluster.topic_admin import (
            Conflict,
            TopicMissing,
            reassigned,
            reassignment_target,
        )

        answers: dict[int, tuple[ErrorCode, str | None]] = {}
        try:
            assignment, version = self.admin.assignment(topic)
        except TopicMissing:
            return dict.fromkeys(changes, (ErrorCode.unknown_topic_or_partition,
                                           "The topic does not exist."))
        except MetadataUnavailable as exc:
            return dict.fromkeys(changes, (ErrorCode.request_timed_out, str(exc)))
        except Unreadable as exc:  # that topic alone (cluster/unreadable.py)
            return dict.fromkeys(changes, (ErrorCode.unknown_server_error, _unreadable(exc)))
        new = assignment
        for p, target in changes.items():
            if p not in assignment.partitions:
                answers[p] = (ErrorCode.unknown_topic_or_partition,
                              "The partition does not exist.")
                continue
            if target is None and reassignment_target(assignment, p) is None:
                answers[p] = (ErrorCode.no_reassignment_in_progress,
                              f"No ongoing reassignment for partition {topic}-{p}.")
                continue
            if target is not None:
                problem = self.replicas_problem(target, f"partition {p}")
                if problem:
                    answers[p] = (ErrorCode.invalid_replica_assignment, problem)
                    continue
            new = reassigned(new, p, target)
            answers[p] = (ErrorCode.none, None)
        if new != assignment:
            try:
                self.admin.set_assignment(topic, new, version)
            except (Conflict, TopicMissing) as exc:
                return {p: (ErrorCode.invalid_request if e == ErrorCode.none else e,
                            str(exc) if e == ErrorCode.none else m)
                        for p, (e, m) in answers.items()}
            except MetadataUnavailable as exc:
                return dict.fromkeys(changes, (ErrorCode.request_timed_out, str(exc)))
            self.controller.wake()

            def shown(image: ClusterImage) -> bool:
                found = image.get(topic)
                return found is not None and all(
                    found.partitions[p].replicas == new.partitions[p]
                    and found.partitions[p].adding == new.adding_replicas.get(p, ())
                    for p in changes if p < len(found.partitions))

            self.cache.wait_for(shown, self.member.store.session_timeout_ms / 1000)
        return answers

    def ongoing_reassignments(self, wanted: list[tuple[str, int]] | None
                              ) -> dict[str, list[PartitionImage]]:
        image = self.cache.image
        found: dict[str, list[PartitionImage]] = {}
        if wanted is None:
            candidates = [p for t in image.topics.values() for p in t.partitions]
        else:
            candidates = [t.partitions[i] for name, i in wanted
                          if (t := image.get(name)) is not None and 0 <= i < len(t.partitions)]
        for p in candidates:
            if p.adding or p.removing:
                found.setdefault(p.topic, []).append(p)
        return found

    def replicas_problem(self, broker_ids, what: str) -> str | None:
        """Why a manual replica list cannot be used (INVALID_REPLICA_ASSIGNMENT), or None."""
        if not broker_ids:
            return f"The manual partition assignment of {what} is an empty replica list."
        if len(set(broker_ids)) != len(broker_ids):
            return (f"The manual partition assignment of {what} names a broker more than "
                    f"once: {list(broker_ids)}.")
        registered = self.live()
        for node in broker_ids:
            if node not in registered:
                return (f"The manual partition assignment of {what} includes broker {node}, "
                        f"which is not registered (brokers: {sorted(registered)}).")
        return None


class ClusterTopics:
    """TopicManager's read and admin interface, answered from and written to ZooKeeper."""

    def __init__(self, mode: ClusterMode) -> None:
        self.mode = mode
        self.local = mode.broker.topics
        self.config = mode.broker.config
        self._memo: dict[str, tuple[Any, ClusterTopic]] = {}

    # --- reads -------------------------------------------------------------------------

    def _topic(self, image_topic) -> ClusterTopic:
        memo = self._memo.get(image_topic.name)
        if memo is not None and memo[0] is image_topic:
            return memo[1]
        try:
            overrides = self.local.check_overrides(image_topic.configs, image_topic.name)
        except ConfigError as exc:
            log.error("topic %s: configs from ZooKeeper refused: %s", image_topic.name, exc)
            overrides = {}
        topic = ClusterTopic(image_topic.name, image_topic.topic_id, overrides,
                             list(image_topic.partitions),
                             len(image_topic.partitions[0].replicas)
                             if image_topic.partitions else 0)
        self._memo[image_topic.name] = (image_topic, topic)
        return topic

    @property
    def topics(self) -> dict[str, Any]:
        """Every topic by name: the cluster's, and those this broker kept alone."""
        image = self.mode.cache.image
        merged: dict[str, Any] = {n: t for n, t in self.local.topics.items()
                                  if n not in image.topics and self._kept_alone(t) is not None}
        merged.update(image.topics)
        return merged

    def get(self, name: str):
        found = self.mode.cache.image.get(name)
        if found is not None:
            return self._topic(found)
        return self._kept_alone(self.local.get(name))

    def by_id(self, topic_id: uuid.UUID | None):
        found = self.mode.cache.image.by_id(topic_id)
        if found is not None:
            return self._topic(found)
        return self._kept_alone(self.local.by_id(topic_id))

    def _kept_alone(self, topic):
        """``topic`` when this broker kept it alone before it joined a cluster, else None: the
        replica manager's local copy of a cluster topic is never answered as the cluster's,
        as it may be made before the cache publishes the topic (replica_watch.py and the
        cache read ZooKeeper apart) and it knows no leader nor replicas."""
        replicas = self.mode.broker.replicas
        if topic is None or (replicas is not None and replicas.holds_copy(topic.name)):
            return None
        return topic

    def topic_config(self, topic, key: str) -> Any:
        return self.local.topic_config(topic, key)

    def override_texts(self, topic) -> dict[str, str]:
        return self.local.override_texts(topic)

    def describe_topic_configs(self, topic):
        return self.local.describe_topic_configs(topic)

    # --- writes ------------------------------------------------------------------------

    def auto_create(self, name: str):
        """Always LEADER_NOT_AVAILABLE, as Kafka answers: also when another broker's creation
        came first (this broker's cache has not published it yet), never TOPIC_ALREADY_EXISTS,
        an error no client looks for in Metadata."""
        try:
            self.create(name, -1, -1, {}, internal=name in INTERNAL_TOPICS)
        except TopicError as exc:
            if exc.error != ErrorCode.topic_already_exists:
                raise
        raise TopicError(ErrorCode.leader_not_available,
                         f"topic {name!r} is being created; its leaders are being elected")

    def create(self, name: str, num_partitions: int, replication_factor: int,
               configs: dict[str, str | None], validate_only: bool = False,
               assignments: dict[int, list[int]] | None = None,
               internal: bool = False) -> ClusterTopic:
        """``internal``: the broker creates one of INTERNAL_TOPICS (clients may not)."""
        from ..cluster.topic_admin import Conflict, TopicExists

        if name in INTERNAL_TOPICS:
            if not internal:
                raise TopicError(ErrorCode.invalid_request,
                                 f"Creation of internal topic {name} is prohibited: the "
                                 f"broker creates it on first use")
            num_partitions, replication_factor, configs = self._internal(name)
            assignments = None
        problem = topic_name_problem(name)
        if problem:
            raise TopicError(ErrorCode.invalid_topic_exception, problem)
        image = self.mode.cache.image
        if name in image.topics:
            raise TopicError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        unified = _unify(name)
        for other in image.topics:
            if _unify(other) == unified:
                raise TopicError(ErrorCode.invalid_topic_exception,
                                 f"Topic '{name}' collides with existing topic: {other}")
        if assignments:
            placed = self._manual(num_partitions, replication_factor, assignments)
            replication_factor = len(placed[0])
        else:
            if num_partitions == -1:
                num_partitions = self.config.get("num.partitions")
            if not 1 <= num_partitions <= MAX_PARTITIONS:
                raise TopicError(ErrorCode.invalid_partitions,
                                 f"number of partitions must be 1..{MAX_PARTITIONS}")
            if replication_factor == -1:
                replication_factor = self.config.get("default.replication.factor")
            try:
                placed = assign(self._candidates(), num_partitions, replication_factor)
            except PlacementError as exc:
                raise TopicError(ErrorCode.invalid_replication_factor, str(exc)) from None
        parsed = self._checked(name, configs, replication_factor)
        topic_id = uuid.uuid4()
        topic = ClusterTopic(name, topic_id, parsed, [], replication_factor)
        if validate_only:
            return topic
        texts = {k: v for k, v in configs.items() if v is not None}
        assignment = zn.TopicAssignment(encode_topic_id(topic_id), dict(enumerate(placed)),
                                        {}, {})
        try:
            self.mode.admin.create_topic(name, assignment, texts)
        except TopicExists:
            raise TopicError(ErrorCode.topic_already_exists,
                             f"topic {name!r} already exists") from None
        except Conflict as exc:
            raise TopicError(ErrorCode.invalid_request, str(exc)) from None
        except MetadataUnavailable as exc:
            raise TopicError(ErrorCode.request_timed_out, str(exc)) from None
        log.info("created topic %s: %d partitions, replicas %s", name, len(placed),
                 {p: list(r) for p, r in enumerate(placed)} if len(placed) <= 16 else "...")
        return topic

    def ensure_internal(self, name: str) -> ClusterTopic | None:
        """The internal topic, or None while it is being created (by this call, or by
        another broker whose write came first)."""
        found = self.mode.cache.image.get(name)
        if found is not None:
            return self._topic(found)
        try:
            self.create(name, -1, -1, {}, internal=True)
        except TopicError as exc:
            if exc.error != ErrorCode.topic_already_exists:
                raise
        return None

    def _internal(self, name: str) -> tuple[int, int, dict[str, str | None]]:
        """(partitions, replication factor, configs) of an internal topic, Kafka's: its
        replication factor setting, or the registered brokers when fewer; compacted;
        min.insync.replicas transaction.state.log.min.isr for __transaction_state, the
        broker's for __consumer_offsets, at most the replication factor."""
        offsets = name == OFFSETS_TOPIC
        partitions = self.config.get("offsets.topic.num.partitions" if offsets
                                     else "transaction.state.log.num.partitions")
        wanted = self.config.get("offsets.topic.replication.factor" if offsets
                                 else "transaction.state.log.replication.factor")
        factor = max(1, min(wanted, len(self.mode.member.brokers)))
        min_isr = self.config.get("min.insync.replicas" if offsets
                                  else "transaction.state.log.min.isr")
        configs: dict[str, str | None] = dict(self.local._internal_overrides(name, text=True))
        configs["min.insync.replicas"] = str(min(min_isr, factor))
        return partitions, factor, configs

    def _candidates(self) -> list[Candidate]:
        try:
            failed = self.mode.admin.brokers_without_log_dirs()
        except MetadataUnavailable as exc:
            raise TopicError(ErrorCode.request_timed_out, str(exc)) from None
        return usable([Candidate(b.broker_id, b.rack) for b in self.mode.member.brokers],
                      failed)

    def _manual(self, num_partitions: int, replication_factor: int,
                assignments: dict[int, list[int]]) -> list[tuple[int, ...]]:
        check_manual_assignment(num_partitions, replication_factor, assignments)
        placed = [tuple(assignments[p]) for p in range(len(assignments))]
        self._check_lists(placed, 0)
        return placed

    def _check_lists(self, placed: list[tuple[int, ...]], first: int,
                     replication_factor: int | None = None) -> None:
        for i, replicas in enumerate(placed):
            problem = self.mode.replicas_problem(replicas, f"partition {first + i}")
            if problem:
                raise TopicError(ErrorCode.invalid_replica_assignment, problem)
            wanted = replication_factor or len(placed[0])
            if len(replicas) != wanted:
                raise TopicError(ErrorCode.invalid_replica_assignment,
                                 f"Inconsistent replication factor between partitions, "
                                 f"partition {first + i} has {len(replicas)} replicas "
                                 f"while others have {wanted}.")

    def _checked(self, name: str, configs: dict[str, str | None],
                 replication_factor: int) -> dict[str, Any]:
        try:
            parsed = self.local.check_overrides(configs, name)
        except ConfigError as exc:
            raise TopicError(ErrorCode.invalid_config, str(exc)) from None
        min_isr = parsed.get("min.insync.replicas",
                             self.config.topic_default("min.insync.replicas"))
        if min_isr is not None and min_isr > replication_factor:
            raise TopicError(ErrorCode.invalid_config,
                             f"min.insync.replicas {min_isr} is larger than the replication "
                             f"factor {replication_factor}: acks=all could never be answered")
        return parsed

    def add_partitions(self, name: str, count: int, assignments: list[list[int]] | None = None,
                       validate_only: bool = False):
        from ..cluster.topic_admin import Conflict, TopicMissing

        if name in INTERNAL_TOPICS:
            raise TopicError(ErrorCode.invalid_request,
                             f"topic {name!r} is internal: its partition count maps group "
                             f"and transactional ids to partitions and cannot change")
        try:
            assignment, version = self.mode.admin.assignment(name)
        except TopicMissing:
            raise TopicError(ErrorCode.unknown_topic_or_partition,
                             f"The topic '{name}' does not exist.") from None
        except MetadataUnavailable as exc:
            raise TopicError(ErrorCode.request_timed_out, str(exc)) from None
        except Unreadable as exc:  # that topic alone (cluster/unreadable.py)
            raise TopicError(ErrorCode.unknown_server_error, _unreadable(exc)) from None
        current = len(assignment.partitions)
        if assignment.adding_replicas or assignment.removing_replicas:
            raise TopicError(ErrorCode.reassignment_in_progress,
                             f"A reassignment of topic {name} is in progress.")
        check_partition_count(current, count)
        replication_factor = len(assignment.partitions[0])
        if assignments is not None:
            if len(assignments) != count - current:
                raise TopicError(ErrorCode.invalid_replica_assignment,
                                 f"Attempted to add {count - current} additional partition(s), "
                                 f"but only {len(assignments)} assignment(s) were specified.")
            placed = [tuple(a) for a in assignments]
            self._check_lists(placed, current, replication_factor)
        else:
            candidates = self._candidates()
            ids = sorted(c.broker_id for c in candidates)
            first = assignment.partitions[0][0]
            start = next((i for i, b in enumerate(ids) if b >= first), 0)
            try:
                placed = assign(candidates, count - current, replication_factor, start=start,
                                first_partition=current)
            except PlacementError as exc:
                raise TopicError(ErrorCode.invalid_replication_factor, str(exc)) from None
        if validate_only:
            return None
        grown = zn.TopicAssignment(assignment.topic_id, {
            **assignment.partitions, **{current + i: r for i, r in enumerate(placed)}}, {}, {})
        try:
            self.mode.admin.set_assignment(name, grown, version)
        except (Conflict, TopicMissing) as exc:
            raise TopicError(ErrorCode.invalid_request, str(exc)) from None
        except MetadataUnavailable as exc:
            raise TopicError(ErrorCode.request_timed_out, str(exc)) from None
        log.info("topic %s: partitions %d -> %d", name, current, count)
        return None

    def delete(self, name: str) -> None:
        if name in INTERNAL_TOPICS:
            raise TopicError(ErrorCode.invalid_topic_exception,
                             f"topic {name!r} is internal: the coordinators keep their state "
                             f"there")
        if self.mode.cache.image.get(name) is None:
            self.local.delete(name)  # its error: no such topic
            return
        if not self.config.get("delete.topic.enable"):
            raise TopicError(ErrorCode.topic_deletion_disabled, "delete.topic.enable is false")
        try:
            self.mode.admin.delete_topic(name)
        except MetadataUnavailable as exc:
            raise TopicError(ErrorCode.request_timed_out, str(exc)) from None
        log.info("topic %s marked for deletion", name)

    def alter_configs(self, name: str, configs: dict[str, str],
                      validate_only: bool = False) -> None:
        from ..cluster.topic_admin import Conflict, TopicMissing

        topic = self.get(name)
        if not isinstance(topic, ClusterTopic):
            self.local.alter_configs(name, configs, validate_only)
            return
        self._checked(name, configs, topic.replication_factor)
        if validate_only:
            return
        try:
            self.mode.admin.alter_topic_config(name, configs)
        except TopicMissing:
            raise TopicError(ErrorCode.unknown_topic_or_partition,
                             f"topic {name!r} does not exist") from None
        except Conflict as exc:
            raise TopicError(ErrorCode.invalid_request, str(exc)) from None
        except MetadataUnavailable as exc:
            raise TopicError(ErrorCode.request_timed_out, str(exc)) from None
        log.info("topic %s configs are now %s (in ZooKeeper)", name, log_safe(configs, 1000))
