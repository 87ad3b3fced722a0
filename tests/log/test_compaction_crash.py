"""A clean cut short at each of its file operations, by kill -9 (files as written) or by a
power cut (only what was made durable): reopening gives a log that reads as the model allows,
and cleaning it again gives what an uninterrupted clean gives. And the disk failing during a
clean (full, EIO, short writes, failed fsyncs): the old segments stay, intact and in use."""

from __future__ import annotations

import copy
import errno
import random

import pytest
from support.compaction_model import DIRECTORY, Harness, read_all

from oncelog.log import cleaning
from oncelog.log.compaction import CompactionConfig
from oncelog.log.disk import LogDirFailure
from oncelog.log.log import Log
from oncelog.log.memory_disk import MemoryDisk
from oncelog.protocol.records import CODECS

SEED = 20240613
CONFIG = CompactionConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=1000)
MUTATIONS = ("open", "write", "writev", "ftruncate", "fsync", "fdatasync", "rename", "unlink",
             "fsync_dir", "open_dir", "fsync_open_dir", "dup", "close")


class Crash(BaseException):
    """The process dies here: nothing after it runs (not an OSError anyone handles)."""


class CrashingDisk(MemoryDisk):
    """A MemoryDisk that dies at its ``crash_at``-th mutating operation (counted from 0), and
    stays dead until ``revive``."""

    def __init__(self) -> None:
        super().__init__()
        self.crash_at: int | None = None
        self.operations = 0

    def revive(self) -> None:
        self.crash_at = None
        self.operations = 0


def _dying(name):
    method = getattr(MemoryDisk, name)

    def operation(self, *args, **kwargs):
        if self.crash_at is not None:
            if self.operations >= self.crash_at:
                raise Crash(name)
            self.operations += 1
        return method(self, *args, **kwargs)

    operation.__name__ = name
    return operation


for _name in MUTATIONS:
    setattr(CrashingDisk, _name, _dying(_name))


def build(seed: int, disk: MemoryDisk | None = None) -> Harness:
    """A compacted log of several segments: keys overwritten, tombstones, compressed
    batches, two idempotent producers; closed cleanly, so all of it is durable."""
    rng = random.Random(seed)
    h = Harness(CONFIG, segment_bytes=500, disk=disk or CrashingDisk())
    for i in range(45):
        records = [(b"k%d" % rng.randrange(30), None if rng.random() < 0.15 else b"v%d" % i)
                   for _ in range(rng.randint(1, 3))]
        h.append(records, producer_id=rng.choice([-1, -1, 1, 2]),
                 compression=rng.choice(sorted(CODECS.values())))
        h.clock += rng.randint(0, 3)
    h.roll()
    h.append([(b"active", b"a")])
    h.log.close()
    return h


def clean_once(h: Harness) -> None:
    """Open the log and clean it (nothing to do when a cut-short clean got to its end)."""
    h.log = Log(DIRECTORY, h.log_config, h.disk)
    h.model.last_clean_ms = h.clock
    if cleaning.run(h.clean_steps()) is None:
        assert h.log.first_dirty_offset == h.log.active.base_offset


@pytest.mark.parametrize("power_cut", [False, True], ids=["kill", "power-cut"])
def test_a_crash_at_any_step_of_a_clean_loses_nothing(power_cut):
    base = build(SEED)
    uninterrupted = copy.deepcopy(base)
    uninterrupted.disk.crash_at = 1 << 30
    clean_once(uninterrupted)
    steps = uninterrupted.disk.operations
    expected = read_all(uninterrupted.log)[1]
    assert steps > 100
    print(f"a clean of {steps} file operations, cut short at each")
    rng = random.Random(SEED)
    for crash_at in range(steps):
        h = copy.deepcopy(base)
        h.disk.crash_at = crash_at
        with pytest.raises(Crash):
            clean_once(h)
        if power_cut:
            h.disk.power_loss(rng)
        else:
            h.disk.crash()
        h.disk.revive()
        h.log = Log(DIRECTORY, h.log_config, h.disk)
        h.model.check(h.log)
        leftovers = [n for n in h.disk.listdir(DIRECTORY)
                     if n.endswith((".cleaned", ".swap", ".tmp"))]
        assert not leftovers, (crash_at, leftovers)
        h.log.close()
        clean_once(h)
        assert read_all(h.log)[1] == expected, crash_at
        h.model.check(h.log)


@pytest.mark.parametrize("op,error,suffix,partial", [
    ("write", errno.ENOSPC, ".log.cleaned", 100),
    ("write", errno.EIO, ".log.cleaned", 0),
    ("write", 0, ".log.cleaned", 7),  # a short write: finished by the next one
    ("write", errno.ENOSPC, ".index.cleaned.tmp", 3),
    ("open", errno.EIO, ".log.cleaned", 0),
    ("rename", errno.EIO, ".swap.tmp", 0),
    ("write", errno.ENOSPC, ".swap.tmp", 0),
    ("fsync", errno.EIO, ".timeindex.cleaned.tmp", 0),
])
def test_a_failing_disk_leaves_the_old_segments_in_use(op, error, suffix, partial):
    h = build(SEED)
    h.log = Log(DIRECTORY, h.log_config, h.disk)
    h.disk.fail(op, error, partial=partial, path_suffix=suffix)
    try:
        result = cleaning.run(h.clean_steps())
    except OSError:
        result = None
    assert h.disk.faults_hit == 1
    h.model.last_clean_ms = h.clock
    h.model.check(h.log)  # groups swapped before the failure stay swapped; the rest as was
    if result is None:  # refused: nothing left behind, and the log in use reads the same
        assert not [n for n in h.disk.listdir(DIRECTORY) if n.endswith((".cleaned", ".swap"))]
    in_use = read_all(h.log)
    h.log.close()
    h.log = Log(DIRECTORY, h.log_config, h.disk)
    assert read_all(h.log) == in_use
    if result is None:  # and it cleans once the disk is well
        assert cleaning.run(h.clean_steps()) is not None
        h.model.check(h.log)


def test_a_failed_fsync_of_the_cleaned_data_takes_the_directory_offline():
    h = build(SEED)
    h.log = Log(DIRECTORY, h.log_config, h.disk)
    h.disk.fail("fsync", path_suffix=".log.cleaned")
    with pytest.raises(LogDirFailure):
        cleaning.run(h.clean_steps())
    restart_and_check(h)


def test_a_failed_directory_fsync_at_any_step_of_a_clean_loses_nothing():
    """Each directory fsync of a clean failing in turn: before the commit the clean is
    refused (an index's atomic write) or the directory goes offline; after it, offline; in
    every case the next start finds a log that reads as the model allows. (The last one is
    the cleaner checkpoint's: its failure is only logged, the next clean redoes the part.)"""
    base = build(SEED)
    counted = copy.deepcopy(base)
    counted.log = Log(DIRECTORY, counted.log_config, counted.disk)
    fsyncs = []
    counted.disk.fsync_dir = lambda path, real=counted.disk.fsync_dir: (
        fsyncs.append(path), real(path))[1]
    cleaning.run(counted.clean_steps())
    assert len(fsyncs) > 5
    for skip in range(len(fsyncs)):
        h = copy.deepcopy(base)
        h.log = Log(DIRECTORY, h.log_config, h.disk)
        _pass_fsyncs(h.disk, skip)
        try:
            cleaning.run(h.clean_steps())
        except (OSError, LogDirFailure):
            pass
        else:  # only the checkpoint's own fsync may fail without failing the clean
            assert skip == len(fsyncs) - 1
        restart_and_check(h)


def _pass_fsyncs(disk: MemoryDisk, count: int) -> None:
    """Let the next ``count`` directory fsyncs through, then fail the one after."""
    disk.clear_faults()
    real = disk.fsync_dir
    calls = [0]

    def fsync_dir(path: str) -> None:
        calls[0] += 1
        if calls[0] == count + 1:
            raise OSError(errno.EIO, "injected", path)
        real(path)

    disk.fsync_dir = fsync_dir


def restart_and_check(h: Harness) -> None:
    """What the next start finds after the directory went offline: a power cut may even
    have come, and no fsync of the failed kind is trusted."""
    h.log.abandon()
    h.disk.clear_faults()
    vars(h.disk).pop("fsync_dir", None)
    h.disk.power_loss(random.Random(SEED))
    h.log = Log(DIRECTORY, h.log_config, h.disk)
    h.model.last_clean_ms = h.clock
    h.model.check(h.log)
    assert cleaning.run(h.clean_steps()) is not None or \
        h.log.first_dirty_offset == h.log.active.base_offset
    h.model.check(h.log)


def test_retention_deleting_a_segment_mid_clean_gives_the_clean_up():
    h = build(SEED)
    h.log = Log(DIRECTORY, h.log_config, h.disk)
    steps = h.clean_steps()
    step = next(steps)  # the first group is written, its fsync handed out
    assert step is not None
    first = h.log.segments[0]
    h.log._delete_first("retention.ms")  # what retention does between two steps
    before = read_all(h.log)
    with pytest.raises(cleaning.GivenUp):
        steps.send(step.call())
    steps.close()
    assert not first.is_open
    assert not [n for n in h.disk.listdir(DIRECTORY) if n.endswith((".cleaned", ".swap"))]
    assert read_all(h.log) == before


class RunsOutOfDescriptors(MemoryDisk):
    """A MemoryDisk whose descriptors run out (EMFILE) right after the rename ``when``
    names (once): at a chosen step of a swap."""

    def __init__(self, when: str) -> None:
        super().__init__()
        self.when: str | None = when

    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        if self.when is not None and src.endswith(self.when):
            self.max_fds = self.open_fds
            self.when = None  # once


@pytest.mark.parametrize("when", [".swap.tmp", ".txnindex.cleaned", ".log.cleaned"],
                         ids=["after-the-commit", "completing", "completed"])
def test_a_swap_out_of_descriptors_never_takes_the_directory_offline(when):
    """EMFILE once a clean's swap is committed (issue 28 #2): the swap needs no descriptor
    it did not take before its commit, so it completes and the directory stays online (an
    fsync that cannot open its directory was taken for a failed one: LogDirFailure)."""
    h = build(SEED, RunsOutOfDescriptors(when))
    h.log = Log(DIRECTORY, h.log_config, h.disk)
    h.model.last_clean_ms = h.clock
    try:
        cleaning.run(h.clean_steps())
    except OSError as exc:
        assert exc.errno == errno.EMFILE, exc  # after the swap: a later step of the clean
    h.disk.max_fds = None
    h.model.check(h.log)
    assert not [n for n in h.disk.listdir(DIRECTORY) if n.endswith((".cleaned", ".swap"))]
    h.log.close()
    clean_once(h)
    h.model.check(h.log)
