"""A random model of a log's life with its seals run late, in any order (written by the second
review of the seal off the event loop, kept as a guard): histories of appends, flushes
(acknowledgements), rolls whose seals are held and run (fsync only, or whole) whenever the
history says, retention, DeleteRecords, truncations (the log abandoned and opened again as a
partition opens it), clean and unclean restarts. ``explore`` cuts the power at each file
operation of a history and checks what a start keeps."""

from __future__ import annotations

import dataclasses
import random

from oncelog.broker.log_dirs import LogDir
from oncelog.broker.partition import Partition
from oncelog.log import cleaning
from oncelog.log.compaction import CompactionConfig
from oncelog.log.log import Log, LogConfig
from oncelog.log.memory_disk import MemoryDisk
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.record_batch import assign_offsets, split_batches
from oncelog.protocol.records import decode_batch, encode_batch
from support.power_cuts import CuttingDisk, IssuedBelow, PowerCut

LOG_DIR = "/data"
DIRECTORY = "/data/t-0"
CONFIG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=100,
                   compaction=CompactionConfig(min_cleanable_dirty_ratio=0.0))
TIMESTAMP = 1_700_000_000_000


def open_partition(disk: MemoryDisk) -> Partition:
    p = Partition("t", 0, DIRECTORY, CONFIG, 1 << 20, StateLimits(), IssuedBelow(),
                  log_dir=LogDir(LOG_DIR), disk=disk)
    assert p.state is not None
    return p


def kept_values(p: Partition, gaps: list | None = None) -> dict[int, bytes]:
    """Offset -> the name of the batch there; with ``gaps``, offsets missing below the log
    end are noted there instead of failing."""
    plog, found = p.log, {}
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 20).records
        if not data and gaps is not None:
            gaps.append((offset, plog.log_end_offset))
            break
        assert data, f"nothing readable at {offset} below the log end {plog.log_end_offset}"
        pos = 0
        while pos < len(data):
            header, records = decode_batch(data, pos)
            if gaps is not None and header.base_offset > offset:
                gaps.append((offset, header.base_offset))
                offset = header.base_offset
            assert header.base_offset == offset, \
                f"offsets are not contiguous: {header.base_offset} where {offset} was due"
            name = records[0].value.split(b"|")[0]
            assert int(name.split(b":")[0]) == offset, (name, offset)
            found[offset] = name
            offset = header.last_offset + 1
            pos += header.size
    return found


class History:
    def __init__(self, disk: MemoryDisk, seed: int, steps: int, trace: list[str] | None = None):
        self.disk = disk
        self.rng = random.Random(seed)
        self.steps = steps
        self.trace = trace if trace is not None else []
        self.held = []  # every seal handed out by a roll, of any log
        self.appended: dict[int, bytes] = {}
        self.acked: dict[int, bytes] = {}
        self.floor = 0
        self.gen = 0
        self.log = self._reopen_log()

    def _reopen_log(self) -> Log:
        log = Log(DIRECTORY, CONFIG, self.disk)
        log.seal_recovered()
        self._run_pending(log, whole=False)
        log.flush()  # as Partition._build does
        return log

    def _run_pending(self, log: Log, whole: bool) -> None:
        """What a flush (or a close) waits for, run now: single thread, nothing runs them
        meanwhile."""
        for seal in log.pending_seals():
            if whole:
                if not seal.done:
                    seal.run()
            elif not seal._synced.is_set():
                seal._fsync()
        if whole:
            for seal in list(log._seals.values()):
                if not seal.done:
                    seal.run()

    def put(self) -> None:
        log = self.log
        i = log.log_end_offset
        self.gen += 1
        name = b"%d:%d" % (i, self.gen)
        # a key of its own: a clean removes nothing, and swaps segments all the same
        batch = encode_batch([(b"k" + name, name + b"|" + b"." * 200, (), TIMESTAMP + i)])
        headers = split_batches(batch, 1 << 20)
        headers, parts = assign_offsets(batch, headers, i, 0)
        log.append(parts, headers)
        self.appended[i] = name

    def flush(self) -> None:
        self._run_pending(self.log, whole=False)
        self.log.flush()
        end = self.log.log_end_offset
        self.acked.update((o, v) for o, v in self.appended.items() if o < end)

    def run(self) -> None:
        ops = ["put"] * 6 + ["flush"] * 2 + ["roll"] * 3 + ["seal"] * 3 + \
            ["retention", "delete_records", "truncate", "clean_restart", "crash_restart"] + \
            ["retention_dir_fails", "index_fails", "retry", "clean"]
        for _ in range(self.steps):
            op = self.rng.choice(ops)
            getattr(self, "op_" + op)()

    def op_put(self) -> None:
        self.trace.append("put")
        self.put()

    def op_flush(self) -> None:
        self.trace.append("flush")
        self.flush()

    def op_roll(self) -> None:
        if self.log.active.size == 0:
            return
        self.trace.append(f"roll at {self.log.log_end_offset}")
        self.log.roll(self.held.append)

    def op_seal(self) -> None:
        waiting = [s for s in self.held if not s.done]
        if not waiting:
            return
        seal = self.rng.choice(waiting)
        if not seal._synced.is_set() and self.rng.random() < 0.5:
            self.trace.append(f"seal {seal.segment.base_offset}: fsync only")
            seal._fsync()
        else:
            self.trace.append(f"seal {seal.segment.base_offset}: run")
            seal.run()

    def op_retention(self) -> None:
        log = self.log
        if len(log.segments) < 2:
            return
        k = self.rng.randint(1, len(log.segments) - 1)
        sizes = [s.size for s in log.segments]
        if 0 in sizes[:k + 1]:
            return
        self.trace.append(f"retention of {k} segments")
        self.floor = max(self.floor, log.segments[k].base_offset)
        log.config = dataclasses.replace(CONFIG, retention_bytes=sum(sizes) - sum(sizes[:k]))
        try:
            log.delete_old_segments(TIMESTAMP)
        finally:
            log.config = CONFIG

    def op_retention_dir_fails(self) -> None:
        """Retention whose directory fsync after the unlinks fails (an OSError the broker
        logs; the directory stays online)."""
        self.disk.fail("fsync_dir", path_suffix="t-0")
        try:
            self.op_retention()
        except OSError:
            self.trace.append("  (its directory fsync failed)")
        self.disk.clear_faults()

    def op_index_fails(self) -> None:
        """A seal whose offset index cannot be written (a full disk)."""
        waiting = [s for s in self.held if not s.done]
        if not waiting:
            return
        seal = self.rng.choice(waiting)
        self.trace.append(f"seal {seal.segment.base_offset}: run, its index write failing")
        self.disk.fail("write", 28, path_suffix=".index.tmp")
        seal.run()
        self.disk.clear_faults()

    def op_retry(self) -> None:
        retry = self.log.seals_to_retry()
        if not retry:
            return
        self.trace.append(f"retry the seals of {[s.segment.base_offset for s in retry]}")
        for seal in retry:
            seal.rearm()
            seal.run()

    def op_clean(self) -> None:
        self.trace.append("clean")
        cleaning.run(cleaning.clean(self.log, {}, TIMESTAMP + 100, 1 << 20))

    def op_delete_records(self) -> None:
        log = self.log
        if log.log_end_offset <= log.log_start_offset:
            return
        offset = self.rng.randint(log.log_start_offset + 1, log.log_end_offset)
        self.trace.append(f"delete records below {offset}")
        self.flush()  # what precedes it on disk first (Partition.delete_records_async)
        self.floor = max(self.floor, offset)
        log.advance_log_start(offset)

    def op_truncate(self) -> None:
        log = self.log
        lowest = max([o + 1 for o in self.acked] + [log.log_start_offset + 1, log.base_offset + 1])
        if lowest >= log.log_end_offset:
            return
        offset = self.rng.randint(lowest, log.log_end_offset - 1)
        self.trace.append(f"truncate to {offset}")
        self.appended = {o: v for o, v in self.appended.items() if o < offset}
        try:
            log.truncate_to(offset)
        finally:
            log.abandon()
        self.log = self._reopen_log()

    def op_clean_restart(self) -> None:
        self.trace.append("clean restart")
        self._run_pending(self.log, whole=True)
        self.log.close()
        self.log = self._reopen_log()

    def op_crash_restart(self) -> None:
        self.trace.append("kill -9 and restart")
        self.log.abandon()
        self.disk.crash()
        self.held = [s for s in self.held if s.done]  # the workers died with the process
        self.log = self._reopen_log()


def explore(seed: int, steps: int, power_seeds=(1, 2), gaps: list | None = None) -> list[str]:
    """Every failure found, cutting the power at each file operation of history ``seed``."""
    whole = CuttingDisk()
    whole.makedirs(LOG_DIR)
    History(whole, seed, steps).run()
    ops = whole.done[:]
    failures = []
    for cut_at in range(len(ops) + 1):
        for power in power_seeds:
            disk = CuttingDisk()
            disk.makedirs(LOG_DIR)
            disk.cut_at = cut_at
            trace: list[str] = []
            history = None
            try:
                history = History(disk, seed, steps, trace)
                history.run()
            except PowerCut:
                pass
            if history is None:
                continue
            disk.cut_at = None
            disk.power_loss(random.Random(power))
            where = (f"history {seed}, power cut at #{cut_at} "
                     f"({ops[cut_at - 1] if cut_at else '-'} done), power seed {power}; "
                     f"trace {trace}")
            try:
                p = open_partition(disk)
                found: list = []
                kept = kept_values(p, found if gaps is not None else None)
                if found and gaps is not None:
                    gaps.append(f"{where}: gaps {found}")
                lost = {o: v for o, v in history.acked.items()
                        if o >= history.floor and kept.get(o) != v}
                assert not lost, f"acknowledged batches lost or changed: {lost}, kept {kept}"
                markers = [n for n in disk.listdir(DIRECTORY) if n.endswith(".unsealed")]
                assert not markers, markers
                p.abandon()
                disk.power_loss(random.Random(power + 100))
                again = open_partition(disk)
                tolerate = [] if gaps is not None else None
                assert kept_values(again, tolerate) == kept, \
                    "a second power cut changed what was kept"
                again.close()
                assert kept_values(open_partition(disk), tolerate) == kept, \
                    "a clean restart changed it"
            except AssertionError as exc:
                failures.append(f"{where}: {exc}")
            except Exception as exc:
                failures.append(f"{where}: {type(exc).__name__}: {exc}")
    return failures
