"""``oncelog audit --spark``: the audit of ``oncelog.audit`` as a Spark job, for topics too big
to read in one process.

Two stages, on Spark's RDD API (its DataFrame mapInArrow would need pandas). First, Spark
tasks read offset ranges of the topic's partitions (cut further with ``min_partitions``):
each batch's header (and a control batch's marker); a range holding transactions again as a
read_committed reader, keeping the headers it gets; and with ``--by`` each record's key or
value hash and location (16 bytes). A batch belongs to the range that holds its last offset,
so cutting a partition never counts a batch twice. Then one shuffle: headers go to the task of
their partition, sorted by offset, through the very ``Audit`` and ``TransactionAudit`` the
one-process audit uses; hashes go to the task of their hash, sorted by (hash, location),
through the same ``RepeatFinder`` (the first copy of a value is then the one with the lowest
partition and offset, as in the one-process audit, which reads partition after partition).
The driver joins the tasks' reports: transactions torn across partitions are found there,
from the markers of all partitions, by ``audit.transactions``' rule; repeated values of
different tasks are different values, so their counts add up. Both audits therefore report
the same.
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
    RepeatExample,
    RepeatFinder,
    RepeatReport,
    read_partition,
)
from ..audit.repeats import digest, merge_repeats, pack_locations
from ..audit.topic import (
    fields_of,
    marker_of,
    open_reader,
    read_back_examples,
    read_committed,
    snapshot,
)
from ..audit.transactions import MarkerSeen, TransactionAudit, TransactionReport, TxnPartitionReport
from .offsets import OffsetRange, split

# Stage one's rows, (key, value), sorted by key in stage two. Keys are int triples:
# (partition, offset, BATCH | VISIBLE | SUMMARY), or (hash, location, KEY | VALUE).
BATCH, VISIBLE, SUMMARY, KEY, VALUE = range(5)
HASHED = {KEY: "key", VALUE: "value"}
Row = tuple


def read_ranges(bootstrap: str, ranges: Iterable[OffsetRange], stable: dict[int, int],
                by: tuple[str, ...]) -> Iterator[Row]:
    """Stage one (a Spark task): each range's batch headers (a control batch's with its
    marker), what read_committed gets of it when it holds transactions, the hashes of the
    records' keys or values for ``by``, then the range's summary."""
    want_key, want_value = "key" in by, "value" in by
    for rng in ranges:
        p = rng.partition
        report = PartitionReport(p, rng.start, rng.end)
        counts = {name: [0, 0] for name in by}  # records hashed, nulls
        transactional = False
        with open_reader(bootstrap, rng.topic) as reader:
            for batch in read_partition(reader, report, controls=True):
                h = batch.header
                if h.last_offset >= rng.end:
                    continue
                transactional = transactional or h.is_transactional
                if h.is_control:
                    yield (p, h.base_offset, BATCH), (h, marker_of(batch, report))
                    continue
                yield (p, h.base_offset, BATCH), (h, None)
                if by and not h.is_transactional:
                    yield from _hashes(p, batch, report, counts, want_key, want_value)
            lost: list[tuple[int, int]] = []
            if transactional:
                for batch in read_committed(reader, p, rng.start, min(rng.end, stable[p]),
                                            lost):
                    h = batch.header
                    if h.is_transactional and h.last_offset < rng.end:
                        yield (p, h.base_offset, VISIBLE), h
                        if by:  # what read_committed gets counts (audit.topic.add_fields)
                            yield from _hashes(p, batch, report, counts, want_key, want_value)
        yield (p, rng.start, SUMMARY), (report.corrupt_batches, report.skipped_offsets,
                                        report.complete, lost, counts)


def _hashes(p: int, batch, report: PartitionReport, counts: dict[str, list[int]],
            want_key: bool, want_value: bool) -> Iterator[Row]:
    offsets, keys, values = fields_of(batch, report, want_key, want_value)
    locations = pack_locations(p, offsets)
    for kind, datas in ((KEY, keys), (VALUE, values)):
        if datas:
            count = counts[HASHED[kind]]
            for location, data in zip(locations, datas, strict=True):
                if data is None:
                    count[1] += 1
                    continue
                count[0] += 1
                yield (int.from_bytes(digest(data)), location, kind), None


def audit_rows(topic: str, rows: Iterable[Row], ranges: dict[int, tuple[int, int]],
               stable: dict[int, int], by: tuple[str, ...],
               examples: int) -> Iterator[tuple[str, str]]:
    """Stage two (a Spark task): rows sorted by key through ``Audit``, ``TransactionAudit``
    and ``RepeatFinder``; out come (kind, JSON) reports."""
    audit = Audit(topic)
    txns = TransactionAudit()
    finders = {name: RepeatFinder(name, 0, None, examples) for name in by}
    summaries: dict[int, dict] = {}
    try:
        for (first, second, kind), value in rows:
            if kind == BATCH:
                header, marker = value
                if not header.is_control:
                    audit.add_header(first, header)
                txns.add_batch(first, header, marker)
            elif kind == VISIBLE:
                txns.add_visible(first, value)
            elif kind == SUMMARY:
                corrupt, skipped, complete, lost, counts = value
                seen = summaries.setdefault(first, {
                    "partition": first, "corrupt_batches": 0, "skipped_offsets": 0,
                    "complete": True, "counts": {name: [0, 0] for name in by}})
                seen["corrupt_batches"] += corrupt
                seen["skipped_offsets"] += skipped
                seen["complete"] = seen["complete"] and complete
                for name, (records, nulls) in counts.items():
                    seen["counts"][name][0] += records
                    seen["counts"][name][1] += nulls
                for lost_first, lost_end in lost:
                    txns.add_lost(first, lost_first, lost_end)
            else:
                finders[HASHED[kind]].add_digest(first.to_bytes(8), second)
        report = audit.finish()
        for p in sorted(summaries):
            if txns.has(p):
                txns.finish_partition(p, min(stable[p], ranges[p][1]))
        repeats = [finder.finish() for finder in finders.values()]
    finally:
        audit.close()
        for finder in finders.values():
            finder.close()
    for part in report.partitions:
        yield "partition", json.dumps(asdict(part))
    for producer in report.producers:
        yield "producer", json.dumps(asdict(producer))
    for summary in summaries.values():
        yield "summary", json.dumps(summary)
    for txn in txns.reports:
        yield "transactions", json.dumps(asdict(txn))
    for marker in txns.markers:
        yield "marker", json.dumps(asdict(marker))
    for repeat in repeats:
        yield "repeat", json.dumps(asdict(repeat))


def _producer(data: dict) -> ProducerReport:
    epochs = [EpochReport(**e) for e in data.pop("epochs")]
    return ProducerReport(**data, epochs=epochs)


def _repeat(data: dict) -> RepeatReport:
    examples = [RepeatExample(e["count"], [tuple(loc) for loc in e["locations"]])
                for e in data.pop("examples")]
    data["by_partition"] = {int(p): n for p, n in data["by_partition"].items()}
    return RepeatReport(**data, examples=examples)


def audit_topic_on_spark(spark, bootstrap: str, topic: str,
                         partitions: Iterable[int] | None = None,
                         min_partitions: int | None = None, by: Iterable[str] = (),
                         examples: int = 5) -> AuditReport:
    """The audit of ``topic`` (all partitions, or ``partitions``), from each partition's log
    start to its high watermark when the audit starts, run on ``spark``: what ``audit_topic``
    reports."""
    started = time.monotonic()
    by = tuple(dict.fromkeys(by))
    with open_reader(bootstrap, topic) as reader:
        offsets, stable = snapshot(reader, partitions)
    indexes = list(offsets)
    ranges = split([OffsetRange(topic, p, s, e) for p, (s, e) in offsets.items()],
                   min_partitions or spark.sparkContext.defaultParallelism)
    sc = spark.sparkContext
    tasks = max(1, min(len(indexes), sc.defaultParallelism))
    if by:
        tasks = max(tasks, sc.defaultParallelism)
    found = (sc.parallelize(ranges, max(1, len(ranges)))
             .mapPartitions(lambda it: read_ranges(bootstrap, it, stable, by))
             .repartitionAndSortWithinPartitions(tasks, lambda key: key[0])
             .mapPartitions(lambda it: audit_rows(topic, it, offsets, stable, by, examples))
             ).collect()

    by_partition = {p: PartitionReport(p, s, e) for p, (s, e) in offsets.items()}
    producers: list[ProducerReport] = []
    txn_parts: list[TxnPartitionReport] = []
    markers: list[MarkerSeen] = []
    counts = {name: [0, 0] for name in by}
    repeats: dict[str, list[RepeatReport]] = {name: [] for name in by}
    for kind, text in found:
        data = json.loads(text)
        if kind == "producer":
            producers.append(_producer(data))
        elif kind == "partition":
            part = by_partition[data["partition"]]
            part.records, part.batches = data["records"], data["batches"]
        elif kind == "summary":
            part = by_partition[data["partition"]]
            part.corrupt_batches = data["corrupt_batches"]
            part.skipped_offsets = data["skipped_offsets"]
            part.complete = data["complete"]
            for name, (records, nulls) in data["counts"].items():
                counts[name][0] += records
                counts[name][1] += nulls
        elif kind == "transactions":
            txn_parts.append(TxnPartitionReport(**data))
        elif kind == "marker":
            markers.append(MarkerSeen(**data))
        else:
            repeats[data["field"]].append(_repeat(data))
    producers.sort(key=lambda r: (r.partition, r.producer_id is not None, r.producer_id or 0))
    report = AuditReport(topic, [by_partition[p] for p in sorted(by_partition)], producers,
                         [merge_repeats(name, repeats[name], *counts[name], examples)
                          for name in by])
    if txn_parts:
        report.transactions = TransactionReport.build(txn_parts, markers)
    if report.repeats:
        with open_reader(bootstrap, topic) as reader:
            read_back_examples(reader, report.repeats)
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
                         master: str, min_partitions: int | None, by: Iterable[str] = (),
                         examples: int = 5) -> AuditReport:
    """``oncelog audit --spark``: start a session on ``master``, audit, stop it (a session
    already running in this process is used as it is, and left running)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    spark = active or local_session(master, f"oncelog audit {topic}")
    try:
        return audit_topic_on_spark(spark, bootstrap, topic, partitions, min_partitions, by,
                                    examples)
    finally:
        if active is None:
            spark.stop()
