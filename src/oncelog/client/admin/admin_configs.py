"""What oncelog.Admin's config calls take and return, and their requests: DescribeConfigs,
AlterConfigs and IncrementalAlterConfigs as any Kafka broker answers them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ...protocol.schema import build

# Kafka's ConfigResource.Type ids, by the names kafka-configs.sh uses (and the singular).
RESOURCE_TYPES = {"topic": 2, "topics": 2, "broker": 4, "brokers": 4}
SOURCES = {0: "UNKNOWN", 1: "TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
           3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG",
           6: "DYNAMIC_BROKER_LOGGER_CONFIG", 7: "CLIENT_METRICS_CONFIG", 8: "GROUP_CONFIG"}
CONFIG_TYPES = {0: "UNKNOWN", 1: "BOOLEAN", 2: "STRING", 3: "INT", 4: "SHORT", 5: "LONG",
                6: "DOUBLE", 7: "LIST", 8: "CLASS", 9: "PASSWORD"}
OPERATIONS = {"SET": 0, "DELETE": 1, "APPEND": 2, "SUBTRACT": 3}


@dataclass(frozen=True, slots=True)
class ConfigResource:
    """A topic, or a broker: ``name`` its id, or "" for the cluster-wide default."""

    type: str  # "topic" or "broker"
    name: str

    def __post_init__(self) -> None:
        if self.type not in RESOURCE_TYPES:
            raise ValueError(f"resource type must be topic or broker, not {self.type!r}")
        object.__setattr__(self, "type", self.type.rstrip("s"))  # one spelling: equal keys

    @property
    def type_id(self) -> int:
        return RESOURCE_TYPES[self.type]


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: str


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: str  # Kafka's ConfigSource name: TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, ...
    read_only: bool
    sensitive: bool
    synonyms: tuple[ConfigSynonym, ...] = ()
    config_type: str = "UNKNOWN"
    documentation: str | None = None

    @property
    def is_default(self) -> bool:
        return self.source == "DEFAULT_CONFIG"


@dataclass(frozen=True, slots=True)
class AlterConfigOp:
    """One change of IncrementalAlterConfigs: SET, DELETE, APPEND or SUBTRACT (the last two
    on list keys, comma-separated items)."""

    name: str
    op: str = "SET"
    value: str | None = None

    def __post_init__(self) -> None:
        if self.op not in OPERATIONS:
            raise ValueError(f"op must be one of {', '.join(OPERATIONS)}, not {self.op!r}")


def describe_request(resources: list[ConfigResource], keys: Iterable[str] | None,
                     synonyms: bool, documentation: bool):
    wanted = None if keys is None else tuple(keys)

    def make(mod, version):
        return build(mod.DescribeConfigsRequest, resources=tuple(
            build(mod.DescribeConfigsResource, resource_type=r.type_id, resource_name=r.name,
                  configuration_keys=wanted) for r in resources),
            include_synonyms=synonyms, include_documentation=documentation)
    return make


def read_entries(result) -> dict[str, ConfigEntry]:
    entries = {}
    for c in result.configs:
        source = getattr(c, "config_source", None)
        if source is None:  # v0 says only whether it is the default
            source = 5 if c.is_default else 4
        entries[c.name] = ConfigEntry(
            c.name, c.value, SOURCES.get(source, "UNKNOWN"), c.read_only, c.is_sensitive,
            tuple(ConfigSynonym(s.name, s.value, SOURCES.get(s.source, "UNKNOWN"))
                  for s in getattr(c, "synonyms", ())),
            CONFIG_TYPES.get(getattr(c, "config_type", 0), "UNKNOWN"),
            getattr(c, "documentation", None))
    return entries


def incremental_request(changes: Mapping[ConfigResource, Iterable[AlterConfigOp]],
                        validate_only: bool):
    def make(mod, version):
        return build(mod.IncrementalAlterConfigsRequest, resources=tuple(
            build(mod.AlterConfigsResource, resource_type=r.type_id, resource_name=r.name,
                  configs=tuple(build(mod.AlterableConfig, name=op.name,
                                      config_operation=OPERATIONS[op.op], value=op.value)
                                for op in ops))
            for r, ops in changes.items()), validate_only=validate_only)
    return make


def alter_request(configs: Mapping[ConfigResource, Mapping[str, str]], validate_only: bool):
    def make(mod, version):
        return build(mod.AlterConfigsRequest, resources=tuple(
            build(mod.AlterConfigsResource, resource_type=r.type_id, resource_name=r.name,
                  configs=tuple(build(mod.AlterableConfig, name=k, value=v)
                                for k, v in values.items()))
            for r, values in configs.items()), validate_only=validate_only)
    return make


def resource_of(result) -> ConfigResource:
    kind = "topic" if result.resource_type == 2 else "broker"
    return ConfigResource(kind, result.resource_name)


def outcome(result) -> tuple[ErrorCode, str | None]:
    return result.error_code, result.error_message
