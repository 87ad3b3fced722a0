"""Group configs: KIP-848's GROUP config resource (type 32) of DescribeConfigs and
IncrementalAlterConfigs / AlterConfigs, and what the consumer-group coordinator takes from it.

The keys are Kafka 4.1's (GroupConfig). Each falls back to the broker's setting when a group
has no value of its own:

    | key                            | broker default                         | honoured here  |
    |--------------------------------|----------------------------------------|----------------|
    | consumer.session.timeout.ms    | group.consumer.session.timeout.ms      | yes (KIP-848)  |
    | consumer.heartbeat.interval.ms | group.consumer.heartbeat.interval.ms   | yes (KIP-848)  |
    | share.*, streams.*             | Kafka's defaults                       | accepted, shown|
    |                                |                                        | (no share or   |
    |                                |                                        | streams groups)|

Kafka's checks (GroupConfig.validate): the session timeout within
group.consumer.min/max.session.timeout.ms, the heartbeat interval within
group.consumer.min/max.heartbeat.interval.ms and below the session timeout; otherwise
INVALID_CONFIG naming the key. An empty group name is INVALID_REQUEST. A change is checked
whole, stored in one compare-and-set of the metadata store (``configs/groups/<group id>``,
key -> text, as Kafka keeps them), then in effect: the group's next heartbeats get the new
interval, its members' sessions the new timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from ..metadata.store import MetadataStore
from .config import BrokerConfig, ConfigError, ConfigKey, _key
from .dynamic_config import AlterError, parse_all, storing

log = logging.getLogger(__name__)

RESOURCE_GROUP = 32
GROUP_CONFIG = "GROUP_CONFIG"  # ConfigEntry.ConfigSource 8

_PREFIX = "configs/groups/"
_INT = "INT"

# key -> (spec, the broker key it falls back to or None: the spec's default)
_KEYS: dict[str, tuple[ConfigKey, str | None]] = {
    "consumer.session.timeout.ms": (_key(
        "consumer.session.timeout.ms", _INT, 45_000,
        "How long a member of this consumer group may go without a heartbeat."),
        "group.consumer.session.timeout.ms"),
    "consumer.heartbeat.interval.ms": (_key(
        "consumer.heartbeat.interval.ms", _INT, 5_000,
        "How often the members of this consumer group heartbeat."),
        "group.consumer.heartbeat.interval.ms"),
    "share.session.timeout.ms": (_key("share.session.timeout.ms", _INT, 45_000,
                                      "Share groups' session timeout (no share groups here)."),
                                 None),
    "share.heartbeat.interval.ms": (_key("share.heartbeat.interval.ms", _INT, 5_000,
                                         "Share groups' heartbeat interval (unused here)."),
                                    None),
    "share.record.lock.duration.ms": (_key("share.record.lock.duration.ms", _INT, 30_000,
                                           "Share groups' record lock (unused here)."), None),
    "share.auto.offset.reset": (_key("share.auto.offset.reset", "STRING", "latest",
                                     "Share groups' start position (unused here)."), None),
    "share.isolation.level": (_key("share.isolation.level", "STRING", "read_uncommitted",
                                   "Share groups' isolation level (unused here)."), None),
    "streams.session.timeout.ms": (_key("streams.session.timeout.ms", _INT, 45_000,
                                        "Streams groups' session timeout (unused here)."),
                                   None),
    "streams.heartbeat.interval.ms": (_key("streams.heartbeat.interval.ms", _INT, 5_000,
                                           "Streams groups' heartbeat interval (unused)."),
                                      None),
    "streams.num.standby.replicas": (_key("streams.num.standby.replicas", _INT, 0,
                                          "Streams groups' standby replicas (unused here)."),
                                     None),
}
GROUP_CONFIGS: dict[str, ConfigKey] = {name: spec for name, (spec, _) in _KEYS.items()}
# The keys the consumer-group coordinator honours, as ConsumerGroupConfig's fields.
_HONOURED = {"consumer.session.timeout.ms": "session_timeout_ms",
             "consumer.heartbeat.interval.ms": "heartbeat_interval_ms"}


def default(config: BrokerConfig, name: str) -> Any:
    spec, broker_key = _KEYS[name]
    return config.get(broker_key) if broker_key is not None else spec.default


def stored(store: MetadataStore, group_id: str) -> tuple[dict[str, str], int]:
    value, version = store.get(_PREFIX + group_id)
    return dict(value or {}), version


def overrides(store: MetadataStore, group_id: str) -> dict[str, Any]:
    """The ConsumerGroupConfig fields a group's stored configs change (for the coordinator);
    a stored value this version cannot take is left out with a log line."""
    texts, _ = stored(store, group_id)
    out = {}
    for name, text in texts.items():
        try:
            value = GROUP_CONFIGS[name].parse(text)
        except ConfigError as exc:  # left out, as Kafka leaves out what it cannot read
            log.warning("group %s: stored config %s=%r left out: %s", group_id, name, text, exc)
            continue
        if name in _HONOURED:
            out[_HONOURED[name]] = value
    return out


def load_all(store: MetadataStore) -> dict[str, dict[str, Any]]:
    found = {}
    for group_id in store.children(_PREFIX.rstrip("/")):
        values = overrides(store, group_id)
        if values:
            found[group_id] = values
    return found


def describe(broker, group_id: str):
    """(error, message, entries) as configs_admin's _describe gives them."""
    if not group_id:
        return ErrorCode.invalid_request, "Group name can't be empty.", []
    texts, _ = stored(broker.store, group_id)
    entries = []
    for name, spec in GROUP_CONFIGS.items():
        if name in texts:
            try:
                value, source = spec.parse(texts[name]), GROUP_CONFIG
            except ConfigError:  # shown as the default, as ``overrides`` leaves it out
                value, source = default(broker.config, name), "DEFAULT_CONFIG"
        else:
            value, source = default(broker.config, name), "DEFAULT_CONFIG"
        entries.append((name, value, source, False, spec, []))
    return ErrorCode.none, None, entries


def alter(broker, res, validate_only: bool,
          new_texts: Callable[[Any, dict[str, str], Callable[[str], Any]], dict[str, str]]
          ) -> None:
    group_id = res.resource_name
    if not group_id:
        raise AlterError(ErrorCode.invalid_request, "Group name can't be empty.")
    current, version = stored(broker.store, group_id)
    texts = new_texts(res, current, lambda name: default(broker.config, name))
    parsed = parse_all(texts, GROUP_CONFIGS, "group")
    _check(broker.config, {name: parsed.get(name, default(broker.config, name))
                           for name in GROUP_CONFIGS})
    if validate_only:
        return
    with storing("the group's configs"):
        if texts:
            broker.store.compare_and_set(_PREFIX + group_id, texts, version)
        elif version >= 0:
            broker.store.delete(_PREFIX + group_id, version)
    values = {_HONOURED[name]: value for name, value in parsed.items() if name in _HONOURED}
    broker.groups.consumer_groups.set_overrides(group_id, values)
    log.info("configs of group %s are now %s", group_id, texts)


def _check(config: BrokerConfig, values: Mapping[str, Any]) -> None:
    session = values["consumer.session.timeout.ms"]
    heartbeat = values["consumer.heartbeat.interval.ms"]
    bounds = (("consumer.session.timeout.ms", session, "group.consumer.min.session.timeout.ms",
               "group.consumer.max.session.timeout.ms"),
              ("consumer.heartbeat.interval.ms", heartbeat,
               "group.consumer.min.heartbeat.interval.ms",
               "group.consumer.max.heartbeat.interval.ms"))
    for name, value, low, high in bounds:
        if value < config.get(low):
            raise AlterError(ErrorCode.invalid_config,
                             f"{name} must be greater than or equal to {low}")
        if value > config.get(high):
            raise AlterError(ErrorCode.invalid_config,
                             f"{name} must be less than or equal to {high}")
    if heartbeat >= session:
        raise AlterError(ErrorCode.invalid_config,
                         "consumer.heartbeat.interval.ms must be less than "
                         "consumer.session.timeout.ms")
