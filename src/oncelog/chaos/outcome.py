"""What a scenario run records: the steps of its sequence diagram and its verdict (shared by
the sequence flows, the transactional flows and the diagram)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Step:
    """One line of the sequence diagram."""

    kind: str  # "request", "response", "producer-note", "broker-note"
    text: str
    lost: bool = False
    tone: str = "normal"  # "normal", "ok", "error", "duplicate"


@dataclass
class Outcome:
    name: str
    title: str
    steps: list[Step] = field(default_factory=list)
    log: list[str] = field(default_factory=list)  # record values read back, in offset order
    offsets: list[int] = field(default_factory=list)  # the offset of each (a log may skip some)
    expected: list[str] = field(default_factory=list)
    verdict: str = ""
    passed: bool = False
    kafka_note: str = ""


def describe_log(log: Iterable[tuple[int, str]]) -> str:
    """A partition's (offset, value) records as runs of one label (a value's text before
    its ":"): "a at 0-4, b at 5-9"."""
    runs: list[list] = []
    for offset, value in log:
        label = value.split(":")[0]
        if runs and runs[-1][0] == label and runs[-1][2] == offset - 1:
            runs[-1][2] = offset
        else:
            runs.append([label, offset, offset])
    return ", ".join(f"{label} at {a}-{b}" for label, a, b in runs) or "empty"
