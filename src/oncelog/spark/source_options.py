"""The options of Spark's Kafka source beyond topics and offsets: positions by time, trigger
admission, Spark task sizes, consumer group ids and the driver's retries. Parsed with
``read_options`` (options.py) before any task runs; no Spark and no network in here.

Precedence, as Spark's Kafka source (KafkaSourceProvider.getKafkaOffsetRangeLimit):
``startingTimestamp`` > ``startingOffsetsByTimestamp`` > ``startingOffsets``, and likewise
``endingTimestamp`` > ``endingOffsetsByTimestamp`` > ``endingOffsets``; the lower ones are
then ignored, as Spark ignores them.

| option                               | default            | checked                          |
|--------------------------------------|--------------------|----------------------------------|
| startingTimestamp / endingTimestamp  | none               | a timestamp in ms, 0 or more     |
| starting/endingOffsetsByTimestamp    | none               | {"topic": {"0": ms, ...}}        |
| startingOffsetsByTimestampStrategy   | error              | error or latest (any case)       |
| minOffsetsPerTrigger                 | none (streams)     | 1 or more, at most maxOffsets... |
| maxTriggerDelay                      | 15m (streams)      | a duration: 500ms, 30s, 15m, 2h  |
| maxRecordsPerPartition               | none               | 1 or more                        |
| groupIdPrefix                        | spark-kafka-source | letters, digits, . _ -           |
| kafka.group.id                       | none (wins)        | not empty                        |
| fetchOffset.numRetries               | 3                  | 1 or more (attempts in all)      |
| fetchOffset.retryIntervalMs          | 1000               | 0 or more                        |
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from .option_error import OptionError

# Spark's Kafka source: a stream's consumers are named <prefix>-<uuid>-..., a batch read's
# spark-kafka-relation-<uuid>.
DEFAULT_GROUP_PREFIX = "spark-kafka-source"
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60_000
DEFAULT_FETCH_RETRIES = 3
DEFAULT_FETCH_RETRY_INTERVAL_MS = 1000
STRATEGIES = ("error", "latest")
# JavaUtils.timeStringAsMs's units (Spark parses maxTriggerDelay with it); bare numbers are ms.
_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
             "d": 86_400_000}


@dataclass(frozen=True)
class ByTimestamp:
    """Offsets looked up by time (ListOffsets by timestamp: the first offset whose record's
    timestamp is at or after it). ``every``: one time for all partitions
    (starting/endingTimestamp); else ``partitions``, one per partition, which must name every
    partition read (as Spark insists). ``latest_if_none``: a partition with no record that
    late starts at its latest offset (strategy latest; always so for an end), else the
    read fails naming it."""

    option: str
    every: int | None = None
    partitions: dict[str, dict[int, int]] = field(default_factory=dict)
    latest_if_none: bool = False

    def wanted(self, tp: tuple[str, int]) -> int | None:
        if self.every is not None:
            return self.every
        return self.partitions.get(tp[0], {}).get(tp[1])


def _timestamp(name: str, value: str) -> int:
    text = value.strip()
    if not re.fullmatch(r"[0-9]+", text):
        raise OptionError(name, f"expected a single long value, got {value!r} (a timestamp in "
                                "milliseconds since the epoch, 0 or more)")
    return int(text)


def _timestamps_json(name: str, value: str) -> dict[str, dict[int, int]]:
    example = '{"topicA":{"0":1700000000000,"1":1700000000000}}'
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise OptionError(name, f"is not JSON ({exc.msg} at character {exc.pos}); it looks "
                                f"like {example}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(name, f"must be a JSON object like {example}")
    result: dict[str, dict[int, int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict) or not partitions:
            raise OptionError(name, f"topic {topic!r} needs an object of partition -> "
                                    f"timestamp, like {example}")
        times = {}
        for partition, ts in partitions.items():
            if not re.fullmatch(r"[0-9]+", str(partition)):
                raise OptionError(name, f"partition {partition!r} of topic {topic!r} is not a "
                                        "partition number")
            if type(ts) is not int or ts < 0:
                raise OptionError(name, f"timestamp {ts!r} of {topic}-{partition} must be "
                                        "milliseconds since the epoch, 0 or more")
            times[int(partition)] = ts
        result[topic] = times
    return result


def strategy(opts: dict[str, str]) -> str:
    value = opts.get("startingOffsetsByTimestampStrategy", "error")
    if value.strip().lower() not in STRATEGIES:
        raise OptionError("startingOffsetsByTimestampStrategy",
                          f"{value!r} is not a strategy (allowed: error, latest)")
    return value.strip().lower()


def by_timestamp(opts: dict[str, str], end: bool) -> ByTimestamp | None:
    """startingTimestamp/endingTimestamp, else starting/endingOffsetsByTimestamp, else None
    (then starting/endingOffsets apply)."""
    side = "ending" if end else "starting"
    latest = end or strategy(opts) == "latest"
    every = f"{side}Timestamp"
    if every in opts:
        return ByTimestamp(every, every=_timestamp(every, opts[every]), latest_if_none=latest)
    each = f"{side}OffsetsByTimestamp"
    if each in opts:
        return ByTimestamp(each, partitions=_timestamps_json(each, opts[each]),
                           latest_if_none=latest)
    return None


def duration_ms(name: str, value: str) -> int:
    """A duration as Spark writes one ("15m", "30s", "500ms"; a bare number is ms)."""
    found = re.fullmatch(r"\s*([0-9]+)\s*([a-z]*)\s*", value.lower())
    if not found or found.group(2) not in ("", *_UNITS_MS):
        raise OptionError(name, f"{value!r} is not a duration (a number with a unit: us, ms, "
                                "s, m, min, h, d; e.g. 15m)")
    return int(int(found.group(1)) * _UNITS_MS.get(found.group(2), 1))


def whole(opts: dict[str, str], name: str, default: int | None, least: int) -> int | None:
    value = opts.get(name)
    if value is None:
        return default
    text = value.strip()
    if not re.fullmatch(r"-?[0-9]+", text) or int(text) < least:
        raise OptionError(name, f"must be a whole number of {least} or more, not {value!r}")
    return int(text)


def group_id(opts: dict[str, str]) -> tuple[str | None, str]:
    """(kafka.group.id, groupIdPrefix): a given group id wins over the prefix, as in Spark."""
    given = opts.get("group.id")
    if given is not None and not given.strip():
        raise OptionError("kafka.group.id", "is empty")
    prefix = opts.get("groupIdPrefix", DEFAULT_GROUP_PREFIX).strip()
    if not re.fullmatch(r"[A-Za-z0-9._-]+", prefix):
        raise OptionError("groupIdPrefix", f"{prefix!r} must be letters, digits, '.', '_' or "
                                           "'-'")
    return (given.strip() if given else None), prefix
