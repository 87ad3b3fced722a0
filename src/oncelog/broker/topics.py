"""Topics on this broker: creation, deletion, configs, kept in the metadata store."""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from ..log import partition_metadata
from ..log.disk import OsDisk, default_disk
from ..log.log import LogConfig
from ..metadata.store import NO_VERSION, BadVersion, MetadataStore
from ..producer_state.manager import StateLimits
from ..protocol.validation import RecordRules
from .config import (
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigError,
    is_compacted,
    validate_topic_configs,
)
from .log_dirs import LogDir
from .partition import IssuedProducerIds, Partition

log = logging.getLogger(__name__)

_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_NAME_LENGTH = 249
MAX_PARTITIONS = 100_000
# Kafka's names: a partition directory is "<topic>-<index>"; one being deleted is renamed to
# "<topic>-<index>.<unique>-delete" first; "partition.metadata" names the topic id it holds.
_PARTITION_DIR = re.compile(r"(.+)-(\d+)")
DELETE_SUFFIX = "-delete"


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


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    overrides: dict[str, Any]
    partitions: list[Partition] = field(default_factory=list)


class TopicManager:
    def __init__(self, config: BrokerConfig, store: MetadataStore,
                 producer_ids: IssuedProducerIds, disk: OsDisk | None = None) -> None:
        self.config = config
        self.store = store
        self._producer_ids = producer_ids
        self.topics: dict[str, Topic] = {}
        self.log_dir = config.log_dir
        self.disk = disk or default_disk()
        self.log_dir_state = LogDir(self.log_dir)
        self.log_dir_state.when_offline(self._abandon_partitions)
        os.makedirs(self.log_dir, exist_ok=True)
        for name in self.store.children("topics"):
            value, _ = self.store.get(f"topics/{name}")
            if value is not None:
                self._materialize(name, value)
        self._remove_stale_directories()

    # --- partition directories -----------------------------------------------------------

    def _remove_stale_directories(self) -> None:
        """Remove what a deletion cut short left behind, before anything is served: renamed
        directories, and directories of topics the metadata no longer has (a crash after the
        metadata entry went and before the directories were renamed) or of an older topic of
        the same name (its topic id differs), so a re-created topic always starts empty."""
        stale = []
        for entry in os.listdir(self.log_dir):
            path = os.path.join(self.log_dir, entry)
            if entry.endswith(DELETE_SUFFIX):
                stale.append(path)
                continue
            match = _PARTITION_DIR.fullmatch(entry)
            if match is None or not os.path.isdir(path) or not _is_partition_dir(path):
                continue
            topic = self.topics.get(match.group(1))
            if topic is None or int(match.group(2)) >= len(topic.partitions) or \
                    partition_metadata.read(self.disk, path) not in (None, topic.topic_id):
                log.warning("%s: left over from a deleted topic; removing it", path)
                stale.append(self._move_aside(path))
        if stale:
            self._sync_log_dir()
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)

    def _move_aside(self, path: str) -> str:
        aside = f"{path}.{uuid.uuid4().hex}{DELETE_SUFFIX}"
        self.disk.rename(path, aside)
        return aside

    def _sync_log_dir(self) -> None:
        self.disk.fsync_dir(self.log_dir)

    def _abandon_partitions(self) -> None:
        for partition in list(self.open_partitions()):
            partition.abandon()

    def _materialize(self, name: str, value: dict[str, Any]) -> Topic:
        overrides = validate_topic_configs(value.get("configs", {}))
        topic = Topic(name, uuid.UUID(value["id"]), overrides)
        topic.partitions = [self._partition(topic, i) for i in range(value["partitions"])]
        self.topics[name] = topic
        return topic

    def _partition(self, topic: Topic, index: int) -> Partition:
        return Partition(
            topic.name, index, os.path.join(self.log_dir, f"{topic.name}-{index}"),
            self.log_config(topic), self.topic_config(topic, "max.message.bytes"),
            self.state_limits(topic), self._producer_ids, self.record_rules(topic),
            log_dir=self.log_dir_state, disk=self.disk, topic_id=topic.topic_id,
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
        # or size, as Kafka's does (and, the cleaner not being built, keeps every record).
        deletes = "delete" in get("cleanup.policy").split(",")
        return LogConfig(
            segment_bytes=get("segment.bytes"),
            segment_ms=get("segment.ms"),
            retention_ms=get("retention.ms") if deletes else -1,
            retention_bytes=get("retention.bytes") if deletes else -1,
            flush_messages=get("flush.messages"),
            flush_ms=get("flush.ms"),
            index_interval_bytes=get("index.interval.bytes"),
        )

    def record_rules(self, topic: Topic) -> RecordRules:
        return RecordRules(
            keys_required=is_compacted(self.topic_config(topic, "cleanup.policy")),
            log_append_time=self.topic_config(topic, "message.timestamp.type") == "LogAppendTime",
            timestamp_before_max_ms=self.topic_config(topic, "message.timestamp.before.max.ms"),
            timestamp_after_max_ms=self.topic_config(topic, "message.timestamp.after.max.ms"),
        )

    def state_limits(self, topic: Topic) -> StateLimits:
        return StateLimits(
            batches_to_retain=self.topic_config(topic, "producer.state.batches.to.retain"),
            max_producers=self.config.get("producer.state.max.producers"),
            expiration_ms=self.config.get("producer.id.expiration.ms"),
            tombstone_ms=self.config.get("producer.id.tombstone.ms"),
        )

    def describe_topic_configs(self, topic: Topic) -> list[tuple[str, Any, bool]]:
        """(key, value, is_default) for every topic config."""
        return [
            (key, self.topic_config(topic, key), key not in topic.overrides)
            for key in TOPIC_CONFIGS
        ]

    # --- lifecycle -----------------------------------------------------------------------

    def get(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def partition(self, name: str, index: int) -> Partition | None:
        topic = self.topics.get(name)
        if topic is None or not 0 <= index < len(topic.partitions):
            return None
        return topic.partitions[index]

    def create(self, name: str, num_partitions: int, replication_factor: int,
               configs: dict[str, str | None], validate_only: bool = False) -> Topic:
        problem = topic_name_problem(name)
        if problem:
            raise TopicError(ErrorCode.invalid_topic_exception, problem)
        if name in self.topics:
            raise TopicError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        if num_partitions == -1:
            num_partitions = self.config.get("num.partitions")
        if not 1 <= num_partitions <= MAX_PARTITIONS:
            raise TopicError(ErrorCode.invalid_partitions,
                             f"number of partitions must be 1..{MAX_PARTITIONS}")
        if replication_factor == -1:
            replication_factor = self.config.get("default.replication.factor")
        if replication_factor != 1:
            raise TopicError(
                ErrorCode.invalid_replication_factor,
                f"replication factor {replication_factor} is larger than the 1 broker available",
            )
        try:
            validate_topic_configs(configs)
        except ConfigError as exc:
            raise TopicError(ErrorCode.invalid_config, str(exc)) from None
        value = {"id": str(uuid.uuid4()), "partitions": num_partitions, "configs": configs}
        if validate_only:
            return Topic(name, uuid.UUID(value["id"]), validate_topic_configs(configs))
        if self.log_dir_state.offline:
            raise TopicError(ErrorCode.kafka_storage_error, str(self.log_dir_state.error()))
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
        for partition in topic.partitions:
            if os.path.isdir(partition.dir):  # left by a deletion cut short
                try:
                    shutil.rmtree(self._move_aside(partition.dir), ignore_errors=True)
                except OSError as exc:  # the next start tells it apart by its topic id
                    log.error("%s: could not be moved aside: %s", partition.dir, exc)
        log.info("created topic %s with %d partitions", name, num_partitions)
        return topic

    def auto_create(self, name: str) -> Topic:
        return self.create(name, -1, -1, {})

    def delete(self, name: str) -> None:
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
        if not self.config.get("delete.topic.enable"):
            raise TopicError(ErrorCode.topic_deletion_disabled, "delete.topic.enable is false")
        # The metadata entry goes first and durably: it is the moment of deletion. The
        # directories are then renamed aside at once (a re-created topic never finds them)
        # and removed in the background; a crash anywhere in between is finished at the
        # next start by _remove_stale_directories.
        try:
            self.store.delete(f"topics/{name}")
        except OSError as exc:
            raise TopicError(ErrorCode.kafka_storage_error,
                             f"removing the topic's metadata failed: {exc}") from None
        del self.topics[name]
        aside = []
        for partition in topic.partitions:
            partition.delete()
            if os.path.isdir(partition.dir):
                try:
                    aside.append(self._move_aside(partition.dir))
                except OSError as exc:
                    log.error("%s: could not be renamed for deletion (%s); the next start "
                              "removes it", partition.dir, exc)
        try:
            self._sync_log_dir()
        except OSError as exc:
            log.error("%s: fsync failed after deleting topic %s: %s", self.log_dir, name, exc)
        if aside:
            threading.Thread(target=_remove_all, args=(aside,), name=f"delete-{name}",
                             daemon=True).start()
        log.info("deleted topic %s", name)

    def open_partitions(self):
        for topic in self.topics.values():
            for partition in topic.partitions:
                if partition.is_open:
                    yield partition

    def close(self) -> None:
        for partition in list(self.open_partitions()):
            partition.close()


def _remove_all(paths: list[str]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _is_partition_dir(path: str) -> bool:
    return any(name.endswith(".log") or name == partition_metadata.FILE_NAME
               for name in os.listdir(path))
