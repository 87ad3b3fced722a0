"""Moving a partition between the log directories of this broker (AlterReplicaLogDirs),
online and crash-safe.

Kafka copies a partition into ``<topic>-<p>.<id>-future`` in the destination while it keeps
serving, then swaps the future log in and deletes the old one. Here, for a move with id I
(a fresh uuid), from directory S to directory D:

1. copy (a worker thread; the partition serves meanwhile): every file of ``S/<tp>`` into
   ``D/<tp>.I-future``, then again what changed since (a segment that grew: its new bytes;
   anything else that changed: the whole file), until a pass finds little to do.
2. finish (on the event loop, so nothing else touches the partition): the partition is
   closed cleanly (producer snapshot, log sealed), what changed since the last pass is
   copied, every file of the future fsynced, then D.
3. commit: ``S/<tp>`` is renamed ``S/<tp>.I-delete`` and S fsynced.
4. ``D/<tp>.I-future`` renamed ``D/<tp>``, D fsynced; the partition reopens from D.
5. ``S/<tp>.I-delete`` removed in the background.

``recover`` runs at start before anything is read, and leaves exactly one complete copy
whatever moment a crash hit: a future whose ``-delete`` twin exists was committed (3 done):
it is renamed in (4); a future without one was not: it is removed and the source is used; a
``-delete`` without a future had 4 done: it is removed with the other ``-delete``
directories. A failure before the commit removes the future and leaves the
partition where it was; a failed fsync at or after the commit takes the directory offline
(its partitions answer KAFKA_STORAGE_ERROR) and the next start finishes the move.

For the tests, ONCELOG_LOG_DIR_MOVE_CRASH=<point> kills the broker (SIGKILL) at a point of
the move: ``copying`` (after the first file), ``copied`` (2 done), ``committed`` (3 done),
``renamed`` (4 done); ONCELOG_LOG_DIR_MOVE_GATE=<file> holds the copy after its first file
while that file exists.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..log import partition_metadata
from .log_dirs import FILE_NAME_MAX, LogDir, directory_bytes, suffixed_dir_name

if TYPE_CHECKING:
    from ..log.disk import OsDisk
    from ..metadata.store import MetadataStore
    from .partition import Partition


class MoveHost(Protocol):
    """What the moves use of the TopicManager that owns them (topics.py): its disk, metadata
    store and log directories, and the count of partitions each directory holds."""

    disk: OsDisk
    store: MetadataStore
    log_dirs: dict[str, LogDir]

    def placed_in(self, source: LogDir, target: LogDir) -> None: ...

log = logging.getLogger(__name__)

FUTURE_SUFFIX = "-future"
DELETE_SUFFIX = "-delete"
_MOVE_DIR = re.compile(r"(.+-\d+)\.([0-9a-f]{32})(-future|-delete)")
_PASSES = 8  # copy passes in the worker before the last one on the event loop
_SMALL_PASS = 1 << 20  # a pass that copied less than this is the last one in the worker
_COPY_CHUNK = 1 << 20
# Files the last pass leaves out: a clean's unfinished output (opening a log removes it).
_SKIPPED_SUFFIXES = (".cleaned", ".tmp")


def _crash_point(name: str) -> None:
    if os.environ.get("ONCELOG_LOG_DIR_MOVE_CRASH") == name:
        log.warning("ONCELOG_LOG_DIR_MOVE_CRASH=%s: killing the broker here", name)
        os.kill(os.getpid(), signal.SIGKILL)


def _hold_at_gate(move: Move) -> None:
    """ONCELOG_LOG_DIR_MOVE_GATE=<file>: the first copy pass waits after its first file while
    that file exists (at most a minute), so a test sees a move under way."""
    gate = os.environ.get("ONCELOG_LOG_DIR_MOVE_GATE")
    deadline = time.monotonic() + 60
    while gate and os.path.exists(gate) and not move.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)


class MoveFailed(Exception):
    pass


@dataclass
class Move:
    partition: Partition
    source: LogDir
    target: LogDir
    move_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    cancelled: bool = False
    committed: bool = False  # the source was renamed "-delete": the copy is the partition
    copied_to: int = -1  # the log end offset the copy has reached at least (-1: not yet)
    # what each file was when last copied: name -> (inode, size, mtime_ns)
    copied: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return os.path.basename(self.partition.dir)

    @property
    def future_dir(self) -> str:
        return os.path.join(self.target.path,
                            suffixed_dir_name(self.name, self.move_id, FUTURE_SUFFIX))

    def deleted_dir(self) -> str:
        return os.path.join(self.source.path,
                            suffixed_dir_name(self.name, self.move_id, DELETE_SUFFIX))


class LogDirMoves:
    def __init__(self, topics: MoveHost) -> None:
        self.topics = topics
        self.moving: dict[Partition, Move] = {}
        self._tasks: set[asyncio.Task] = set()
        # the partition the log cleaner is cleaning, if any (set by the broker)
        self.cleaning: Callable[[], Partition | None] = lambda: None

    # --- at start --------------------------------------------------------------------------

    def recover(self) -> None:
        """Finish or undo the moves a crash cut short (see the module's text)."""
        found: dict[str, dict[str, str]] = {}  # move id -> suffix -> path
        for state in self.topics.log_dirs.values():
            if state.offline:
                continue
            for entry in os.listdir(state.path):
                match = _MOVE_DIR.fullmatch(entry)
                if match is not None:
                    found.setdefault(match.group(2), {})[match.group(3)] = \
                        os.path.join(state.path, entry)
        for move_id, parts in found.items():
            future, deleted = parts.get(FUTURE_SUFFIX), parts.get(DELETE_SUFFIX)
            try:
                if future is not None and deleted is not None:
                    live = self._live_path(future)
                    log.warning("moving %s to %s was committed and cut short: finishing it",
                                os.path.basename(live), os.path.dirname(live))
                    os.replace(future, live)
                    self.topics.disk.fsync_dir(os.path.dirname(live))
                    shutil.rmtree(deleted, ignore_errors=True)
                elif future is not None and any(d.offline for d in self.topics.log_dirs.values()):
                    log.warning("%s: a move's copy left as it is while a log directory is "
                                "offline (it may hold the move's commit)", future)
                elif future is not None:
                    log.warning("moving to %s was cut short before its commit: the copy %s "
                                "is removed, the partition stays where it was",
                                os.path.dirname(future), os.path.basename(future))
                    shutil.rmtree(future, ignore_errors=True)
                # A "-delete" alone: the move got past step 4 (or it is a topic deletion's
                # leftover): the topic manager removes it with the others.
            except OSError as exc:
                log.error("recovering the move %s failed: %s; the directory it was in is "
                          "taken offline", move_id, exc)
                self.topics.log_dirs[os.path.dirname(future or deleted or "")].fail(exc)

    def _live_path(self, path: str) -> str:
        match = _MOVE_DIR.fullmatch(os.path.basename(path))
        assert match is not None
        name = match.group(1)
        if len(os.path.basename(path)) >= FILE_NAME_MAX:  # the topic may have been cut
            name = self._full_name(path, name)
        return os.path.join(os.path.dirname(path), name)

    def _full_name(self, future: str, cut_name: str) -> str:
        """The partition a copy with a cut name belongs to: the topic whose name starts
        with the cut one and whose id the copy's partition.metadata holds."""
        prefix, _, index = cut_name.rpartition("-")
        topic_id = partition_metadata.read(self.topics.disk, future)
        store = self.topics.store
        for topic in store.children("topics"):
            if topic.startswith(prefix) and topic_id is not None and \
                    (store.get(f"topics/{topic}")[0] or {}).get("id") == str(topic_id):
                return f"{topic}-{index}"
        raise OSError(f"no topic of this broker owns the copy {os.path.basename(future)}")

    # --- moving ----------------------------------------------------------------------------

    def start(self, partition: Partition, target: LogDir) -> None:
        """Move ``partition`` into ``target`` in the background (already there: nothing to
        do; moving elsewhere: that move is cancelled first)."""
        current = self.moving.get(partition)
        if current is not None:
            if current.target is target:
                return
            self.cancel(partition)
        if partition.log_dir is target:
            return
        move = Move(partition, partition.log_dir, target)
        self.moving[partition] = move
        task = asyncio.get_running_loop().create_task(self._run(move))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel(self, partition: Partition) -> None:
        move = self.moving.pop(partition, None)
        if move is not None:
            move.cancelled = True
            log.info("moving %s to %s cancelled", partition.name, move.target.path)

    async def _run(self, move: Move) -> None:
        partition = move.partition
        log.info("moving %s from %s to %s", partition.name, move.source.path, move.target.path)
        try:
            if not os.path.isdir(partition.dir) and not partition.is_open \
                    and not partition.opening:
                self._relocate_empty(move)
                return
            os.makedirs(move.future_dir)
            for _ in range(_PASSES):
                end = partition.log.log_end_offset if partition.is_open else -1
                copied = await asyncio.to_thread(self._copy_pass, move, True)
                move.copied_to = end
                if move.cancelled or copied < _SMALL_PASS:
                    break
            # The last pass runs where nothing else does: wait for a running fsync, a
            # rolled segment's seal, an opening of its log and a clean of this partition
            # (each works in worker threads) to be over.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while partition.flush_running or partition.seal_running or \
                    partition.opening or self.cleaning() is partition:
                if loop.time() > deadline:
                    raise MoveFailed("the partition stayed busy (fsync, seal, opening or "
                                     "clean) for 60 s")
                await asyncio.sleep(0.01)
            if move.cancelled:
                raise MoveFailed("cancelled")
            self._finish(move)
        except Exception as exc:
            if self.moving.get(partition) is move:
                del self.moving[partition]
            if not move.committed:
                # The copy goes first: when the line below says the partition stayed, the
                # target directory holds nothing of the move any more.
                await asyncio.to_thread(shutil.rmtree, move.future_dir, True)
            if not isinstance(exc, MoveFailed) or str(exc) != "cancelled":
                log.error("moving %s to %s failed, it stays in %s: %s", partition.name,
                          move.target.path, partition.log_dir.path, exc)
            if move.committed:
                log.error("%s is offline until a restart, which finishes the move into %s",
                          partition.name, move.target.path)
            return
        if self.moving.get(partition) is move:
            del self.moving[partition]

    def _relocate_empty(self, move: Move) -> None:
        """A partition that never held data has no files: only its place changes."""
        partition = move.partition
        partition.relocate(os.path.join(move.target.path, move.name), move.target)
        self.topics.placed_in(move.source, move.target)
        del self.moving[partition]
        log.info("%s (no data yet) now in %s", partition.name, move.target.path)

    def _copy_pass(self, move: Move, stoppable: bool) -> int:
        """Copy what changed in the partition's directory since the last pass; returns the
        bytes copied. A file deleted meanwhile (retention) is left out of the copy."""
        source = move.partition.dir
        copied = 0
        names = set(os.listdir(source))
        for name in sorted(names, key=lambda n: (not n.endswith(".log"), n)):  # data first
            if stoppable and move.cancelled:
                return 0
            if not stoppable and name.endswith(_SKIPPED_SUFFIXES):
                continue
            src = os.path.join(source, name)
            try:
                st = os.stat(src)
            except FileNotFoundError:
                continue
            if not os.path.isfile(src):
                continue
            now = (st.st_ino, st.st_size, st.st_mtime_ns)
            before = move.copied.get(name)
            if before == now:
                continue
            grew = before is not None and before[0] == now[0] and name.endswith(".log") \
                and now[1] >= before[1]
            try:
                copied += _copy_file(src, os.path.join(move.future_dir, name),
                                     before[1] if grew and before else 0, move)
            except FileNotFoundError:
                continue
            move.copied[name] = now
            if stoppable and len(move.copied) == 1:
                _crash_point("copying")
                _hold_at_gate(move)
        for name in set(move.copied) - names:  # gone from the source: gone from the copy
            del move.copied[name]
            try:
                os.unlink(os.path.join(move.future_dir, name))
            except FileNotFoundError:
                pass
        return copied

    def _finish(self, move: Move) -> None:
        """Steps 2 to 4, on the event loop."""
        partition = move.partition
        end = partition.log.log_end_offset if partition.is_open else 0
        partition.close()
        if partition.log_dir.offline:
            raise MoveFailed(str(partition.log_dir.error()))
        self._copy_pass(move, False)
        disk = self.topics.disk
        for name in os.listdir(move.future_dir):
            fd = disk.open(os.path.join(move.future_dir, name), os.O_RDONLY)
            try:
                disk.fsync(fd)
            finally:
                disk.close(fd)
        disk.fsync_dir(move.future_dir)
        disk.fsync_dir(move.target.path)
        move.copied_to = end
        _crash_point("copied")
        # The commit: from here the move is rolled forward, never back.
        try:
            disk.rename(partition.dir, move.deleted_dir())
        except OSError as exc:
            raise MoveFailed(f"renaming {partition.dir} failed: {exc}") from exc
        move.committed = True  # from here a failure keeps the copy: the next start uses it
        try:
            disk.fsync_dir(move.source.path)
        except OSError as exc:
            # Whether the rename is durable is unknown, so the partition may take nothing
            # more until the next start decides (the copy is renamed in if the "-delete" is
            # there, removed if not): it stays with the source, now offline.
            partition.relocate(move.future_dir, move.source)
            move.source.fail(exc)
            raise MoveFailed(f"fsync of {move.source.path} failed: {exc}") from exc
        _crash_point("committed")
        live = os.path.join(move.target.path, move.name)
        try:
            disk.rename(move.future_dir, live)
            disk.fsync_dir(move.target.path)
        except OSError as exc:
            # committed: the next start finishes it; until then the partition is offline
            partition.relocate(move.future_dir, move.target)
            move.target.fail(exc)
            raise MoveFailed(f"renaming the copy into {live} failed: {exc}") from exc
        _crash_point("renamed")
        partition.relocate(live, move.target)
        self.topics.placed_in(move.source, move.target)
        del self.moving[partition]
        threading.Thread(target=shutil.rmtree, args=(move.deleted_dir(), True),
                         name=f"moved-{move.name}", daemon=True).start()
        log.info("moved %s from %s to %s", partition.name, move.source.path, move.target.path)

    # --- what DescribeLogDirs shows ---------------------------------------------------------

    def futures_in(self, state: LogDir) -> list[tuple[Partition, int, int]]:
        """(partition, bytes copied, offset lag) of each copy being made into ``state``."""
        result = []
        for partition, move in self.moving.items():
            if move.target is state:
                size = directory_bytes(move.future_dir)
                if move.copied_to >= 0 and partition.is_open:
                    lag = max(0, partition.log.log_end_offset - move.copied_to)
                else:
                    lag = partition.log.log_end_offset if partition.is_open else 0
                result.append((partition, size, lag))
        return result

    def stop(self) -> None:
        """At shutdown: every move stops at its next chunk; the next start removes copies
        that were not committed."""
        for partition in list(self.moving):
            self.cancel(partition)


def _copy_file(src: str, dst: str, start: int, move: Move) -> int:
    """Copy ``src`` into ``dst`` from byte ``start`` on (0: the whole file); returns the
    bytes copied."""
    copied = 0
    with open(src, "rb") as reader, open(dst, "r+b" if start else "wb") as writer:
        reader.seek(start)
        writer.seek(start)
        writer.truncate()
        while not move.cancelled and (chunk := reader.read(_COPY_CHUNK)):
            writer.write(chunk)
            copied += len(chunk)
    return copied
