"""CreateTopics and DeleteTopics (configs: configs_admin.py)."""

from __future__ import annotations

import collections
import logging

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.api_versions import CREATE_TOPICS, DELETE_TOPICS
from ...protocol.messages import Request
from ...protocol.schema import build, response_module
from .. import authorize
from ..authorize import Op, Rt
from ..client_quotas import THROTTLING_QUOTA_EXCEEDED_MESSAGE
from ..config import render
from ..log_limits import log_safe
from ..topics import TopicError
from .api_meta import NO_THROTTLE
from .configs_admin import topic_config_source

log = logging.getLogger(__name__)


# Kafka 4's controller refuses a CreateTopics whose topics add up to more partitions than
# one metadata batch holds (MAX_PARTITIONS_PER_BATCH); here it also bounds what one request
# makes the broker create and hold (5 x 100,000 partitions froze every client 11 s).
MAX_PARTITIONS_PER_REQUEST = 10_000


def handle_create_topics(broker, request: Request):
    mod = response_module(CREATE_TOPICS, request.api_version)
    body = request.body
    duplicates = _duplicates(t.name for t in body.topics)
    results = []
    total = sum(_partitions_asked(broker, t) for t in body.topics)
    if total > MAX_PARTITIONS_PER_REQUEST:
        log.info("create topics refused: %d partitions in one request, more than %d", total,
                 MAX_PARTITIONS_PER_REQUEST)
        return build(mod.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(
            _create_refused(mod, name, ErrorCode.policy_violation,
                            "Excessively large number of partitions per request.")
            for name in dict.fromkeys(t.name for t in body.topics)))
    # Cluster Create allows every topic, else Create on each
    names = {t.name for t in body.topics}
    creatable = names if authorize.cluster(broker, request, Op.CREATE, quiet=True) else \
        authorize.allowed_names(broker, request, Op.CREATE, Rt.TOPIC, names)
    shown = authorize.allowed_names(broker, request, Op.DESCRIBE_CONFIGS, Rt.TOPIC,
                                    creatable, quiet=True)
    quota = broker.quotas.mutations(request)  # controller_mutation_rate (KIP-599)
    for t in body.topics:
        if t.name in duplicates:
            continue
        if t.name not in creatable:
            results.append(_create_refused(mod, t.name, ErrorCode.topic_authorization_failed,
                                           "Authorization failed."))
        elif not body.validate_only and quota.refused():
            results.append(_create_refused(mod, t.name, ErrorCode.throttling_quota_exceeded,
                                           THROTTLING_QUOTA_EXCEEDED_MESSAGE))
        else:
            results.append(_create_topic(broker, mod, t, body.validate_only,
                                         t.name in shown))
            if not body.validate_only and results[-1].error_code == ErrorCode.none:
                quota.done(_partitions_asked(broker, t))
    # Kafka refuses every copy of a name given twice and answers for it once: clients match
    # results to topics by name (librdkafka rejects a response naming a topic twice).
    for name in duplicates:
        log.info("create topic %r refused: named more than once in the request",
                 log_safe(name))
        results.append(_create_refused(mod, name, ErrorCode.invalid_request,
                                       "Duplicate topic name."))
    answer = build(mod.CreateTopicsResponse, throttle_time=quota.throttle_time,
                   topics=tuple(results))
    if broker.cluster_mode is not None and not body.validate_only:  # once leaders are elected
        return broker.cluster_mode.answer_when(broker.cluster_mode.created, [
            r.name for r in results if r.error_code == ErrorCode.none], body.timeout, answer)
    return answer


def _partitions_asked(broker, t) -> int:
    if t.assignments:
        return len(t.assignments)
    return t.num_partitions if t.num_partitions != -1 else broker.config.get("num.partitions")


def _duplicates(names) -> list[str]:
    """The names that occur more than once, in order of first occurrence."""
    counts = collections.Counter(names)
    return [name for name, n in counts.items() if n > 1]


def _create_topic(broker, mod, t, validate_only: bool, show_configs: bool = True):
    configs = {c.name: c.value for c in t.configs}
    assignments = {a.partition_index: list(a.broker_ids) for a in t.assignments or ()}
    try:
        if len(assignments) != len(t.assignments or ()):
            raise TopicError(ErrorCode.invalid_replica_assignment,
                             "The manual partition assignment names a partition twice.")
        topic = (broker.cluster_topics or broker.topics).create(
            t.name, t.num_partitions, t.replication_factor, configs,
            validate_only=validate_only, assignments=assignments)
    except TopicError as exc:
        log.info("create topic %r refused: %s", log_safe(t.name), log_safe(exc))
        return _create_refused(mod, t.name, exc.error, str(exc))
    described = () if not (show_configs and hasattr(mod, "CreatableTopicConfigs")) else tuple(
        build(mod.CreatableTopicConfigs, name=key, value=render(value), read_only=False,
              config_source=topic_config_source(broker, topic, key), is_sensitive=False)
        for key, value, _ in broker.topics.describe_topic_configs(topic)
    )
    # A validate_only topic has no partitions to count: answer what would have been made.
    partitions = len(topic.partitions) or len(assignments) or t.num_partitions
    if partitions == -1:
        partitions = broker.config.get("num.partitions")
    return build(mod.CreatableTopicResult, name=t.name, topic_id=topic.topic_id,
                 error_code=ErrorCode.none, error_message=None,
                 # its configs are shown only to who may describe them
                 topic_config_error_code=0 if show_configs
                 else ErrorCode.topic_authorization_failed,
                 num_partitions=partitions,
                 replication_factor=getattr(topic, "replication_factor", 1), configs=described)


def _create_refused(mod, name: str, error: ErrorCode, message: str):
    return build(mod.CreatableTopicResult, name=name, topic_id=None, error_code=error,
                 error_message=message, topic_config_error_code=0, num_partitions=-1,
                 replication_factor=-1, configs=())


def handle_delete_topics(broker, request: Request):
    """Topics by name; from v6 each by name or by id (KIP-516), as Kafka 4 takes them: both,
    or neither, is INVALID_REQUEST, an id no topic has UNKNOWN_TOPIC_ID, a topic named twice
    (by name or id) INVALID_REQUEST."""
    mod = response_module(DELETE_TOPICS, request.api_version)
    body = request.body
    asked = [(t.name, t.topic_id) for t in body.topics] if hasattr(body, "topics") \
        else [(name, None) for name in body.topic_names]
    duplicates = set(_duplicates(asked))
    results = []
    topics = broker.cluster_topics or broker.topics
    quota = broker.quotas.mutations(request)  # controller_mutation_rate (KIP-599)
    for name, topic_id in dict.fromkeys(asked):  # one answer per topic, as for CreateTopics
        error, message = ErrorCode.none, None
        try:
            if (name, topic_id) in duplicates:
                raise TopicError(ErrorCode.invalid_request, "Duplicate topic name or id.")
            if name is not None and topic_id is not None:
                raise TopicError(ErrorCode.invalid_request,
                                 "You may not specify both topic name and topic id.")
            if topic_id is not None:
                topic = topics.by_id(topic_id)
                if topic is None:
                    raise TopicError(ErrorCode.unknown_topic_id, f"No topic has id {topic_id}.")
                name = topic.name
                if not authorize.allowed(broker, request, Op.DESCRIBE, Rt.TOPIC, name):
                    raise TopicError(ErrorCode.topic_authorization_failed,
                                     "Authorization failed.")
            elif name is None:
                raise TopicError(ErrorCode.invalid_request, "Neither topic name nor id given.")
            if not authorize.allowed(broker, request, Op.DELETE, Rt.TOPIC, name):
                raise TopicError(ErrorCode.topic_authorization_failed, "Authorization failed.")
            found = topics.get(name)
            topic_id = topic_id or (found.topic_id if found is not None else None)
            if found is not None and quota.refused():
                raise TopicError(ErrorCode.throttling_quota_exceeded,
                                 THROTTLING_QUOTA_EXCEEDED_MESSAGE)
            topics.delete(name)
            quota.done(len(found.partitions) if found is not None else 0)
            broker.counters.forget_topic(name)
            broker.groups.delete_topic_offsets(name)
        except TopicError as exc:
            error, message = exc.error, str(exc)
        results.append(build(mod.DeletableTopicResult, name=name, topic_id=topic_id,
                             error_code=error, error_message=message))
    answer = build(mod.DeleteTopicsResponse, throttle_time=quota.throttle_time,
                   responses=tuple(results))
    if broker.cluster_mode is not None:  # once the controller removed them
        return broker.cluster_mode.answer_when(broker.cluster_mode.deleted, [
            r.name for r in results if r.error_code == ErrorCode.none], body.timeout, answer)
    return answer


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.CREATE_TOPICS: handle_create_topics,
    apis.DELETE_TOPICS: handle_delete_topics,
}
