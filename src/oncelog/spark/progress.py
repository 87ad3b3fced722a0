"""What a stream's driver does between micro-batches besides choosing offsets: trigger
admission (minOffsetsPerTrigger / maxTriggerDelay), how far behind each micro-batch is, and
the consumer group its progress is committed to.

Spark 4's Python streaming source API has no composite read limit and a ``ReadMinRows``
without a delay, and no hook for a source's custom progress metrics: so admission is decided
here, in ``latestOffset`` (as Spark's Kafka source decides it in its own), and the lag, which
Spark's Kafka source puts in each micro-batch's progress ``metrics``
(``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest``, ``avgOffsetsBehindLatest``,
``estimatedTotalBytesBehindLatest``), is logged under those names, shown in the progress as
the source's ``latestOffset`` beside its ``endOffset``, and visible as the lag of the
query's consumer group (``oncelog groups describe``), to which each finished micro-batch's
end offsets are committed.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from ..client.admin.admin import Admin
from ..client.network.connection import KafkaError
from .options import ReadOptions

log = logging.getLogger(__name__)

Offsets = dict[tuple[str, int], int]


@dataclass
class Admission:
    """Spark's Kafka source's rule for minOffsetsPerTrigger: a trigger with fewer new
    offsets than the minimum runs no micro-batch, unless maxTriggerDelay has passed since the
    last one that ran (the first trigger of a query always runs)."""

    min_offsets: int
    max_delay_ms: int
    last_trigger_ms: float = 0.0

    def hold(self, start: Offsets, latest: Offsets, now_ms: float | None = None) -> bool:
        now_ms = time.time() * 1000 if now_ms is None else now_ms
        if now_ms - self.last_trigger_ms >= self.max_delay_ms:
            self.last_trigger_ms = now_ms
            return False
        new = sum(offset - start.get(tp, 0) for tp, offset in latest.items())
        if new < self.min_offsets:
            return True
        self.last_trigger_ms = now_ms
        return False


def behind(end: Offsets, latest: Offsets, sizes: dict[tuple[str, int], tuple[int, int]]
           ) -> dict[str, str]:
    """Spark's Kafka source's lag metrics of a micro-batch ending at ``end`` while the
    partitions end at ``latest``: offsets behind per partition (min, max, average) and the
    bytes behind, estimated from each partition's size on disk and offset span
    (``sizes``: (bytes, offsets) of each)."""
    lags = {tp: max(0, latest[tp] - offset) for tp, offset in end.items() if tp in latest}
    if not lags:
        return {}
    estimate = 0
    for tp, lag in lags.items():
        size, span = sizes.get(tp, (0, 0))
        if span > 0:
            estimate += size * min(lag, span) // span
    values = list(lags.values())
    return {"minOffsetsBehindLatest": str(min(values)),
            "maxOffsetsBehindLatest": str(max(values)),
            "avgOffsetsBehindLatest": str(sum(values) / len(values)),
            "estimatedTotalBytesBehindLatest": str(estimate)}


def sizes(options: ReadOptions, marks: dict[tuple[str, int], tuple[int, int]]
          ) -> dict[tuple[str, int], tuple[int, int]]:
    """(bytes on disk, offsets held) of each partition, from DescribeLogDirs."""
    topics: dict[str, list[int]] = {}
    for topic, partition in marks:
        topics.setdefault(topic, []).append(partition)
    with Admin(options.client(**{"client.id": "oncelog-spark"})) as admin:
        dirs = admin.describe_log_dirs(topics)
    result = {}
    for d in (d for described in dirs.values() for d in described):
        for replica in d.replicas:
            tp = (replica.topic, replica.partition)
            if tp in marks and not replica.is_future:
                low, high = marks[tp]
                result[tp] = (replica.size, high - low)
    return result


def group_id(options: ReadOptions) -> str:
    """The group a stream commits its progress to: kafka.group.id, else one per query run
    named as Spark's Kafka source names its consumers' (<groupIdPrefix>-<uuid>)."""
    return options.group_id or f"{options.group_id_prefix}-{uuid.uuid4()}"


def commit(options: ReadOptions, group: str, end: Offsets) -> None:
    """Commit a finished micro-batch's end offsets to ``group`` (as a tool commits: refused
    while the group has members, as a kafka.group.id that consumers use may have). Only for
    watching: the checkpoint, never the group, says where a query resumes; a failure is
    logged, never fails the query."""
    try:
        with Admin(options.client(**{"client.id": "oncelog-spark"})) as admin:
            errors = admin.alter_group_offsets(group, end)
    except (KafkaError, OSError) as exc:
        log.warning("group %s: committing the micro-batch's offsets failed: %s", group, exc)
        return
    refused = {f"{tp.topic}-{tp.partition}": e.name for tp, e in errors.items() if e}
    if refused:
        log.warning("group %s: the coordinator refused the micro-batch's offsets: %s", group,
                    refused)
