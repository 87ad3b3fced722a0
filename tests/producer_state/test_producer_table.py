"""The producer table (producer_state/table.py) behaves exactly as the dict it replaced: an
insertion-ordered dict of producer id -> packed entry where every write moves the producer to
the end, under random puts, pops, expiries (everything matching, popped while walking the
order, as ProducerStateManager.expire does), snapshots and restores, with entries wider than
its slots now and then. Small ids and a small start make the index probe, wrap, shift back
on deletion and grow, and the slots grow and get reused."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from oncelog.producer_state.table import ProducerTable

WIDTH = 12
PIDS = st.one_of(st.integers(0, 40), st.integers(0, 2**63 - 1))
ENTRIES = st.binary(min_size=0, max_size=WIDTH).map(bytes) | st.binary(
    min_size=WIDTH + 1, max_size=3 * WIDTH)


class TableAgainstDict(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = ProducerTable(WIDTH)
        self.model: dict[int, bytes] = {}

    @rule(pid=PIDS, packed=ENTRIES)
    def put(self, pid: int, packed: bytes) -> None:
        self.model.pop(pid, None)
        self.model[pid] = packed
        self.table.put(pid, packed)

    @rule(pid=PIDS)
    def pop(self, pid: int) -> None:
        expected = self.model.pop(pid, None)
        if expected is None:
            try:
                self.table.pop(pid)
            except KeyError:
                return
            raise AssertionError(f"popped {pid}, which was not there")
        assert self.table.pop(pid) == expected

    @rule(pid=PIDS)
    def read(self, pid: int) -> None:
        assert self.table.get(pid) == self.model.get(pid)
        assert (pid in self.table) == (pid in self.model)

    @rule(below=st.integers(0, 256))
    def expire(self, below: int) -> None:
        """Everything whose first byte is below ``below`` goes, in order."""
        def idle(packed: bytes) -> bool:
            return not packed or packed[0] < below
        gone = [pid for pid, packed in self.table.items() if idle(packed)]
        assert gone == [pid for pid, packed in self.model.items() if idle(packed)]
        for pid in gone:
            self.table.pop(pid)
            del self.model[pid]

    @rule()
    def the_oldest_one_not_excluded(self) -> None:
        """The eviction's walk: stopped after the first match, the table unchanged."""
        excluded = set(list(self.model)[::2])
        expected = next((p for p in self.model if p not in excluded), None)
        assert next((p for p in self.table if p not in excluded), None) == expected

    @rule()
    def snapshot_and_restore(self) -> None:
        self.table = ProducerTable.of(list(self.table.items()), WIDTH)

    @invariant()
    def same_contents_in_the_same_order(self) -> None:
        assert len(self.table) == len(self.model)
        assert list(self.table.items()) == list(self.model.items())
        assert list(self.table) == list(self.model)


TableAgainstDict.TestCase.settings = settings(
    derandomize=True, database=None, max_examples=80, stateful_step_count=60, deadline=None)
TestTableAgainstDict = TableAgainstDict.TestCase


def test_many_producers_in_sequence_then_most_gone():
    """Runs of consecutive ids (as producer ids are issued) through growth and deletion."""
    table = ProducerTable(8)
    model: dict[int, bytes] = {}
    for pid in [*range(10**6, 10**6 + 3000), *range(5, 3000, 7)]:
        packed = pid.to_bytes(8, "little")
        table.put(pid, packed)
        model[pid] = packed
    for pid in list(model)[::3]:
        assert table.pop(pid) == model.pop(pid)
    for pid in range(10**6, 10**6 + 3000, 5):
        if pid in model:
            table.put(pid, model.pop(pid))
            model[pid] = table.get(pid)
    assert list(table.items()) == list(model.items())
