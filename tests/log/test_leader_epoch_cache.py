"""log/leader_epoch.py: the leader epoch cache's rows against a model (hypothesis), and its
checkpoint file read as Kafka writes it, a damaged one starting empty (a count is checked
against the lines there before anything is built from it)."""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from oncelog.log.leader_epoch import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    LeaderEpochCache,
    parse,
    render,
)
from oncelog.log.memory_disk import MemoryDisk

DIR = "/p"


class CacheModel(RuleBasedStateMachine):
    """The model: the epoch of every offset of the log, as the batches were stamped."""

    @initialize()
    def start(self):
        self.disk = MemoryDisk()
        self.disk.makedirs(DIR)
        self.cache = LeaderEpochCache(DIR, self.disk)
        self.log: list[int] = []  # epoch per offset

    @rule(epoch_step=st.integers(0, 2), count=st.integers(0, 4))
    def lead(self, epoch_step, count):
        """A leader at an epoch at or above the latest assigns it at the log end (A1/A2),
        then appends ``count`` records at it."""
        epoch = max(self.log[-1] if self.log else 0, self.cache.latest_epoch, 0) + epoch_step
        self.cache.assign(epoch, len(self.log))
        self.log += [max(epoch, self.cache.latest_epoch)] * count

    @rule(data=st.data())
    def truncate(self, data):
        end = data.draw(st.integers(0, len(self.log)))
        self.log = self.log[:end]
        self.cache.truncate_from_end(end)  # T1

    @rule(epoch=st.integers(-1, 12))
    def ask(self, epoch):
        got = self.cache.end_offset_for(epoch, len(self.log))
        epochs = [e for e, _ in self.cache.entries]
        if epoch == -1 or not epochs or epoch > epochs[-1]:
            assert got == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)  # Q4
        elif epoch == epochs[-1]:
            assert got == (epoch, len(self.log))  # Q1
        else:
            # Q2/Q3: the first offset of a later epoch is where this one (or the last at or
            # below it) ends, in the log as written
            later = [o for o, e in enumerate(self.log) if e > epoch]
            start_of_next = next(s for e, s in self.cache.entries if e > epoch)
            assert got[1] == start_of_next
            if later:
                assert got[1] <= later[0]
            below = [e for e in epochs if e <= epoch]
            assert got[0] == (below[-1] if below else epoch)

    @invariant()
    def consistent(self):
        entries = self.cache.entries
        assert all(a[0] < b[0] and a[1] <= b[1] for a, b in itertools.pairwise(entries))
        assert all(start <= len(self.log) for _, start in entries)
        # what a restart reads back is what is in memory
        assert LeaderEpochCache(DIR, self.disk).entries == entries


CacheModel.TestCase.settings = settings(max_examples=60, stateful_step_count=30,
                                        deadline=None)
TestCacheModel = CacheModel.TestCase


def test_checkpoint_file_format_and_damage():
    assert render([(0, 0), (3, 120)]) == b"0\n2\n0 0\n3 120\n"
    assert parse("0\n2\n0 0\n3 120\n") == [(0, 0), (3, 120)]
    assert parse("0\n0\n") == []
    assert parse("1\n1\n0 0\n") == []  # a version we do not know
    assert parse("0\n999999999\n0 0\n") == []  # a count the file does not hold
    assert parse("0\n2\n3 0\n1 5\n") == []  # out of order
    assert parse("0\n1\nx y\n") == []
    assert parse("") == []
    disk = MemoryDisk()
    disk.makedirs(DIR)
    fd = disk.open(f"{DIR}/{LEADER_EPOCH_CHECKPOINT_FILE}", 0o101 | 0o1000, 0o644)
    disk.write(fd, b"garbage")
    disk.close(fd)
    assert LeaderEpochCache(DIR, disk).entries == []
