"""What a second review of the seal off the event loop found, each held here (each failed
before its fix):

* flush.messages=N counted only the active segment's messages: a roll reset the count while
  the old segment's were not on disk yet (its seal runs), so after a roll up to 2(N-1)
  acknowledged messages were off disk where the policy allows N-1. The count now goes on
  over a roll (Log.roll; Kafka counts the log end less the recovery point).
* A failed fsync in the seal's second half (the index files' own fsync, the directory's
  fsync after the marker's removal) was taken for a full disk: logged, retried later, the
  log directory left online. It is the seal's ``error`` now: the directory goes offline.
  Likewise the directory fsync that makes a start's drop of the segments after a hole
  durable: LogDirFailure, not an OSError after which a retried opening went on without
  that drop ever being durable.
* The seals of every log directory shared one pool of four threads, and a flush waits for
  its seals without a bound: a directory whose fsyncs hang held the acknowledgements
  (flush.messages=1) of a healthy directory's partition that rolled. Each LogDir has its
  own pool now.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import os
import random
import threading
import time

import pytest

from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.log.disk import LogDirFailure
from oncelog.log.log import Log, LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.record_batch import assign_offsets, split_batches
from oncelog.protocol.records import decode_batch, encode_batch

WAIT_S = 10
LOG_DIR = "/data"
DIRECTORY = "/data/t-0"
SEGMENT0 = "00000000000000000000"


class Issued:
    def is_issued(self, producer_id: int) -> bool:
        return True

    def highest_claimed(self) -> int:
        return 0


def record(n: int) -> bytes:
    return encode_batch([(None, b"%d:" % n + b"r" * 90, (), int(time.time() * 1000))])


def open_partition(disk: MemoryDisk, config: LogConfig, directory: str = DIRECTORY,
                   log_dir: str | LogDir = LOG_DIR) -> Partition:
    p = Partition("t", 0, directory, config, 1 << 20, StateLimits(), Issued(),
                  log_dir=log_dir if isinstance(log_dir, LogDir) else LogDir(log_dir),
                  disk=disk)
    assert p.state is not None
    return p


def values(p: Partition) -> list[int]:
    plog, found = p.log, []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 20).records
        if not data:
            break
        pos = 0
        while pos < len(data):
            header, records = decode_batch(data, pos)
            found += [int(r.value.split(b":")[0]) for r in records]
            pos += header.size
        offset = header.last_offset + 1
    return found


def power_cut_copy(disk: MemoryDisk) -> MemoryDisk:
    cut = MemoryDisk()
    with getattr(disk, "_lock", contextlib.nullcontext()):  # (main's disk has no lock)
        cut._files, cut._dirs, cut._durable_names = copy.deepcopy(
            (disk._files, disk._dirs, disk._durable_names))
    return cut


class GatedDisk(MemoryDisk):
    """The fsync of a segment whose name ends in one of ``gated`` (its log), when made by a
    worker thread, signals ``reached`` and waits for ``release``; on the event loop's
    thread it goes through."""

    def __init__(self, gated: tuple[str, ...] = (SEGMENT0 + ".log",)) -> None:
        super().__init__()
        self.gated = gated
        self.armed = False
        self.reached = threading.Semaphore(0)
        self.release = threading.Event()

    def fsync(self, fd: int) -> None:  # type: ignore[override]
        opened = self._fds.get(fd)
        if self.armed and opened is not None and opened.path.endswith(self.gated) and \
                threading.current_thread() is not threading.main_thread():
            self.reached.release()
            assert self.release.wait(WAIT_S * 3), "the test never opened the gate"
        MemoryDisk.fsync(self, fd)

    fdatasync = fsync


# --- flush.messages=N after a roll --------------------------------------------------------

def test_a_roll_does_not_reset_what_flush_messages_counts():
    """flush.messages=2: at most one acknowledged message may be off disk at any time. Five
    batches fill segment 0, every second one flushed: the fifth (A) is acknowledged
    unflushed, as the policy allows. The sixth (B) rolls; the seal of segment 0 is held in
    its worker. B is acknowledged at once (the new segment counts one message), so two
    acknowledged messages are off disk, and a power cut loses both. (On main the roll
    fsynced segment 0: only B could be lost.)"""
    size = len(record(0))
    config = LogConfig(segment_bytes=5 * size, index_interval_bytes=100, flush_messages=2)
    disk = GatedDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk, config)
    acked: list[int] = []
    cuts: list[MemoryDisk] = []

    async def scenario() -> None:
        for n in range(5):
            waiting = p.durable(p.append_records(record(n)))
            if waiting is not None:
                await asyncio.wait_for(waiting, WAIT_S)
            acked.append(n)
        assert len(p.log.segments) == 1
        disk.armed = True
        rolled = p.append_records(record(5))
        assert len(p.log.segments) == 2, "the sixth batch did not roll"
        waiting = p.durable(rolled)
        if waiting is not None:
            done, _ = await asyncio.wait([waiting], timeout=0.3)
            if not done:  # held behind the seal, as Kafka's count would have it
                disk.release.set()
                await asyncio.wait_for(waiting, WAIT_S)
        acked.append(5)
        cuts.append(power_cut_copy(disk))  # the seal of segment 0 still held (if it is)
        disk.release.set()
        for _ in range(WAIT_S * 100):
            if not getattr(p, "seal_running", False):  # (main has no seals)
                break
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    p.abandon()
    worst: list[int] = []
    for seed in range(8):
        cut = copy.deepcopy(cuts[0])
        cut.power_loss(random.Random(seed))
        kept = set(values(open_partition(cut, config)))
        lost = [n for n in acked if n not in kept]
        if len(lost) > len(worst):
            worst = lost
    assert len(worst) <= config.flush_messages - 1, \
        f"acknowledged batches lost to a power cut: {worst}, flush.messages=" \
        f"{config.flush_messages} allows {config.flush_messages - 1}"


# --- fsync failures the seal takes for a full disk ----------------------------------------

class WorkerFaultDisk(MemoryDisk):
    """Once armed, the first ``op`` ("fsync_dir", or "fsync" of a path ending in
    ``suffix``) made by a worker thread fails with EIO."""

    def __init__(self, op: str, suffix: str = "") -> None:
        super().__init__()
        self.op, self.suffix = op, suffix
        self.armed = False

    def _trip(self, op: str, path: str) -> None:
        if self.armed and op == self.op and path.endswith(self.suffix) and \
                threading.current_thread() is not threading.main_thread():
            self.armed = False
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    def fsync(self, fd: int) -> None:  # type: ignore[override]
        opened = self._fds.get(fd)
        self._trip("fsync", opened.path if opened is not None else "")
        MemoryDisk.fsync(self, fd)

    fdatasync = fsync

    def fsync_dir(self, path: str) -> None:  # type: ignore[override]
        self._trip("fsync_dir", path)
        MemoryDisk.fsync_dir(self, path)


@pytest.mark.parametrize("op,suffix", [
    pytest.param("fsync", ".index.tmp", id="the-index-files-fsync"),
    pytest.param("fsync_dir", "t-0", id="the-directory-fsync-after-the-markers-removal"),
])
def test_a_failed_fsync_in_a_seal_takes_the_directory_offline(op, suffix):
    """The seal's fsync of its offset index file, or of the directory after it removed the
    marker, fails with EIO in its worker: the log directory must go offline, as for the
    segment's own fsync (DESIGN.md: a failed fsync takes the log directory offline, as
    Kafka does). The branch logs "writing its index files failed" and retries later."""
    config = LogConfig(segment_bytes=1024, index_interval_bytes=100, flush_messages=1)
    disk = WorkerFaultDisk(op, suffix)
    disk.makedirs(LOG_DIR)
    p = open_partition(disk, config)

    async def scenario() -> None:
        n = 0
        while len(p.log.segments) < 2:
            if len(p.log.segments) == 1 and \
                    p.log.active.size + len(record(n)) > config.segment_bytes:
                disk.armed = True  # the next append rolls
            waiting = p.durable(p.append_records(record(n)))
            n += 1
            if waiting is not None:
                with contextlib.suppress(OSError):  # (offline: what the test wants)
                    await asyncio.wait_for(waiting, WAIT_S)
        for _ in range(WAIT_S * 100):
            if not p.seal_running:
                break
            await asyncio.sleep(0.01)
        for _ in range(10):
            await asyncio.sleep(0)  # the seal's report reaches the loop
        assert not disk.armed, "the fault was never met"

    asyncio.run(scenario())
    offline = p.log_dir.offline
    p.abandon()
    assert offline, f"a failed {op} of the seal left the log directory online"


def put(log: Log, i: int) -> None:
    batch = encode_batch([(None, b"%d:" % i + b"." * 200, (), 1_700_000_000_000 + i)])
    headers = split_batches(batch, 1 << 20)
    headers, parts = assign_offsets(batch, headers, log.log_end_offset, 0)
    log.append(parts, headers)


def test_a_failed_directory_fsync_of_the_drop_after_a_hole_takes_the_directory_offline():
    """A start finds segment 0 marked and cut short, and drops segment 7 after it; the
    directory fsync that makes that drop durable fails with EIO. The branch raises a plain
    OSError: the opening is retried, finds segment 7 gone (its unlink only in memory) and
    opens without ever fsyncing the directory, so a later power cut can bring segment 7
    back. A failed fsync must take the directory offline (LogDirFailure)."""
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=100)
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    log = Log(DIRECTORY, config, disk)
    held: list = []
    for i in range(5):
        put(log, i)
    log.flush()
    for i in range(5, 7):
        put(log, i)  # on disk only by the seal, which never runs
    log.roll(held.append)
    for i in range(7, 9):
        put(log, i)
    log.abandon()
    for seed in range(64):  # a power cut that cuts segment 0 short
        cut = copy.deepcopy(disk)
        cut.power_loss(random.Random(seed))
        seg0 = cut._files[os.path.join(DIRECTORY, SEGMENT0 + ".log")]
        if len(seg0.data) < len(disk._files[os.path.join(DIRECTORY, SEGMENT0 + ".log")].data):
            break
    else:
        raise AssertionError("no power cut of the 64 cut segment 0 short")
    assert "00000000000000000007.log" in cut.listdir(DIRECTORY)
    cut.fail("fsync_dir", errno.EIO, path_suffix="t-0")
    with pytest.raises(LogDirFailure):
        Log(DIRECTORY, config, cut)


# --- one pool of seal workers for every log directory -------------------------------------

def test_a_hung_log_directory_does_not_hold_the_acks_of_a_healthy_one():
    """Four partitions of log directory /a roll; /a's disk hangs, so their seals hold the
    four workers of the one seal pool. A partition of the healthy /b then rolls and takes a
    batch with flush.messages=1: its acknowledgement waits for its seal, queued behind
    /a's, for as long as /a hangs (no bound). (On main a roll on /a would have hung the
    event loop itself; the branch's pool, shared by every directory, still lets one disk
    hold another's acknowledgements.)"""
    size = len(record(0))
    config = LogConfig(segment_bytes=4 * size, index_interval_bytes=100, flush_messages=1)
    disk = GatedDisk()
    disk.makedirs("/a")
    disk.makedirs("/b")
    a, b = LogDir("/a"), LogDir("/b")  # each broker directory is one LogDir
    hung = [open_partition(disk, config, f"/a/t-{i}", a) for i in range(4)]
    healthy = open_partition(disk, config, "/b/u-0", b)
    workers = hung[0].log_dir.seal_pool._max_workers
    assert workers <= len(hung)

    def fill(p: Partition) -> None:
        n = 0
        while p.log.active.size + size <= config.segment_bytes:
            p.append_records(record(n))
            n += 1

    async def scenario() -> bool:
        try:
            for p in hung:
                fill(p)
            disk.gated = tuple(f"/a/t-{i}/{SEGMENT0}.log" for i in range(4))  # /a only
            disk.armed = True
            for p in hung:
                p.append_records(record(99))  # rolls: its seal hangs with /a
            for _ in range(workers):
                assert await asyncio.to_thread(disk.reached.acquire, True, WAIT_S)
            fill(healthy)
            rolled = healthy.append_records(record(99))
            assert len(healthy.log.segments) == 2
            waiting = healthy.durable(rolled)
            assert waiting is not None
            done, _ = await asyncio.wait([waiting], timeout=2.0)
            return bool(done)
        finally:
            disk.release.set()
            for p in [*hung, healthy]:
                for _ in range(WAIT_S * 100):
                    if not p.seal_running:
                        break
                    await asyncio.sleep(0.01)

    acked_in_time = asyncio.run(scenario())
    for p in [*hung, healthy]:
        p.abandon()
    assert acked_in_time, "the healthy directory's acknowledgement waited for /a's hung disk"
