"""The races of opening a partition's log in a worker thread (broker/log_opening.py),
played deterministically: the worker is held at a chosen file operation (GatedDisk, the real
filesystem under a tmp directory) while the event loop closes or deletes the partition, or
opens it again.

* An opening that lands after its partition was deleted or closed is never published, its
  files are closed (no descriptor of the process points into them), and a deleted
  partition's directory is not brought back on disk.
* Concurrent callers share one opening (the segment file opened once).
* The worker never touches the process's descriptor bound (log/open_files.OPEN_FILES, which
  has no lock): with the bound at 3 descriptors, openings of multi-segment logs run in the
  worker while the loop appends to other partitions, every record read back is in the
  partition it was written to, and every call into the bound came from the loop's thread.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sys
import threading
import uuid

import pytest
from support.txn_storage_helpers import Issued, accept

from oncelog.broker import log_opening
from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.log.disk import OsDisk
from oncelog.log.leader_epoch import LeaderEpochCache
from oncelog.log.log import LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.log.open_files import OPEN_FILES
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.record_batch import scan_batches
from oncelog.protocol.records import decode_batch, encode_batch

WAIT_S = 10


class GatedDisk(OsDisk):
    """The real filesystem; the first ``op`` on a path ending in ``suffix`` (once armed) in
    a worker thread signals ``reached`` and waits for ``release``. Counts opens by path."""

    def __init__(self) -> None:
        self.gate: tuple[str, str] | None = None
        self.reached = threading.Event()
        self.release = threading.Event()
        self.opens: dict[str, int] = {}

    def arm(self, op: str, suffix: str) -> None:
        self.gate = (op, suffix)
        self.reached.clear()
        self.release.clear()

    def _pass(self, op: str, path: str) -> None:
        gate = self.gate
        if gate is not None and gate[0] == op and str(path).endswith(gate[1]) and \
                threading.current_thread() is not threading.main_thread():  # workers only
            self.gate = None
            self.reached.set()
            assert self.release.wait(WAIT_S), "the test never released the worker"

    def isdir(self, path: str) -> bool:  # type: ignore[override]
        self._pass("isdir", path)
        return os.path.isdir(path)

    def fdatasync(self, fd: int) -> None:  # type: ignore[override]
        self._pass("fdatasync", "")  # a flush round's, in the executor
        os.fdatasync(fd)

    def fsync_dir(self, path: str) -> None:  # type: ignore[override]
        self._pass("fsync_dir", path)
        OsDisk.fsync_dir(path)

    def open_dir(self, path: str) -> int:  # type: ignore[override]
        self._pass("open_dir", path)
        return OsDisk.open_dir(path)

    def open(self, path: str, flags: int, mode: int = 0o777) -> int:  # type: ignore[override]
        self.opens[path] = self.opens.get(path, 0) + 1
        self._pass("open", path)
        return os.open(path, flags, mode)


@pytest.fixture
def no_backoff(monkeypatch):
    """The next opening after a failed one may start at once (no backoff: the test is
    about something else)."""
    from oncelog.broker import partition_opening

    monkeypatch.setattr(partition_opening, "_RETRY_FIRST_S", 0.0)


def _partition(root, disk: OsDisk, index: int = 0, config: LogConfig | None = None
               ) -> Partition:
    return Partition("t", index, str(root / f"t-{index}"), config or LogConfig(), 1 << 20,
                     StateLimits(), Issued(), log_dir=LogDir(str(root)), disk=disk,
                     topic_id=uuid.uuid4())


def _record(value: bytes) -> bytes:
    return encode_batch([(None, value, (), 1_700_000_000_000)])


def _descriptors_into(path) -> list[str]:
    """What this process holds open under ``path`` (its own descriptors, by /proc)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)):
            found.append(target)
    return found


async def _reached(disk: GatedDisk) -> None:
    assert await asyncio.to_thread(disk.reached.wait, WAIT_S), "the worker never got there"


async def _settled(directory: str) -> None:
    """Until the opening of ``directory`` is over (refused ones: their files closed)."""
    for _ in range(WAIT_S * 100):
        if not log_opening.busy(directory):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the opening of {directory} never ended")


def _delete(partition: Partition, aside: str) -> None:
    """What TopicManager.delete does to a partition: its directory renamed away under the
    partition's directory lock, then the partition let go of."""
    def rename() -> None:
        if os.path.isdir(partition.dir):
            os.rename(partition.dir, aside)
    partition.set_aside(rename)
    partition.delete()


async def _deleted_while_opening(partition: Partition, disk: GatedDisk, held_at: tuple,
                                 aside: str) -> None:
    """The partition deleted while a worker opening it is held at ``held_at``: the opening
    fails FileNotFoundError and is over."""
    disk.arm(*held_at)
    opening = asyncio.ensure_future(partition.open_async())
    await _reached(disk)
    _delete(partition, aside)
    disk.release.set()
    with pytest.raises(FileNotFoundError):
        await opening
    await _settled(partition.dir)


@pytest.mark.parametrize("held_at", [("isdir", "t-0"), ("open", "partition.metadata.tmp")],
                         ids=["before-mkdir", "files-open"])
def test_an_opening_landing_after_its_partition_was_deleted_is_discarded(tmp_path, held_at):
    disk = GatedDisk()
    p = _partition(tmp_path, disk)
    aside = str(tmp_path / "t-0.deleted")

    asyncio.run(_deleted_while_opening(p, disk, held_at, aside))
    assert not p.is_open
    assert not os.path.exists(p.dir), "the deleted partition's directory came back"
    assert _descriptors_into(tmp_path) == []
    with pytest.raises(FileNotFoundError):  # and stays deleted for every use
        p.append_records(_record(b"late"), accept)


def test_an_opening_landing_after_close_is_discarded_and_the_next_one_works(tmp_path):
    disk = GatedDisk()
    p = _partition(tmp_path, disk)

    async def scenario() -> None:
        disk.arm("open", "partition.metadata.tmp")
        opening = asyncio.ensure_future(p.open_async())
        await _reached(disk)
        p.close()  # the broker stopping, or the replica let go of
        disk.release.set()
        with pytest.raises(OSError, match="closed while its log opened"):
            await opening
        assert not p.is_open
        await _settled(p.dir)
        assert _descriptors_into(p.dir) == []  # the refused log's files closed
        await p.open_async()  # the next opening is a fresh one, and is published
        assert p.append_records(_record(b"after"), accept).base_offset == 0

    asyncio.run(scenario())
    p.close()


def test_concurrent_openers_share_one_opening(tmp_path):
    disk = GatedDisk()
    p = _partition(tmp_path, disk)
    segment = os.path.join(p.dir, "0" * 20 + ".log")

    async def scenario() -> list:
        disk.arm("open", segment)
        waiting = [asyncio.ensure_future(p.open_async()) for _ in range(3)]
        await _reached(disk)
        waiting.append(asyncio.ensure_future(p.open_async()))  # one more while it runs
        disk.release.set()
        return await asyncio.gather(*waiting)

    assert asyncio.run(scenario()) == [None] * 4
    assert disk.opens[segment] == 1
    assert p.append_records(_record(b"one"), accept).base_offset == 0
    p.close()



def test_an_opening_asked_for_once_the_log_is_open_opens_nothing(tmp_path):
    """The produce path (apis/produce.py, rest_off_loop) finds the log not open, validates
    the batches in a worker, then asks for the opening: another request may have opened
    the log meanwhile and appended to it. Opened a second time, a second Log over the same
    files was installed over the first: its producer state rebuilt from what the files held
    when the worker read them (a producer's next batch: OUT_OF_ORDER_SEQUENCE_NUMBER), its
    segment sizes behind the file's (O_APPEND writes at the file's end, the index and the
    offsets said otherwise: a Fetch sent bytes from inside a batch, "Unsupported MagicByte"),
    and the first log's descriptors leaked."""
    disk = GatedDisk()
    p = _partition(tmp_path, disk)
    segment = os.path.join(p.dir, "0" * 20 + ".log")

    def batch(sequence: int) -> bytes:
        return encode_batch([(None, b"seq-%d" % sequence, (), 1_700_000_000_000)],
                            producer_id=7, producer_epoch=0, base_sequence=sequence)

    async def scenario() -> None:
        await p.open_async()  # another request's opening, published
        first = p.log
        assert p.append_records(batch(0), accept).base_offset == 0
        disk.arm("fdatasync", "")  # an opening's last file work, once it read the files
        opening = p.start_opening()  # the produce request, its batches validated
        if not opening.done():
            await _reached(disk)
        assert p.append_records(batch(1), accept).base_offset == 1  # meanwhile
        disk.release.set()
        await opening
        assert p.log is first
        assert p.append_records(batch(2), accept).base_offset == 2

    asyncio.run(scenario())
    assert disk.opens[segment] == 2  # one opening: the worker's, then the loop's at its use
    data = p.log.read(0, 1 << 20).records
    values = [bytes(r.value) for pos, _ in scan_batches(data)
              for r in decode_batch(data, pos)[1]]
    assert values == [b"seq-0", b"seq-1", b"seq-2"]
    p.close()
    assert _descriptors_into(p.dir) == []


PARTITIONS = 12
PREFILLED = 40  # records of about 100 bytes: 1 KiB segments, about 5 of them a partition


def test_openings_in_workers_never_touch_the_loops_descriptor_bound(tmp_path, monkeypatch):
    config = LogConfig(segment_bytes=1024)
    disk = OsDisk()
    written: dict[int, list[bytes]] = {}
    for i in range(PARTITIONS):  # logs of several segments, left unclean: recovered
        p = _partition(tmp_path, disk, i, config)
        written[i] = []
        for n in range(PREFILLED):
            value = b"t-%d:%d:" % (i, n) + b"x" * 60
            p.append_records(_record(value), accept)
            written[i].append(value)
        p.abandon()
    loop_thread: list[int] = []
    callers: set[int] = set()
    for name in ("opened", "used", "closed"):  # who calls into the process's bound
        method = getattr(OPEN_FILES, name)

        def spy(holder, method=method):
            callers.add(threading.get_ident())
            return method(holder)
        monkeypatch.setattr(OPEN_FILES, name, spy)
    monkeypatch.setattr(OPEN_FILES, "limit", 3)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # the worker and the loop interleave as finely as can be
    partitions = [_partition(tmp_path, disk, i, config) for i in range(PARTITIONS)]

    async def scenario() -> None:
        loop_thread.append(threading.get_ident())
        on_loop = partitions[: PARTITIONS // 2]
        for p in on_loop:
            p.log  # noqa: B018  (opened on the loop, appended to while the others open)
        openings = [p.start_opening() for p in partitions[PARTITIONS // 2:]]
        n = PREFILLED
        while not all(o.done() for o in openings):
            for p in partitions:
                if p.is_open:
                    value = b"t-%d:%d:" % (p.index, n) + b"y" * 60
                    p.append_records(_record(value), accept)
                    written[p.index].append(value)
            n += 1
            await asyncio.sleep(0)
        await asyncio.gather(*openings)
        for p in partitions:
            p.close()

    try:
        asyncio.run(scenario())
    finally:
        sys.setswitchinterval(switch)
    assert callers == set(loop_thread), "a worker thread used the loop's descriptor bound"
    for i in range(PARTITIONS):  # every record where it was written, and nothing else
        p = _partition(tmp_path, disk, i, config)
        plog, values, offset = p.log, [], 0
        while offset < plog.log_end_offset:
            data = plog.read(offset, 1 << 20).records
            for pos, header in scan_batches(data):
                values += [bytes(r.value) for r in decode_batch(data, pos)[1]]
                offset = header.last_offset + 1
        assert values == written[i], f"partition {i} holds what was not written to it"
        p.close()


def test_a_truncation_cuts_and_reopens_the_log_in_a_worker(tmp_path):
    """A follower's truncation (Partition.truncate_async): the log leaves the loop while a
    worker cuts it and recovers it (a use meanwhile is refused, never a second log opened
    over the files); then it is published again, cut, its segments in the loop's bound."""
    disk = GatedDisk()
    p = _partition(tmp_path, disk, config=LogConfig(segment_bytes=1024))
    for n in range(30):
        p.append_records(_record(b"%d" % n + b"z" * 80), accept)
    assert len(p.log.segments) > 2

    async def scenario() -> None:
        disk.arm("isdir", p.dir)  # the reopening, after the cut
        cut = asyncio.ensure_future(p.truncate_async(10))
        await _reached(disk)
        assert not p.is_open
        with pytest.raises(log_opening.OpenInProgress):
            p.log  # noqa: B018
        disk.release.set()
        await cut

    asyncio.run(scenario())
    assert p.is_open and p.log.log_end_offset == 10
    assert all(s in OPEN_FILES._lru for s in p.log.segments if s._fd >= 0)
    assert p.append_records(_record(b"next"), accept).base_offset == 10
    p.close()


def test_a_failed_opening_leaves_nothing_open_and_the_next_one_works(caplog, no_backoff):
    """One write fails in the worker: every caller gets the error (and the broker's log
    says so), nothing is open, a use on the loop meets the same error without opening
    again; the next opening works. An fsync failing in the worker takes the directory
    offline (declared on the loop)."""
    disk = MemoryDisk()
    disk.makedirs("/data")
    p = Partition("t", 0, "/data/t-0", LogConfig(), 1 << 20, StateLimits(), Issued(),
                  log_dir=LogDir("/data"), disk=disk, topic_id=uuid.uuid4())

    async def openers(n: int) -> list:
        return await asyncio.gather(*(p.open_async() for _ in range(n)),
                                    return_exceptions=True)

    disk.fail("write", path_suffix="partition.metadata.tmp")  # one write fails, once
    failed = asyncio.run(openers(3))
    assert [type(e) for e in failed] == [OSError] * 3
    assert any("opening its log failed" in r.getMessage() for r in caplog.records)
    assert not p.is_open and not p.opening and not p.log_dir.offline
    with pytest.raises(OSError) as again:
        p.append_records(_record(b"x"), accept)
    assert again.value is failed[0]  # the worker's error, not a second opening on the loop
    assert asyncio.run(openers(2)) == [None] * 2
    assert p.append_records(_record(b"first"), accept).base_offset == 0
    p.close()

    disk = MemoryDisk()
    disk.makedirs("/data")
    p = Partition("t", 0, "/data/t-0", LogConfig(), 1 << 20, StateLimits(), Issued(),
                  log_dir=LogDir("/data"), disk=disk, topic_id=uuid.uuid4())
    disk.fail("fsync_dir", path_suffix="t-0")
    failed = asyncio.run(openers(2))
    assert all("offline" in str(e) for e in failed), failed
    assert not p.is_open and p.log_dir.offline


def test_retention_of_a_log_not_open_opens_it_in_a_worker_for_its_next_pass(tmp_path):
    """After a restart, retention's pass meets logs not open: it starts their openings in
    workers and leaves them to its next pass, never opening one on the loop."""
    config = LogConfig(segment_bytes=1024, retention_ms=60_000)
    p = _partition(tmp_path, OsDisk(), config=config)
    for n in range(30):  # records of 2023: every sealed segment is past retention
        p.append_records(_record(b"%d" % n + b"r" * 80), accept)
    segments = len(p.log.segments)
    p.close()
    disk = GatedDisk()
    p = _partition(tmp_path, disk, config=config)

    async def scenario() -> None:
        disk.arm("isdir", p.dir)
        p.apply_retention(2_000_000_000_000)
        await _reached(disk)  # the worker opens it; the loop went on
        assert not p.is_open
        disk.release.set()
        await _settled(p.dir)
        assert p.is_open and len(p.log.segments) == segments
        p.apply_retention(2_000_000_000_000)  # the next pass applies it
        assert len(p.log.segments) == 1

    asyncio.run(scenario())
    p.close()


def _cut_held(p: Partition, offset: int, disk: GatedDisk):
    """A truncation to ``offset`` started, its worker held at the reopening."""
    disk.arm("isdir", p.dir)
    return asyncio.ensure_future(p.truncate_async(offset))


def test_a_leader_epoch_written_as_the_cut_log_is_published_is_kept(tmp_path):
    """A follower cutting its log is made leader meanwhile: the role waits for the log and
    is applied by a callback of the opening (ReplicaManager._log_opened), which may run
    before the truncation's own continuation; the new leader's epoch entry must survive."""
    disk = GatedDisk()
    p = _partition(tmp_path, disk, config=LogConfig(segment_bytes=1024))
    p.become_leader(4)
    for n in range(30):
        p.append_records(_record(b"%d" % n + b"e" * 80), accept)
    p.become_leader(5)
    p.append_records(_record(b"at epoch 5"), accept)

    async def scenario() -> None:
        cut = _cut_held(p, 10, disk)
        await _reached(disk)
        p._opening.add_done_callback(lambda _: p.become_leader(6))  # the role, held
        disk.release.set()
        await cut

    asyncio.run(scenario())
    assert p.leader_epochs.entries == [(4, 0), (6, 10)]
    assert LeaderEpochCache(p.dir, OsDisk()).entries == [(4, 0), (6, 10)]  # on disk too
    p.close()


def test_a_flush_asked_for_while_the_log_is_cut_completes(tmp_path):
    """A flush round started while a truncation has the log runs once it is published (it
    was left marked running, and never started: a produce waiting on it hung)."""
    disk = GatedDisk()
    p = _partition(tmp_path, disk, config=LogConfig(segment_bytes=1024))
    for n in range(30):
        p.append_records(_record(b"%d" % n + b"f" * 80), accept)

    async def scenario() -> None:
        cut = _cut_held(p, 10, disk)
        await _reached(disk)
        flushed = p._request_flush()
        for _ in range(3):
            await asyncio.sleep(0)  # the round's start runs, meets the log taken
        disk.release.set()
        await cut
        await asyncio.wait_for(flushed, WAIT_S)
        assert not p.flush_running
        # and one asked for while a cut is closed off is answered at close
        cut = _cut_held(p, 5, disk)
        await _reached(disk)
        waiting = p._request_flush()
        await asyncio.sleep(0)
        p.close()
        assert waiting.done()
        disk.release.set()
        with pytest.raises(OSError):
            await cut
        await _settled(p.dir)

    asyncio.run(scenario())


class _StoreDown(Issued):
    asked_on: list[threading.Thread] = []

    def highest_claimed(self) -> int:
        from oncelog.metadata.store import MetadataUnavailable
        self.asked_on.append(threading.current_thread())
        raise MetadataUnavailable("zookeeper is away")


def test_a_store_failing_while_the_log_opens_fails_the_opening(tmp_path, no_backoff):
    """Opening needs the producer id bound (the metadata store, in a cluster) when the
    log lost batches: it is read in the worker (ZooKeeper may take its session timeout to
    answer), and a store that fails with anything fails the opening's waiters (they waited
    forever) with an OSError every use answers; a synchronous use after it never recovers
    the log (nor asks the store) on the loop; the next opening works."""
    config = LogConfig(segment_bytes=1024, retention_ms=60_000)
    p = _partition(tmp_path, OsDisk(), config=config)
    for n in range(30):
        p.append_records(_record(b"%d" % n + b"s" * 80), accept)
    p.apply_retention(2_000_000_000_000)
    assert p.log.base_offset > 0
    p.close()
    for name in os.listdir(p.dir):
        if name.endswith(".snapshot"):
            os.unlink(os.path.join(p.dir, name))
    p = Partition("t", 0, p.dir, config, 1 << 20, StateLimits(), _StoreDown(),
                  log_dir=LogDir(str(tmp_path)), disk=OsDisk(), topic_id=p.topic_id)

    async def scenario() -> None:
        with pytest.raises(OSError, match="zookeeper is away"):
            await asyncio.wait_for(p.open_async(), WAIT_S)
        assert _StoreDown.asked_on and threading.main_thread() not in _StoreDown.asked_on
        await _settled(p.dir)
        assert not p.is_open and not p.opening
        with pytest.raises(OSError):  # what the worker met: no recovery on the loop
            _ = p.log
        assert threading.main_thread() not in _StoreDown.asked_on
        await _settled(p.dir)
        p._producer_ids = Issued()
        await asyncio.wait_for(p.open_async(), WAIT_S)
        assert p.is_open

    asyncio.run(scenario())
    assert p.append_records(_record(b"after"), accept).base_offset == 30  # it serves
    p.close()


def test_a_deletion_under_a_first_write_never_takes_the_directory_offline(tmp_path):
    """The worker created the directory and first segment; the topic is deleted (its
    directory renamed aside) before the worker's fsync of the directory, which then fails:
    the opening is stale, its error is dropped, the log directory stays online."""
    disk = GatedDisk()
    p = _partition(tmp_path, disk)
    aside = str(tmp_path / "t-0.deleted")

    asyncio.run(_deleted_while_opening(p, disk, ("fsync_dir", "t-0"), aside))
    assert not p.log_dir.offline
    assert not os.path.exists(p.dir)


def test_a_truncation_never_hands_the_loops_segments_to_its_worker(tmp_path):
    """Code on the loop may hold the log's segments across an await (the cleaner, a
    coordinator's load): while a worker cuts the log, such a holder meets a closed segment
    (an error it answers as a log replaced), never a segment moved into the worker's
    descriptor bound, which has no lock and would close or reuse a descriptor under it."""
    disk = GatedDisk()
    p = _partition(tmp_path, disk, config=LogConfig(segment_bytes=1024))
    for n in range(30):
        p.append_records(_record(b"%d" % n + b"h" * 80), accept)
    held = list(p.log.segments)

    async def scenario() -> None:
        disk.arm("open_dir", p.dir)  # the cut's first step, in the worker
        cut = asyncio.ensure_future(p.truncate_async(10))
        await _reached(disk)
        for segment in held:
            with pytest.raises(OSError):
                segment._file()
        disk.release.set()
        await cut

    asyncio.run(scenario())
    assert p.is_open and p.log.log_end_offset == 10
    assert all(s._files is OPEN_FILES for s in p.log.segments)
    assert p.append_records(_record(b"next"), accept).base_offset == 10
    p.close()


def test_markers_refused_create_no_log(tmp_path):
    """WriteTxnMarkers opens (creates) in workers only the logs it will write: a marker
    refused (this broker follows the partition) leaves no directory behind."""
    from types import SimpleNamespace

    from kio.schema.errors import ErrorCode

    from oncelog.broker.apis.txn_markers import write_markers
    from oncelog.broker.replication import ReplicaState

    p = _partition(tmp_path, OsDisk())
    p.replication = ReplicaState(1, 2, 3, (1, 2), (1, 2), 0)  # broker 2 leads
    broker = SimpleNamespace(topics=SimpleNamespace(partition=lambda topic, index: p))
    errors = asyncio.run(write_markers(broker, 7, 0, True, 0, [("t", 0)]))
    assert errors == {("t", 0): ErrorCode.not_leader_or_follower}
    assert not os.path.exists(p.dir)


def test_openings_still_queued_when_the_loop_ends_are_dropped(tmp_path):
    """The broker stopping (its event loop ending) drops openings still queued for a
    worker: the process's exit does not run every queued recovery (nor create logs)."""
    held = threading.Event()
    busy = [log_opening._POOL.submit(held.wait, WAIT_S) for _ in range(8)]  # every worker
    p = _partition(tmp_path, OsDisk())

    async def scenario() -> None:
        p.start_opening()  # queued behind the busy workers; the loop ends meanwhile

    try:
        asyncio.run(scenario())
    finally:
        held.set()
    for job in busy:
        job.result(WAIT_S)
    workers = log_opening._POOL._max_workers
    barrier = threading.Barrier(workers)  # every worker here: all jobs before are over
    for job in [log_opening._POOL.submit(barrier.wait, WAIT_S) for _ in range(workers)]:
        job.result(WAIT_S)
    assert not os.path.exists(p.dir)


def test_a_flush_running_over_a_cut_log_covers_nothing_of_the_new_one(tmp_path):
    """A flush round's fsync started before a truncation (of the old log's files): a batch
    appended to the log published after the cut waits for a round of its own, never that
    one, whatever offsets it covered before the cut."""
    disk = GatedDisk()
    p = _partition(tmp_path, disk, config=LogConfig(segment_bytes=1024))
    for n in range(30):
        p.append_records(_record(b"%d" % n + b"d" * 80), accept)

    async def scenario() -> None:
        disk.arm("fdatasync", "")
        running = p._request_flush()
        await _reached(disk)
        try:
            await asyncio.wait_for(p.truncate_async(10), WAIT_S)
            result = p.append_records(_record(b"after the cut"), accept)
            assert result.base_offset == 10
            waits = p.durable(result)
            assert waits is not None and waits is not running
        finally:
            disk.release.set()
        await asyncio.wait_for(asyncio.gather(running, waits), WAIT_S)
        assert p.flushed_offset == 11

    asyncio.run(scenario())
    p.close()


def test_a_flush_asked_for_while_a_failing_cut_runs_is_answered(tmp_path):
    """The reopening after a cut fails: a flush asked for meanwhile is failed with it (it
    waited for a log that is not there)."""
    disk = MemoryDisk()
    disk.makedirs("/data")
    p = Partition("t", 0, "/data/t-0", LogConfig(segment_bytes=1024), 1 << 20,
                  StateLimits(), Issued(), log_dir=LogDir("/data"), disk=disk,
                  topic_id=uuid.uuid4())
    for n in range(30):
        p.append_records(_record(b"%d" % n + b"c" * 80), accept)
    disk.fail("open", path_suffix=".log")  # the worker's log cannot open its segment

    async def scenario() -> None:
        cut = asyncio.ensure_future(p.truncate_async(10))
        await asyncio.sleep(0)  # the log handed to the worker
        assert not p.is_open
        flushed = p._request_flush()
        # (asyncio.wait, not wait_for: its TimeoutError is an OSError too)
        done, _ = await asyncio.wait([cut, flushed], timeout=WAIT_S)
        assert cut in done and flushed in done, "the flush was never answered"
        assert isinstance(cut.exception(), OSError)
        assert isinstance(flushed.exception(), OSError)
        assert not p.flush_running

    asyncio.run(scenario())
    assert not p.log_dir.offline


@pytest.mark.parametrize("api", ["list_offsets", "offset_for_leader_epoch", "delete_records"])
def test_a_client_denied_the_topic_opens_no_log(tmp_path, api):
    """ListOffsets, OffsetForLeaderEpoch and DeleteRecords authorize before they open (a
    log not open since a restart is recovered in a worker): a denied client recovers
    nothing."""
    from types import SimpleNamespace

    from oncelog.broker.apis import fetch, partition_admin
    from oncelog.protocol import api_versions as apis

    p = _partition(tmp_path, OsDisk())
    p.append_records(_record(b"before the restart"), accept)
    p.close()
    p = _partition(tmp_path, OsDisk())
    assert p.needs_open
    deny = SimpleNamespace(authorize=lambda *_: False)
    broker = SimpleNamespace(authorizer=SimpleNamespace(decision=deny),
                             topics=SimpleNamespace(partition=lambda topic, index: p))
    partition = SimpleNamespace(partition_index=0, partition=0, timestamp=-1, offset=0,
                                current_leader_epoch=-1, leader_epoch=0)
    topic = SimpleNamespace(name="t", topic="t", partitions=[partition])
    handler, key, version = {
        "list_offsets": (fetch.handle_list_offsets, apis.LIST_OFFSETS, 7),
        "offset_for_leader_epoch": (fetch.handle_offset_for_leader_epoch,
                                    apis.OFFSET_FOR_LEADER_EPOCH, 4),
        "delete_records": (partition_admin.handle_delete_records, apis.DELETE_RECORDS, 2)}[api]
    request = SimpleNamespace(session=None, peer="127.0.0.1:1", api_key=key,
                              api_version=version, body=SimpleNamespace(
                                  topics=[topic], replica_id=-1, isolation_level=0,
                                  timeout_ms=1000))

    async def scenario() -> None:
        answer = handler(broker, request)
        if asyncio.iscoroutine(answer):
            await answer
        await _settled(p.dir)

    asyncio.run(scenario())
    assert not p.is_open


def test_a_long_poll_reread_waits_for_an_opening_another_request_started(tmp_path):
    """A Fetch woken from its long poll reads again: a log another request began opening
    meanwhile (here a first write's, its directory made) is waited for, not answered
    KAFKA_STORAGE_ERROR (OpenInProgress); and needs_open says so while the opening runs."""
    from datetime import timedelta
    from types import SimpleNamespace

    from kio.schema.errors import ErrorCode

    from oncelog.broker.apis import fetch

    disk = GatedDisk()
    opening, written = _partition(tmp_path, disk, 0), _partition(tmp_path, OsDisk(), 1)
    written.append_records(_record(b"before"), accept)
    parts = {0: opening, 1: written}
    broker = SimpleNamespace(
        authorizer=None, topics=SimpleNamespace(partition=lambda topic, i: parts[i]),
        config=SimpleNamespace(get=lambda key: 1 << 20),
        quotas=SimpleNamespace(fetch_allowance=lambda request: 1 << 20),
        cluster_brokers=lambda listener=None: ())
    preqs = [SimpleNamespace(partition=i, fetch_offset=o, partition_max_bytes=1 << 20,
                             current_leader_epoch=-1, log_start_offset=-1)
             for i, o in ((0, 0), (1, 1))]
    request = SimpleNamespace(session=SimpleNamespace(listener=None), api_version=12,
                              body=SimpleNamespace(
                                  max_wait=timedelta(seconds=WAIT_S), min_bytes=1,
                                  max_bytes=1 << 20, isolation_level=0, replica_id=-1,
                                  topics=[SimpleNamespace(topic="t", partitions=preqs)]))

    async def scenario() -> None:
        polling = asyncio.create_task(fetch.handle_fetch(broker, request))
        for _ in range(20):  # until it long-polls (nothing to read at first)
            await asyncio.sleep(0)
        assert not polling.done()
        disk.arm("open", "partition.metadata.tmp")
        first_write = opening.start_opening()
        await _reached(disk)  # the directory is made, the worker held
        assert opening.needs_open
        written.append_records(_record(b"wakes the poll"), accept)
        for _ in range(20):  # the re-read: refused at once before, waits for the opening now
            await asyncio.sleep(0)
        disk.release.set()
        await asyncio.wait_for(first_write, WAIT_S)
        answer = await asyncio.wait_for(polling, WAIT_S)
        codes = [p.error_code for t in answer.responses for p in t.partitions]
        assert codes == [ErrorCode.none, ErrorCode.none]

    asyncio.run(scenario())
    opening.close()
    written.close()


def test_a_synchronous_use_after_a_failed_opening_starts_the_next_try(no_backoff):
    """A use that only reads ``partition.log`` (a coordinator's load retrying) after a
    worker's opening failed is answered retriable and starts the next opening in a worker:
    it is not refused forever until a duty happens to open the log."""
    disk = MemoryDisk()
    disk.makedirs("/data")
    p = Partition("t", 0, "/data/t-0", LogConfig(), 1 << 20, StateLimits(), Issued(),
                  log_dir=LogDir("/data"), disk=disk, topic_id=uuid.uuid4())
    disk.fail("write", path_suffix="partition.metadata.tmp")  # one write fails, once

    async def scenario() -> None:
        with pytest.raises(OSError):
            await asyncio.wait_for(p.open_async(), WAIT_S)
        await _settled(p.dir)
        with pytest.raises(OSError) as refused:
            _ = p.log
        assert refused.value.errno == errno.EAGAIN and p.opening  # the next try runs
        await asyncio.wait_for(p.open_async(), WAIT_S)
        assert p.is_open and p.log.log_end_offset == 0

    asyncio.run(scenario())
    p.close()


def test_markers_whose_openings_outlast_the_shutdown_are_not_written(tmp_path):
    """WriteTxnMarkers waits for its logs' openings before it appends: the broker's clean
    shutdown (TopicManager.close, each partition shut) meanwhile leaves every log closed
    for good. The append after the wait is refused (KAFKA_STORAGE_ERROR), not written to
    a log opened again on the loop with its clean-shutdown marker removed."""
    from types import SimpleNamespace

    from kio.schema.errors import ErrorCode

    from oncelog.broker.apis.txn_markers import write_markers
    from oncelog.log.log import CLEAN_SHUTDOWN_FILE

    disk = GatedDisk()
    held, opened = _partition(tmp_path, disk, 0), _partition(tmp_path, OsDisk(), 1)
    parts = {0: held, 1: opened}
    broker = SimpleNamespace(topics=SimpleNamespace(partition=lambda topic, i: parts[i]))

    async def scenario() -> dict:
        disk.arm("open", "partition.metadata.tmp")
        writing = asyncio.create_task(write_markers(broker, 7, 0, True, 0, [("t", 0), ("t", 1)]))
        await _reached(disk)
        for _ in range(WAIT_S * 100):
            if opened.is_open:
                break
            await asyncio.sleep(0.01)
        assert opened.is_open
        for p in parts.values():  # what TopicManager.close does
            p.shut()
        disk.release.set()
        errors = await asyncio.wait_for(writing, WAIT_S)
        await _settled(held.dir)
        return errors

    errors = asyncio.run(scenario())
    assert errors == {("t", 0): ErrorCode.kafka_storage_error,
                      ("t", 1): ErrorCode.kafka_storage_error}
    assert not opened.is_open and not held.is_open
    assert os.path.exists(os.path.join(opened.dir, CLEAN_SHUTDOWN_FILE))


def test_a_replica_being_opened_fails_no_other_replicas_round(tmp_path):
    """A follower's partition whose log is being opened in a worker is left out of the
    fetcher's round (asked again once open) and of the ISR's high watermark move: its
    ``partition.log`` (OpenInProgress) no longer fails the Fetch of every partition of
    that leader, an answer applied to it, or the replica manager's pass over a topic."""
    from types import SimpleNamespace

    from kio.schema.errors import ErrorCode

    from oncelog.broker.replica_fetcher import LeaderFetcher, _Followed
    from oncelog.broker.replica_manager import ReplicaManager
    from oncelog.broker.replication import ReplicaState
    from oncelog.cluster import znodes as zn
    from oncelog.protocol import fetch_response

    disk = GatedDisk()
    held = _partition(tmp_path, disk, 0)
    held.append_records(_record(b"before the restart"), accept)
    held.close()
    held = _partition(tmp_path, disk, 0)
    fetched = _partition(tmp_path, OsDisk(), 1)
    fetched.append_records(_record(b"followed"), accept)
    for p in (held, fetched):
        p.replication = ReplicaState(2, 1, 3, (1, 2), (1, 2), 0)  # broker 1 leads
    asked: list = []

    async def call(api, version, body, decode):  # answered as fetch_response decodes it
        asked.extend((t.topic, p.partition) for t in body.topics for p in t.partitions)
        return 0, ErrorCode.none, [fetch_response.FetchedPartition(
            "t", i, ErrorCode.none, 1, 1, 0, (), None) for _, i in asked]

    manager = SimpleNamespace(config=SimpleNamespace(get=lambda key: 1000), broker_id=2)
    fetcher = LeaderFetcher(manager, 1)
    fetcher._conn = SimpleNamespace(call=call)
    followed = [_Followed(held, 3), _Followed(fetched, 3)]
    for f in followed:
        f.truncated = True
        fetcher.followed[(f.partition.topic, f.partition.index)] = f

    async def scenario() -> None:
        disk.arm("open", ".log")
        opening = held.start_opening()
        await _reached(disk)
        await fetcher._fetch(followed)
        assert asked == [("t", 1)] and followed[0].resume_at > 0
        assert fetched.replication.high_watermark == 1
        fetcher._apply(followed[0], 0, SimpleNamespace(
            error_code=ErrorCode.none, records=_record(b"x"), high_watermark=1,
            log_start_offset=0))
        ReplicaManager._adopt_isr(SimpleNamespace(_count_isr=lambda *_: None), held,
                                  held.replication, zn.PartitionState(1, 3, (1, 2), 0), 0,
                                  (1, 2), 1)
        disk.release.set()
        await asyncio.wait_for(opening, WAIT_S)
        assert held.log.log_end_offset == 1  # nothing applied while it was opened

    asyncio.run(scenario())
    held.close()
    fetched.close()


def test_a_partition_opened_before_its_turn_keeps_its_validation(tmp_path, monkeypatch):
    """A Produce whose logs are opened in workers validates each partition's batches
    once: one whose opening ends while an earlier partition's still runs is appended with
    the validation done before (not validated again on the loop, its decompression charged
    twice to the request's Inflation budget)."""
    from types import SimpleNamespace

    from oncelog.broker.apis import produce

    disk = GatedDisk()
    first, second = _partition(tmp_path, disk, 0), _partition(tmp_path, OsDisk(), 1)
    parts = {0: first, 1: second}
    appended: dict[int, object] = {}
    append = Partition.append_records

    def recorded(self, records, verify=None, inflation=None, validated=None):
        appended[self.index] = validated
        return append(self, records, verify, inflation, validated)

    monkeypatch.setattr(Partition, "append_records", recorded)
    broker = SimpleNamespace(
        authorizer=None, counters=SimpleNamespace(inc=lambda *_: None),
        topics=SimpleNamespace(partition=lambda topic, i: parts[i], by_id=lambda _: None))
    data = [SimpleNamespace(index=i, records=_record(b"v%d" % i)) for i in (0, 1)]
    for d in data:
        d._replace = lambda records, d=d: SimpleNamespace(index=d.index, records=records)
    request = SimpleNamespace(client_id="c", body=SimpleNamespace(
        acks=0, transactional_id=None, timeout_ms=1000,
        topic_data=[SimpleNamespace(name="t", topic_id=None, partition_data=data)]))

    async def scenario() -> None:
        disk.arm("open", "partition.metadata.tmp")
        producing = asyncio.ensure_future(produce._produce(broker, request))
        await _reached(disk)
        for _ in range(WAIT_S * 100):
            if second.is_open:
                break
            await asyncio.sleep(0.01)
        assert second.is_open and not first.is_open
        disk.release.set()
        assert await asyncio.wait_for(producing, WAIT_S) is None  # acks=0: all appended
        assert first.log.log_end_offset == 1 and second.log.log_end_offset == 1
        assert appended[0] is not None and appended[1] is not None

    asyncio.run(scenario())
    first.close()
    second.close()


def test_a_second_log_is_never_installed_over_the_published_one(tmp_path):
    """Defence against the double-opening class (an opening begun for a log already
    open): its installation fails loudly (its waiters get the error, its files closed) and
    the log appended to stays the partition's. A RuntimeError, not an assert (python -O
    strips asserts)."""
    p = _partition(tmp_path, OsDisk())
    p.append_records(_record(b"first"), accept)
    published = p.log

    async def scenario() -> None:
        again = p._begin_opening(lambda files: p._build(files, p.dir, p._snapshots))
        with pytest.raises(RuntimeError, match="second log"):
            await asyncio.wait_for(again, WAIT_S)

    asyncio.run(scenario())
    assert p.log is published
    assert p.append_records(_record(b"second"), accept).base_offset == 1
    p.close()


def test_a_truncation_asked_by_a_follower_that_leads_once_open_cuts_nothing(tmp_path):
    """The fetcher's truncation waits for the log's opening: a role given meanwhile (this
    broker leads now) makes its offset stale, and nothing is cut (acknowledged data)."""
    from oncelog.broker.replication import ReplicaState

    disk = GatedDisk()
    p = _partition(tmp_path, disk)
    for n in range(3):
        p.append_records(_record(b"%d" % n), accept)
    p.close()
    p = _partition(tmp_path, disk)
    p.replication = ReplicaState(2, 1, 3, (1, 2), (1, 2), 0)  # broker 1 leads

    async def scenario() -> None:
        disk.arm("open", ".log")
        cutting = asyncio.ensure_future(p.truncate_async(1))
        await _reached(disk)
        p.replication = ReplicaState(2, 2, 4, (1, 2), (1, 2), 0)  # now this broker leads
        disk.release.set()
        await asyncio.wait_for(cutting, WAIT_S)
        assert p.log.log_end_offset == 3

    asyncio.run(scenario())
    p.close()


@pytest.mark.parametrize("api", ["fetch", "list_offsets", "offset_for_leader_epoch",
                                 "delete_records"])
def test_a_partition_this_broker_does_not_lead_opens_no_log(tmp_path, api):
    """Fetch, ListOffsets, OffsetForLeaderEpoch and DeleteRecords answer a consumer's
    partition this broker does not lead NOT_LEADER_OR_FOLLOWER without recovering its log
    first (in a worker: file work for nothing)."""
    from datetime import timedelta
    from types import SimpleNamespace

    from kio.schema.errors import ErrorCode

    from oncelog.broker.apis import fetch, partition_admin
    from oncelog.broker.replication import ReplicaState
    from oncelog.protocol import api_versions as apis

    p = _partition(tmp_path, OsDisk())
    p.append_records(_record(b"before the restart"), accept)
    p.close()
    p = _partition(tmp_path, OsDisk())
    p.replication = ReplicaState(1, 2, 3, (1, 2), (1, 2), 0)  # broker 2 leads
    assert p.needs_open
    broker = SimpleNamespace(authorizer=None, broker_id=1,
                             topics=SimpleNamespace(partition=lambda topic, index: p),
                             config=SimpleNamespace(get=lambda key: 1 << 20),
                             quotas=SimpleNamespace(fetch_allowance=lambda request: 1 << 20),
                             cluster_brokers=lambda listener=None: ())
    partition = SimpleNamespace(partition_index=0, partition=0, timestamp=-1, offset=0,
                                current_leader_epoch=-1, leader_epoch=0, fetch_offset=0,
                                partition_max_bytes=1 << 20, log_start_offset=-1)
    topic = SimpleNamespace(name="t", topic="t", partitions=[partition])
    handler, key, version = {
        "fetch": (fetch.handle_fetch, apis.FETCH, 12),
        "list_offsets": (fetch.handle_list_offsets, apis.LIST_OFFSETS, 7),
        "offset_for_leader_epoch": (fetch.handle_offset_for_leader_epoch,
                                    apis.OFFSET_FOR_LEADER_EPOCH, 4),
        "delete_records": (partition_admin.handle_delete_records, apis.DELETE_RECORDS, 2)}[api]
    request = SimpleNamespace(session=SimpleNamespace(listener=None), peer="127.0.0.1:1",
                              api_key=key, api_version=version, body=SimpleNamespace(
                                  topics=[topic], replica_id=-1, isolation_level=0,
                                  timeout_ms=1000, max_wait=timedelta(seconds=WAIT_S),
                                  min_bytes=1, max_bytes=1 << 20))

    async def scenario():
        answer = handler(broker, request)
        if asyncio.iscoroutine(answer):
            answer = await answer
        await _settled(p.dir)
        return answer

    answer = asyncio.run(scenario())
    codes = [getattr(q, "error_code", None)
             for t in getattr(answer, "topics", None) or answer.responses
             for q in (getattr(t, "partitions", None) or ())]
    assert codes == [ErrorCode.not_leader_or_follower]
    assert not p.is_open


def _produce_to(parts: dict, acks: int = 0):
    """A broker and a Produce request (topic t, one record per partition of ``parts``)
    enough for produce._produce, which opens the logs in workers."""
    from types import SimpleNamespace

    broker = SimpleNamespace(
        authorizer=None, counters=SimpleNamespace(inc=lambda *_: None),
        topics=SimpleNamespace(partition=lambda topic, i: parts.get(i), by_id=lambda _: None))
    data = [SimpleNamespace(index=i, records=_record(b"v%d" % i)) for i in parts]
    for d in data:
        d._replace = lambda records, d=d: SimpleNamespace(index=d.index, records=records)
    request = SimpleNamespace(client_id="c", body=SimpleNamespace(
        acks=acks, transactional_id=None, timeout_ms=1000,
        topic_data=[SimpleNamespace(name="t", topic_id=None, partition_data=data)]))
    return broker, request


def test_a_log_closed_after_its_opening_is_opened_again_for_the_produce(tmp_path,
                                                                        monkeypatch):
    """A partition's log closed between the end of its opening and the Produce's turn (a
    log-dir move's close, the broker's abandoning a failed directory) is opened again and
    appended to: before, it was silently left out of the answer and never appended (acks=0:
    the records dropped without a word)."""
    from oncelog.broker.apis import produce

    closed = _partition(tmp_path, OsDisk(), 0)
    opened = Partition.open_async
    closes = [1]

    async def closed_once_opened(self) -> None:
        await opened(self)
        if closes:
            closes.pop()
            self.close()  # what a log-dir move's _finish does after the opening

    monkeypatch.setattr(Partition, "open_async", closed_once_opened)
    broker, request = _produce_to({0: closed})

    async def scenario() -> None:
        assert await asyncio.wait_for(produce._produce(broker, request), WAIT_S) is None
        assert closed.log.log_end_offset == 1

    asyncio.run(scenario())
    closed.close()


def test_a_replica_whose_opening_failed_fails_no_other_replicas_truncation(tmp_path,
                                                                           no_backoff):
    """A follower's partition whose log could not be opened (its worker's opening failed)
    is left out of the fetcher's OffsetForLeaderEpoch round, backed off with its next
    opening started: before, its ``leader_epochs`` (OpenInProgress) failed the round of
    every partition of that leader, and they all stalled while that one log kept failing."""
    from types import SimpleNamespace

    from kio.schema.errors import ErrorCode

    from oncelog.broker.replica_fetcher import LeaderFetcher, _Followed
    from oncelog.broker.replication import ReplicaState

    def replica(index: int) -> Partition:
        disk = MemoryDisk()
        disk.makedirs("/data")
        return Partition("t", index, f"/data/t-{index}", LogConfig(), 1 << 20,
                         StateLimits(), Issued(), log_dir=LogDir("/data"), disk=disk,
                         topic_id=uuid.uuid4())

    broken, fine = replica(0), replica(1)
    broken.disk.fail("write", path_suffix="partition.metadata.tmp")  # its opening fails
    for p in (broken, fine):
        p.replication = ReplicaState(2, 1, 3, (1, 2), (1, 2), 0)  # broker 1 leads
    asked: list = []

    async def call(api, version, body):
        asked.extend((t.topic, p.partition) for t in body.topics for p in t.partitions)
        return SimpleNamespace(topics=[SimpleNamespace(topic="t", partitions=[
            SimpleNamespace(partition=i, error_code=ErrorCode.none, leader_epoch=0,
                            end_offset=0) for _, i in asked])])

    manager = SimpleNamespace(config=SimpleNamespace(get=lambda key: 1000), broker_id=2)
    fetcher = LeaderFetcher(manager, 1)
    fetcher._conn = SimpleNamespace(call=call)
    followed = [_Followed(broken, 3), _Followed(fine, 3)]
    for f in followed:
        fetcher.followed[(f.partition.topic, f.partition.index)] = f

    async def scenario() -> None:
        await asyncio.wait_for(fetcher._truncate(followed), WAIT_S)
        assert asked == [("t", 1)]
        assert followed[0].resume_at > 0 and not followed[0].truncated
        assert followed[1].truncated
        await asyncio.wait_for(broken.open_async(), WAIT_S)  # its next try, started
        await _settled(broken.dir)

    asyncio.run(scenario())
    broken.close()
    fine.close()


def test_a_bug_failing_an_opening_is_said_with_its_traceback_and_kept(tmp_path, monkeypatch,
                                                                      caplog):
    """A worker opening failing with neither an OSError nor the metadata store's
    unavailability is a bug: logged with its traceback and kept as it is (a use after it
    is refused with it, no next try started), not turned into a retriable EAGAIN that
    every use retries quietly forever."""
    import logging

    p = _partition(tmp_path, OsDisk())
    os.makedirs(p.dir)  # written before: a read opens it

    def broken(*_args, **_kwargs):
        raise ZeroDivisionError("a bug in the recovery")

    monkeypatch.setattr(Partition, "_build", broken)

    async def scenario() -> None:
        with caplog.at_level(logging.ERROR, logger="oncelog.broker.partition_opening"):
            with pytest.raises(ZeroDivisionError):
                await asyncio.wait_for(p.open_async(), WAIT_S)
        await _settled(p.dir)
        assert any(r.exc_info and r.exc_info[0] is ZeroDivisionError for r in caplog.records)
        with pytest.raises(ZeroDivisionError):
            _ = p.log
        assert not p.opening  # no quiet retry

    asyncio.run(scenario())


def test_the_next_try_after_a_failed_opening_waits_for_its_backoff(monkeypatch):
    """A log whose opening keeps failing is not recovered back to back by every use: the
    next try in the background starts only once its backoff is over (doubling from 0.5 s
    to 30 s, back to the start once an opening works); a use before it is refused retriable
    and starts nothing."""
    from oncelog.broker import partition_opening

    now = [1000.0]
    monkeypatch.setattr(partition_opening, "_now", lambda: now[0], raising=False)
    disk = MemoryDisk()
    disk.makedirs("/data")
    p = Partition("t", 0, "/data/t-0", LogConfig(), 1 << 20, StateLimits(), Issued(),
                  log_dir=LogDir("/data"), disk=disk, topic_id=uuid.uuid4())
    disk.fail("write", path_suffix="partition.metadata.tmp", times=2)

    async def refused_without_a_try() -> None:
        with pytest.raises(OSError) as refused:
            _ = p.log
        assert refused.value.errno == errno.EAGAIN
        assert p.opened_for_a_duty() and not p.opening

    async def a_try_started() -> asyncio.Future:
        with pytest.raises(OSError) as refused:
            _ = p.log
        assert refused.value.errno == errno.EAGAIN and p.opening
        return p.start_opening()

    async def scenario() -> None:
        with pytest.raises(OSError):
            await asyncio.wait_for(p.open_async(), WAIT_S)
        await _settled(p.dir)
        await refused_without_a_try()
        now[0] += 0.5
        with pytest.raises(OSError):  # the second failure: 1 s now
            await asyncio.wait_for(await a_try_started(), WAIT_S)
        await _settled(p.dir)
        now[0] += 0.9
        await refused_without_a_try()
        now[0] += 0.1
        await asyncio.wait_for(await a_try_started(), WAIT_S)
        assert p.is_open and p.log.log_end_offset == 0

    asyncio.run(scenario())
    p.close()


def test_an_isr_shrink_moves_the_high_watermark_of_a_leader_whose_log_is_closed(tmp_path):
    """The ISR shrinking to the leader alone moves its high watermark and answers its
    acks=-1 waiters even while its log is closed (a log-dir move, a failed opening): its
    opening is started and the move made once it is open. Before, the ISR adoption
    skipped it, and the Produce waited out its timeout."""
    from types import SimpleNamespace

    from oncelog.broker.replica_manager import ReplicaManager
    from oncelog.broker.replication import ReplicaState
    from oncelog.cluster import znodes as zn

    p = _partition(tmp_path, OsDisk())
    p.append_records(_record(b"acks=-1"), accept)
    p.close()
    current = p.replication = ReplicaState(1, 1, 3, (1, 2), (1, 2), 0)  # broker 1 leads

    async def scenario() -> None:
        waiting = current.wait_for(1, WAIT_S)
        assert waiting is not None
        ReplicaManager._adopt_isr(SimpleNamespace(_count_isr=lambda *_: None), p, current,
                                  zn.PartitionState(1, 3, (1,), 0), 1, (1, 2), 1)
        await asyncio.wait_for(waiting, WAIT_S)
        assert current.high_watermark == 1 and p.is_open

    asyncio.run(scenario())
    p.close()


def test_a_new_leader_role_opens_its_log_during_a_failed_openings_backoff():
    """Becoming leader is no retry: a log whose last opening failed is opened for the new
    role at once, the role held until then, not applied over a log refused (its use
    failing the pass over the topic's other partitions) until the backoff ends."""
    from types import SimpleNamespace

    from oncelog.broker.replica_manager import ReplicaManager
    from oncelog.cluster import isr as rules

    disk = MemoryDisk()
    disk.makedirs("/data")
    p = Partition("t", 0, "/data/t-0", LogConfig(), 1 << 20, StateLimits(), Issued(),
                  log_dir=LogDir("/data"), disk=disk, topic_id=uuid.uuid4())
    disk.fail("write", path_suffix="partition.metadata.tmp")
    opened: list = []
    manager = SimpleNamespace(_awaiting_log={}, _unopened=set(), _log_opened=opened.append)

    async def scenario() -> None:
        with pytest.raises(OSError):
            await asyncio.wait_for(p.open_async(), WAIT_S)
        await _settled(p.dir)
        args = (SimpleNamespace(leader_epoch=1), 0)
        assert ReplicaManager._open_first(manager, p, rules.Role.BECOME_LEADER, args)
        assert p.opening
        for _ in range(WAIT_S * 100):
            if opened:
                break
            await asyncio.sleep(0.01)
        assert opened == [p] and p.is_open

    asyncio.run(scenario())
    p.close()


def test_a_log_built_in_a_worker_waits_for_the_loop_holding_no_descriptor(tmp_path):
    """While the loop has yet to install a log a worker finished, that log holds no file
    open: the workers go on finishing others meanwhile, in no bound of descriptors (a
    restart's retention pass opened every partition of a broker with a low RLIMIT_NOFILE
    and ran it out of them). Installed, it opens its files again at their next use."""
    p = _partition(tmp_path, OsDisk())
    p.append_records(_record(b"before the restart"), accept)
    p.close()
    p = _partition(tmp_path, OsDisk())
    seen: list = []

    async def scenario() -> None:
        settle = p._settle

        def looking(*args):  # on the loop, before the install
            seen.append(_descriptors_into(p.dir))
            return settle(*args)

        p._settle = looking
        await p.open_async()
        assert p.append_records(_record(b"after"), accept).base_offset == 1

    asyncio.run(scenario())
    assert seen == [[]]
    p.close()
