"""Topics on this broker: creation, deletion, configs, kept in the metadata store."""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from ..log.log import LogConfig
from ..metadata.store import NO_VERSION, MetadataStore
from ..producer_state.manager import StateLimits
from ..protocol.validation import RecordRules
from .config import (
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigError,
    is_compacted,
    validate_topic_configs,
)
from .partition import IssuedProducerIds, Partition

log = logging.getLogger(__name__)

_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_NAME_LENGTH = 249
MAX_PARTITIONS = 100_000


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
                 producer_ids: IssuedProducerIds) -> None:
        self.config = config
        self.store = store
        self._producer_ids = producer_ids
        self.topics: dict[str, Topic] = {}
        self.log_dir = config.log_dir
        os.makedirs(self.log_dir, exist_ok=True)
        self._remove_deleted_leftovers()
        for name in self.store.children("topics"):
            value, _ = self.store.get(f"topics/{name}")
            if value is not None:
                self._materialize(name, value)

    def _remove_deleted_leftovers(self) -> None:
        for entry in os.listdir(self.log_dir):
            if entry.endswith("-delete"):
                shutil.rmtree(os.path.join(self.log_dir, entry), ignore_errors=True)

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
        self.store.compare_and_set(f"topics/{name}", value, NO_VERSION)
        topic = self._materialize(name, value)
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
        self.store.delete(f"topics/{name}")
        del self.topics[name]
        for partition in topic.partitions:
            partition.delete()
        log.info("deleted topic %s", name)

    def open_partitions(self):
        for topic in self.topics.values():
            for partition in topic.partitions:
                if partition.is_open:
                    yield partition

    def close(self) -> None:
        for partition in list(self.open_partitions()):
            partition.close()
