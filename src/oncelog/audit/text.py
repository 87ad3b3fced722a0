"""The audit's report as text, for people."""

from __future__ import annotations

import sys
from datetime import UTC, datetime

from .report import AuditReport, ProducerReport
from .wording import counted


def _shorten(data: bytes | None, limit: int = 60) -> str:
    if data is None:
        return "(not read)"
    text = repr(data)[2:-1]
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _epochs(row: ProducerReport) -> str:
    numbers = [e.epoch for e in row.epochs]
    if not numbers:
        return "-"
    if len(numbers) <= 3:
        return ",".join(map(str, numbers))
    return f"{numbers[0]}..{numbers[-1]} ({len(numbers)})"


def _table(rows: list[tuple[str, ...]], left: int, out) -> None:
    """Columns padded to their widest cell: the first ``left`` flush left, the rest right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i < left else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip(),
              file=out)


def _transactions(report: AuditReport, out) -> None:
    txns = report.transactions
    print(file=out)
    rows = [("PARTITION", "MARKERS", "COMMITTED", "ABORTED", "OPEN", "READ_COMMITTED_TO",
             "ABORTED_VISIBLE", "OPEN_VISIBLE", "COMMITTED_MISSING")]
    for p in txns.partitions:
        rows.append((str(p.partition), str(p.markers), str(p.committed), str(p.aborted),
                     str(p.open), str(p.read_committed_end), str(p.aborted_visible),
                     str(p.open_visible), str(p.committed_missing)))
    t = txns.totals
    rows.append(("TOTAL", str(sum(p.markers for p in txns.partitions)),
                 str(t["committed_records"]), str(t["aborted_records"]), str(t["open_records"]),
                 "", str(t["aborted_visible"]), str(t["open_visible"]),
                 str(t["committed_missing"])))
    _table(rows, 1, out)
    print(f"transactions: {counted(t['transactions'], 'transaction')} across partitions "
          f"(records counted by their markers' decision; OPEN: no marker yet), "
          f"{counted(t['torn_transactions'], 'torn transaction')}", file=out)
    for torn in txns.torn:
        when = datetime.fromtimestamp(torn.timestamp / 1000, UTC).isoformat(
            timespec="milliseconds")
        print(f"  torn: producer id {torn.producer_id} epoch {torn.epoch}, markers at {when}: "
              f"committed on partition {', '.join(map(str, torn.committed))} "
              f"({counted(torn.records_committed, 'record')}), aborted on partition "
              f"{', '.join(map(str, torn.aborted))} "
              f"({counted(torn.records_aborted, 'record')})", file=out)


def format_report(report: AuditReport, out=None, max_rows: int = 100) -> None:
    out = out or sys.stdout
    print(f"topic {report.topic}: {counted(len(report.partitions), 'partition')} read", file=out)
    rows = [("PARTITION", "OFFSETS", "RECORDS", "BATCHES", "NOTES")]
    for p in report.partitions:
        notes = []
        if p.corrupt_batches:
            notes.append(f"{p.corrupt_batches} corrupt batches skipped")
        if p.skipped_offsets:
            notes.append(f"{p.skipped_offsets} offsets deleted while reading")
        if not p.complete:
            notes.append("not read to the end")
        rows.append((str(p.partition), f"{p.start_offset}..{p.end_offset}", str(p.records),
                     str(p.batches), "; ".join(notes)))
    _table(rows, 2, out)
    print(file=out)
    rows = [("PARTITION", "PRODUCER_ID", "EPOCHS", "RECORDS", "DUPLICATES", "GAPS", "MISSING",
             "REGRESSIONS")]
    shown = report.producers
    if len(shown) > max_rows:  # many producer ids: the ones with problems first
        shown = [r for r in shown if r.problems][:max_rows]
        shown += [r for r in report.producers if not r.problems][:max_rows - len(shown)]
        shown.sort(key=lambda r: (r.partition, r.producer_id is not None, r.producer_id or 0))
    for row in shown:
        if row.producer_id is None:
            rows.append((str(row.partition), "none", "-", str(row.records), "-", "-", "-", "-"))
        else:
            rows.append((str(row.partition), str(row.producer_id), _epochs(row),
                         str(row.records), str(row.duplicates), str(row.gaps), str(row.missing),
                         str(row.regressions)))
    t = report.totals
    rows.append(("TOTAL", str(t["producers"]), "", str(t["records"]), str(t["duplicates"]),
                 str(t["gaps"]), str(t["missing"]), str(t["regressions"])))
    _table(rows, 3, out)
    if len(shown) < len(report.producers):
        print(f"({len(report.producers) - len(shown):,} rows without problems not shown; "
              "--json lists every one)", file=out)
    if report.transactions is not None:
        _transactions(report, out)
    for repeat in report.repeats:
        print(file=out)
        print(f"by {repeat.field}: {counted(repeat.records, 'record')} with a {repeat.field} "
              f"({repeat.nulls:,} null); {counted(repeat.repeated, repeat.field)} occurring more "
              f"than once, {counted(repeat.extra, 'extra record')}", file=out)
        if repeat.by_partition:
            print("  extra records per partition (the copies read last): " + ", ".join(
                f"{p}: {n}" for p, n in repeat.by_partition.items()), file=out)
        for example in repeat.examples:
            where = ", ".join(f"{p}:{o}" for p, o in example.locations)
            more = "" if example.count <= len(example.locations) else ", ..."
            same = "" if example.same is not False else " (hash collision: the bytes differ)"
            print(f"  {_shorten(example.data)!s}  x{example.count} at {where}{more}{same}",
                  file=out)
    print(file=out)
    print(report.verdict, file=out)
