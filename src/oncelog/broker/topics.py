"""Topics on this broker: creation, deletion, configs, kept in the metadata store."""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from ..log import partition_metadata
from ..log.compaction import CompactionConfig
from ..log.disk import OsDisk, default_disk, out_of_descriptors
from ..log.log import LogConfig
from ..metadata.store import NO_VERSION, BadVersion, MetadataStore
from ..producer_state.manager import StateLimits
from ..protocol.recompression import STORED_CODECS
from ..protocol.validation import RecordRules
from .config import (
    SEGMENT_BYTES_MIN,
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigError,
    compaction_lag_problem,
    is_compacted,
    render,
    stored_topic_configs,
    validate_topic_configs,
)
from .log_dir_moves import LogDirMoves
from .log_dirs import LogDir, listdir_at_start, suffixed_dir_name
from .log_limits import log_safe
from .partition import IssuedProducerIds, Partition

log = logging.getLogger(__name__)

_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_NAME_LENGTH = 249
MAX_PARTITIONS = 100_000
# Kafka's names: a partition directory is "<topic>-<index>"; one being deleted is renamed to
# "<topic>-<index>.<topic id>-delete" first; one that belongs to no topic the broker has is
# renamed to "...-stray" and kept; "partition.metadata" names the topic id it holds.
_PARTITION_DIR = re.compile(r"(.+)-(\d+)")
_DELETED_DIR = re.compile(r".+-\d+\.([0-9a-f]{32})-delete")
DELETE_SUFFIX = "-delete"
STRAY_SUFFIX = "-stray"


# Topics the broker writes itself: clients read them, never produce to or delete them.
OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})
# The broker key each internal topic's segment.bytes comes from at creation.
_INTERNAL_SEGMENT_KEYS = {OFFSETS_TOPIC: "offsets.topic.segment.bytes",
                          TRANSACTION_STATE_TOPIC: "transaction.state.log.segment.bytes"}
_INTERNAL_SEGMENT_FLOOR = 1 << 20


def internal_topic_problem(name: str, get: Callable[[str], Any],
                           segment_floor: int) -> str | None:
    """What the internal topics' coordinators need of them, whoever asks (a client's
    CreateTopics, AlterConfigs or IncrementalAlterConfigs, or overrides stored by an older
    version); ``get(key)`` is a topic config's value as it would be in effect,
    ``segment_floor`` the least segment.bytes allowed.

    | request                               | answer                                       |
    |---------------------------------------|----------------------------------------------|
    | CreateTopics of an internal name      | INVALID_REQUEST: the broker creates it on    |
    |                                       | first use with its partition count (Kafka    |
    |                                       | refuses __cluster_metadata the same way)     |
    | cleanup.policy other than compact     | INVALID_CONFIG: delete (with compact, or by  |
    | (set, appended, emptied or deleted    | falling back to the broker's default) would  |
    | back to the broker's default)         | remove committed offsets and transaction     |
    |                                       | states by age or size                        |
    | segment.bytes below 1 MiB (Kafka 4's  | INVALID_CONFIG: a segment per record would   |
    | minimum), or below the broker's       | hold a file per record open; an operator may |
    | offsets.topic.segment.bytes or        | go lower with those broker keys              |
    | transaction.state.log.segment.bytes   |                                              |
    | when that is lower                    |                                              |
    | any other key (retention.ms=0 too:    | accepted: nothing a coordinator relies on    |
    | compact alone applies no retention)   |                                              |
    """
    if get("cleanup.policy") != "compact":
        return (f"cleanup.policy of internal topic {name} must stay compact (got "
                f"{render(get('cleanup.policy'))!r}): its coordinator's state would be lost")
    segment_key = "internal.segment.bytes" if get("internal.segment.bytes") else "segment.bytes"
    if get(segment_key) < segment_floor:
        return (f"{segment_key} of internal topic {name} must be at least {segment_floor}, "
                f"got {get(segment_key)}")
    return None


# In a topic's stored value: a local replica of a topic ZooKeeper assigns to this broker
# (broker/replica_manager.py), not one this broker keeps alone.
REPLICA_MARK = "replica"


class TopicError(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


def topic_name_problem(name: str | None) -> str | None:
    """Why ``name`` is not a legal Kafka topic name, or None when it is."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name cannot be {name!r}"
    if len(name) > MAX_NAME_LENGTH:
        return f"topic name is longer than {MAX_NAME_LENGTH} characters"
    if not _LEGAL_NAME.fullmatch(name):
        return f"topic name {name!r} has characters other than ASCII letters, digits, '.', '_', '-'"
    return None


def _unify(name: str) -> str:
    """Names that differ only in '.' and '_' collide (Kafka's Topic.unifyCollisionChars):
    metric names turn one into the other."""
    return name.replace(".", "_")


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    overrides: dict[str, Any]
    partitions: list[Partition] = field(default_factory=list)


def check_partition_count(current: int, count: int) -> None:
    """CreatePartitions' rule for the new count (Kafka's messages): more than the topic has,
    at most MAX_PARTITIONS; one broker's topics and cluster mode's both ask it."""
    if count == current:
        raise TopicError(ErrorCode.invalid_partitions,
                         f"Topic already has {current} partition(s).")
    if count < current:
        raise TopicError(ErrorCode.invalid_partitions,
                         f"Topic currently has {current} partition(s), which is higher "
                         f"than the requested {count}.")
    if count > MAX_PARTITIONS:
        raise TopicError(ErrorCode.invalid_partitions,
                         f"number of partitions must be 1..{MAX_PARTITIONS}")


def check_manual_assignment(num_partitions: int, replication_factor: int,
                            assignments: dict[int, list[int]]) -> None:
    """CreateTopics' rule for a manual assignment's shape (Kafka's messages): no partition
    count or replication factor beside it, partitions numbered 0..n-1; one broker's topics
    and cluster mode's both ask it."""
    if num_partitions != -1 or replication_factor != -1:
        raise TopicError(ErrorCode.invalid_request,
                         "Both numPartitions or replicationFactor and replicasAssignments "
                         "were set. Both cannot be used at the same time.")
    if sorted(assignments) != list(range(len(assignments))):
        raise TopicError(ErrorCode.invalid_replica_assignment,
                         f"The manual partition assignment names partitions "
                         f"{sorted(assignments)}; they must be 0..{len(assignments) - 1}.")


class TopicManager:
    def __init__(self, config: BrokerConfig, store: MetadataStore,
                 producer_ids: IssuedProducerIds, disk: OsDisk | None = None) -> None:
        self.config = config
        self.store = store
        self._producer_ids = producer_ids
        self.topics: dict[str, Topic] = {}
        self._by_id: dict[uuid.UUID, Topic] = {}  # Produce v13, Fetch v13+, DeleteTopics v6
        self._unified: dict[str, str] = {}  # _unify(name) -> name, for collisions
        self.disk = disk or default_disk()
        # JBOD: every directory of log.dirs holds partitions, each its own health (one that
        # fails takes only its partitions offline). The first also holds the broker's
        # metadata; ``log_dir_state`` is that one.
        self.log_dirs: dict[str, LogDir] = {}
        for path in config.log_dirs:
            state = LogDir(os.path.abspath(path))
            state.when_offline(functools.partial(self._abandon_partitions, state))
            try:
                os.makedirs(state.path, exist_ok=True)
                listdir_at_start(state.path)
            except OSError as exc:
                if out_of_descriptors(exc):
                    raise  # the start fails: no directory is offline for it
                state.fail(exc)
            self.log_dirs[state.path] = state
        self.log_dir_state = next(iter(self.log_dirs.values()))
        self.log_dir = self.log_dir_state.path
        self.moves = LogDirMoves(self)
        self.moves.recover()
        self._placed = self._find_partition_dirs()
        self._load: Counter[str] = Counter()  # partitions placed in each directory
        self._starting = True
        for name in self.store.children("topics"):
            value, _ = self.store.get(f"topics/{name}")
            if value is not None:
                self._materialize(name, value)
        self._starting = False
        self._placed.clear()  # what no topic claimed is set aside just below
        self._remove_stale_directories()

    # --- partition directories -----------------------------------------------------------

    def _remove_stale_directories(self) -> None:
        """Before anything is served: finish what a deletion cut short, and set aside what
        belongs to no topic of this broker, so that a re-created topic always starts empty.

        A deletion renames the topic's partition directories to "...<topic id>-delete" first
        (its commit point), then removes the metadata entry, then the directories. A crash
        after the renames is rolled forward here: the entry goes, then the directories. A
        partition directory of a topic the metadata does not have, or of another topic id
        (an older topic of the same name), cannot come from that sequence (a lost or restored
        metadata store, a copied directory): it is renamed "...-stray", not read, and kept
        for an operator, as Kafka keeps stray replicas."""
        by_id = {topic.topic_id.hex: topic for topic in self.topics.values()}
        deleted, strays, touched = [], 0, set()
        for entry, path in self._entries():
            gone = _DELETED_DIR.fullmatch(entry)
            if gone is not None:
                topic = by_id.pop(gone.group(1), None)
                if topic is not None:
                    log.warning("deleting topic %s was cut short; finishing it", topic.name)
                    try:
                        self.store.delete(f"topics/{topic.name}")
                    except OSError as exc:  # left for the next start
                        log.error("topic %s: removing its metadata failed: %s", topic.name,
                                  exc)
                        continue
                    del self.topics[topic.name]
                    self._by_id.pop(topic.topic_id, None)
                    self._unified.pop(_unify(topic.name), None)
                deleted.append(path)
                touched.add(os.path.dirname(path))
                continue
            match = _PARTITION_DIR.fullmatch(entry)
            if match is None or not os.path.isdir(path) or not _is_partition_dir(path):
                continue
            topic = self.topics.get(match.group(1))
            index = int(match.group(2))
            state = self.log_dirs[os.path.dirname(path)]
            if state.offline:  # failed by an earlier entry: nothing more is read of it
                continue
            if topic is None or index >= len(topic.partitions) or \
                    topic.partitions[index].dir != path or \
                    partition_metadata.read(self.disk, path) not in (None, topic.topic_id):
                try:
                    aside = self._move_aside(path, STRAY_SUFFIX)
                except OSError as exc:  # never read as a topic's: its directory goes
                    state.fail(exc)
                    continue
                log.warning("%s belongs to no topic of this broker (a lost or restored "
                            "metadata store, or a second copy in another log directory?): "
                            "renamed to %s, not read, not deleted", path, aside)
                strays += 1
                touched.add(os.path.dirname(path))
        for directory in touched:
            self._fsync_or_fail(directory)
        _remove_all(deleted)

    def _fsync_or_fail(self, directory: str, fd: int | None = None) -> None:
        """The directory's fsync after renames in it (through ``fd``, its descriptor taken
        before them, when given); failed, the directory goes offline (what the renames moved
        may come back after a power cut: nothing of it is read until the next start sets it
        aside again). Out of descriptors is no failure of the directory: raised (at start,
        the start fails, as listdir_at_start)."""
        try:
            if fd is None:
                self.disk.fsync_dir(directory)
            else:
                self.disk.fsync_open_dir(fd)
        except OSError as exc:
            if out_of_descriptors(exc):
                raise
            self.log_dirs[directory].fail(exc)

    def _open_dirs(self, directories: set[str]) -> dict[str, int]:
        """A descriptor of each online directory, for fsyncs after renames in it: out of
        descriptors, none is kept and TopicError (retriable) says nothing was done; a
        directory that cannot be opened otherwise has failed, and goes offline."""
        fds: dict[str, int] = {}
        for directory in sorted(directories):
            state = self.log_dirs.get(directory)
            if state is None or state.offline:  # nothing read of it again anyway
                continue
            try:
                fds[directory] = self.disk.open_dir(directory)
            except OSError as exc:
                if out_of_descriptors(exc):
                    for fd in fds.values():
                        self.disk.close(fd)
                    raise TopicError(ErrorCode.kafka_storage_error,
                                     f"out of file descriptors: {exc}") from exc
                state.fail(exc)
        return fds

    def _entries(self):
        """(name, path) of everything in the online log directories."""
        for state in self.log_dirs.values():
            if state.offline:
                continue
            try:
                names = listdir_at_start(state.path)
            except OSError as exc:
                if out_of_descriptors(exc):
                    raise  # as above
                state.fail(exc)
                continue
            for entry in names:
                yield entry, os.path.join(state.path, entry)

    def _find_partition_dirs(self) -> dict[str, list[str]]:
        """"<topic>-<index>" -> the log directories holding a directory of that name (Kafka
        finds its logs again the same way: by looking)."""
        placed: dict[str, list[str]] = {}
        for entry, path in self._entries():
            if _PARTITION_DIR.fullmatch(entry) and os.path.isdir(path):
                placed.setdefault(entry, []).append(os.path.dirname(path))
        return placed

    def _found_in(self, topic: Topic, name: str) -> str | None:
        """The log directory holding this topic's partition ``name``: the one whose
        partition.metadata names the topic's id (else one that names none); a copy of an
        older topic of the same name is set aside at start as a stray."""
        named = {}
        for directory in self._placed.pop(name, []):
            try:
                named[directory] = partition_metadata.read(self.disk, os.path.join(directory,
                                                                                   name))
            except OSError as exc:
                self.log_dirs[directory].fail(exc)
        for wanted in (topic.topic_id, None):
            for directory, topic_id in named.items():
                if topic_id == wanted:
                    return directory
        return None

    def placed_in(self, source: LogDir, target: LogDir) -> None:
        """A partition moved from ``source`` to ``target`` (see log_dir_moves.py)."""
        self._load[source.path] -= 1
        self._load[target.path] += 1

    def choose_log_dir(self) -> LogDir:
        """Where a new partition goes: the online directory with the fewest partitions (the
        first of log.dirs among equals), as Kafka chooses."""
        online = [state for state in self.log_dirs.values() if not state.offline]
        if not online:
            raise TopicError(ErrorCode.kafka_storage_error,
                             "every log directory is offline: " + "; ".join(
                                 str(state.error()) for state in self.log_dirs.values()))
        return min(online, key=lambda state: self._load[state.path])

    def _move_aside(self, path: str, suffix: str) -> str:
        aside = os.path.join(os.path.dirname(path), suffixed_dir_name(
            os.path.basename(path), uuid.uuid4().hex, suffix))
        self.disk.rename(path, aside)
        return aside

    def _abandon_partitions(self, state: LogDir) -> None:
        for partition in list(self.open_partitions()):
            if partition.log_dir is state:
                partition.abandon()

    def _materialize(self, name: str, value: dict[str, Any]) -> Topic:
        overrides = stored_topic_configs(value.get("configs", {}))
        if name in INTERNAL_TOPICS:
            problem = self._internal_problem(name, overrides)
            if problem:  # stored before the rule: the coordinator's needs win
                log.warning("%s; using cleanup.policy=compact and segment.bytes=%d instead",
                            problem, self.config.get(_INTERNAL_SEGMENT_KEYS[name]))
                overrides.pop("internal.segment.bytes", None)
                overrides.update(self._internal_overrides(name))
        topic = Topic(name, uuid.UUID(value["id"]), overrides)
        topic.partitions = [self._partition(topic, i) for i in range(value["partitions"])]
        self.topics[name] = topic
        self._by_id[topic.topic_id] = topic
        self._unified[_unify(name)] = name
        return topic

    def _partition(self, topic: Topic, index: int) -> Partition:
        name = f"{topic.name}-{index}"
        found = self._found_in(topic, name)
        if found is not None:
            state = self.log_dirs[found]
        elif self._starting and any(state.offline for state in self.log_dirs.values()):
            # A partition from before this start whose directory was not found while a log
            # directory is offline: its data may be there, so it must not start empty
            # elsewhere (Kafka refuses to create a log that is not new while directories
            # are offline).
            state = next(state for state in self.log_dirs.values() if state.offline)
        else:
            state = self.choose_log_dir()
        self._load[state.path] += 1
        return Partition(
            topic.name, index, os.path.join(state.path, name),
            self.log_config(topic), self.topic_config(topic, "max.message.bytes"),
            self.state_limits(topic), self._producer_ids, self.record_rules(topic),
            log_dir=state, disk=self.disk, topic_id=topic.topic_id,
        )

    # --- configs -------------------------------------------------------------------------

    def topic_config(self, topic: Topic, key: str) -> Any:
        if key in topic.overrides:
            return topic.overrides[key]
        return self.config.topic_default(key)

    def log_config(self, topic: Topic) -> LogConfig:
        def get(key: str) -> Any:
            return self.topic_config(topic, key)

        # A compacted topic without the delete policy keeps its segments whatever their age
        # or size, as Kafka's does: the log cleaner alone removes its records.
        deletes = "delete" in get("cleanup.policy").split(",")
        compaction = None
        segment_ms = get("segment.ms")
        if is_compacted(get("cleanup.policy")):
            compaction = CompactionConfig(
                delete_retention_ms=get("delete.retention.ms"),
                min_cleanable_dirty_ratio=get("min.cleanable.dirty.ratio"),
                min_compaction_lag_ms=get("min.compaction.lag.ms"),
                max_compaction_lag_ms=get("max.compaction.lag.ms"),
            )
            # Kafka's rule: the active segment is never cleaned, so it rolls by the time a
            # record in it must be compacted.
            segment_ms = min(segment_ms, compaction.max_compaction_lag_ms)
        return LogConfig(
            segment_bytes=get("internal.segment.bytes") or get("segment.bytes"),
            segment_ms=segment_ms,
            retention_ms=get("retention.ms") if deletes else -1,
            retention_bytes=get("retention.bytes") if deletes else -1,
            flush_messages=get("flush.messages"),
            flush_ms=get("flush.ms"),
            index_interval_bytes=get("index.interval.bytes"),
            compaction=compaction,
        )

    def record_rules(self, topic: Topic) -> RecordRules:
        codec = self.topic_config(topic, "compression.type")
        level_key = f"compression.{codec}.level"
        return RecordRules(
            keys_required=is_compacted(self.topic_config(topic, "cleanup.policy")),
            log_append_time=self.topic_config(topic, "message.timestamp.type") == "LogAppendTime",
            timestamp_before_max_ms=self.topic_config(topic, "message.timestamp.before.max.ms"),
            timestamp_after_max_ms=self.topic_config(topic, "message.timestamp.after.max.ms"),
            compression=STORED_CODECS[codec],
            compression_level=self.topic_config(topic, level_key)
            if level_key in TOPIC_CONFIGS else None,
        )

    def state_limits(self, topic: Topic) -> StateLimits:
        return StateLimits(
            batches_to_retain=self.topic_config(topic, "producer.state.batches.to.retain"),
            max_producers=self.config.get("producer.state.max.producers"),
            expiration_ms=self.config.get("producer.id.expiration.ms"),
            tombstone_ms=self.config.get("producer.id.tombstone.ms"),
        )

    def reconfigure(self, topic: Topic) -> None:
        """The topic's configs as they are now, in effect at once in every partition."""
        log_config, rules = self.log_config(topic), self.record_rules(topic)
        limits = self.state_limits(topic)
        max_message_bytes = self.topic_config(topic, "max.message.bytes")
        for partition in topic.partitions:
            partition.reconfigure(log_config, max_message_bytes, limits, rules)

    def reconfigure_all(self) -> None:
        """After a change of the broker's dynamic configs, which topics default to."""
        for topic in list(self.topics.values()):
            self.reconfigure(topic)

    def check_overrides(self, configs: dict[str, str | None],
                        name: str | None = None) -> dict[str, Any]:
        """A topic's overrides parsed and checked together; ConfigError naming the key."""
        parsed = validate_topic_configs(configs)
        lag_problem = compaction_lag_problem(*(
            parsed.get(key, self.config.topic_default(key))
            for key in ("min.compaction.lag.ms", "max.compaction.lag.ms")))
        if lag_problem:
            raise ConfigError(lag_problem)
        if name in INTERNAL_TOPICS:
            problem = self._internal_problem(name, parsed)
            if problem:
                raise ConfigError(problem)
        return parsed

    def _internal_problem(self, name: str, overrides: dict[str, Any]) -> str | None:
        return internal_topic_problem(
            name, lambda key: overrides.get(key, self.config.topic_default(key)),
            min(_INTERNAL_SEGMENT_FLOOR, self.config.get(_INTERNAL_SEGMENT_KEYS[name])))

    def alter_configs(self, name: str, configs: dict[str, str],
                      validate_only: bool = False) -> None:
        """Replace the topic's overrides with ``configs``: checked, stored in one
        compare-and-set, then in effect; nothing changes on any error."""
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition,
                             f"topic {name!r} does not exist")
        try:
            parsed = self.check_overrides(configs, name)
        except ConfigError as exc:
            raise TopicError(ErrorCode.invalid_config, str(exc)) from None
        if validate_only:
            return
        if self.log_dir_state.offline:
            raise TopicError(ErrorCode.kafka_storage_error, str(self.log_dir_state.error()))
        path = f"topics/{name}"
        try:
            stored, version = self.store.get(path)
            if stored is None:
                raise TopicError(ErrorCode.unknown_topic_or_partition,
                                 f"topic {name!r} does not exist")
            self.store.compare_and_set(path, {**stored, "configs": dict(configs)}, version)
        except BadVersion:
            raise TopicError(ErrorCode.invalid_request,
                             f"topic {name!r} changed meanwhile; try again") from None
        except OSError as exc:
            raise TopicError(ErrorCode.kafka_storage_error,
                             f"writing the topic's metadata failed: {exc}") from None
        topic.overrides = parsed
        self.reconfigure(topic)
        log.info("topic %s configs are now %s", name, log_safe(configs, 1000))

    def override_texts(self, topic: Topic) -> dict[str, str]:
        return {key: render(value) for key, value in topic.overrides.items()}

    def describe_topic_configs(self, topic: Topic) -> list[tuple[str, Any, bool]]:
        """(key, value, is_default) for every topic config."""
        return [
            (key, self.topic_config(topic, key), key not in topic.overrides)
            for key in TOPIC_CONFIGS
        ]

    # --- lifecycle -----------------------------------------------------------------------

    def get(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def by_id(self, topic_id: uuid.UUID | None) -> Topic | None:
        return self._by_id.get(topic_id) if topic_id is not None else None

    def partition(self, name: str, index: int) -> Partition | None:
        topic = self.topics.get(name)
        if topic is None or not 0 <= index < len(topic.partitions):
            return None
        return topic.partitions[index]

    def create(self, name: str, num_partitions: int, replication_factor: int,
               configs: dict[str, str | None], validate_only: bool = False,
               assignments: dict[int, list[int]] | None = None,
               internal: bool = False) -> Topic:
        """``assignments``: partition index -> broker ids, given instead of a partition count
        and a replication factor (both -1 then), as Kafka's CreateTopics takes them.
        ``internal``: the broker creates one of INTERNAL_TOPICS (clients may not)."""
        if assignments:
            num_partitions, replication_factor = self._from_assignments(
                num_partitions, replication_factor, assignments)
        problem = topic_name_problem(name)
        if problem:
            raise TopicError(ErrorCode.invalid_topic_exception, problem)
        if name in self.topics:
            raise TopicError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        other = self._unified.get(_unify(name))
        if other is not None:  # Kafka's Topic.hasCollision: metrics use either as the same
            raise TopicError(ErrorCode.invalid_topic_exception,
                             f"Topic '{name}' collides with existing topic: {other}")
        if name in INTERNAL_TOPICS and not internal:
            raise TopicError(ErrorCode.invalid_request,
                             f"Creation of internal topic {name} is prohibited: the broker "
                             f"creates it on first use")
        if num_partitions == -1:
            num_partitions = self.config.get("num.partitions")
        if not 1 <= num_partitions <= MAX_PARTITIONS:
            raise TopicError(ErrorCode.invalid_partitions,
                             f"number of partitions must be 1..{MAX_PARTITIONS}")
        if not internal:
            self._check_partition_room(num_partitions)
        if replication_factor == -1:
            replication_factor = self.config.get("default.replication.factor")
        if replication_factor != 1:
            raise TopicError(
                ErrorCode.invalid_replication_factor,
                f"replication factor {replication_factor} is larger than the 1 broker available",
            )
        try:
            self.check_overrides(configs, name)
        except ConfigError as exc:
            raise TopicError(ErrorCode.invalid_config, str(exc)) from None
        value = {"id": str(uuid.uuid4()), "partitions": num_partitions, "configs": configs}
        if validate_only:
            return Topic(name, uuid.UUID(value["id"]), validate_topic_configs(configs))
        self.choose_log_dir()  # raises when no directory can take the partitions
        try:
            self.store.compare_and_set(f"topics/{name}", value, NO_VERSION)
        except BadVersion:
            # Stored by an earlier attempt whose answer was an error (its directory fsync
            # failed after the rename): the topic exists.
            stored, _ = self.store.get(f"topics/{name}")
            if stored is not None:
                self._materialize(name, stored)
            raise TopicError(ErrorCode.topic_already_exists,
                             f"topic {name!r} already exists") from None
        except OSError as exc:
            raise TopicError(ErrorCode.kafka_storage_error,
                             f"writing the topic's metadata failed: {exc}") from None
        topic = self._materialize(name, value)
        self._set_aside_existing(topic.partitions)
        log.info("created topic %s with %d partitions", name, num_partitions)
        return topic

    def ensure_replica_topic(self, name: str, topic_id: uuid.UUID, num_partitions: int,
                             configs: dict[str, str]) -> Topic:
        """Cluster mode: this broker's local replica of a topic ZooKeeper assigns to it
        (broker/replica_manager.py), created with the topic's configs; a local topic of that
        name with another id (an older topic) is set aside first, kept."""
        topic = self.topics.get(name)
        if topic is not None and topic.topic_id == topic_id:
            return topic
        if topic is not None:
            self.delete(name, internal=True, keep=True)
        value = {"id": str(topic_id), "partitions": num_partitions, "configs": configs,
                 REPLICA_MARK: True}
        try:
            self.store.compare_and_set(f"topics/{name}", value, NO_VERSION)
        except BadVersion:  # left by a deletion cut short: ours replaces it
            _, version = self.store.get(f"topics/{name}")
            self.store.compare_and_set(f"topics/{name}", value, version)
        topic = self._materialize(name, value)
        self._set_aside_existing(topic.partitions)
        log.info("created the local replica of topic %s (%d partitions)", name, num_partitions)
        return topic

    def _set_aside_existing(self, partitions: list[Partition]) -> None:
        for partition in partitions:
            if os.path.isdir(partition.dir):  # put there by hand since the start
                try:
                    log.warning("%s: set aside as %s before the new partition uses its name",
                                partition.dir, self._move_aside(partition.dir, STRAY_SUFFIX))
                except OSError as exc:  # never opened as the new partition: the directory
                    partition.log_dir.fail(exc)  # goes; the next start sets it aside

    # --- manual assignments and new partitions ---------------------------------------------

    def replicas_problem(self, broker_ids: list[int] | tuple[int, ...], what: str) -> str | None:
        """Why a manual replica list cannot be placed on this one-broker cluster (Kafka's
        INVALID_REPLICA_ASSIGNMENT), or None."""
        if not broker_ids:
            return f"The manual partition assignment of {what} is an empty replica list."
        if len(set(broker_ids)) != len(broker_ids):
            return (f"The manual partition assignment of {what} names a broker more than once: "
                    f"{list(broker_ids)}.")
        broker_id = self.config.get("broker.id")
        for node in broker_ids:
            if node != broker_id:
                return (f"The manual partition assignment of {what} includes broker {node}, "
                        f"but no broker with that id exists (this cluster is broker "
                        f"{broker_id} alone).")
        return None

    def _from_assignments(self, num_partitions: int, replication_factor: int,
                          assignments: dict[int, list[int]]) -> tuple[int, int]:
        """(partition count, replication factor) of a CreateTopics with manual assignments."""
        check_manual_assignment(num_partitions, replication_factor, assignments)
        for index, broker_ids in sorted(assignments.items()):
            problem = self.replicas_problem(broker_ids, f"partition {index}")
            if problem:
                raise TopicError(ErrorCode.invalid_replica_assignment, problem)
        return len(assignments), 1

    def add_partitions(self, name: str, count: int,
                       assignments: list[list[int]] | None = None,
                       validate_only: bool = False) -> Topic:
        """CreatePartitions: grow topic ``name`` to ``count`` partitions (stored in the
        metadata store before any is served: a crash leaves the old count or the new)."""
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition,
                             f"The topic '{name}' does not exist.")
        if name in INTERNAL_TOPICS:
            raise TopicError(ErrorCode.invalid_request,
                             f"topic {name!r} is internal: its partition count maps group "
                             f"and transactional ids to partitions and cannot change")
        current = len(topic.partitions)
        check_partition_count(current, count)
        self._check_partition_room(count - current)
        if assignments is not None:
            if len(assignments) != count - current:
                raise TopicError(ErrorCode.invalid_replica_assignment,
                                 f"Attempted to add {count - current} additional partition(s), "
                                 f"but only {len(assignments)} assignment(s) were specified.")
            for i, broker_ids in enumerate(assignments):
                problem = self.replicas_problem(broker_ids, f"partition {current + i}")
                if problem:
                    raise TopicError(ErrorCode.invalid_replica_assignment, problem)
        if validate_only:
            return topic
        self.choose_log_dir()  # raises when no directory can take the partitions
        stored, version = self.store.get(f"topics/{name}")
        if stored is None or stored.get("id") != str(topic.topic_id):
            raise TopicError(ErrorCode.unknown_topic_or_partition,
                             f"The topic '{name}' does not exist.")
        try:
            self.store.compare_and_set(f"topics/{name}", {**stored, "partitions": count},
                                       version)
        except BadVersion:
            raise TopicError(ErrorCode.invalid_request,
                             f"topic {name!r} was changed meanwhile; try again") from None
        except OSError as exc:
            raise TopicError(ErrorCode.kafka_storage_error,
                             f"writing the topic's metadata failed: {exc}") from None
        added = [self._partition(topic, i) for i in range(current, count)]
        self._set_aside_existing(added)
        topic.partitions.extend(added)
        log.info("topic %s: partitions %d -> %d", name, current, count)
        return topic

    def _check_partition_room(self, adding: int) -> None:
        """max.broker.partitions (KIP-578's name; Kafka 4 has no broker-wide cap): what every
        partition costs the broker (its state, its directory, its share of each Metadata
        answer) stays bounded however many topics clients create. The internal topics are
        exempt: the coordinators need them whatever clients did."""
        held = sum(self._load.values())
        limit = self.config.get("max.broker.partitions")
        if held + adding > limit:
            raise TopicError(ErrorCode.policy_violation,
                             f"Adding {adding} partition(s) would exceed max.broker.partitions "
                             f"({limit}): the broker holds {held}.")

    def auto_create(self, name: str) -> Topic:
        if name == OFFSETS_TOPIC:
            return self.offsets_topic()
        if name == TRANSACTION_STATE_TOPIC:
            return self.transaction_state_topic()
        return self.create(name, -1, -1, {})

    def transaction_state_topic(self) -> Topic:
        """``__transaction_state``, created on first use as Kafka creates it: compacted, with
        transaction.state.log.num.partitions partitions."""
        return self._internal_topic(TRANSACTION_STATE_TOPIC,
                                    "transaction.state.log.num.partitions")

    def _internal_topic(self, name: str, partitions_key: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None and self.config.get("zookeeper.connect") is not None:
            # Cluster mode: the cluster's topic (ClusterTopics.ensure_internal), of which the
            # replica manager makes the local replica; never one of this broker's own.
            raise TopicError(ErrorCode.coordinator_not_available,
                             f"{name} has no replica on this broker yet")
        if topic is None:
            topic = self.create(name, self.config.get(partitions_key), 1,
                                self._internal_overrides(name, text=True), internal=True)
        return topic

    def _internal_overrides(self, name: str, text: bool = False) -> dict[str, Any]:
        segment_bytes = self.config.get(_INTERNAL_SEGMENT_KEYS[name])
        # below segment.bytes's minimum only where an operator (a test) set the broker key so
        key = "segment.bytes" if segment_bytes >= SEGMENT_BYTES_MIN else "internal.segment.bytes"
        return {"cleanup.policy": "compact", key: str(segment_bytes) if text else segment_bytes}

    def offsets_topic(self) -> Topic:
        """``__consumer_offsets``, created as Kafka creates it on first use: compacted, with
        offsets.topic.num.partitions partitions of offsets.topic.segment.bytes segments."""
        return self._internal_topic(OFFSETS_TOPIC, "offsets.topic.num.partitions")

    def delete(self, name: str, internal: bool = False, keep: bool = False) -> None:
        """``internal``: the replica manager drops its replica of an internal topic.
        ``keep``: the partition directories are renamed "...-stray" and kept for an
        operator, not removed (the replica manager's copy of a topic whose id changed
        without this broker seeing it deleted: Kafka sets such replicas aside too)."""
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
        if name in INTERNAL_TOPICS and not internal:
            raise TopicError(ErrorCode.invalid_topic_exception,
                             f"topic {name!r} is internal: the broker keeps its state there")
        if not keep and not self.config.get("delete.topic.enable"):
            raise TopicError(ErrorCode.topic_deletion_disabled, "delete.topic.enable is false")
        # The renames go first and durably: they are the moment of deletion (a crash after
        # them is rolled forward at the next start, see _remove_stale_directories). Then the
        # metadata entry, then the directories, in the background. Each directory's
        # descriptor is taken before anything changes: out of descriptors, nothing is done.
        dir_fds = self._open_dirs({os.path.dirname(p.dir) for p in topic.partitions})
        aside: list[str] = []
        try:
            for partition in topic.partitions:
                self.moves.cancel(partition)
                target = os.path.join(os.path.dirname(partition.dir), suffixed_dir_name(
                    os.path.basename(partition.dir), uuid.uuid4().hex if keep
                    else topic.topic_id.hex, STRAY_SUFFIX if keep else DELETE_SUFFIX))

                def rename(source: str = partition.dir, target: str = target) -> None:
                    if os.path.isdir(source):
                        self.disk.rename(source, target)
                        aside.append(target)

                try:  # a log opening in a worker thread creates no directory after it
                    partition.set_aside(rename)
                except OSError as exc:
                    # A directory that cannot be renamed goes offline (Kafka's rule for a
                    # failed operation on a log directory): what it holds of the topic is
                    # not read again, and the next start sets it aside as a stray.
                    self.log_dirs.get(os.path.dirname(partition.dir),
                                      partition.log_dir).fail(exc)
            for directory in {os.path.dirname(path) for path in aside} & dir_fds.keys():
                self._fsync_or_fail(directory, dir_fds[directory])
        finally:
            for fd in dir_fds.values():
                self.disk.close(fd)
        removed = False
        if not aside:  # no rename decided it: the metadata entry's removal does
            try:
                self.store.delete(f"topics/{name}")
            except OSError as exc:
                for partition in topic.partitions:
                    partition.kept()
                raise TopicError(ErrorCode.kafka_storage_error,
                                 f"deleting topic {name}: {exc}") from exc
            removed = True
        for partition in topic.partitions:
            partition.delete()
            self._load[partition.log_dir.path] -= 1
        del self.topics[name]
        self._by_id.pop(topic.topic_id, None)
        self._unified.pop(_unify(name), None)
        if not removed:
            try:
                self.store.delete(f"topics/{name}")
            except OSError as exc:  # the renames decided it: the next start finishes it
                log.error("topic %s: removing its metadata failed (%s); the next start "
                          "does it", name, exc)
        if keep:
            for path in aside:
                log.warning("%s: the replica of an earlier topic %s (id %s), kept for an "
                            "operator: not read, not removed", path, name, topic.topic_id)
        elif aside:
            threading.Thread(target=_remove_all, args=(aside,), name=f"delete-{name}",
                             daemon=True).start()
        log.info("deleted topic %s", name)

    def open_partitions(self):
        for topic in self.topics.values():
            for partition in topic.partitions:
                if partition.is_open:
                    yield partition

    def close(self) -> None:
        self.moves.stop()
        for topic in self.topics.values():
            for partition in topic.partitions:
                partition.shut()


def _remove_all(paths: list[str]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _is_partition_dir(path: str) -> bool:
    return any(name.endswith(".log") or name == partition_metadata.FILE_NAME
               for name in os.listdir(path))
