"""Broker and topic configuration: Kafka's keys, types, defaults, and the .properties format.

Every key the broker accepts is declared once in BROKER_CONFIGS; an unknown key is an error
naming the key. Topic configs (TOPIC_CONFIGS) fall back to the broker key they shadow, as in
Kafka (``segment.bytes`` defaults to ``log.segment.bytes``).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..metadata.zookeeper import parse_connect
from ..protocol.validation import DEFAULT_AFTER_MAX_MS, DEFAULT_BEFORE_MAX_MS
from ..security.principal_mapping import parse_rules
from .kafka_broker_keys import KAFKA_ONLY_BROKER_KEYS
from .listeners import (
    SECURITY_PROTOCOLS,
    Endpoint,
    inter_broker_listener,
    listener_override,
    parse_listeners,
    parse_protocol_map,
)

LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1


class ConfigError(ValueError):
    pass


def parse_log_dirs(text: str) -> list[str]:
    """log.dirs as Kafka reads it: comma-separated, each directory once; ConfigError names
    the key otherwise."""
    dirs = [d.strip() for d in text.split(",")]
    if not all(dirs):
        raise ConfigError(f"log.dirs: an empty directory name in {text!r}")
    real = [os.path.realpath(d) for d in dirs]
    if len(set(real)) != len(real):
        raise ConfigError(f"log.dirs: a directory is named twice in {text!r}")
    return dirs


def _parse_int(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ConfigError(f"expected an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise ConfigError(f"{value} is outside {lo}..{hi}")
        return value

    return parse


def _parse_ratio(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ConfigError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{value} is outside 0..1")
    return value


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ConfigError(f"expected true or false, got {text!r}")


def _parse_str(text: str) -> str:
    return text.strip()


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip()
        if value not in choices:
            raise ConfigError(f"expected one of {', '.join(choices)}, got {text!r}")
        return value

    return parse


_ASSIGNOR_CLASSES = {
    "org.apache.kafka.coordinator.group.assignor.UniformAssignor": "uniform",
    "org.apache.kafka.coordinator.group.assignor.RangeAssignor": "range",
}


def _migration_policy(text: str) -> str:
    # Kafka's ConsumerGroupMigrationPolicy: case insensitive.
    value = text.strip().lower()
    if value not in ("disabled", "downgrade", "upgrade", "bidirectional"):
        raise ConfigError(f"expected one of disabled, downgrade, upgrade, bidirectional, "
                          f"got {text!r}")
    return value


def _parse_assignors(text: str) -> str:
    names = [_ASSIGNOR_CLASSES.get(n.strip(), n.strip()) for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ("uniform", "range")]
    if not names or unknown:
        raise ConfigError(f"expected a list of uniform and range, got {text!r}")
    return ",".join(dict.fromkeys(names))


def _check_consumer_group_bounds(config: BrokerConfig) -> None:
    """Kafka's GroupCoordinatorConfig rules for the consumer protocol's timings."""
    prefix = "group.consumer."
    for what in ("session.timeout.ms", "heartbeat.interval.ms"):
        value = config.get(prefix + what)
        lo, hi = config.get(f"{prefix}min.{what}"), config.get(f"{prefix}max.{what}")
        if not lo <= value <= hi:
            raise ConfigError(f"{prefix}{what} ({value}) must be within {prefix}min.{what} "
                              f"({lo}) and {prefix}max.{what} ({hi})")
    if config.get(prefix + "heartbeat.interval.ms") >= config.get(prefix + "session.timeout.ms"):
        raise ConfigError(f"{prefix}heartbeat.interval.ms must be less than "
                          f"{prefix}session.timeout.ms")


# compression.type's values: Kafka's names; "producer" keeps what the producer sent.
COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")


def parse_connection_overrides(text: str) -> dict[str, int]:
    """``host:count,host:count`` (Kafka's syntax; an IPv6 address may have colons, the
    count is after the last one) -> address -> count. A host name is resolved once."""
    overrides: dict[str, int] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        host = host.strip().strip("[]")
        try:
            value = int(count.strip())
        except ValueError:
            value = -1
        if not sep or not host or value < 0:
            raise ConfigError(f"Invalid format for max.connections.per.ip.overrides entry "
                              f"{item!r}: expected host:count with count >= 0")
        overrides[_address(host)] = value
    return overrides


def _address(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host)
    except OSError:
        raise ConfigError(f"max.connections.per.ip.overrides: cannot resolve {host!r}") from None


def _connection_overrides(text: str) -> str:
    parse_connection_overrides(text)
    return text.strip()


def _gzip_level(text: str) -> int:
    value = _parse_int(-1, 9)(text)
    if value == 0:
        raise ConfigError("expected 1..9 or -1, got 0")
    return value


def _throttled_replicas(text: str) -> str:
    """Kafka's list of partition:broker pairs, or * for all (stored only: no replication)."""
    value = text.strip()
    if value in ("", "*") or re.fullmatch(r"\d+:\d+(\s*,\s*\d+:\d+)*", value):
        return value
    raise ConfigError(f"expected * or partition:broker pairs separated by commas, got {text!r}")


def _no_tiered_storage(text: str) -> bool:
    if _parse_bool(text):
        raise ConfigError("tiered storage is not available on this broker")
    return False


@dataclass(frozen=True, slots=True)
class ConfigKey:
    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    kind: str  # Kafka's ConfigType name for DescribeConfigs: INT, LONG, DOUBLE, BOOLEAN, STRING,
    #            LIST


def _key(name: str, kind: str, default: Any, doc: str, parse: Callable[[str], Any] | None = None):
    if parse is None:
        parse = {
            "INT": _parse_int(-(1 << 31), INT_MAX),
            "LONG": _parse_int(-(1 << 63), LONG_MAX),
            "BOOLEAN": _parse_bool,
            "STRING": _parse_str,
            "LIST": _parse_str,
            "DOUBLE": _parse_ratio,
        }[kind]
    return ConfigKey(name, parse, default, doc, kind)


def _cleanup_policy(text: str) -> str:
    """Kafka's list: ``delete``, ``compact``, both, or empty (KIP-1161: neither, so nothing
    is ever removed but by DeleteRecords, as retention.ms=-1 and retention.bytes=-1 would
    have it); a policy named twice counts once."""
    policies = [p.strip() for p in text.split(",")] if text.strip() else []
    if not all(p in ("delete", "compact") for p in policies):
        raise ConfigError(f"expected delete, compact or both (comma-separated), or nothing, "
                          f"got {text!r}")
    return ",".join(dict.fromkeys(policies))


def is_compacted(cleanup_policy: str) -> bool:
    return "compact" in cleanup_policy.split(",")


_POSITIVE_INT = _parse_int(1, INT_MAX)


def _authorizer_class(text: str) -> str:
    name = text.strip()
    if name and name not in _AUTHORIZERS:
        raise ConfigError(f"expected empty (no authorizer) or one of {', '.join(_AUTHORIZERS)}, "
                          f"got {text!r}")
    return name


_AUTHORIZERS = ("kafka.security.authorizer.AclAuthorizer",
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer")


def _zookeeper_connect(text: str) -> str:
    try:
        parse_connect(text)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return text.strip()


# Kafka 4's least segment.bytes and log.segment.bytes (KIP-1030): smaller segments would cost
# a file (and a descriptor) per few records. Tests go lower with internal.segment.bytes.
SEGMENT_BYTES_MIN = 1 << 20
# Twice the largest request (socket.request.max.bytes): one request of any allowed size can
# be read while another is handled, and request memory stays under 300 MiB in all.
QUEUED_MAX_REQUEST_BYTES_DEFAULT = 209_715_200
_NON_NEGATIVE_LONG = _parse_int(0, LONG_MAX)
_RETENTION = _parse_int(-1, LONG_MAX)

def _protocol_map(text: str) -> str:
    try:
        parse_protocol_map(text)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return text.strip()


def _sasl_mechanisms(text: str) -> str:
    names = [n.strip().upper() for n in text.split(",") if n.strip()]
    return ",".join(dict.fromkeys(names))


def _pem_only(text: str) -> str:
    value = text.strip().upper()
    if value != "PEM":
        raise ConfigError(f"oncelog reads PEM files only (Kafka's ssl.*.type=PEM), got {text!r}")
    return value


def _mapping_rules(text: str) -> str:
    try:
        parse_rules(text)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return text


def _tls_versions(text: str) -> str:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        _one_of("TLSv1.2", "TLSv1.3")(name)
    if not names:
        raise ConfigError("expected TLSv1.2 and/or TLSv1.3")
    return ",".join(names)


# Authentication (issue 25): Kafka's names; per listener as listener.name.<name>.<key>.
SECURITY_KEYS = (
    _key("listener.security.protocol.map", "STRING",
         "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT",
         "Each listener name's security protocol, as NAME:PROTOCOL pairs.", _protocol_map),
    _key("sasl.enabled.mechanisms", "LIST", "GSSAPI",
         "The SASL mechanisms a SASL_PLAINTEXT or SASL_SSL listener offers: PLAIN, "
         "SCRAM-SHA-256, SCRAM-SHA-512 (GSSAPI, Kafka's default, is not available).",
         _sasl_mechanisms),
    _key("connection.failed.authentication.delay.ms", "INT", 100,
         "How long a failed authentication waits before it is answered and the connection "
         "closed (ms).", _parse_int(0, INT_MAX)),
    _key("connections.max.reauth.ms", "LONG", 0,
         "KIP-368: a SASL session's lifetime (ms), told to the client, which re-authenticates "
         "on the same connection before it ends or has the connection closed at its next "
         "request; 0: sessions never end. Per listener and mechanism as "
         "listener.name.<listener>.<mechanism>.connections.max.reauth.ms.",
         _parse_int(0, LONG_MAX)),
    _key("ssl.keystore.type", "STRING", "PEM", "PEM only.", _pem_only),
    _key("ssl.keystore.location", "STRING", None,
         "A PEM file with the listener's certificate chain and private key."),
    _key("ssl.keystore.certificate.chain", "PASSWORD", None,
         "The certificate chain in PEM, in place of ssl.keystore.location.", _parse_str),
    _key("ssl.keystore.key", "PASSWORD", None,
         "The private key in PEM, with ssl.keystore.certificate.chain.", _parse_str),
    _key("ssl.key.password", "PASSWORD", None,
         "The password of an encrypted private key.", _parse_str),
    _key("ssl.truststore.type", "STRING", "PEM", "PEM only.", _pem_only),
    _key("ssl.truststore.location", "STRING", None,
         "A PEM file with the CA certificates that sign client certificates."),
    _key("ssl.truststore.certificates", "PASSWORD", None,
         "The CA certificates in PEM, in place of ssl.truststore.location.", _parse_str),
    _key("ssl.client.auth", "STRING", "none",
         "Mutual TLS: required, requested (checked when given) or none.",
         _one_of("required", "requested", "none")),
    _key("ssl.enabled.protocols", "LIST", "TLSv1.2,TLSv1.3", "TLS versions accepted.",
         _tls_versions),
    _key("ssl.principal.mapping.rules", "STRING", "DEFAULT",
         "A client certificate's principal: rules RULE:pattern/replacement/[LU] and DEFAULT "
         "(User:<the subject's distinguished name>), the first whose pattern matches the "
         "whole subject applies; none: the connection is refused.", _mapping_rules),
    _key("ssl.endpoint.identification.algorithm", "STRING", "https",
         "A broker reaching another over TLS: https checks that the certificate names the "
         "host it registered; empty: it need not.", _one_of("https", "HTTPS", "")),
    # Cluster mode: how brokers reach each other (followers fetching from leaders).
    _key("inter.broker.listener.name", "STRING", None,
         "The listener brokers reach each other on (one of advertised.listeners); not with "
         "security.inter.broker.protocol."),
    _key("security.inter.broker.protocol", "STRING", "PLAINTEXT",
         "The listener named as this protocol is the brokers' when inter.broker.listener.name "
         "is not set.", _one_of(*SECURITY_PROTOCOLS)),
    _key("sasl.mechanism.inter.broker.protocol", "STRING", "GSSAPI",
         "The SASL mechanism a broker authenticates with to another, as the username and "
         "password of listener.name.<listener>.<mechanism>.sasl.jaas.config."),
)


def _listener_key(name: str) -> ConfigKey | None:
    """The ConfigKey of a listener.name.<listener>.<key> override: a security key, or a
    mechanism's sasl.jaas.config (accepted as Kafka's brokers need it; PLAIN's user_ entries
    are its users)."""
    found = listener_override(name)
    if found is None:
        return None
    key = found[1]
    if re.fullmatch(r"[a-z0-9-]+\.sasl\.jaas\.config", key):
        return ConfigKey(name, _parse_str, None, "A mechanism's JAAS configuration.", "PASSWORD")
    if re.fullmatch(r"([a-z0-9-]+\.)?connections\.max\.reauth\.ms", key):  # KIP-368
        return BROKER_CONFIGS["connections.max.reauth.ms"]
    if (key.startswith(("ssl.", "sasl.")) or key == "max.connection.creation.rate") \
            and key in BROKER_CONFIGS:
        return BROKER_CONFIGS[key]
    return None


BROKER_CONFIGS: dict[str, ConfigKey] = {k.name: k for k in (
    _key("broker.id", "INT", 0, "The id of this broker.", _parse_int(0, INT_MAX)),
    _key("zookeeper.connect", "STRING", None,
         "Cluster mode: host:port[,host:port...][/chroot] of ZooKeeper, where the broker "
         "registers, elects the controller and claims producer-id blocks; unset: one broker "
         "alone, no ZooKeeper.", _zookeeper_connect),
    _key("authorizer.class.name", "STRING", "",
         "Empty: no authorizer, everyone may do everything. Kafka's AclAuthorizer or "
         "StandardAuthorizer class name: ACLs decide (CreateAcls, `oncelog acls`).",
         _authorizer_class),
    _key("super.users", "STRING", None,
         "Principals the authorizer allows everything, `User:a;User:b`."),
    _key("allow.everyone.if.no.acl.found", "BOOLEAN", False,
         "With an authorizer: a resource no ACL names is open to everyone."),
    _key("zookeeper.session.timeout.ms", "INT", 18_000,
         "The ZooKeeper session timeout (ms): a broker silent this long is gone from the "
         "cluster.", _POSITIVE_INT),
    _key("zookeeper.connection.timeout.ms", "INT", None,
         "How long the broker waits to reach ZooKeeper at start before it exits with an error "
         "(ms); unset: zookeeper.session.timeout.ms.", _POSITIVE_INT),
    _key("replica.lag.time.max.ms", "LONG", 30_000,
         "Cluster mode: a follower not caught up with its leader this long leaves the ISR "
         "(ms).", _parse_int(1, LONG_MAX)),
    _key("replica.fetch.wait.max.ms", "INT", 500,
         "Cluster mode: how long a follower's Fetch waits at the leader for data (ms).",
         _POSITIVE_INT),
    _key("replica.fetch.max.bytes", "INT", 1_048_576,
         "Cluster mode: bytes a follower's Fetch asks for per partition.", _POSITIVE_INT),
    _key("replica.fetch.response.max.bytes", "INT", 10_485_760,
         "Cluster mode: bytes a follower's Fetch asks for in all.", _POSITIVE_INT),
    _key("replica.fetch.backoff.ms", "INT", 1000,
         "Cluster mode: a follower's wait before fetching again after an error (ms; at most "
         "a second is waited).", _parse_int(0, INT_MAX)),
    _key("replica.high.watermark.checkpoint.interval.ms", "LONG", 5000,
         "Cluster mode: how often each partition's high watermark is written to its "
         "replication-offset-checkpoint (ms).", _parse_int(1, LONG_MAX)),
    _key("listeners", "STRING", "PLAINTEXT://127.0.0.1:9092",
         "Where the broker listens: NAME://host:port, comma-separated, each name mapped to a "
         "security protocol by listener.security.protocol.map (port 0 picks a free port)."),
    _key("advertised.listeners", "STRING", None,
         "What Metadata tells a client that came in on a listener to connect to, as "
         "NAME://host:port per listener; a listener not named: where it is bound."),
    *SECURITY_KEYS,
    _key("metrics.listener", "STRING", "",
         "Where /metrics (Prometheus text) is served over HTTP, as host:port (port 0 picks a "
         "free port); empty: not served. Never on the Kafka port."),
    _key("metrics.partition.series.max", "INT", 1000,
         "Series each per-partition metric keeps (the partitions with the largest values); "
         "oncelog_partition_series_omitted counts the rest.", _POSITIVE_INT),
    _key("log.dirs", "STRING", "./data",
         "The directories holding the partitions' logs, comma-separated (JBOD). The first also "
         "holds the broker's metadata (.oncelog-metadata)."),
    _key("log.dir", "STRING", "./data", "Used when log.dirs is not set."),
    _key("max.broker.partitions", "INT", 100_000,
         "Partitions this broker holds at most (KIP-578's name); CreateTopics, CreatePartitions "
         "and auto-creation past it are refused with POLICY_VIOLATION. Internal topics are "
         "exempt.", _POSITIVE_INT),
    _key("num.partitions", "INT", 1, "Partitions of an auto-created topic.", _POSITIVE_INT),
    _key("default.replication.factor", "INT", 1,
         "Replication factor of topics created without one (auto-created, or -1); above 1 "
         "only in cluster mode (zookeeper.connect).", _POSITIVE_INT),
    _key("auto.create.topics.enable", "BOOLEAN", True,
         "Create a topic when a client asks Metadata for it."),
    _key("delete.topic.enable", "BOOLEAN", True, "Allow DeleteTopics."),
    _key("log.segment.bytes", "INT", 1 << 30, "Size at which a segment is rolled.",
         _parse_int(SEGMENT_BYTES_MIN, INT_MAX)),
    _key("log.internal.segment.bytes", "INT", None,
         "For tests only: the default of internal.segment.bytes (segments smaller than "
         "log.segment.bytes allows).", _parse_int(14, INT_MAX)),
    _key("log.roll.ms", "LONG", None, "Age at which a segment is rolled (ms).",
         _parse_int(1, LONG_MAX)),
    _key("log.roll.hours", "INT", 168, "Age at which a segment is rolled (hours).",
         _POSITIVE_INT),
    _key("log.retention.ms", "LONG", None, "How long data is kept (ms); -1 keeps it forever.",
         _RETENTION),
    _key("log.retention.minutes", "INT", None, "How long data is kept (minutes).",
         _parse_int(-1, INT_MAX)),
    _key("log.retention.hours", "INT", 168, "How long data is kept (hours).",
         _parse_int(-1, INT_MAX)),
    _key("log.retention.bytes", "LONG", -1, "Size a partition is trimmed to; -1: no limit.",
         _RETENTION),
    _key("log.retention.check.interval.ms", "LONG", 300_000,
         "How often retention is applied (ms).", _parse_int(1, LONG_MAX)),
    _key("log.flush.interval.messages", "LONG", LONG_MAX,
         "Messages appended before the log is fsynced.", _parse_int(1, LONG_MAX)),
    _key("log.flush.interval.ms", "LONG", LONG_MAX,
         "Time after which unflushed messages are fsynced (ms).", _NON_NEGATIVE_LONG),
    _key("log.flush.scheduler.interval.ms", "LONG", 1000,
         "How often the time-based flush is checked (ms).", _parse_int(1, LONG_MAX)),
    _key("log.index.interval.bytes", "INT", 4096, "Bytes between offset index entries.",
         _parse_int(0, INT_MAX)),
    _key("log.cleanup.policy", "LIST", "delete",
         "delete and/or compact: delete applies retention; compact refuses records without "
         "a key and lets the log cleaner keep only the latest record of each key.",
         _cleanup_policy),
    _key("log.cleaner.enable", "BOOLEAN", True,
         "Run the log cleaner, which compacts the logs of topics with cleanup.policy "
         "compact."),
    _key("log.cleaner.backoff.ms", "LONG", 15_000,
         "How long the log cleaner sleeps when no log needs cleaning (ms).",
         _NON_NEGATIVE_LONG),
    _key("log.cleaner.dedupe.buffer.size", "LONG", 134_217_728,
         "Memory for the key -> offset map of one clean (bytes, estimated); a dirty section "
         "with more keys is cleaned in several passes.", _parse_int(1 << 20, LONG_MAX)),
    _key("log.cleaner.delete.retention.ms", "LONG", 86_400_000,
         "How long a tombstone (a null value) stays after its first clean (ms).",
         _NON_NEGATIVE_LONG),
    _key("log.cleaner.min.cleanable.ratio", "DOUBLE", 0.5,
         "Dirty share of a log (bytes not yet cleaned over all) from which it is cleaned.",
         _parse_ratio),
    _key("log.cleaner.min.compaction.lag.ms", "LONG", 0,
         "Records younger than this are not compacted (ms).", _NON_NEGATIVE_LONG),
    _key("log.cleaner.max.compaction.lag.ms", "LONG", LONG_MAX,
         "Records older than this are compacted whatever the dirty ratio (ms); the active "
         "segment of a compacted log rolls at this age.", _parse_int(1, LONG_MAX)),
    _key("log.message.timestamp.type", "STRING", "CreateTime",
         "CreateTime (the producer's) or LogAppendTime (the broker's clock when it appends).",
         _one_of("CreateTime", "LogAppendTime")),
    _key("log.message.timestamp.before.max.ms", "LONG", DEFAULT_BEFORE_MAX_MS,
         "With CreateTime, how far a record's timestamp may lie before the broker's clock.",
         _NON_NEGATIVE_LONG),
    _key("log.message.timestamp.after.max.ms", "LONG", DEFAULT_AFTER_MAX_MS,
         "With CreateTime, how far a record's timestamp may lie after the broker's clock.",
         _NON_NEGATIVE_LONG),
    _key("message.max.bytes", "INT", 1_048_588, "Largest record batch accepted.",
         _parse_int(0, INT_MAX)),
    _key("compression.type", "STRING", "producer",
         "The codec batches are stored with: producer keeps each batch as its producer "
         "compressed it; uncompressed, gzip, snappy, lz4 or zstd has the broker recompress a "
         "batch sent with another codec.", _one_of(*COMPRESSION_TYPES)),
    _key("compression.gzip.level", "INT", -1,
         "gzip level of batches the broker recompresses (1..9, or -1: the codec's default).",
         _gzip_level),
    _key("compression.lz4.level", "INT", 9, "lz4 level of batches the broker recompresses.",
         _parse_int(1, 17)),
    _key("compression.zstd.level", "INT", 3, "zstd level of batches the broker recompresses.",
         _parse_int(-131072, 22)),
    _key("min.insync.replicas", "INT", 1,
         "Replicas that must have a batch before acks=all answers it (cluster mode; one "
         "broker alone is always the whole in-sync set).", _POSITIVE_INT),
    _key("unclean.leader.election.enable", "BOOLEAN", False,
         "Whether a replica outside the in-sync set may become leader (stored; used once "
         "replication comes)."),
    _key("auto.leader.rebalance.enable", "BOOLEAN", True,
         "Cluster mode: the controller moves leadership back to each partition's preferred "
         "replica when a broker leads too few of the partitions it is preferred for."),
    _key("leader.imbalance.check.interval.seconds", "LONG", 300,
         "How often the controller checks the leader balance.", _parse_int(1, LONG_MAX)),
    _key("leader.imbalance.per.broker.percentage", "INT", 10,
         "The share of a broker's preferred partitions it may lead elsewhere before the "
         "controller rebalances them.", _parse_int(0, 100)),
    _key("log.segment.delete.delay.ms", "LONG", 60_000,
         "Kafka's wait before a deleted segment's files go (accepted; oncelog deletes them "
         "at once).", _NON_NEGATIVE_LONG),
    _key("log.preallocate", "BOOLEAN", False,
         "Kafka's preallocation of new segment files (accepted; oncelog does not "
         "preallocate)."),
    _key("log.index.size.max.bytes", "INT", 10_485_760,
         "Kafka's offset index size limit (accepted; oncelog's indexes grow as needed).",
         _parse_int(4, INT_MAX)),
    _key("log.roll.jitter.ms", "LONG", None,
         "Kafka's random jitter subtracted from segment.ms (accepted; oncelog rolls without "
         "jitter).", _NON_NEGATIVE_LONG),
    _key("log.roll.jitter.hours", "INT", 0, "log.roll.jitter.ms in hours.",
         _parse_int(0, INT_MAX)),
    _key("log.local.retention.ms", "LONG", -2,
         "Tiered storage's local retention (accepted; this broker has no tiered storage).",
         _parse_int(-2, LONG_MAX)),
    _key("log.local.retention.bytes", "LONG", -2,
         "Tiered storage's local retention (accepted; this broker has no tiered storage).",
         _parse_int(-2, LONG_MAX)),
    _key("socket.request.max.bytes", "INT", 104_857_600, "Largest request frame accepted.",
         _POSITIVE_INT),
    _key("fetch.max.bytes", "INT", 57_671_680,
         "Largest Fetch answer: record bytes past it are left for the next Fetch (one batch "
         "more at most, when the first is larger), whatever max_bytes the request asks.",
         _parse_int(1024, INT_MAX)),
    _key("queued.max.requests", "INT", 500,
         "Requests read and waiting only for a handler (not for a long-polling Fetch ahead "
         "of them, nor for their client to read answers), across the broker, before "
         "connections stop reading.", _POSITIVE_INT),
    _key("queued.max.request.bytes", "LONG", QUEUED_MAX_REQUEST_BYTES_DEFAULT,
         "Bytes of requests read (a large one from its size prefix on) and not yet handled, "
         "across the broker, before connections stop reading; at least "
         "socket.request.max.bytes, or -1 (or 0) for no limit (Kafka's default). Finite here "
         "because a Python process has no heap limit to stop it, where Kafka's JVM has one.",
         _parse_int(-1, LONG_MAX)),
    # Connections and client quotas (connection_limits.py, client_quotas.py).
    _key("max.connections", "INT", INT_MAX,
         "Connections the broker keeps; one more is closed at once.", _parse_int(0, INT_MAX)),
    _key("max.connections.per.ip", "INT", INT_MAX,
         "Connections one address may have; one more is closed at once.",
         _parse_int(0, INT_MAX)),
    _key("max.connection.creation.rate", "INT", INT_MAX,
         "New connections a second the broker takes on its listeners but the inter-broker "
         "one (KIP-612); one over it is served only once the rate is back under it. Per "
         "listener as listener.name.<listener>.max.connection.creation.rate.",
         _parse_int(0, INT_MAX)),
    _key("max.connections.per.ip.overrides", "STRING", "",
         "host:count,... per-address limits in place of max.connections.per.ip.",
         _connection_overrides),
    _key("connections.max.idle.ms", "LONG", 600_000,
         "A connection with nothing read or written for this long is closed (-1: never).",
         _parse_int(-1, LONG_MAX)),
    _key("quota.window.num", "INT", 11,
         "Samples a client quota's rate is measured over.", _parse_int(1, INT_MAX)),
    _key("quota.window.size.seconds", "INT", 1,
         "Length of each client quota sample.", _parse_int(1, INT_MAX)),
    _key("controller.quota.window.num", "INT", 11,
         "controller_mutation_rate: a client may make this many windows' worth of mutations "
         "at once (KIP-599's burst).", _parse_int(1, INT_MAX)),
    _key("controller.quota.window.size.seconds", "INT", 1,
         "controller_mutation_rate: the length of each of those windows.",
         _parse_int(1, INT_MAX)),
    _key("producer.id.expiration.ms", "INT", 86_400_000,
         "Idle time after which a producer's state moves out of memory to a compact record.",
         _parse_int(1, INT_MAX)),
    _key("producer.id.expiration.check.interval.ms", "INT", 600_000,
         "How often idle producers are looked for (ms).", _parse_int(1, INT_MAX)),
    _key("producer.id.tombstone.ms", "LONG", 604_800_000,
         "How long the compact record of an expired producer is kept (ms).",
         _parse_int(0, LONG_MAX)),
    _key("producer.state.max.producers", "INT", 100_000,
         "Producers kept in memory per partition; the least recently active are moved to "
         "compact records beyond this.", _POSITIVE_INT),
    _key("producer.state.batches.to.retain", "INT", 5,
         "Batches remembered per producer per partition to answer retries as duplicates.",
         _parse_int(1, 255)),
    # The transaction coordinator (Kafka's names and defaults).
    _key("transaction.state.log.num.partitions", "INT", 50,
         "Partitions of __transaction_state when it is created (fixed from then on).",
         _POSITIVE_INT),
    _key("transaction.state.log.segment.bytes", "INT", 104_857_600,
         "Segment size of __transaction_state.", _parse_int(14, INT_MAX)),
    _key("transaction.state.log.replication.factor", "SHORT", 3,
         "Replication factor of __transaction_state when it is created (cluster mode; the "
         "registered brokers' count when fewer).", _POSITIVE_INT),
    _key("transaction.state.log.min.isr", "INT", 2,
         "min.insync.replicas of __transaction_state when it is created (cluster mode; at "
         "most its replication factor).", _POSITIVE_INT),
    _key("transaction.max.timeout.ms", "INT", 900_000,
         "Longest transaction.timeout.ms a producer may ask for.", _POSITIVE_INT),
    # On, unlike Kafka's default: the Spark sink's exactly-once default needs it (README,
    # Spark), and the idle warning, find-prepared and `spark recover` end what hangs.
    _key("transaction.two.phase.commit.enable", "BOOLEAN", True,
         "Allow producers to take part in two-phase commit with an external coordinator "
         "(KIP-939: InitProducerId enable2Pc and keepPreparedTxn); refused with "
         "TRANSACTIONAL_ID_AUTHORIZATION_FAILED otherwise. Kafka's default is false."),
    _key("transactional.id.expiration.ms", "INT", 604_800_000,
         "How long an idle transactional id is remembered.", _POSITIVE_INT),
    _key("transaction.abort.timed.out.transaction.cleanup.interval.ms", "INT", 10_000,
         "How often transactions past their timeout are looked for (and aborted).",
         _POSITIVE_INT),
    _key("transaction.remove.expired.transaction.cleanup.interval.ms", "INT", 3_600_000,
         "How often expired transactional ids are looked for.", _POSITIVE_INT),
    # The group coordinator (Kafka's names and defaults).
    _key("offsets.topic.num.partitions", "INT", 50,
         "Partitions of __consumer_offsets when it is created (fixed from then on).",
         _POSITIVE_INT),
    _key("offsets.topic.segment.bytes", "INT", 104_857_600,
         "Segment size of __consumer_offsets.", _parse_int(14, INT_MAX)),
    _key("offsets.topic.replication.factor", "SHORT", 3,
         "Replication factor of __consumer_offsets when it is created (cluster mode; the "
         "registered brokers' count when fewer).", _POSITIVE_INT),
    _key("offsets.commit.timeout.ms", "INT", 5000,
         "How long a coordinator's write waits for the in-sync replicas (cluster mode) "
         "before it is answered COORDINATOR_NOT_AVAILABLE.", _POSITIVE_INT),
    _key("offsets.retention.minutes", "INT", 10080,
         "How long the committed offsets of a group without members are kept.",
         _POSITIVE_INT),
    _key("offsets.retention.check.interval.ms", "LONG", 600_000,
         "How often expired offsets are looked for (ms).", _parse_int(1, LONG_MAX)),
    _key("offset.metadata.max.bytes", "INT", 4096,
         "Largest metadata string of a committed offset (at most 32767, what the offset "
         "record's string holds).", _parse_int(0, 32767)),
    _key("group.min.session.timeout.ms", "INT", 6000,
         "Shortest session timeout a member may ask for.", _parse_int(0, INT_MAX)),
    _key("group.max.session.timeout.ms", "INT", 1_800_000,
         "Longest session timeout a member may ask for.", _parse_int(0, INT_MAX)),
    _key("group.initial.rebalance.delay.ms", "INT", 3000,
         "How long the first rebalance of an empty group waits for more members.",
         _parse_int(0, INT_MAX)),
    _key("group.max.size", "INT", INT_MAX, "Most members a classic group may have.",
         _POSITIVE_INT),
    # Consumer groups of the new protocol (KIP-848); Kafka's names, defaults and bounds.
    _key("group.consumer.session.timeout.ms", "INT", 45_000,
         "A consumer group member is removed after this long without a heartbeat.",
         _POSITIVE_INT),
    _key("group.consumer.min.session.timeout.ms", "INT", 45_000,
         "Lowest group.consumer.session.timeout.ms allowed.", _POSITIVE_INT),
    _key("group.consumer.max.session.timeout.ms", "INT", 60_000,
         "Highest group.consumer.session.timeout.ms allowed.", _POSITIVE_INT),
    _key("group.consumer.heartbeat.interval.ms", "INT", 5_000,
         "How often consumer group members heartbeat.", _POSITIVE_INT),
    _key("group.consumer.min.heartbeat.interval.ms", "INT", 5_000,
         "Lowest group.consumer.heartbeat.interval.ms allowed.", _POSITIVE_INT),
    _key("group.consumer.max.heartbeat.interval.ms", "INT", 15_000,
         "Highest group.consumer.heartbeat.interval.ms allowed.", _POSITIVE_INT),
    _key("group.consumer.max.size", "INT", INT_MAX, "Most members a consumer group may have.",
         _POSITIVE_INT),
    _key("group.consumer.assignors", "LIST", "uniform,range",
         "Server-side assignors (uniform, range, or Kafka's class names of them); the first "
         "is the default.", _parse_assignors),
    _key("group.consumer.migration.policy", "STRING", "bidirectional",
         "Which way a group may change protocol while it has members (KIP-848's online "
         "migration): bidirectional, upgrade, downgrade or disabled.",
         _migration_policy),
)}



def _kafka_parser(kind: str, valid: str) -> Callable[[str], Any]:
    """Kafka's ConfigDef check of a type and its documented valid values ("[1,...]",
    "[0,...,1]", "[a, b]", "(case insensitive) [A, B]")."""
    bounds = re.fullmatch(r"\[(-?[\d.]+),\.\.\.(?:,(-?[\d.]+))?\]", valid)
    choices = re.fullmatch(r"(\(case insensitive\) )?\[([^.\]]*)\]", valid)
    if kind in ("INT", "SHORT", "LONG"):
        width = {"INT": 31, "SHORT": 15, "LONG": 63}[kind]
        lo, hi = -(1 << width), (1 << width) - 1
        if bounds:
            lo, hi = int(bounds.group(1)), int(bounds.group(2) or hi)
        return _parse_int(lo, hi)
    if kind == "DOUBLE":
        def parse_double(text: str) -> float:
            try:
                value = float(text.strip())
            except ValueError:
                raise ConfigError(f"expected a number, got {text!r}") from None
            if bounds and not float(bounds.group(1)) <= value <= float(
                    bounds.group(2) or "inf"):
                raise ConfigError(f"{value} is outside {valid}")
            return value
        return parse_double
    if kind == "BOOLEAN":
        return _parse_bool
    if choices and kind in ("STRING", "LIST"):
        allowed = [c.strip() for c in choices.group(2).split(",")]
        if choices.group(1):
            return lambda text: _one_of(*allowed)(text.strip().upper())
        if kind == "LIST":
            def parse_list(text: str) -> str:
                for item in text.split(","):
                    _one_of(*allowed)(item)
                return ",".join(i.strip() for i in text.split(","))
            return parse_list
        return _one_of(*allowed)
    return _parse_str


def _kafka_only_keys() -> dict[str, ConfigKey]:
    """kafka_broker_keys.py's table as ConfigKeys: accepted, checked, shown, no effect."""
    keys = {}
    for name, kind, default_text, valid, _mode in KAFKA_ONLY_BROKER_KEYS:
        parse = _kafka_parser(kind, valid)
        # Kafka does not check a default against the valid values (process.roles: "").
        default: Any = default_text
        if default_text is not None and kind in ("INT", "SHORT", "LONG"):
            default = int(default_text)
        elif default_text is not None and kind == "DOUBLE":
            default = float(default_text)
        elif default_text is not None and kind == "BOOLEAN":
            default = default_text == "true"
        keys[name] = ConfigKey(name, parse, default,
                               f"Kafka's {name} (accepted, checked and shown; changes nothing "
                               f"on this broker).", kind)
    return keys


BROKER_CONFIGS.update(_kafka_only_keys())

# topic key -> (broker key it defaults to, how the broker value maps to the topic value)
TOPIC_CONFIGS: dict[str, ConfigKey] = {k.name: k for k in (
    _key("cleanup.policy", "LIST", "delete",
         "delete and/or compact (keys required, the latest record of each key kept).",
         _cleanup_policy),
    _key("delete.retention.ms", "LONG", None,
         "How long a tombstone stays after its first clean (ms).", _NON_NEGATIVE_LONG),
    _key("min.cleanable.dirty.ratio", "DOUBLE", None,
         "Dirty share of the log from which it is cleaned.", _parse_ratio),
    _key("min.compaction.lag.ms", "LONG", None, "Records younger than this are not compacted.",
         _NON_NEGATIVE_LONG),
    _key("max.compaction.lag.ms", "LONG", None,
         "Records older than this are compacted whatever the dirty ratio.",
         _parse_int(1, LONG_MAX)),
    _key("message.timestamp.type", "STRING", None, "CreateTime or LogAppendTime.",
         _one_of("CreateTime", "LogAppendTime")),
    _key("message.timestamp.before.max.ms", "LONG", None,
         "How far a CreateTime timestamp may lie in the past.", _NON_NEGATIVE_LONG),
    _key("message.timestamp.after.max.ms", "LONG", None,
         "How far a CreateTime timestamp may lie in the future.", _NON_NEGATIVE_LONG),
    _key("segment.bytes", "INT", None, "Segment size.", _parse_int(SEGMENT_BYTES_MIN, INT_MAX)),
    _key("internal.segment.bytes", "INT", None,
         "For tests only (Kafka's internal key): the segment size in place of segment.bytes, "
         "below its minimum; shown only when set.", _parse_int(14, INT_MAX)),
    _key("segment.ms", "LONG", None, "Segment age.", _parse_int(1, LONG_MAX)),
    _key("retention.ms", "LONG", None, "Retention time.", _RETENTION),
    _key("retention.bytes", "LONG", None, "Retention size.", _RETENTION),
    _key("flush.messages", "LONG", None, "Messages between fsyncs.", _parse_int(1, LONG_MAX)),
    _key("flush.ms", "LONG", None, "Time between fsyncs.", _NON_NEGATIVE_LONG),
    _key("max.message.bytes", "INT", None, "Largest batch.", _parse_int(0, INT_MAX)),
    _key("index.interval.bytes", "INT", None, "Index density.", _parse_int(0, INT_MAX)),
    _key("producer.state.batches.to.retain", "INT", None,
         "Batches remembered per producer to answer retries as duplicates.", _parse_int(1, 255)),
    _key("compression.type", "STRING", None,
         "The codec batches are stored with (producer: as sent; otherwise the broker "
         "recompresses a batch sent with another codec).", _one_of(*COMPRESSION_TYPES)),
    _key("compression.gzip.level", "INT", None, "gzip level of recompressed batches.",
         _gzip_level),
    _key("compression.lz4.level", "INT", None, "lz4 level of recompressed batches.",
         _parse_int(1, 17)),
    _key("compression.zstd.level", "INT", None, "zstd level of recompressed batches.",
         _parse_int(-131072, 22)),
    _key("min.insync.replicas", "INT", None,
         "Replicas that must have a batch for acks=all (stored; enforced with replication).",
         _POSITIVE_INT),
    _key("unclean.leader.election.enable", "BOOLEAN", None,
         "Whether an out-of-sync replica may lead (stored; used with replication)."),
    _key("file.delete.delay.ms", "LONG", None,
         "Wait before a deleted segment's files go (accepted; deleted at once here).",
         _NON_NEGATIVE_LONG),
    _key("preallocate", "BOOLEAN", None, "Preallocate segment files (accepted; not done here)."),
    _key("segment.index.bytes", "INT", None,
         "Offset index size limit (accepted; indexes grow as needed here).",
         _parse_int(4, INT_MAX)),
    _key("segment.jitter.ms", "LONG", None,
         "Random jitter subtracted from segment.ms (accepted; no jitter here).",
         _NON_NEGATIVE_LONG),
    _key("local.retention.ms", "LONG", None, "Tiered storage's local retention (accepted).",
         _parse_int(-2, LONG_MAX)),
    _key("local.retention.bytes", "LONG", None, "Tiered storage's local retention (accepted).",
         _parse_int(-2, LONG_MAX)),
    _key("remote.storage.enable", "BOOLEAN", False,
         "Tiered storage for this topic: not available on this broker (only false).",
         _no_tiered_storage),
    _key("remote.log.copy.disable", "BOOLEAN", False,
         "Tiered storage: stop copying segments (accepted; no tiered storage here)."),
    _key("remote.log.delete.on.disable", "BOOLEAN", False,
         "Tiered storage: delete remote data when disabled (accepted; no tiered storage)."),
    _key("leader.replication.throttled.replicas", "LIST", "",
         "Replicas throttled on the leader side (stored; used with replication).",
         _throttled_replicas),
    _key("follower.replication.throttled.replicas", "LIST", "",
         "Replicas throttled on the follower side (stored; used with replication).",
         _throttled_replicas),
)}

TOPIC_TO_BROKER_KEY = {
    "cleanup.policy": "log.cleanup.policy",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "segment.bytes": "log.segment.bytes",
    "internal.segment.bytes": "log.internal.segment.bytes",
    "segment.ms": "log.roll.ms",
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "index.interval.bytes": "log.index.interval.bytes",
    "producer.state.batches.to.retain": "producer.state.batches.to.retain",
    "compression.type": "compression.type",
    "compression.gzip.level": "compression.gzip.level",
    "compression.lz4.level": "compression.lz4.level",
    "compression.zstd.level": "compression.zstd.level",
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "preallocate": "log.preallocate",
    "segment.index.bytes": "log.index.size.max.bytes",
    "segment.jitter.ms": "log.roll.jitter.ms",
    "local.retention.ms": "log.local.retention.ms",
    "local.retention.bytes": "log.local.retention.bytes",
}

# Broker keys a topic default can come from besides TOPIC_TO_BROKER_KEY's, in the order Kafka
# reads them: setting log.retention.hours changes retention.ms just as log.retention.ms does.
BROKER_FALLBACK_KEYS = {
    "retention.ms": ("log.retention.minutes", "log.retention.hours"),
    "segment.ms": ("log.roll.hours",),
    "segment.jitter.ms": ("log.roll.jitter.hours",),
}


def parse_properties(text: str) -> dict[str, str]:
    """Java .properties: ``key=value`` or ``key: value``, ``#``/``!`` comments, ``\\`` joins."""
    result: dict[str, str] = {}
    logical: list[str] = []
    for raw in text.splitlines():
        line = raw.strip() if not logical else raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical.append(line[:-1])
            continue
        logical.append(line)
        entry = "".join(logical)
        logical = []
        match = re.match(r"^((?:[^=:\s\\]|\\.)+)\s*[=:\s]\s*(.*)$", entry)
        if match:
            key, value = match.group(1), match.group(2)
        else:
            key, value = entry, ""
        result[key.replace("\\", "")] = value
    return result


@dataclass(frozen=True, slots=True)
class Listener:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str, key: str) -> Listener:
        match = re.fullmatch(r"(?:PLAINTEXT://)?\[?([^\]\s]*)\]?:(\d{1,5})", text.strip())
        if not match or int(match.group(2)) > 65535:
            raise ConfigError(f"{key}: expected PLAINTEXT://host:port, got {text!r}")
        host = match.group(1) or "0.0.0.0"
        return cls(host, int(match.group(2)))


# Where a broker config's value comes from, in the order it is looked for (Kafka's
# ConfigSource names, as DescribeConfigs reports them).
DYNAMIC_BROKER_CONFIG = "DYNAMIC_BROKER_CONFIG"  # set for this broker (entity name "0")
DYNAMIC_DEFAULT_BROKER_CONFIG = "DYNAMIC_DEFAULT_BROKER_CONFIG"  # cluster-wide (name "")
STATIC_BROKER_CONFIG = "STATIC_BROKER_CONFIG"  # the properties file or --set
DEFAULT_CONFIG = "DEFAULT_CONFIG"


class BrokerConfig:
    """Validated broker configuration. ``explicit`` remembers what the user set at start;
    ``dynamic_broker`` and ``dynamic_default`` what was set since with AlterConfigs (kept in
    the metadata store, see dynamic_config.py), looked at first."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self.explicit: dict[str, Any] = {}
        self.dynamic_broker: dict[str, Any] = {}
        self.dynamic_default: dict[str, Any] = {}
        self.listener_overrides: dict[str, Any] = {}  # listener.name.<listener>.<key>
        for name, text in (values or {}).items():
            key = BROKER_CONFIGS.get(name)
            override = _listener_key(name) if key is None else None
            if key is None and override is None:
                raise ConfigError(f"unknown config key {name!r}")
            try:
                if override is not None:
                    self.listener_overrides[name] = override.parse(text)
                else:
                    self.explicit[name] = key.parse(text)
            except ConfigError as exc:
                raise ConfigError(f"{name}: {exc}") from None
        self.log_dirs: list[str] = parse_log_dirs(
            self.get("log.dirs") if "log.dirs" in self.explicit else self.get("log.dir"))
        # The broker's own metadata lives in the first directory, as Kafka's metadata.log.dir
        # defaults to the first of log.dirs.
        self.log_dir: str = self.log_dirs[0]
        self.check()
        self.listeners, self.advertised_listeners = self._listeners()
        self.listener = self.listeners[0]  # the first: where the broker's own tools connect
        metrics_at = self.get("metrics.listener")
        self.metrics_listener = Listener.parse(
            metrics_at.removeprefix("http://"), "metrics.listener") if metrics_at else None

    def _listeners(self) -> tuple[list[Endpoint], dict[str, Endpoint]]:
        """The listeners, and what each advertises (by name)."""
        protocols = parse_protocol_map(self.get("listener.security.protocol.map"))
        found = []
        for key in ("listeners", "advertised.listeners"):
            try:
                found.append(parse_listeners(self.get(key) or self.get("listeners"), protocols))
            except ValueError as exc:
                raise ConfigError(f"{key}: {exc}") from None
        bound, advertised = found
        names = {e.name for e in bound}
        stray = [e.name for e in advertised if e.name not in names]
        if stray:
            raise ConfigError(f"advertised.listeners: {', '.join(stray)} is not in listeners")
        for listener, key in (listener_override(n) for n in self.listener_overrides):
            if listener.upper() not in names:
                raise ConfigError(f"listener.name.{listener}.{key}: no listener {listener} "
                                  f"in listeners")
        by_name = {e.name: e for e in advertised if self.get("advertised.listeners")}
        try:
            self.inter_broker_listener_name = inter_broker_listener(
                self.get("inter.broker.listener.name"),
                self.explicit.get("security.inter.broker.protocol"),
                [e.name for e in advertised], self.get("zookeeper.connect") is not None)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return bound, by_name

    def listener_setting(self, listener: str, key: str) -> Any:
        """``key`` for one listener: its listener.name.<listener>.<key> when set."""
        return self.listener_overrides.get(f"listener.name.{listener.lower()}.{key}",
                                           self.get(key))

    def check(self) -> None:
        """The rules that join several keys; raises ConfigError naming them."""
        queued = self.get("queued.max.request.bytes")
        if 0 < queued < self.get("socket.request.max.bytes"):
            raise ConfigError(
                f"queued.max.request.bytes ({queued}"
                f"{', the default' if self.is_default('queued.max.request.bytes') else ''}) "
                f"must be at least socket.request.max.bytes "
                f"({self.get('socket.request.max.bytes')}), or -1 for no limit")
        lag_problem = compaction_lag_problem(self.get("log.cleaner.min.compaction.lag.ms"),
                                             self.get("log.cleaner.max.compaction.lag.ms"))
        if lag_problem:
            raise ConfigError(f"log.cleaner.{lag_problem}")
        _check_consumer_group_bounds(self)

    @classmethod
    def from_sources(cls, properties_file: str | None, overrides: Iterable[str]) -> BrokerConfig:
        values: dict[str, str] = {}
        if properties_file:
            try:
                with open(properties_file, encoding="utf-8") as f:
                    values.update(parse_properties(f.read()))
            except OSError as exc:
                raise ConfigError(f"cannot read config file {properties_file}: {exc}") from None
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"--set expects key=value, got {item!r}")
            name, value = item.split("=", 1)
            values[name.strip()] = value
        return cls(values)

    def get(self, name: str) -> Any:
        for layer in (self.dynamic_broker, self.dynamic_default, self.explicit):
            if name in layer:
                return layer[name]
        return BROKER_CONFIGS[name].default

    def is_default(self, name: str) -> bool:
        return self.source(name) == DEFAULT_CONFIG

    def source(self, name: str) -> str:
        if name in self.dynamic_broker:
            return DYNAMIC_BROKER_CONFIG
        if name in self.dynamic_default:
            return DYNAMIC_DEFAULT_BROKER_CONFIG
        if name in self.explicit:
            return STATIC_BROKER_CONFIG
        return DEFAULT_CONFIG

    def layers(self, name: str) -> list[tuple[str, Any]]:
        """(source, value) of every layer that has a value for ``name``, the one in effect
        first: Kafka's synonyms of one key."""
        found = [(source, layer[name]) for source, layer in (
            (DYNAMIC_BROKER_CONFIG, self.dynamic_broker),
            (DYNAMIC_DEFAULT_BROKER_CONFIG, self.dynamic_default),
            (STATIC_BROKER_CONFIG, self.explicit)) if name in layer]
        if BROKER_CONFIGS[name].default is not None:
            found.append((DEFAULT_CONFIG, BROKER_CONFIGS[name].default))
        return found

    @property
    def roll_ms(self) -> int:
        if self.get("log.roll.ms") is not None:
            return self.get("log.roll.ms")
        return self.get("log.roll.hours") * 3_600_000

    @property
    def retention_ms(self) -> int:
        for name, factor in (("log.retention.ms", 1), ("log.retention.minutes", 60_000)):
            value = self.get(name)
            if value is not None:
                return -1 if value < 0 else value * factor
        hours = self.get("log.retention.hours")
        return -1 if hours < 0 else hours * 3_600_000

    def topic_default(self, topic_key: str) -> Any:
        broker_key = TOPIC_TO_BROKER_KEY.get(topic_key)
        if broker_key is None:  # a topic key without a broker synonym
            return TOPIC_CONFIGS[topic_key].default
        if broker_key == "log.roll.ms":
            return self.roll_ms
        if broker_key == "log.retention.ms":
            return self.retention_ms
        if broker_key == "log.roll.jitter.ms" and self.get(broker_key) is None:
            return self.get("log.roll.jitter.hours") * 3_600_000
        return self.get(broker_key)

    def effective(self) -> dict[str, Any]:
        """Every broker key with its value (DescribeConfigs for the broker resource)."""
        return {name: self.get(name) for name in BROKER_CONFIGS}


def stored_topic_configs(configs: Mapping[str, str | None]) -> dict[str, Any]:
    """Overrides read back from the metadata store: one that no longer parses (stored by an
    older version, before a minimum such as segment.bytes's) is dropped with a warning, for
    the broker's default, rather than keep the broker from starting."""
    parsed: dict[str, Any] = {}
    for name, text in configs.items():
        try:
            parsed.update(validate_topic_configs({name: text}))
        except ConfigError as exc:
            logging.getLogger(__name__).warning("stored topic config dropped: %s", exc)
    return parsed


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, Any]:
    """Parse topic-level overrides; raises ConfigError naming the bad key."""
    parsed: dict[str, Any] = {}
    for name, text in configs.items():
        key = TOPIC_CONFIGS.get(name)
        if key is None:
            raise ConfigError(f"unknown topic config {name!r}")
        if text is None:
            raise ConfigError(f"{name}: a value is required")
        try:
            parsed[name] = key.parse(text)
        except ConfigError as exc:
            raise ConfigError(f"{name}: {exc}") from None
    return parsed


def compaction_lag_problem(min_lag_ms: int, max_lag_ms: int) -> str | None:
    """Kafka's check of the two lags together (each topic's, each broker's)."""
    if min_lag_ms > max_lag_ms:
        return (f"min.compaction.lag.ms ({min_lag_ms}) is more than max.compaction.lag.ms "
                f"({max_lag_ms})")
    return None


def render(value: Any) -> str | None:
    """A config value as Kafka prints it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
