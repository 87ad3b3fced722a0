"""The options of ``format("oncelog")``: parsed and checked before any task runs.

Names follow Spark's Kafka source and sink, so a job written for ``format("kafka")`` needs
only its format changed. Kafka client settings may carry Spark's ``kafka.`` prefix or not
(``kafka.bootstrap.servers`` and ``bootstrap.servers`` are the same option). Spark hands
options over with lower-cased names; errors name them as the documentation spells them.
Every mistake is an ``OptionError`` that names the option, says what was given and what is
allowed: an unknown option is a mistake too (a misspelt ``subscribe`` would otherwise be
ignored).

This module knows nothing of Spark or of the network: the tests check it directly.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..client.network.connection import parse_bootstrap
from ..client.network.security import SECURITY_KEYS
from ..client.producer.producer_config import CONFIG_KEYS, TRANSACTIONAL_KEYS, parse_producer_config
from . import source_options as more
from .option_error import OptionError

log = logging.getLogger(__name__)

EARLIEST = -2  # in offset JSON, as in Spark's Kafka source
LATEST = -1


# Options Spark itself may hand to a data source, which are not ours to judge.
_SPARK_OWN = ("path", "paths", "checkpointLocation", "queryName",
              # a table's reserved properties (CREATE TABLE ... USING oncelog): Spark's
              # TableCatalog PROP_* names
              "provider", "owner", "location", "comment", "external", "is_managed_location",
              "collation", "table_type")

# Kafka client settings: accepted with or without Spark's "kafka." prefix.
_CLIENT_READ = ("bootstrap.servers", "isolation.level", "group.id", *sorted(SECURITY_KEYS))
_CLIENT_WRITE = tuple(sorted(CONFIG_KEYS))  # oncelog.Producer's settings
_READ = ("subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets",
         "maxOffsetsPerTrigger", "minPartitions", "includeHeaders", "failOnDataLoss",
         "kafkaConsumer.pollTimeoutMs", "startingTimestamp", "startingOffsetsByTimestamp",
         "startingOffsetsByTimestampStrategy", "endingTimestamp", "endingOffsetsByTimestamp",
         "minOffsetsPerTrigger", "maxTriggerDelay", "maxRecordsPerPartition", "groupIdPrefix",
         "fetchOffset.numRetries", "fetchOffset.retryIntervalMs")
# Spark's Kafka source ignores these in a batch read, with a warning.
_STREAM_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
# isolation.level, as Kafka's consumer spells it; the default is the consumer's (and so
# Spark's Kafka source's).
READ_UNCOMMITTED, READ_COMMITTED = "read_uncommitted", "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)
# Spark's Kafka source waits this long (spark.network.timeout) for a fetch to make progress.
DEFAULT_POLL_TIMEOUT_MS = 120_000
_WRITE = ("topic", "guarantee", "transactionalIdPrefix")
# The sink's batch.size unless given: a task has its rows at hand, so bigger batches cost no
# latency, and at 16 KiB (the producer's default, Java's) a 1 KiB row's share of a batch's
# fixed cost (client, request, broker) is most of the write (docs/benchmarks.md, issue 15).
SINK_BATCH_SIZE = "262144"


def _unprefixed(options: Mapping[str, str]) -> dict[str, str]:
    """A table's options (CREATE TABLE ... USING oncelog OPTIONS): Spark hands each over
    also as a table property ``option.<name>``; those count once, by their own name."""
    plain = {k.lower() for k in options}
    result = {}
    for key, value in options.items():
        if key.lower().startswith("option."):
            key = key[len("option."):]
            if key.lower() in plain:
                continue
        result[key] = value
    return result


def _canonical(options: Mapping[str, str], plain: tuple[str, ...],
               client: tuple[str, ...]) -> dict[str, str]:
    """Options by their documented names (``kafka.`` stripped); unknown names refused."""
    names = {n.lower(): n for n in plain + _SPARK_OWN}
    names.update({n.lower(): n for n in client})
    names.update({f"kafka.{n}".lower(): n for n in client})
    result: dict[str, str] = {}
    for key, value in _unprefixed(options).items():
        name = names.get(key.lower())
        if name is None:
            known = ", ".join(sorted(plain + client, key=str.lower))
            raise OptionError(key, f"unknown option (known: {known}; Kafka client settings "
                                   "may also be written with the kafka. prefix)")
        if name in result:
            raise OptionError(name, "given twice (with and without the kafka. prefix)")
        if name not in _SPARK_OWN:
            result[name] = value
    return result


def _bootstrap(options: dict[str, str]) -> str:
    value = options.get("bootstrap.servers")
    if not options:
        raise OptionError("bootstrap.servers",
                          "required, and no option at all reached format(\"oncelog\"): Spark 4 "
                          "hands a SQL table's OPTIONS (CREATE TABLE ... USING oncelog) to a "
                          "Python data source's schema only, not to its reads and writes; "
                          "use CREATE TEMPORARY VIEW ... USING oncelog OPTIONS (...)")
    if not value:
        raise OptionError("bootstrap.servers",
                          'required: the brokers to connect to, e.g. "127.0.0.1:9092" '
                          "(kafka.bootstrap.servers works too)")
    try:
        parse_bootstrap(value)
    except ValueError as exc:
        raise OptionError("bootstrap.servers", str(exc)) from None
    return value


def _flag(options: dict[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if value.strip().lower() not in ("true", "false"):
        raise OptionError(name, f"must be true or false, not {value!r}")
    return value.strip().lower() == "true"


def _positive(options: dict[str, str], name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        number = 0
    if number < 1:
        raise OptionError(name, f"must be a whole number of 1 or more, not {value!r}")
    return number


def _json(name: str, value: str, example: str):
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise OptionError(name, f"is neither earliest/latest nor JSON ({exc.msg} at "
                                f"character {exc.pos}); JSON looks like {example}") from None


def _partition_number(name: str, topic: str, text) -> int:
    try:
        number = int(text)
    except (TypeError, ValueError):
        number = -1
    if number < 0 or str(text).strip() != str(number):
        raise OptionError(name, f"partition {text!r} of topic {topic!r} is not a partition "
                                "number")
    return number


def parse_assign(value: str) -> dict[str, tuple[int, ...]]:
    example = '{"topicA":[0,1],"topicB":[2,4]}'
    parsed = _json("assign", value, example)
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError("assign", f"must be a JSON object of topic -> partitions, like "
                                    f"{example}")
    result = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not partitions:
            raise OptionError("assign", f"topic {topic!r} needs a non-empty list of partitions,"
                                        f" like {example}")
        result[topic] = tuple(sorted({_partition_number("assign", topic, p)
                                      for p in partitions}))
    return result


def parse_offsets(name: str, value: str, allowed: tuple[str, ...]) -> str | dict:
    """``earliest``, ``latest`` or ``{"topic": {"0": offset, ...}}`` (-2 earliest, -1 latest);
    ``allowed`` lists the words (and so the matching negative offsets) permitted."""
    word = value.strip().lower()
    if word in ("earliest", "latest"):
        if word not in allowed:
            raise OptionError(name, f"{word} is not allowed here (allowed: "
                                    f"{', '.join(allowed)} or per-partition JSON)")
        return word
    example = '{"topicA":{"0":23,"1":-2}}'
    parsed = _json(name, value, example)
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(name, f"must be earliest, latest or a JSON object like {example}")
    special = {EARLIEST: "earliest", LATEST: "latest"}
    special = {number: word for number, word in special.items() if word in allowed}
    result: dict[str, dict[int, int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict) or not partitions:
            raise OptionError(name, f"topic {topic!r} needs an object of partition -> offset, "
                                    f"like {example}")
        offsets = {}
        for partition, offset in partitions.items():
            number = _partition_number(name, topic, partition)
            if type(offset) is not int or (offset < 0 and offset not in special):
                words = "".join(f" or {n} ({w})" for n, w in special.items())
                raise OptionError(name, f"offset {offset!r} of {topic}-{number} must be an "
                                        f"offset of 0 or more{words}")
            offsets[number] = offset
        result[topic] = offsets
    return result


@dataclass(frozen=True)
class ReadOptions:
    bootstrap: str
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # earliest/latest, per-partition offsets, or source_options.ByTimestamp
    starting: str | dict | object = "earliest"
    ending: str | dict | object = "latest"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    # A task that reads nothing new for this long fails (it never returns fewer rows).
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    # isolation.level=read_committed: reads end at the last stable offset and leave out
    # aborted transactions, as Kafka's consumer does.
    read_committed: bool = False
    # The rest of Spark's Kafka source options (spark/source_options.py).
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    max_records_per_partition: int | None = None
    group_id: str | None = None  # kafka.group.id: the group a stream commits its progress to
    group_id_prefix: str = "spark-kafka-source"
    fetch_retries: int = 3  # attempts at each driver lookup of offsets (fetchOffset.*)
    fetch_retry_interval_ms: int = 1000
    # kafka.security.protocol, kafka.sasl.*, kafka.ssl.*: every client of the source takes them
    security: dict[str, str] = field(default_factory=dict)

    def client(self, **settings: str) -> dict[str, str]:
        """A client's settings: the bootstrap servers, the security settings, ``settings``."""
        return {"bootstrap.servers": self.bootstrap, **self.security, **settings}

    def wants(self, topic: str) -> bool:
        """Whether ``topic`` is among those read."""
        if self.subscribe:
            return topic in self.subscribe
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.assign


def read_options(options: Mapping[str, str], streaming: bool | None) -> ReadOptions:
    """Checked read options; ``streaming`` None checks only what batch and stream share."""
    opts = _canonical(options, _READ, _CLIENT_READ)
    bootstrap = _bootstrap(opts)
    chosen = [n for n in ("subscribe", "subscribePattern", "assign") if n in opts]
    if len(chosen) != 1:
        raise OptionError("subscribe", "give exactly one of subscribe (topics, comma-separated),"
                                       " subscribePattern (a regular expression) or assign "
                                       f"(JSON); given: {', '.join(chosen) or 'none'}")
    subscribe: tuple[str, ...] = ()
    pattern = None
    assign: dict[str, tuple[int, ...]] = {}
    if "subscribe" in opts:
        subscribe = tuple(dict.fromkeys(t.strip() for t in opts["subscribe"].split(",")
                                        if t.strip()))
        if not subscribe:
            raise OptionError("subscribe", "names no topic")
    elif "subscribePattern" in opts:
        pattern = opts["subscribePattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError("subscribePattern", f"{pattern!r} is not a regular expression: "
                                                  f"{exc}") from None
    else:
        assign = parse_assign(opts["assign"])

    level = opts.get("isolation.level", READ_UNCOMMITTED)  # exact, as Kafka checks it
    if level not in ISOLATION_LEVELS:
        raise OptionError("isolation.level", f"{opts['isolation.level']!r} is not an isolation "
                                             f"level (allowed: {', '.join(ISOLATION_LEVELS)})")

    start_time, end_time = more.by_timestamp(opts, end=False), more.by_timestamp(opts, end=True)
    if streaming is None:  # the schema only: checks common to batch and stream
        starting = parse_offsets("startingOffsets", opts.get("startingOffsets", "earliest"),
                                 ("earliest", "latest"))
        ending = parse_offsets("endingOffsets", opts.get("endingOffsets", "latest"),
                               ("latest",))
    elif streaming:
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if name in opts:
                raise OptionError(name, "applies to batch reads (spark.read) only; a stream "
                                        "reads on as records arrive")
        starting = parse_offsets("startingOffsets", opts.get("startingOffsets", "latest"),
                                 ("earliest", "latest"))
        ending = "latest"
    else:
        for name in _STREAM_ONLY:
            if name in opts:
                log.warning("%s option ignored in batch queries", name)
        starting = parse_offsets("startingOffsets", opts.get("startingOffsets", "earliest"),
                                 ("earliest",))
        ending = parse_offsets("endingOffsets", opts.get("endingOffsets", "latest"),
                               ("latest",))
    starting = start_time or starting
    ending = (end_time or ending) if not streaming else ending
    if isinstance(starting, more.ByTimestamp) and isinstance(ending, more.ByTimestamp) and \
            starting.every is not None and ending.every is not None and \
            starting.every > ending.every:
        raise OptionError(ending.option, f"{ending.every} is before startingTimestamp "
                                         f"{starting.every}")
    least = more.whole(opts, "minOffsetsPerTrigger", None, 1)
    most = _positive(opts, "maxOffsetsPerTrigger")
    if least is not None and most is not None and least > most:
        raise OptionError("minOffsetsPerTrigger", f"the value of minOffsetsPerTrigger ({least}) "
                                                  f"is higher than the maxOffsetsPerTrigger "
                                                  f"({most})")
    group, group_prefix = more.group_id(opts)
    if group is not None and "groupIdPrefix" in opts:
        log.warning("Option groupIdPrefix will be ignored as option kafka.group.id has been "
                    "set.")
    result = ReadOptions(
        bootstrap, subscribe, pattern, assign, starting, ending,
        _positive(opts, "maxOffsetsPerTrigger"), _positive(opts, "minPartitions"),
        _flag(opts, "includeHeaders", False), _flag(opts, "failOnDataLoss", True),
        _positive(opts, "kafkaConsumer.pollTimeoutMs") or DEFAULT_POLL_TIMEOUT_MS,
        level == READ_COMMITTED, least,
        more.duration_ms("maxTriggerDelay", opts["maxTriggerDelay"])
        if "maxTriggerDelay" in opts else more.DEFAULT_MAX_TRIGGER_DELAY_MS,
        more.whole(opts, "maxRecordsPerPartition", None, 1), group, group_prefix,
        more.whole(opts, "fetchOffset.numRetries", more.DEFAULT_FETCH_RETRIES, 1),
        more.whole(opts, "fetchOffset.retryIntervalMs", more.DEFAULT_FETCH_RETRY_INTERVAL_MS,
                   0), {k: v for k, v in opts.items() if k in SECURITY_KEYS})
    for name, offsets in (("startingOffsets", starting), ("endingOffsets", ending)):
        if isinstance(offsets, more.ByTimestamp):
            name, offsets = offsets.option, offsets.partitions
        if isinstance(offsets, dict):
            for topic, partitions in offsets.items():
                if not result.wants(topic):
                    raise OptionError(name, f"names topic {topic!r}, which this query does "
                                            "not read")
                missing = set(partitions) - set(assign.get(topic, partitions))
                if missing:
                    raise OptionError(name, f"names {topic}-{min(missing)}, which assign does "
                                            "not")
    return result


EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
GUARANTEES = (EXACTLY_ONCE, AT_LEAST_ONCE)
DEFAULT_PREFIX = "oncelog-spark"


@dataclass(frozen=True)
class WriteOptions:
    bootstrap: str
    topic: str | None
    producer: dict[str, str]  # oncelog.Producer settings, checked by its own parser
    guarantee: str = EXACTLY_ONCE
    # Every transactional id of the sink starts with it (spark/two_phase.py); it is also the
    # consumer group that holds the sink's commit decisions. None: a stream's, named by the
    # tasks after their query's id.
    transactional_id_prefix: str | None = None

    def admin_config(self) -> dict[str, str]:
        """The sink's admin client: the producer's bootstrap and security settings."""
        return {"bootstrap.servers": self.bootstrap,
                **{k: v for k, v in self.producer.items() if k in SECURITY_KEYS}}


def _refuse_transactional_keys(options: Mapping[str, str]) -> None:
    """The transactional settings are the sink's own (spark/two_phase.py sets them per task):
    a user's value would break the naming its recovery relies on."""
    names = {k.lower(): k for k in TRANSACTIONAL_KEYS}
    names.update({f"kafka.{k}".lower(): k for k in TRANSACTIONAL_KEYS})
    for key in _unprefixed(options):
        if key.lower() in names:
            raise OptionError(key, "the oncelog sink sets the transactional settings itself "
                                   "(a transactional id per task attempt, two-phase commit); "
                                   "choose the ids' start with transactionalIdPrefix, or write "
                                   'without transactions with option("guarantee", '
                                   '"at-least-once")')


def _guarantee(opts: dict[str, str]) -> str:
    value = opts.pop("guarantee", EXACTLY_ONCE)
    if value.strip().lower() not in GUARANTEES:
        raise OptionError("guarantee", f"{value!r} must be {' or '.join(GUARANTEES)}")
    return value.strip().lower()


def _prefix(opts: dict[str, str], topic: str | None, streaming: bool) -> str | None:
    """The transactional id prefix: given, or one per save() for a batch write (random:
    nothing else is unique to one save()); None for a stream, whose tasks name it by their
    query's id (spark/two_phase.py, stream_prefix), which its checkpoint keeps."""
    value = opts.pop("transactionalIdPrefix", None)
    if value is not None:
        value = value.strip()
        if not value or not re.fullmatch(r"[A-Za-z0-9._-]+", value):
            raise OptionError("transactionalIdPrefix", f"{value!r} must be letters, digits, "
                                                       "'.', '_' or '-'")
        return value
    if streaming:
        return None
    suffix = re.sub(r"[^A-Za-z0-9._-]", "_", topic) if topic else "topics"
    return f"{DEFAULT_PREFIX}-{suffix}-{secrets.token_hex(6)}"


def write_options(options: Mapping[str, str], streaming: bool = False) -> WriteOptions:
    _refuse_transactional_keys(options)
    opts = _canonical(options, _WRITE, _CLIENT_WRITE)
    bootstrap = _bootstrap(opts)
    topic = opts.pop("topic", None)
    if topic is not None and not topic.strip():
        raise OptionError("topic", "is empty")
    topic = topic.strip() if topic else None
    guarantee = _guarantee(opts)
    prefix = _prefix(opts, topic, streaming)
    if opts.get("enable.idempotence", "true").strip().lower() != "true":
        raise OptionError("enable.idempotence", "the oncelog sink always writes with an "
                                                "idempotent producer")
    if opts.get("acks", "all").strip().lower() not in ("all", "-1"):
        raise OptionError("acks", f"{opts['acks']!r}: an idempotent producer needs acks=all")
    producer = {"batch.size": SINK_BATCH_SIZE, **opts, "bootstrap.servers": bootstrap,
                "enable.idempotence": "true"}
    try:
        parse_producer_config(producer)
    except ValueError as exc:
        name, _, problem = str(exc).partition(": ")
        raise OptionError(name if name in CONFIG_KEYS else "kafka.*", problem or str(exc)) \
            from None
    return WriteOptions(bootstrap, topic, producer, guarantee, prefix)
