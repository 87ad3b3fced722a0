"""Configuration changed while the broker runs: what may change, how a change is worked out,
and where the broker's own changes are kept.

Kafka's rules, kept here in one place:

- A topic's overrides change with IncrementalAlterConfigs (SET, DELETE, APPEND, SUBTRACT) or
  AlterConfigs (the whole set replaced). Every topic key may change.
- The broker's keys that Kafka lists as dynamic (cluster-wide, which can also be set for one
  broker) change the same way, for the entity "" (the cluster-wide default,
  DYNAMIC_DEFAULT_BROKER_CONFIG) or "<broker id>" (this broker, DYNAMIC_BROKER_CONFIG, which
  wins over the default). Every other broker key is read-only: set in the properties file,
  taken at start.
- A change to a resource is all or nothing: every key is checked (unknown, read-only, bad
  value: INVALID_CONFIG naming the key; the keys together, as at start), then the resource's
  whole new set of overrides is written in one compare-and-set of the metadata store (a
  temp file, fsync, rename), then applied in memory. Nothing changes on any error.

Kept in the metadata store as Kafka kept them in ZooKeeper: ``configs/brokers/<default>`` and
``configs/brokers/<id>``, each a map of key to the text it was set to. A stored value this
version cannot parse is logged and left out at start, as Kafka does.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from ..metadata.store import BadVersion, MetadataStore
from .config import BROKER_CONFIGS, BrokerConfig, ConfigError, ConfigKey, render
from .kafka_broker_keys import KAFKA_ONLY_BROKER_KEYS
from .log_limits import log_safe

log = logging.getLogger(__name__)

# Kafka's AlterConfigOp.OpType ids.
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
OP_NAMES = {SET: "SET", DELETE: "DELETE", APPEND: "APPEND", SUBTRACT: "SUBTRACT"}

DEFAULT_ENTITY = ""  # the broker resource name of the cluster-wide default
_DEFAULT_PATH = "<default>"

# The broker keys Kafka updates without a restart (cluster-wide; each may also be set for one
# broker), among those this broker has: the log's (DynamicLogConfig), the log cleaner's
# (LogCleaner.ReconfigurableConfigs), producer id expiration (KIP-854), oncelog's own
# producer state limits, and the keys kafka_broker_keys.py lists as cluster-wide or
# per-broker (stored and shown; they change nothing here).
DYNAMIC_BROKER_KEYS = frozenset({
    "log.segment.bytes", "log.roll.ms", "log.roll.hours", "log.roll.jitter.ms",
    "log.roll.jitter.hours", "log.index.size.max.bytes", "log.flush.interval.messages",
    "log.flush.interval.ms", "log.retention.bytes", "log.retention.ms",
    "log.retention.minutes", "log.retention.hours", "log.index.interval.bytes",
    "log.cleaner.delete.retention.ms", "log.cleaner.min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms", "log.segment.delete.delay.ms",
    "log.cleaner.min.cleanable.ratio", "log.cleanup.policy", "log.preallocate",
    "log.message.timestamp.type", "log.message.timestamp.before.max.ms",
    "log.message.timestamp.after.max.ms", "log.local.retention.ms",
    "log.local.retention.bytes", "message.max.bytes", "compression.type",
    "compression.gzip.level", "compression.lz4.level", "compression.zstd.level",
    "min.insync.replicas", "unclean.leader.election.enable",
    "log.cleaner.backoff.ms", "log.cleaner.dedupe.buffer.size",
    "producer.id.expiration.ms", "producer.id.tombstone.ms",
    "producer.state.max.producers", "producer.state.batches.to.retain",
    "max.connections", "max.connections.per.ip", "max.connections.per.ip.overrides",
    "max.connection.creation.rate",
}) | {name for name, *_, mode in KAFKA_ONLY_BROKER_KEYS if mode != "read-only"}
assert DYNAMIC_BROKER_KEYS <= BROKER_CONFIGS.keys()


class AlterError(Exception):
    """A change refused as a whole: the Kafka error and a message naming the key."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


@contextlib.contextmanager
def storing(what: str) -> Iterator[None]:
    """One AlterConfigs write to the store: a lost race and a failed disk are the request's
    errors (the client may try again), never the connection's."""
    try:
        yield
    except BadVersion:
        raise AlterError(ErrorCode.invalid_request,
                         f"{what} changed meanwhile; try again") from None
    except OSError as exc:
        raise AlterError(ErrorCode.kafka_storage_error,
                         f"storing the configs failed: {exc}") from None


Op = tuple[str, int, "str | None"]  # (key, operation, value)


def incremental(current: Mapping[str, str], ops: list[Op], specs: Mapping[str, ConfigKey],
                current_value: Callable[[str], Any]) -> dict[str, str]:
    """The overrides (key -> text) after ``ops``, Kafka's IncrementalAlterConfigs rules:
    APPEND and SUBTRACT only on list keys, starting from the override or, without one, the
    value in effect; a key named twice is INVALID_REQUEST."""
    counts = collections.Counter(name for name, _, _ in ops)  # linear: 20,000 ops are fine
    if len(counts) != len(ops):
        twice = sorted(n for n, k in counts.items() if k > 1)
        raise AlterError(ErrorCode.invalid_request,
                         f"Error due to duplicate config keys: {', '.join(twice)}")
    result = dict(current)
    for name, op, value in ops:
        spec = specs.get(name)
        if spec is None:
            raise AlterError(ErrorCode.invalid_config, f"Unknown config name: {name}")
        if op == SET:
            if value is None:
                raise AlterError(ErrorCode.invalid_config, f"{name}: a value is required")
            result[name] = value
        elif op == DELETE:
            result.pop(name, None)
        elif op in (APPEND, SUBTRACT):
            if spec.kind != "LIST":
                raise AlterError(ErrorCode.invalid_config,
                                 f"Config value {OP_NAMES[op].lower()} is not allowed for "
                                 f"config key: {name}")
            base = result.get(name)
            if base is None:
                base = render(current_value(name)) or ""
            items = [i.strip() for i in base.split(",") if i.strip()]
            given = [i.strip() for i in (value or "").split(",") if i.strip()]
            if op == APPEND:  # membership in sets: values of 100,000 items cost linear time
                present = set(items)
                items += [i for i in given if i not in present]
            else:
                dropped = set(given)
                items = [i for i in items if i not in dropped]
            result[name] = ",".join(items)
        else:
            raise AlterError(ErrorCode.invalid_request,
                             f"{name}: unknown config operation {op}")
    return result


def parse_all(texts: Mapping[str, str | None], specs: Mapping[str, ConfigKey],
              what: str) -> dict[str, Any]:
    """Every value parsed; INVALID_CONFIG naming the first bad key."""
    parsed = {}
    for name, text in texts.items():
        spec = specs.get(name)
        if spec is None:
            raise AlterError(ErrorCode.invalid_config, f"Unknown {what} config name: {name}")
        if text is None:
            raise AlterError(ErrorCode.invalid_config, f"{name}: a value is required")
        try:
            parsed[name] = spec.parse(text)
        except ConfigError as exc:
            raise AlterError(ErrorCode.invalid_config,
                             f"Invalid value {text!r} for configuration {name}: {exc}") from None
    return parsed


# --- the broker's dynamic configs ---------------------------------------------------------------

def _path(entity: str) -> str:
    return f"configs/brokers/{entity or _DEFAULT_PATH}"


def load(store: MetadataStore, config: BrokerConfig) -> None:
    """At start: the dynamic configs stored by earlier runs, under the static ones' checks."""
    for entity, layer in ((DEFAULT_ENTITY, config.dynamic_default),
                          (str(config.get("broker.id")), config.dynamic_broker)):
        stored, _ = store.get(_path(entity))
        for name, text in (stored or {}).items():
            try:
                if name not in DYNAMIC_BROKER_KEYS:
                    raise ConfigError("not a dynamic config")
                layer[name] = BROKER_CONFIGS[name].parse(text)
            except (ConfigError, KeyError) as exc:
                log.warning("dynamic broker config %s=%r for %r left out: %s", name,
                            log_safe(text), entity or "<default>", exc)
    try:
        config.check()
    except ConfigError as exc:  # the static file changed under them: static wins
        log.warning("dynamic broker configs left out, they break a rule with the static "
                    "ones: %s", exc)
        config.dynamic_default.clear()
        config.dynamic_broker.clear()


def stored_texts(store: MetadataStore, entity: str) -> tuple[dict[str, str], int]:
    value, version = store.get(_path(entity))
    return dict(value or {}), version


def alter_broker(store: MetadataStore, config: BrokerConfig, entity: str,
                 texts: dict[str, str], version: int, validate_only: bool) -> bool:
    """Make ``texts`` the dynamic configs of ``entity`` ("" or this broker's id): checked,
    stored, then in effect. Returns whether anything changed."""
    read_only = sorted(name for name in texts if name in BROKER_CONFIGS
                       and name not in DYNAMIC_BROKER_KEYS)
    if read_only:
        raise AlterError(ErrorCode.invalid_config,
                         f"Cannot update these configs dynamically: {', '.join(read_only)} "
                         "(read-only: set them in the broker's properties file)")
    parsed = parse_all(texts, BROKER_CONFIGS, "broker")
    layer = "dynamic_default" if entity == DEFAULT_ENTITY else "dynamic_broker"
    before = getattr(config, layer)
    setattr(config, layer, parsed)
    try:
        config.check()
    except ConfigError as exc:
        raise AlterError(ErrorCode.invalid_config, str(exc)) from None
    finally:
        setattr(config, layer, before)
    if validate_only:
        return False
    with storing("the broker's configs"):
        store.compare_and_set(_path(entity), texts, version)
    setattr(config, layer, parsed)
    shown = {k: "[hidden]" if BROKER_CONFIGS[k].kind == "PASSWORD" else v
             for k, v in texts.items()}  # passwords are never logged nor described
    log.info("dynamic broker configs of %s are now %s", entity or "<default>",
             log_safe(shown, 1000))
    return True
