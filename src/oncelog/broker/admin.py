"""CreateTopics, DeleteTopics and DescribeConfigs."""

from __future__ import annotations

import collections
import logging

from kio.schema.errors import ErrorCode

from ..protocol.api_versions import CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS
from ..protocol.messages import Request
from ..protocol.schema import build, response_module
from .api_meta import NO_THROTTLE
from .config import BROKER_CONFIGS, TOPIC_CONFIGS, TOPIC_TO_BROKER_KEY, render
from .topics import TopicError

log = logging.getLogger(__name__)

# Kafka's ConfigResource.Type and ConfigEntry.ConfigSource / ConfigType ids.
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "LONG": 5, "DOUBLE": 6, "LIST": 7}


def handle_create_topics(broker, request: Request):
    mod = response_module(CREATE_TOPICS, request.api_version)
    body = request.body
    duplicates = _duplicates(t.name for t in body.topics)
    results = []
    for t in body.topics:
        if t.name not in duplicates:
            results.append(_create_topic(broker, mod, t, body.validate_only))
    # Kafka refuses every copy of a name given twice and answers for it once: clients match
    # results to topics by name (librdkafka rejects a response naming a topic twice).
    for name in duplicates:
        log.info("create topic %r refused: named more than once in the request", name)
        results.append(_create_refused(mod, name, ErrorCode.invalid_request,
                                       "Duplicate topic name."))
    return build(mod.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(results))


def _duplicates(names) -> list[str]:
    """The names that occur more than once, in order of first occurrence."""
    counts = collections.Counter(names)
    return [name for name, n in counts.items() if n > 1]


def _create_topic(broker, mod, t, validate_only: bool):
    configs = {c.name: c.value for c in t.configs}
    assignments = {a.partition_index: list(a.broker_ids) for a in t.assignments or ()}
    try:
        if len(assignments) != len(t.assignments or ()):
            raise TopicError(ErrorCode.invalid_replica_assignment,
                             "The manual partition assignment names a partition twice.")
        topic = broker.topics.create(t.name, t.num_partitions, t.replication_factor, configs,
                                     validate_only=validate_only, assignments=assignments)
    except TopicError as exc:
        log.info("create topic %r refused: %s", t.name, exc)
        return _create_refused(mod, t.name, exc.error, str(exc))
    described = () if not hasattr(mod, "CreatableTopicConfigs") else tuple(
        build(mod.CreatableTopicConfigs, name=key, value=render(value), read_only=False,
              config_source=_topic_config_source(broker, key, is_default), is_sensitive=False)
        for key, value, is_default in broker.topics.describe_topic_configs(topic)
    )
    # A validate_only topic has no partitions to count: answer what would have been made.
    partitions = len(topic.partitions) or len(assignments) or t.num_partitions
    if partitions == -1:
        partitions = broker.config.get("num.partitions")
    return build(mod.CreatableTopicResult, name=t.name, topic_id=topic.topic_id,
                 error_code=ErrorCode.none, error_message=None, topic_config_error_code=0,
                 num_partitions=partitions, replication_factor=1, configs=described)


def _create_refused(mod, name: str, error: ErrorCode, message: str):
    return build(mod.CreatableTopicResult, name=name, topic_id=None, error_code=error,
                 error_message=message, topic_config_error_code=0, num_partitions=-1,
                 replication_factor=-1, configs=())


def handle_delete_topics(broker, request: Request):
    mod = response_module(DELETE_TOPICS, request.api_version)
    names = request.body.topic_names
    duplicates = _duplicates(names)
    results = []
    for name in dict.fromkeys(names):  # one answer per name, as for CreateTopics
        error, message = ErrorCode.none, None
        try:
            if name in duplicates:
                raise TopicError(ErrorCode.invalid_request, "Duplicate topic name.")
            broker.topics.delete(name)
            broker.counters.forget_topic(name)
            broker.groups.delete_topic_offsets(name)
        except TopicError as exc:
            error, message = exc.error, str(exc)
        results.append(build(mod.DeletableTopicResult, name=name, error_code=error,
                             error_message=message))
    return build(mod.DeleteTopicsResponse, throttle_time=NO_THROTTLE, responses=tuple(results))


def handle_describe_configs(broker, request: Request):
    mod = response_module(DESCRIBE_CONFIGS, request.api_version)
    body = request.body
    results = []
    for res in body.resources:
        error, message, entries = _describe(broker, res.resource_type, res.resource_name)
        wanted = res.configuration_keys
        configs = tuple(
            build(mod.DescribeConfigsResourceResult, name=name, value=render(value),
                  read_only=read_only, config_source=source, is_sensitive=False,
                  synonyms=_synonyms(mod, broker, name, source, body.include_synonyms,
                                     res.resource_type),
                  config_type=CONFIG_TYPES.get(kind, 0),
                  documentation=doc if getattr(body, "include_documentation", False) else None,
                  is_default=source == SOURCE_DEFAULT)
            for name, value, source, read_only, kind, doc in entries
            if wanted is None or name in wanted
        )
        results.append(build(mod.DescribeConfigsResult, error_code=error, error_message=message,
                             resource_type=res.resource_type, resource_name=res.resource_name,
                             configs=configs))
    return build(mod.DescribeConfigsResponse, throttle_time=NO_THROTTLE, results=tuple(results))


def _describe(broker, resource_type: int, name: str):
    if resource_type == RESOURCE_TOPIC:
        topic = broker.topics.get(name)
        if topic is None:
            return ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist", []
        entries = []
        for key, value, is_default in broker.topics.describe_topic_configs(topic):
            spec = TOPIC_CONFIGS[key]
            entries.append((key, value, _topic_config_source(broker, key, is_default), False,
                            spec.kind, spec.doc))
        return ErrorCode.none, None, entries
    if resource_type == RESOURCE_BROKER:
        if name not in ("", str(broker.broker_id)):
            return ErrorCode.invalid_request, f"broker {name!r} is not this broker", []
        entries = [
            (key, value, SOURCE_DEFAULT if broker.config.is_default(key) else SOURCE_STATIC_BROKER,
             True, BROKER_CONFIGS[key].kind, BROKER_CONFIGS[key].doc)
            for key, value in broker.config.effective().items()
        ]
        return ErrorCode.none, None, entries
    return ErrorCode.invalid_request, f"resource type {resource_type} is not supported", []


# Broker keys a topic default can come from besides TOPIC_TO_BROKER_KEY's: setting
# log.retention.hours changes retention.ms just as log.retention.ms does.
BROKER_FALLBACK_KEYS = {
    "retention.ms": ("log.retention.minutes", "log.retention.hours"),
    "segment.ms": ("log.roll.hours",),
}


def _topic_config_source(broker, key: str, is_default: bool) -> int:
    """Where a topic config's value comes from: the topic, the broker's config, or the default."""
    if not is_default:
        return SOURCE_TOPIC
    broker_keys = (TOPIC_TO_BROKER_KEY[key], *BROKER_FALLBACK_KEYS.get(key, ()))
    if all(broker.config.is_default(k) for k in broker_keys):
        return SOURCE_DEFAULT
    return SOURCE_STATIC_BROKER


def _synonyms(mod, broker, name, source, include: bool, resource_type: int):
    if not include or not hasattr(mod, "DescribeConfigsSynonym"):
        return ()
    if resource_type == RESOURCE_TOPIC and name in TOPIC_TO_BROKER_KEY:
        broker_key = TOPIC_TO_BROKER_KEY[name]
        return (build(mod.DescribeConfigsSynonym, name=broker_key,
                      value=render(broker.config.get(broker_key)),
                      source=SOURCE_DEFAULT if broker.config.is_default(broker_key)
                      else SOURCE_STATIC_BROKER),)
    return ()
