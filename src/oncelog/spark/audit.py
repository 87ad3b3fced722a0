"""``oncelog audit --spark``: the sequence audit of ``oncelog.audit`` as a Spark job, for topics
too big to read in one process.

Two stages, on Spark's RDD API (its DataFrame mapInArrow would need pandas). First, Spark
tasks read offset ranges of the topic's partitions (cut further with
``min_partitions``) and keep only each batch's header: the audit needs no record. A batch
belongs to the range that holds its last offset, so cutting a partition never counts a batch
twice. Then the headers are grouped by partition, sorted by offset, and each partition goes
through the very ``Audit`` the one-process audit uses, so both report the same duplicates,
gaps and regressions per producer id, epoch and partition. Headers are small (about 60 bytes
a batch), so the second stage is cheap next to the reading.

Repeated keys or values (``--by``) are not looked for on Spark yet.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict

from ..audit import (
    Audit,
    AuditReport,
    EpochReport,
    PartitionReport,
    ProducerReport,
    read_partition,
)
from ..audit.topic import open_reader, topic_ranges
from ..protocol.record_batch import BatchHeader
from .offsets import OffsetRange, split

# A batch header as stage one hands it on: (partition, base offset) first, the sort key.
# A range's summary row follows its headers: (partition, start, None, corrupt batches,
# offsets deleted while reading, complete).
Row = tuple


def read_headers(bootstrap: str, ranges: Iterable[OffsetRange]) -> Iterator[Row]:
    """Stage one (a Spark task): the batch headers of each range, then its summary."""
    for rng in ranges:
        report = PartitionReport(rng.partition, rng.start, rng.end)
        with open_reader(bootstrap, rng.topic) as reader:
            for batch in read_partition(reader, report):
                h = batch.header
                if h.last_offset < rng.end:
                    yield (rng.partition, h.base_offset), h
        yield (rng.partition, rng.start), (None, report.corrupt_batches,
                                           report.skipped_offsets, report.complete)


def audit_headers(topic: str, rows: Iterable[Row]) -> Iterator[tuple[str, str]]:
    """Stage two (a Spark task): headers sorted by partition and offset through ``Audit``;
    out come ("partition" | "producer" | "summary", JSON) reports."""
    audit = Audit(topic)
    summaries: dict[int, dict] = {}
    try:
        for (partition, _), row in rows:
            if isinstance(row, BatchHeader):
                audit.add_header(partition, row)
                continue
            _, corrupt, skipped, complete = row
            seen = summaries.setdefault(partition, {
                "partition": partition, "corrupt_batches": 0, "skipped_offsets": 0,
                "complete": True})
            seen["corrupt_batches"] += corrupt
            seen["skipped_offsets"] += skipped
            seen["complete"] = seen["complete"] and complete
        report = audit.finish()
    finally:
        audit.close()
    for part in report.partitions:
        yield "partition", json.dumps(asdict(part))
    for producer in report.producers:
        yield "producer", json.dumps(asdict(producer))
    for summary in summaries.values():
        yield "summary", json.dumps(summary)


def _producer(data: dict) -> ProducerReport:
    epochs = [EpochReport(**e) for e in data.pop("epochs")]
    return ProducerReport(**data, epochs=epochs)


def audit_topic_on_spark(spark, bootstrap: str, topic: str,
                         partitions: Iterable[int] | None = None,
                         min_partitions: int | None = None) -> AuditReport:
    """The sequence audit of ``topic`` (all partitions, or ``partitions``), from each
    partition's log start to its high watermark when the audit starts, run on ``spark``."""
    started = time.monotonic()
    with open_reader(bootstrap, topic) as reader:
        offsets = topic_ranges(reader, partitions)
    indexes = list(offsets)
    ranges = split([OffsetRange(topic, p, s, e) for p, (s, e) in offsets.items()],
                   min_partitions or spark.sparkContext.defaultParallelism)
    sc = spark.sparkContext
    tasks = max(1, min(len(indexes), sc.defaultParallelism))
    found = (sc.parallelize(ranges, max(1, len(ranges)))
             .mapPartitions(lambda it: read_headers(bootstrap, it))
             .repartitionAndSortWithinPartitions(tasks, lambda key: key[0])
             .mapPartitions(lambda it: audit_headers(topic, it))).collect()

    by_partition = {p: PartitionReport(p, s, e) for p, (s, e) in offsets.items()}
    producers = []
    for kind, text in found:
        data = json.loads(text)
        part = by_partition[data["partition"]]
        if kind == "producer":
            producers.append(_producer(data))
        elif kind == "partition":
            part.records, part.batches = data["records"], data["batches"]
        else:
            part.corrupt_batches = data["corrupt_batches"]
            part.skipped_offsets = data["skipped_offsets"]
            part.complete = data["complete"]
    producers.sort(key=lambda r: (r.partition, r.producer_id is not None, r.producer_id or 0))
    report = AuditReport(topic, [by_partition[p] for p in sorted(by_partition)], producers, [])
    report.seconds = time.monotonic() - started
    return report


def local_session(master: str = "local[*]", app: str = "oncelog"):
    """A SparkSession for oncelog's own commands: the UI off, everything on 127.0.0.1 when
    ``master`` is local, the workers running this interpreter (which has oncelog)."""
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def audit_in_new_session(bootstrap: str, topic: str, partitions: Iterable[int] | None,
                         master: str, min_partitions: int | None) -> AuditReport:
    """``oncelog audit --spark``: start a session on ``master``, audit, stop it (a session
    already running in this process is used as it is, and left running)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    spark = active or local_session(master, f"oncelog audit {topic}")
    try:
        return audit_topic_on_spark(spark, bootstrap, topic, partitions, min_partitions)
    finally:
        if active is None:
            spark.stop()
