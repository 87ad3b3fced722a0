"""oncelog.Producer's configuration: Kafka's key names, defaults and consistency rules.

Values may be given as strings (as in a .properties file) or as Python values. An unknown key
or a bad value raises ValueError naming the key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...protocol.records import CODECS
from ..network.security import PLAINTEXT, SECURITY_DEFAULTS, ClientSecurity

MAX_IN_FLIGHT_WITH_IDEMPOTENCE = 5  # what the broker's per-producer batch cache covers
# Deterministic batches are cut by record count alone; 500 keeps 1 KiB records well inside
# max.request.size.
DETERMINISTIC_BATCH_RECORDS = 500

_DEFAULTS: dict[str, Any] = {
    "bootstrap.servers": "127.0.0.1:9092",
    "client.id": "oncelog-producer",
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 5,
    "batch.size": 16_384,
    "batch.num.messages": 10_000,
    "batching": "linger",
    "buffer.memory": 33_554_432,
    "max.block.ms": 60_000,
    "max.request.size": 1_048_576,
    "compression.type": "none",
    "retries": 2_147_483_647,
    "retry.backoff.ms": 100,
    "request.timeout.ms": 30_000,
    "delivery.timeout.ms": 120_000,
    "max.in.flight.requests.per.connection": 5,
    "metadata.max.age.ms": 300_000,
    "partitioner": "murmur2_random",
    "transactional.id": None,
    "transaction.timeout.ms": 60_000,
    "transaction.two.phase.commit.enable": False,
    "statistics.interval.ms": 0,
    "stats_cb": None,
    **SECURITY_DEFAULTS,
}
_PARTITIONERS = ("murmur2_random", "murmur2", "random")
# The keys a producer takes as plain settings (the Spark sink passes these through). The
# transactional ones need calls the application makes (init_transactions, ...), and stats_cb
# is a callable: parse_producer_config knows them, a producer used for you does not take them.
TRANSACTIONAL_KEYS = frozenset({"transactional.id", "transaction.timeout.ms",
                                "transaction.two.phase.commit.enable"})
CONFIG_KEYS = frozenset(_DEFAULTS) - TRANSACTIONAL_KEYS - {"stats_cb", "statistics.interval.ms"}


@dataclass(frozen=True)
class ProducerConfig:
    bootstrap_servers: str
    client_id: str
    acks: int
    idempotence: bool
    linger: float           # seconds
    batch_size: int
    batch_records: int
    deterministic: bool
    buffer_memory: int
    max_block: float        # seconds
    max_request_size: int
    codec: int
    retries: int
    retry_backoff: float    # seconds
    request_timeout: float  # seconds
    delivery_timeout: float  # seconds
    max_in_flight: int
    metadata_max_age: float  # seconds
    partitioner: str | Callable[[bytes | None, int], int]
    transactional_id: str | None = None
    transaction_timeout_ms: int = 60_000
    two_phase: bool = False
    statistics_interval_ms: int = 0
    stats_cb: Callable[[str], object] | None = None
    security: ClientSecurity = PLAINTEXT


def _int(key: str, value: Any, minimum: int = 0) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: {value!r} is not an integer") from None
    if number < minimum:
        raise ValueError(f"{key}: {number} is below the minimum {minimum}")
    return number


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"{key}: {value!r} is not true or false")


def _acks(value: Any) -> int:
    text = str(value).strip().lower()
    if text in ("all", "-1"):
        return -1
    if text in ("0", "1"):
        return int(text)
    raise ValueError(f"acks: {value!r} must be all, -1, 0 or 1")


def parse_producer_config(config: dict[str, Any]) -> ProducerConfig:
    unknown = sorted(set(config) - set(_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown producer config {', '.join(unknown)} (known: "
                         f"{', '.join(sorted(_DEFAULTS))})")
    c = {**_DEFAULTS, **config}
    acks = _acks(c["acks"])
    retries = _int("retries", c["retries"])
    max_in_flight = _int("max.in.flight.requests.per.connection",
                         c["max.in.flight.requests.per.connection"], 1)
    idempotence = _bool("enable.idempotence", c["enable.idempotence"])
    transactional_id = c["transactional.id"]
    if transactional_id is not None:
        transactional_id = str(transactional_id)
        if not transactional_id:
            raise ValueError("transactional.id: must not be empty")
        if "enable.idempotence" in config and not idempotence:
            raise ValueError("transactional.id needs enable.idempotence=true (a transaction's "
                             "records carry the producer id, epoch and sequences)")
        if "acks" in config and acks != -1:
            raise ValueError("transactional.id needs acks=all")
    if idempotence:
        # As Java's producer: an explicit request for idempotence that other settings
        # contradict is an error; the default quietly yields to them.
        explicit = "enable.idempotence" in config
        conflict = None
        if acks != -1:
            conflict = "acks must be all"
        elif retries == 0:
            conflict = "retries must be above 0"
        elif max_in_flight > MAX_IN_FLIGHT_WITH_IDEMPOTENCE:
            conflict = (f"max.in.flight.requests.per.connection must be at most "
                        f"{MAX_IN_FLIGHT_WITH_IDEMPOTENCE}: the broker remembers only the last "
                        f"{MAX_IN_FLIGHT_WITH_IDEMPOTENCE} batches of each producer, so a retry "
                        "of an older one could not be recognised")
        if conflict and (explicit or transactional_id is not None):
            raise ValueError(f"enable.idempotence=true: {conflict}")
        if conflict:
            idempotence = False
    codec_name = str(c["compression.type"]).lower()
    if codec_name not in CODECS:
        raise ValueError(f"compression.type: {c['compression.type']!r} must be one of "
                         f"{', '.join(CODECS)}")
    batching = str(c["batching"])
    if batching not in ("linger", "deterministic"):
        raise ValueError(f"batching: {batching!r} must be linger or deterministic")
    partitioner = c["partitioner"]
    if not callable(partitioner) and partitioner not in _PARTITIONERS:
        raise ValueError(f"partitioner: {partitioner!r} must be one of "
                         f"{', '.join(_PARTITIONERS)} or a callable (key, partitions) -> int")
    linger_ms = _int("linger.ms", c["linger.ms"])
    request_timeout_ms = _int("request.timeout.ms", c["request.timeout.ms"], 1)
    delivery_timeout_ms = _int("delivery.timeout.ms", c["delivery.timeout.ms"], 1)
    if delivery_timeout_ms < linger_ms + request_timeout_ms:
        raise ValueError(f"delivery.timeout.ms: {delivery_timeout_ms} must be at least "
                         f"linger.ms + request.timeout.ms ({linger_ms + request_timeout_ms})")
    max_request_size = _int("max.request.size", c["max.request.size"], 1024)
    buffer_memory = _int("buffer.memory", c["buffer.memory"], 1024)
    two_phase = _bool("transaction.two.phase.commit.enable",
                      c["transaction.two.phase.commit.enable"])
    if two_phase and transactional_id is None:
        raise ValueError("transaction.two.phase.commit.enable needs a transactional.id")
    stats_cb = c["stats_cb"]
    if stats_cb is not None and not callable(stats_cb):
        raise ValueError("stats_cb: must be a callable taking the statistics as JSON")
    batch_records = c["batch.num.messages"]
    if batching == "deterministic" and "batch.num.messages" not in config:
        batch_records = DETERMINISTIC_BATCH_RECORDS
    return ProducerConfig(
        bootstrap_servers=str(c["bootstrap.servers"]),
        client_id=str(c["client.id"]),
        acks=acks,
        idempotence=idempotence,
        linger=linger_ms / 1000,
        batch_size=_int("batch.size", c["batch.size"], 1),
        batch_records=_int("batch.num.messages", batch_records, 1),
        deterministic=batching == "deterministic",
        buffer_memory=buffer_memory,
        max_block=_int("max.block.ms", c["max.block.ms"]) / 1000,
        max_request_size=max_request_size,
        codec=CODECS[codec_name],
        retries=retries,
        retry_backoff=_int("retry.backoff.ms", c["retry.backoff.ms"]) / 1000,
        request_timeout=request_timeout_ms / 1000,
        delivery_timeout=delivery_timeout_ms / 1000,
        max_in_flight=max_in_flight,
        metadata_max_age=_int("metadata.max.age.ms", c["metadata.max.age.ms"], 1) / 1000,
        partitioner=partitioner,
        transactional_id=transactional_id,
        transaction_timeout_ms=_int("transaction.timeout.ms", c["transaction.timeout.ms"], 1),
        two_phase=two_phase,
        statistics_interval_ms=_int("statistics.interval.ms", c["statistics.interval.ms"]),
        stats_cb=stats_cb,
        security=ClientSecurity.from_config(config),
    )
