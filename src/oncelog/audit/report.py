"""The audit's report: per partition, per producer id and epoch, repeated values; totals and
the verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from .repeats import RepeatReport
from .wording import counted

if TYPE_CHECKING:
    from .transactions import TransactionReport


@dataclass
class EpochReport:
    epoch: int
    records: int
    batches: int
    first_sequence: int
    last_sequence: int
    duplicates: int
    gaps: int
    missing: int
    regressions: int


@dataclass
class ProducerReport:
    partition: int
    producer_id: int | None  # None: records written without a producer id (not idempotent)
    records: int
    duplicates: int = 0
    gaps: int = 0
    missing: int = 0
    regressions: int = 0
    unsequenced: int = 0
    epochs: list[EpochReport] = field(default_factory=list)

    @property
    def problems(self) -> int:
        return self.duplicates + self.gaps + self.regressions


@dataclass
class PartitionReport:
    partition: int
    start_offset: int = -1  # the range read: [start_offset, end_offset)
    end_offset: int = -1
    records: int = 0
    batches: int = 0
    corrupt_batches: int = 0  # CRC mismatch: skipped
    skipped_offsets: int = 0  # deleted by retention while the audit read
    complete: bool = True  # False: the reader could not get to end_offset


@dataclass
class AuditReport:
    topic: str
    partitions: list[PartitionReport]
    producers: list[ProducerReport]
    repeats: list[RepeatReport]
    seconds: float = 0.0
    transactions: TransactionReport | None = None  # None: no transactional batch read

    @property
    def totals(self) -> dict[str, int]:
        return {
            "records": sum(p.records for p in self.partitions),
            "batches": sum(p.batches for p in self.partitions),
            "producers": len({p.producer_id for p in self.producers
                              if p.producer_id is not None}),
            "duplicates": sum(p.duplicates for p in self.producers),
            "gaps": sum(p.gaps for p in self.producers),
            "missing": sum(p.missing for p in self.producers),
            "regressions": sum(p.regressions for p in self.producers),
            "corrupt_batches": sum(p.corrupt_batches for p in self.partitions),
            "incomplete_partitions": sum(not p.complete for p in self.partitions),
            **{f"repeated_{r.field}s": r.repeated for r in self.repeats},
            **{f"extra_{r.field}_records": r.extra for r in self.repeats},
            **(self.transactions.totals if self.transactions is not None else {}),
        }

    @property
    def problems(self) -> list[str]:
        t = self.totals
        found = []
        if t["duplicates"]:
            found.append(counted(t["duplicates"], "duplicate sequence"))
        if t["gaps"]:
            found.append(f"{counted(t['gaps'], 'gap')} "
                         f"({counted(t['missing'], 'missing sequence')})")
        if t["regressions"]:
            found.append(counted(t["regressions"], "regressed sequence"))
        for r in self.repeats:
            if r.extra:
                found.append(f"{counted(r.repeated, r.field)} repeated "
                             f"({counted(r.extra, 'extra record')})")
        if t["corrupt_batches"]:
            found.append(counted(t["corrupt_batches"], "corrupt batch", "corrupt batches"))
        if t["incomplete_partitions"]:
            found.append(counted(t["incomplete_partitions"], "partition") + " not read to the end")
        if self.transactions is not None:
            found += self.transactions.problems
        return found

    @property
    def clean(self) -> bool:
        return not self.problems

    @property
    def verdict(self) -> str:
        t = self.totals
        read = (f"{counted(t['records'], 'record')} in "
                f"{counted(len(self.partitions), 'partition')}, "
                f"{counted(t['producers'], 'producer id')}")
        if self.clean:
            checked = "duplicate, gap or regression" + (
                "".join(f", repeated {r.field}" for r in self.repeats))
            if self.transactions is not None:
                checked += (f"; {counted(t['transactions'], 'transaction')}: no aborted or "
                            "open-transaction record visible to read_committed, no committed "
                            "record missing, no torn transaction")
            return f"CLEAN: {read}; no {checked}"
        return f"NOT CLEAN: {read}; " + ", ".join(self.problems)

    def to_json(self) -> dict:
        repeats = []
        for r in self.repeats:
            d = asdict(r)
            d["by_partition"] = {str(k): v for k, v in r.by_partition.items()}
            for example in d["examples"]:
                data = example.pop("data")
                example["data"] = None if data is None else data.decode("utf-8", "replace")
                example["data_hex"] = None if data is None else data.hex()
                example["locations"] = [{"partition": p, "offset": o}
                                        for p, o in example["locations"]]
            repeats.append(d)
        return {
            "topic": self.topic,
            "clean": self.clean,
            "verdict": self.verdict,
            "problems": self.problems,
            "totals": self.totals,
            "partitions": [asdict(p) for p in self.partitions],
            "producers": [asdict(p) for p in self.producers],
            "repeats": repeats,
            **({} if self.transactions is None else {"transactions": {
                "partitions": [asdict(p) for p in self.transactions.partitions],
                "torn": [asdict(t) for t in self.transactions.torn]}}),
            "seconds": round(self.seconds, 3),
        }


