"""A roll seals the old segment in a worker thread, never on the event loop (log/sealing.py),
and every promise holds while the seal runs, played deterministically: the fsync of segment 0
in a worker waits at a gate the test opens (GatedDisk, a MemoryDisk).

* The roll's append returns with the seal's fsync held; an acknowledgement of a batch after
  the roll (log.flush.interval.messages=1) waits for it, and flushed_offset stays behind the
  old segment's end until it is done; after a power cut every acknowledged batch is there.
* The seal's fsync fails: the log directory goes offline, and neither the batch left in the
  old segment nor the one after the roll is acknowledged.
* A clean close waits for the seal (its marker gone before the clean-shutdown file is made);
  one that cannot within the bound leaves the log to the next start's recovery.
* A truncation while the seal runs cancels it: no index file of the cut segment is written
  behind the truncation.
* Retention deletes the segment whose seal runs, and the directory's fsync after fails: the
  flush of a batch after the roll still waits for that seal (a power cut could bring the
  segment back cut short, and a start would drop what follows it).
* A truncation whose directory fsync fails takes the directory offline.
* A seal queued behind others holds the flush as long as it takes, never takes the
  directory offline (no bound counts the time it waited its turn).
* DeleteRecords waits for a seal in a worker, the event loop free meanwhile.
* A close after a seal's failed fsync declares the directory offline at once, so that a
  move between log directories never goes on with the partition.
* A power cut at each step of a move between log directories whose first copy pass ran
  while a seal was in flight keeps every acknowledged batch, in one copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import os
import random
import shutil
import threading
import time
from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode

from oncelog.broker import partition as partition_module
from oncelog.broker.apis import partition_admin
from oncelog.broker.log_dir_moves import LogDirMoves, Move, MoveFailed
from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.log.disk import OsDisk
from oncelog.log.log import CLEAN_SHUTDOWN_FILE, LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.records import decode_batch, encode_batch

WAIT_S = 10
LOG_DIR = "/data"
DIRECTORY = "/data/t-0"
SEGMENT0 = "00000000000000000000"
CONFIG = LogConfig(segment_bytes=1024, index_interval_bytes=100, flush_messages=1)


class GatedDisk(MemoryDisk):
    """Once ``armed``, the fsync of segment 0's log (or ``segment``'s): on the event loop's
    thread it is counted (``on_loop``) and goes through; in a worker it signals ``reached``
    and waits for ``release`` (set by the test, or by the next snapshot written once
    ``release_at_snapshot``), then fails with EIO if ``fail`` is set. Notes the files it
    creates and removes, in order (``names``)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.fail = False
        self.release_at_snapshot = False
        self.reached = threading.Event()
        self.release = threading.Event()
        self.on_loop = 0
        self.names: list[str] = []
        self.segment = SEGMENT0

    def fsync(self, fd: int) -> None:  # type: ignore[override]
        opened = self._fds.get(fd)
        if self.armed and opened is not None and opened.path.endswith(self.segment + ".log"):
            if threading.current_thread() is threading.main_thread():
                self.on_loop += 1
            else:
                self.armed = False
                self.reached.set()
                assert self.release.wait(WAIT_S), "the test never opened the gate"
                if self.fail:
                    MemoryDisk.fail(self, "fsync", path_suffix=self.segment + ".log")
        MemoryDisk.fsync(self, fd)

    fdatasync = fsync

    def open(self, path: str, flags: int, mode: int = 0o777) -> int:  # type: ignore[override]
        if flags & os.O_CREAT:
            self.names.append("create " + os.path.basename(path))
            if self.release_at_snapshot and path.endswith(".snapshot.tmp"):
                self.release.set()
        return MemoryDisk.open(self, path, flags, mode)

    def unlink(self, path: str) -> None:  # type: ignore[override]
        self.names.append("remove " + os.path.basename(path))
        MemoryDisk.unlink(self, path)


class Issued:
    def is_issued(self, producer_id: int) -> bool:
        return True

    def highest_claimed(self) -> int:
        return 0


def open_partition(disk: MemoryDisk, config: LogConfig = CONFIG) -> Partition:
    partition = Partition("t", 0, DIRECTORY, config, 1 << 20, StateLimits(), Issued(),
                          log_dir=LogDir(LOG_DIR), disk=disk)
    assert partition.state is not None
    return partition


def record(n: int) -> bytes:
    return encode_batch([(None, b"%d:" % n + b"r" * 90, (), int(time.time() * 1000))])


def values(partition: Partition) -> list[int]:
    """The record each offset from the log start holds: nothing missing before the end."""
    plog, found = partition.log, []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 20).records
        assert data, f"nothing readable at {offset}"
        pos = 0
        while pos < len(data):
            header, records = decode_batch(data, pos)
            found += [int(r.value.split(b":")[0]) for r in records]
            pos += header.size
        offset = header.last_offset + 1
    return found


async def fill_segment0(p: Partition, leave: int = 0) -> int:
    """Acknowledged batches (each on disk) until one more would roll, with ``leave`` bytes to
    spare; returns how many."""
    n = 0
    while p.log.active.size + len(record(n)) + leave <= CONFIG.segment_bytes:
        waiting = p.durable(p.append_records(record(n)))
        assert waiting is not None
        await asyncio.wait_for(waiting, WAIT_S)
        n += 1
    return n


async def seal_held(disk: GatedDisk) -> None:
    assert disk.on_loop == 0, "the old segment was fsynced on the event loop"
    assert await asyncio.to_thread(disk.reached.wait, WAIT_S), "no seal reached its fsync"


async def roll_holding_the_seal(p: Partition, disk: GatedDisk) -> int:
    """Segment 0 filled (each batch acknowledged), then one batch more, which rolls it: its
    seal's fsync held at the gate. Returns the batches before that one."""
    n = await fill_segment0(p)
    disk.armed = True
    p.append_records(record(n))
    await seal_held(disk)
    return n


async def seals_done(p: Partition) -> None:
    for _ in range(WAIT_S * 100):
        if not p.seal_running:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the seal never ended")


def test_a_roll_does_not_wait_for_the_old_segments_fsync_and_an_ack_after_it_does():
    disk = GatedDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)

    async def scenario() -> int:
        n = await fill_segment0(p)
        disk.armed = True
        rolled = p.append_records(record(n))
        assert rolled.base_offset == n and len(p.log.segments) == 2
        await seal_held(disk)
        waiting = p.durable(rolled)
        assert waiting is not None
        done, _ = await asyncio.wait([waiting], timeout=0.2)
        assert not done, "acknowledged before the old segment was on disk"
        assert p.flushed_offset <= n
        disk.release.set()
        await asyncio.wait_for(waiting, WAIT_S)
        assert p.flushed_offset == n + 1
        await seals_done(p)
        return n + 1

    acked = asyncio.run(scenario())
    p.abandon()
    disk.power_loss(random.Random(20261129))
    assert values(open_partition(disk))[:acked] == list(range(acked))


def test_a_failed_fsync_of_the_seal_takes_the_directory_offline_and_acks_nothing():
    disk = GatedDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)

    async def scenario() -> None:
        small = encode_batch([(None, b"last", (), int(time.time() * 1000))])
        n = await fill_segment0(p, leave=len(small))
        disk.armed = disk.fail = True
        # One more batch in segment 0, its fsync asked for, and in the same turn of the
        # loop the batch that rolls: the round that covers both starts after the roll.
        last = p.append_records(small)
        assert last.base_offset == n and len(p.log.segments) == 1
        waiting = [p.durable(last)]
        rolled = p.append_records(record(n + 1))
        assert len(p.log.segments) == 2
        waiting.append(p.durable(rolled))
        await seal_held(disk)
        disk.release.set()
        for future in waiting:
            assert future is not None
            with pytest.raises(OSError):
                await asyncio.wait_for(future, WAIT_S)
        assert p.log_dir.offline
        assert p.flushed_offset == n

    asyncio.run(scenario())
    p.abandon()


def test_a_clean_close_waits_for_the_seal():
    disk = GatedDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)

    async def scenario() -> int:
        n = await roll_holding_the_seal(p, disk)
        disk.release_at_snapshot = True  # the close's snapshot, before the log's close
        p.close()
        return n + 1

    written = asyncio.run(scenario())
    names = disk.names
    assert names.index(f"remove {SEGMENT0}.unsealed") < names.index(
        f"create {CLEAN_SHUTDOWN_FILE}"), names
    assert f"{SEGMENT0}.index" in disk.listdir(DIRECTORY)
    assert values(open_partition(disk)) == list(range(written))


def test_a_close_that_cannot_wait_for_the_seal_leaves_the_log_to_recovery(monkeypatch):
    disk = GatedDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)

    async def scenario() -> int:
        n = await roll_holding_the_seal(p, disk)
        seal = p.log.pending_seals()[0]
        from oncelog.log import sealing  # (imported here: the tests run against main too)

        monkeypatch.setattr(sealing, "SEAL_WAIT_S", 0.05)
        p.close()  # gives up waiting: not a clean shutdown
        assert CLEAN_SHUTDOWN_FILE not in disk.listdir(DIRECTORY)
        disk.release.set()
        assert await asyncio.to_thread(seal._done.wait, WAIT_S)
        return n + 1

    written = asyncio.run(scenario())
    names = disk.listdir(DIRECTORY)
    assert f"{SEGMENT0}.unsealed" in names and f"{SEGMENT0}.index" not in names, names
    assert values(open_partition(disk)) == list(range(written))
    assert f"{SEGMENT0}.unsealed" not in disk.listdir(DIRECTORY)


def test_a_truncation_while_the_seal_runs_cancels_its_file_writes():
    disk = GatedDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)

    async def scenario() -> None:
        await roll_holding_the_seal(p, disk)
        seal = p.log.pending_seals()[0]
        p.truncate_to(2)  # inside segment 0, whose seal is held
        disk.release.set()
        assert await asyncio.to_thread(seal._done.wait, WAIT_S)
        assert seal.error is None and not seal.unmarked

    asyncio.run(scenario())
    names = disk.listdir(DIRECTORY)
    assert f"{SEGMENT0}.index" not in names, "the cancelled seal wrote the cut segment's index"
    assert values(p) == [0, 1]
    p.close()
    assert values(open_partition(disk)) == [0, 1]



def power_cut_copy(disk: MemoryDisk) -> MemoryDisk:
    """The disk as it is now, in a MemoryDisk of its own: a power cut of the copy stops no
    thread still working on ``disk``."""
    cut = MemoryDisk()
    with disk._lock:
        cut._files, cut._dirs, cut._durable_names = copy.deepcopy(
            (disk._files, disk._dirs, disk._durable_names))
    return cut


def survivors(cut: MemoryDisk, seed: int) -> list[int]:
    cut = copy.deepcopy(cut)
    cut.power_loss(random.Random(seed))
    return values(open_partition(cut))


def signal_when_a_flush_waits_for(monkeypatch, base_offset: int) -> threading.Event:
    """Set once a flush round (in its worker) is about to wait for the seal of the segment
    at ``base_offset``."""
    waits = threading.Event()
    real = partition_module.wait_synced

    def wait_synced(seals) -> None:
        if any(s.segment.base_offset == base_offset for s in seals):
            waits.set()
        real(seals)

    monkeypatch.setattr(partition_module, "wait_synced", wait_synced)
    return waits


def test_a_segment_deleted_while_its_seal_runs_holds_the_flush_until_it_is_on_disk(
        monkeypatch):
    """Retention deletes segment 0 (never flushed but by its seal) while its seal's fsync is
    held, and the directory's fsync after the unlink fails: a power cut brings segment 0
    back with its marker, cut short. The flush of a batch after the roll waits for that
    seal all the same, so that the start never drops an acknowledged segment 1 after it: a
    power cut while the seal is held (nothing of segment 1 acknowledged yet) and one after
    it (all of it acknowledged) keep every acknowledged batch."""
    disk = GatedDisk()
    disk.makedirs(LOG_DIR)
    config = dataclasses.replace(CONFIG, retention_bytes=0)
    p = open_partition(disk, config)
    flush_waits = signal_when_a_flush_waits_for(monkeypatch, 0)
    cuts: list[tuple[MemoryDisk, list[int]]] = []  # (a power cut, what was acknowledged)

    async def scenario() -> None:
        n = 0
        while p.log.active.size + len(record(n)) <= config.segment_bytes:
            p.append_records(record(n))  # no acknowledgement asked: on disk by the seal
            n += 1
        disk.armed = True
        assert p.append_records(record(n)).base_offset == n  # the roll: the seal held
        first = n
        n += 1
        await seal_held(disk)
        MemoryDisk.fail(disk, "fsync_dir", path_suffix="t-0")  # (fail: the gate's flag)
        with pytest.raises(OSError):
            p.apply_retention(int(time.time() * 1000))
        assert p.log.log_start_offset == first  # segment 0 deleted, not durably
        last = p.append_records(record(n))
        n += 1
        waiting = p.durable(last)
        assert waiting is not None
        waits = asyncio.ensure_future(asyncio.to_thread(flush_waits.wait, WAIT_S))
        try:
            await asyncio.wait([waiting, waits], timeout=WAIT_S,
                               return_when=asyncio.FIRST_COMPLETED)
            acked = list(range(first, n)) if waiting.done() else []
            cuts.append((power_cut_copy(disk), acked))
            disk.release.set()
            await asyncio.wait_for(waiting, WAIT_S)
            await seals_done(p)
            cuts.append((power_cut_copy(disk), list(range(first, n))))
        finally:
            flush_waits.set()
            disk.release.set()
            await waits

    asyncio.run(scenario())
    assert not p.log_dir.offline
    p.abandon()
    for i, (cut, acked) in enumerate(cuts):
        for seed in range(8):
            kept = survivors(cut, seed)
            assert set(acked) <= set(kept), f"acknowledged batches lost (cut {i}, seed {seed})"
            assert len(kept) == len(set(kept)), f"a batch kept twice (cut {i}, seed {seed})"


def test_a_truncation_whose_directory_fsync_fails_takes_the_directory_offline():
    """A follower's cut into segment 0 deletes segment 1, whose seal's fsync is held, and the
    directory's fsync after fails: nothing would wait for that seal once the log is opened
    again, and segment 1 could come back after a power cut beside what is appended after
    the cut. The directory goes offline instead, as for any failed fsync; a power cut keeps
    what was below the cut."""
    disk = GatedDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)

    async def scenario() -> None:
        n = await fill_segment0(p)  # acknowledged, on disk
        p.append_records(record(n))  # the roll: segment 0's seal runs freely
        await seals_done(p)
        disk.segment, disk.armed = f"{n:020d}", True
        while len(p.log.segments) < 3:  # segment 1 not flushed; its seal held at the roll
            n += 1
            p.append_records(record(n))
        await seal_held(disk)
        MemoryDisk.fail(disk, "fsync_dir", path_suffix="t-0")  # (fail: the gate's flag)
        with pytest.raises(OSError):
            p.truncate_to(2)
        assert p.log_dir.offline
        disk.release.set()
        await asyncio.to_thread(time.sleep, 0)

    asyncio.run(scenario())
    p.abandon()
    for seed in range(4):
        cut = copy.deepcopy(power_cut_copy(disk))
        cut.power_loss(random.Random(seed))
        reopened = open_partition(cut)
        assert values(reopened)[:2] == [0, 1], seed


def test_a_seal_queued_behind_others_holds_the_flush_and_never_takes_the_directory_offline(
        monkeypatch):
    """Every seal worker busy (other partitions' seals): a roll's seal waits its turn. The
    flush of a batch after it waits as long as that takes, whatever the bound on a close's
    wait (zero here), and the directory stays online."""
    from oncelog.log import sealing  # (imported here: the tests run against main too)

    monkeypatch.setattr(sealing, "SEAL_WAIT_S", 0.0)
    disk = MemoryDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)
    flush_waits = signal_when_a_flush_waits_for(monkeypatch, 0)
    gate = threading.Event()
    pool = p.log_dir.seal_pool
    busy = [pool.submit(gate.wait, WAIT_S) for _ in range(pool._max_workers)]

    async def scenario() -> int:
        try:
            n = await fill_segment0(p)
            rolled = p.append_records(record(n))
            assert len(p.log.segments) == 2
            waiting = p.durable(rolled)
            assert waiting is not None
            assert await asyncio.to_thread(flush_waits.wait, WAIT_S)
            gate.set()  # the seal's turn comes
            await asyncio.wait_for(waiting, WAIT_S)
            assert p.flushed_offset == n + 1
            await seals_done(p)
            return n + 1
        finally:
            gate.set()

    written = asyncio.run(scenario())
    for job in busy:
        job.result(WAIT_S)
    assert not p.log_dir.offline
    p.abandon()
    disk.power_loss(random.Random(20261129))
    assert values(open_partition(disk)) == list(range(written))


def test_delete_records_waits_for_a_seal_off_the_event_loop(monkeypatch):
    """DeleteRecords past what is on disk: its flush waits for a seal held at its fsync, in a
    worker. The gate is opened by the event loop itself, which a wait on the loop would
    hold until the seal's bound ran out (then the directory offline)."""
    from oncelog.log import sealing  # (imported here: the tests run against main too)

    monkeypatch.setattr(sealing, "SEAL_WAIT_S", 2.0)
    disk = GatedDisk()
    disk.makedirs(LOG_DIR)
    p = open_partition(disk)
    broker = SimpleNamespace(topics=SimpleNamespace(
        partition=lambda topic, index: p, get=lambda topic: None,
        topic_config=lambda topic, key: "delete"))

    async def scenario() -> tuple[ErrorCode, int]:
        n = await fill_segment0(p)
        disk.armed = True
        p.append_records(record(n))  # the roll: the seal held
        p.append_records(record(n + 1))
        await seal_held(disk)
        asyncio.get_running_loop().call_soon(disk.release.set)
        answer = partition_admin._delete_records(broker, "t", 0, n + 1)
        if asyncio.iscoroutine(answer):
            answer = await asyncio.wait_for(answer, WAIT_S)
        return answer

    assert asyncio.run(scenario()) == (ErrorCode.none, p.log.log_end_offset - 1)
    assert not p.log_dir.offline
    assert p.log.log_start_offset == p.log.log_end_offset - 1
    p.close()


def test_a_close_after_a_failed_seal_stops_a_move_between_log_directories(tmp_path):
    """The seal's fsync failed and its report has not reached the event loop yet when a
    move's last step closes the partition: the close declares the directory offline, and
    the move stops there (never copying nor committing a partition whose fsync failed)."""
    source, target = str(tmp_path / "a"), str(tmp_path / "b")
    disk = GatedDisk()
    disk.makedirs(source)
    p = Partition("t", 0, os.path.join(source, "t-0"), CONFIG, 1 << 20, StateLimits(),
                  Issued(), log_dir=LogDir(source), disk=disk)
    assert p.state is not None
    moves = LogDirMoves(SimpleNamespace(disk=disk, store=None, log_dirs={},
                                        placed_in=lambda a, b: None))

    async def scenario() -> None:
        n = await fill_segment0(p)
        disk.armed = disk.fail = True
        p.append_records(record(n))  # the roll: the seal held, then failing
        await seal_held(disk)
        seal = p.log.pending_seals()[0]
        disk.release.set()
        # Waited for on the loop: its report (Partition._sealed) cannot have run.
        assert seal._done.wait(WAIT_S) and seal.error is not None
        assert not p.log_dir.offline
        move = Move(p, p.log_dir, LogDir(target))
        moves.moving[p] = move
        with pytest.raises(MoveFailed):
            moves._finish(move)
        assert p.log_dir.offline

    asyncio.run(scenario())
    assert not os.path.exists(tmp_path / "b")


# --- a power cut at every step of a move between log directories, a seal in flight --------

class PowerCut(BaseException):
    """The power goes here: nothing after it runs (no handler takes it for an OSError)."""


class PowerCutDisk(OsDisk):
    """The real filesystem, journalling in memory what each fsync made durable of each file
    (its size then, as InstrumentedDisk does, following renames of files and directories);
    the power goes at its ``cut_at``-th file operation (from 0), after which ``cut`` leaves
    each file with what was durable of it. (Names are not undone: a rename or unlink done
    is taken as durable, a limit of a test on a real filesystem.)"""

    def __init__(self) -> None:
        self.cut_at: int | None = None
        self.done: list[str] = []
        self.durable: dict[str, int] = {}
        self.paths: dict[int, str] = {}

    def _step(self, name: str, target: str) -> None:
        if self.cut_at is not None and len(self.done) >= self.cut_at:
            raise PowerCut(name)
        self.done.append(f"{name} {os.path.basename(target)}")

    def open(self, path: str, flags: int, mode: int = 0o777) -> int:  # type: ignore[override]
        path = os.path.abspath(path)
        self._step("open", path)
        fd = os.open(path, flags, mode)
        self.paths[fd] = path
        if flags & os.O_TRUNC:
            self.durable[path] = 0
        return fd

    def close(self, fd: int) -> None:  # type: ignore[override]
        self.paths.pop(fd, None)
        os.close(fd)

    def dup(self, fd: int) -> int:  # type: ignore[override]
        new = os.dup(fd)
        self.paths[new] = self.paths.get(fd, "")
        return new

    def write(self, fd: int, data) -> int:  # type: ignore[override]
        self._step("write", self.paths.get(fd, ""))
        return os.write(fd, data)

    def writev(self, fd: int, parts) -> int:  # type: ignore[override]
        self._step("writev", self.paths.get(fd, ""))
        return os.writev(fd, parts)

    def ftruncate(self, fd: int, length: int) -> None:  # type: ignore[override]
        path = self.paths.get(fd, "")
        self._step("ftruncate", path)
        os.ftruncate(fd, length)
        self.durable[path] = min(self.durable.get(path, 0), length)

    def fsync(self, fd: int) -> None:  # type: ignore[override]
        path = self.paths.get(fd, "")
        self._step("fsync", path)
        size = os.fstat(fd).st_size
        os.fsync(fd)
        self.durable[path] = size

    fdatasync = fsync

    def unlink(self, path: str) -> None:  # type: ignore[override]
        path = os.path.abspath(path)
        self._step("unlink", path)
        os.unlink(path)
        self.durable.pop(path, None)

    def rename(self, src: str, dst: str) -> None:  # type: ignore[override]
        src, dst = os.path.abspath(src), os.path.abspath(dst)
        self._step("rename", src)
        os.replace(src, dst)
        for path in [p for p in self.durable if p == src or p.startswith(src + os.sep)]:
            self.durable[dst + path[len(src):]] = self.durable.pop(path)

    def fsync_dir(self, path: str) -> None:  # type: ignore[override]
        self._step("fsync_dir", path)
        OsDisk.fsync_dir(path)

    def open_dir(self, path: str) -> int:  # type: ignore[override]
        self._step("open_dir", path)
        return OsDisk.open_dir(path)

    def fsync_open_dir(self, fd: int) -> None:  # type: ignore[override]
        self._step("fsync_open_dir", str(fd))
        os.fsync(fd)

    def cut(self, root: str) -> None:
        """The power cut: every descriptor gone, every file cut back to what was durable."""
        for fd in list(self.paths):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.paths.clear()
        for folder, _, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                os.truncate(path, min(os.path.getsize(path), self.durable.get(path, 0)))


def move_history(root: str, disk: OsDisk, acked: list[int]) -> None:
    """Batches acknowledged, two more on disk only by the seal of segment 0, which is held
    while a move's first copy pass runs; the seal ends, the rest is acknowledged, the move
    finishes (close, last copy, fsyncs, commit, rename), and the partition, opened again in
    its new directory, takes one more."""
    a, b = os.path.join(root, "a"), os.path.join(root, "b")
    source, target = LogDir(a), LogDir(b)
    p = Partition("t", 0, os.path.join(a, "t-0"), CONFIG, 1 << 20, StateLimits(), Issued(),
                  log_dir=source, disk=disk)
    held: list = []
    p._start_seal = held.append  # the partition's rolls hand their seals to the test
    for n in range(3):
        p.append_records(record(n))
        p.flush_now()
        acked.append(n)
    for n in range(3, 5):
        p.append_records(record(n))
    p._roll()
    for n in range(5, 7):
        p.append_records(record(n))
    moves = LogDirMoves(SimpleNamespace(disk=disk, store=None, log_dirs={a: source, b: target},
                                        placed_in=lambda s, t: None))
    move = Move(p, source, target)
    moves.moving[p] = move
    os.makedirs(move.future_dir)
    moves._copy_pass(move, True)  # the seal of segment 0 in flight: its marker copied
    held.pop().run()
    p.flush_now()
    acked.extend(range(3, 7))
    moves._copy_pass(move, True)
    moves._finish(move)
    assert p.dir == os.path.join(b, "t-0")
    p.append_records(record(7))
    p.flush_now()
    acked.append(7)
    p.close()


def join_removals() -> None:
    """Wait for a finished move's removal of its source, in the background."""
    for thread in threading.enumerate():
        if thread.name.startswith("moved-"):
            thread.join(WAIT_S)


def test_power_lost_at_any_step_of_a_move_with_a_seal_in_flight_keeps_every_ack(tmp_path):
    """A power cut at each file operation of the history above: the start (the moves'
    recovery, then the partition opened wherever the commit decided) finds every
    acknowledged batch once, at its offset, with no hole and no marker left."""
    whole = PowerCutDisk()
    os.makedirs(tmp_path / "whole" / "a")
    os.makedirs(tmp_path / "whole" / "b")
    move_history(str(tmp_path / "whole"), whole, [])
    join_removals()
    steps = whole.done[:]
    assert any(s.startswith("rename t-0") for s in steps), steps
    for cut_at in range(len(steps) + 1):
        root = str(tmp_path / f"cut{cut_at}")
        a, b = os.path.join(root, "a"), os.path.join(root, "b")
        os.makedirs(a)
        os.makedirs(b)
        disk = PowerCutDisk()
        disk.cut_at = cut_at
        acked: list[int] = []
        try:
            move_history(root, disk, acked)
        except PowerCut:
            pass
        join_removals()  # (the power would stop them; what they removed stays removed)
        disk.cut(root)
        where = f"the power cut at #{cut_at} ({steps[cut_at - 1] if cut_at else '-'} done)"
        LogDirMoves(SimpleNamespace(disk=OsDisk(), store=None,
                                    log_dirs={a: LogDir(a), b: LogDir(b)},
                                    placed_in=lambda s, t: None)).recover()
        live = [d for d in (a, b) if os.path.isdir(os.path.join(d, "t-0"))]
        if not live:  # the power went before the partition's directory was made
            assert not acked, f"{where}: batches acknowledged, and no partition directory"
            shutil.rmtree(root)
            continue
        assert len(live) == 1, f"{where}: {os.listdir(a)} {os.listdir(b)}"
        leftovers = [n for d in (a, b) for n in os.listdir(d)
                     if n != "t-0" and not n.endswith("-delete")]
        assert not leftovers, f"{where}: {leftovers}"
        p = Partition("t", 0, os.path.join(live[0], "t-0"), CONFIG, 1 << 20, StateLimits(),
                      Issued(), log_dir=LogDir(live[0]), disk=OsDisk())
        kept = values(p)
        assert kept == list(range(len(kept))), where
        assert set(acked) <= set(kept), f"acknowledged batches lost: {where}"
        assert not [n for n in os.listdir(p.dir) if n.endswith(".unsealed")], where
        p.close()
        shutil.rmtree(root)
