"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics and the broker.

DescribeConfigs answers what is in effect and where it comes from, as Kafka's ConfigHelper
does: every key with its value (null when unset), its source, ``read_only`` (a broker key
Kafka cannot change without a restart; topic keys and dynamic broker keys are not), the
synonyms it was chosen from (the topic's override, then each broker key it falls back to at
each level: this broker's dynamic value, the cluster-wide dynamic default, the static file, the
default), its type and, on request, its documentation. The broker resource "" is the
cluster-wide dynamic default and lists only what is set there, as Kafka's does.

The alterations are worked out in dynamic_config.py (the rules) and topics.py (a topic's
overrides); this module reads requests and writes answers.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.api_versions import ALTER_CONFIGS, DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS
from ...protocol.messages import Request
from ...protocol.schema import build, response_module
from ...security.acls import CLUSTER_NAME
from .. import authorize, dynamic_config, group_configs
from ..authorize import Op, Rt
from ..config import (
    BROKER_CONFIGS,
    BROKER_FALLBACK_KEYS,
    DEFAULT_CONFIG,
    DYNAMIC_BROKER_CONFIG,
    DYNAMIC_DEFAULT_BROKER_CONFIG,
    TOPIC_CONFIGS,
    TOPIC_TO_BROKER_KEY,
    render,
)
from ..dynamic_config import DEFAULT_ENTITY, DYNAMIC_BROKER_KEYS, AlterError
from ..log_limits import log_safe
from ..topics import TopicError
from .api_meta import NO_THROTTLE

log = logging.getLogger(__name__)

# Kafka's ConfigResource.Type, ConfigEntry.ConfigSource and ConfigType ids.
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_IDS = {"TOPIC_CONFIG": 1, DYNAMIC_BROKER_CONFIG: 2, DYNAMIC_DEFAULT_BROKER_CONFIG: 3,
              "STATIC_BROKER_CONFIG": 4, DEFAULT_CONFIG: 5, group_configs.GROUP_CONFIG: 8}
TOPIC_CONFIG = "TOPIC_CONFIG"
CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "SHORT": 4, "LONG": 5, "DOUBLE": 6,
                "LIST": 7, "CLASS": 8, "PASSWORD": 9}

# A broker key and those that stand for the same setting, the one that wins first (Kafka's
# synonyms: log.retention.ms over log.retention.minutes over log.retention.hours).
_BROKER_SYNONYMS: dict[str, tuple[str, ...]] = {}
for _group in (("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
               ("log.roll.ms", "log.roll.hours"),
               ("log.roll.jitter.ms", "log.roll.jitter.hours"),
               ("log.dirs", "log.dir")):
    for _key in _group:
        _BROKER_SYNONYMS[_key] = _group

Synonym = tuple[str, Any, str]  # (key, value, source)


def _broker_synonyms(config, keys: tuple[str, ...], per_broker: bool = True) -> list[Synonym]:
    """Each level's values of ``keys``, level by level, in Kafka's order."""
    found: list[Synonym] = []
    for source in (DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG,
                   "STATIC_BROKER_CONFIG", DEFAULT_CONFIG):
        if source == DYNAMIC_BROKER_CONFIG and not per_broker:
            continue
        for key in keys:
            found += [(key, value, s) for s, value in config.layers(key) if s == source]
    return found


def broker_entry(config, name: str, per_broker: bool = True) -> tuple[Any, str, list[Synonym]]:
    """(value, source, synonyms) of a broker key."""
    group = _BROKER_SYNONYMS.get(name, (name,))
    synonyms = _broker_synonyms(config, group, per_broker)
    while synonyms and synonyms[0][0] != name:  # those that win over it are its own entries
        synonyms.pop(0)
    source = synonyms[0][2] if synonyms else DEFAULT_CONFIG
    return config.get(name), source, synonyms


def topic_entry(broker, topic, name: str) -> tuple[Any, str, list[Synonym]]:
    """(value, source, synonyms) of a topic key."""
    synonyms: list[Synonym] = []
    value = broker.topics.topic_config(topic, name)
    if name in topic.overrides:
        synonyms.append((name, value, TOPIC_CONFIG))
    broker_key = TOPIC_TO_BROKER_KEY.get(name)
    if broker_key is not None:
        keys = (broker_key, *BROKER_FALLBACK_KEYS.get(name, ()))
        synonyms += _broker_synonyms(broker.config, keys)
    source = synonyms[0][2] if synonyms else DEFAULT_CONFIG
    return value, source, synonyms


def topic_config_source(broker, topic, name: str) -> int:
    """The source id of a topic key (CreateTopics answers it too)."""
    return SOURCE_IDS[topic_entry(broker, topic, name)[1]]


# --- DescribeConfigs ----------------------------------------------------------------------------

def handle_describe_configs(broker, request: Request):
    mod = response_module(DESCRIBE_CONFIGS, request.api_version)
    body = request.body
    with_docs = bool(getattr(body, "include_documentation", False))
    results = []
    for res in body.resources:
        refusal = _config_refusal(broker, request, Op.DESCRIBE_CONFIGS, res)
        error, message, entries = (refusal, None, []) if refusal is not None else \
            _describe(broker, res.resource_type, res.resource_name)
        wanted = res.configuration_keys
        configs = tuple(
            build(mod.DescribeConfigsResourceResult, name=name,
                  value=None if spec.kind == "PASSWORD" else render(value),
                  read_only=read_only, config_source=SOURCE_IDS[source],
                  is_sensitive=spec.kind == "PASSWORD",
                  is_default=source == DEFAULT_CONFIG,
                  synonyms=tuple(
                      build(mod.DescribeConfigsSynonym, name=k,
                            value=None if spec.kind == "PASSWORD" else render(v),
                            source=SOURCE_IDS[s]) for k, v, s in synonyms
                  ) if body.include_synonyms and hasattr(mod, "DescribeConfigsSynonym") else (),
                  config_type=CONFIG_TYPES.get(spec.kind, 0),
                  documentation=spec.doc if with_docs else None)
            for name, value, source, read_only, spec, synonyms in entries
            if wanted is None or name in wanted
        )
        results.append(build(mod.DescribeConfigsResult, error_code=error, error_message=message,
                             resource_type=res.resource_type, resource_name=res.resource_name,
                             configs=configs))
    return build(mod.DescribeConfigsResponse, throttle_time=NO_THROTTLE, results=tuple(results))


# A config resource type's ACL resource and the error for it (Kafka's ConfigResource types:
# a broker's, its loggers' and client metrics' configs are the cluster's).
_CONFIG_ACL = {
    RESOURCE_TOPIC: (Rt.TOPIC, ErrorCode.topic_authorization_failed),
    RESOURCE_BROKER: (Rt.CLUSTER, ErrorCode.cluster_authorization_failed),
    8: (Rt.CLUSTER, ErrorCode.cluster_authorization_failed),  # BROKER_LOGGER
    16: (Rt.CLUSTER, ErrorCode.cluster_authorization_failed),  # CLIENT_METRICS
    group_configs.RESOURCE_GROUP: (Rt.GROUP, ErrorCode.group_authorization_failed),
}


def _config_refusal(broker, request: Request, operation: Op, res) -> ErrorCode | None:
    """DescribeConfigs or AlterConfigs on the resource, else its *_AUTHORIZATION_FAILED."""
    acl = _CONFIG_ACL.get(res.resource_type)
    if acl is None:
        return None  # a type Kafka does not know: refused as unsupported
    resource_type, error = acl
    name = CLUSTER_NAME if resource_type == Rt.CLUSTER else res.resource_name
    return None if authorize.allowed(broker, request, operation, resource_type, name) \
        else error


def _describe(broker, resource_type: int, name: str):
    if resource_type == RESOURCE_TOPIC:
        topic = (broker.cluster_topics or broker.topics).get(name)
        if topic is None:
            return ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist", []
        entries = []
        for key, spec in TOPIC_CONFIGS.items():
            if key == "internal.segment.bytes" and key not in topic.overrides:
                continue  # Kafka's internal key: shown only where set
            value, source, synonyms = topic_entry(broker, topic, key)
            entries.append((key, value, source, False, spec, synonyms))
        return ErrorCode.none, None, entries
    if resource_type == RESOURCE_BROKER:
        problem = _broker_name_problem(broker, name)
        if problem:
            return ErrorCode.invalid_request, problem, []
        config = broker.config
        if name == DEFAULT_ENTITY:
            return ErrorCode.none, None, [
                (key, value, DYNAMIC_DEFAULT_BROKER_CONFIG, False, BROKER_CONFIGS[key],
                 broker_entry(config, key, per_broker=False)[2])
                for key, value in config.dynamic_default.items()]
        entries = []
        for key, spec in BROKER_CONFIGS.items():
            value, source, synonyms = broker_entry(config, key)
            entries.append((key, value, source, key not in DYNAMIC_BROKER_KEYS, spec, synonyms))
        return ErrorCode.none, None, entries
    if resource_type == group_configs.RESOURCE_GROUP:
        return group_configs.describe(broker, name)
    return (ErrorCode.invalid_request,
            f"resource type {resource_type} is not supported (topics: 2, brokers: 4)", [])


def _broker_name_problem(broker, name: str) -> str | None:
    if name in (DEFAULT_ENTITY, str(broker.broker_id)):
        return None
    return (f"Unexpected broker id, expected {broker.broker_id} or empty string, but received "
            f"{name!r}")


# --- AlterConfigs and IncrementalAlterConfigs ---------------------------------------------------

def handle_incremental_alter_configs(broker, request: Request):
    body = request.body

    def new_texts(res, current: dict[str, str], current_value) -> dict[str, str]:
        ops = [(c.name, c.config_operation, c.value) for c in res.configs]
        specs = {RESOURCE_TOPIC: TOPIC_CONFIGS, group_configs.RESOURCE_GROUP:
                 group_configs.GROUP_CONFIGS}.get(res.resource_type, BROKER_CONFIGS)
        return dynamic_config.incremental(current, ops, specs, current_value)

    mod = response_module(INCREMENTAL_ALTER_CONFIGS, request.api_version)
    results = _alter_all(broker, request, body.resources, body.validate_only, new_texts)
    return build(mod.IncrementalAlterConfigsResponse, throttle_time=NO_THROTTLE,
                 responses=tuple(_result(mod, *r) for r in results))


def handle_alter_configs(broker, request: Request):
    body = request.body

    def new_texts(res, current: dict[str, str], current_value) -> dict[str, str]:
        names = [c.name for c in res.configs]
        if len(set(names)) != len(names):
            raise AlterError(ErrorCode.invalid_request, "Error due to duplicate config keys")
        return {c.name: c.value for c in res.configs}

    mod = response_module(ALTER_CONFIGS, request.api_version)
    results = _alter_all(broker, request, body.resources, body.validate_only, new_texts)
    return build(mod.AlterConfigsResponse, throttle_time=NO_THROTTLE,
                 responses=tuple(_result(mod, *r) for r in results))


def _result(mod, res, error: ErrorCode, message: str | None):
    return build(mod.AlterConfigsResourceResponse, error_code=error, error_message=message,
                 resource_type=res.resource_type, resource_name=res.resource_name)


def _alter_all(broker, request: Request, resources, validate_only: bool, new_texts) -> list:
    counts = collections.Counter((r.resource_type, r.resource_name) for r in resources)
    results = []
    broker_changed = False
    for res in resources:
        error, message = ErrorCode.none, None
        try:
            if counts[(res.resource_type, res.resource_name)] > 1:
                raise AlterError(ErrorCode.invalid_request,
                                 f"resource {res.resource_name!r} named more than once")
            refusal = _config_refusal(broker, request, Op.ALTER_CONFIGS, res)
            if refusal is not None:
                results.append((res, refusal, None))
                continue
            if res.resource_type == RESOURCE_TOPIC:
                _alter_topic(broker, res, validate_only, new_texts)
            elif res.resource_type == RESOURCE_BROKER:
                broker_changed |= _alter_broker(broker, res, validate_only, new_texts)
            elif res.resource_type == group_configs.RESOURCE_GROUP:
                group_configs.alter(broker, res, validate_only, new_texts)
            else:
                raise AlterError(ErrorCode.invalid_request,
                                 f"resource type {res.resource_type} is not supported "
                                 "(topics: 2, brokers: 4)")
        except (AlterError, TopicError) as exc:
            error, message = exc.error, str(exc)
            log.info("alter configs of %s %r refused: %s (%s)", _kind(res.resource_type),
                     log_safe(res.resource_name), log_safe(message), error.name)
        results.append((res, error, message))
    if broker_changed:
        broker.topics.reconfigure_all()
        cleaner = broker.log_cleaner
        cleaner.backoff_ms = broker.config.get("log.cleaner.backoff.ms")
        cleaner.map_capacity = broker.config.get("log.cleaner.dedupe.buffer.size")
    return results


def _kind(resource_type: int) -> str:
    return {RESOURCE_TOPIC: "topic", RESOURCE_BROKER: "broker"}.get(resource_type, "resource")


def _alter_topic(broker, res, validate_only: bool, new_texts) -> None:
    topics = broker.cluster_topics or broker.topics
    topic = topics.get(res.resource_name)
    if topic is None:
        raise TopicError(ErrorCode.unknown_topic_or_partition,
                         f"topic {res.resource_name!r} does not exist")
    texts = new_texts(res, topics.override_texts(topic),
                      lambda key: topics.topic_config(topic, key))
    try:
        dynamic_config.parse_all(texts, TOPIC_CONFIGS, "topic")
    except AlterError as exc:
        raise TopicError(exc.error, str(exc)) from None
    topics.alter_configs(res.resource_name, texts, validate_only)


def _alter_broker(broker, res, validate_only: bool, new_texts) -> bool:
    problem = _broker_name_problem(broker, res.resource_name)
    if problem:
        raise AlterError(ErrorCode.invalid_request, problem)
    read_only = sorted(c.name for c in res.configs
                       if c.name in BROKER_CONFIGS and c.name not in DYNAMIC_BROKER_KEYS)
    if read_only:
        raise AlterError(ErrorCode.invalid_config,
                         f"Cannot update these configs dynamically: {', '.join(read_only)} "
                         "(read-only: set them in the broker's properties file)")
    current, version = dynamic_config.stored_texts(broker.store, res.resource_name)
    texts = new_texts(res, current, broker.config.get)
    return dynamic_config.alter_broker(broker.store, broker.config, res.resource_name, texts,
                                       version, validate_only)


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.DESCRIBE_CONFIGS: handle_describe_configs,
    apis.ALTER_CONFIGS: handle_alter_configs,
    apis.INCREMENTAL_ALTER_CONFIGS: handle_incremental_alter_configs,
}
