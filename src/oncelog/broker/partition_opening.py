"""A partition's log opened in a worker thread, never on the event loop: the part of
``Partition`` (broker/partition.py) that starts an opening, shares it between callers,
settles it on the loop (published, or refused when the partition was closed, deleted or
moved meanwhile) and cuts a follower's log off the loop; the machinery of the worker itself
(its own descriptor bound, one opening per directory, handing the result to the loop) is
broker/log_opening.py. ``open_all`` and ``opened_first`` are what the request handlers call
before a use that would open logs.

The building of the log and producer state (``Partition._build``) and its installation on
the loop (``Partition._install``) stay with the partition: they are the same whether the log
is opened here or synchronously (tools, tests).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from ..log.disk import LogDirFailure
from ..log.log import Log
from ..log.open_files import OpenFiles
from ..metadata.store import MetadataUnavailable
from ..producer_state.manager import ProducerStateManager
from . import log_opening
from .log_limits import RateLimitedLog

log = logging.getLogger(__name__)
# An opening failing again and again (a bad segment file: each retry of a client's) is one
# line per retry without a bound.
_failed = RateLimitedLog(log)
on_loop = RateLimitedLog(log)  # a log opened on the event loop (Partition._open)
# After a failed opening the next try waits this long, doubled at each failure up to the
# most: a log that cannot be opened (a bad segment file) is not recovered back to back by
# every use and every client's retry.
_RETRY_FIRST_S = 0.5
_RETRY_MOST_S = 30.0
_now = time.monotonic  # (a test moves the clock)

if TYPE_CHECKING:
    from ..log.snapshots import SnapshotFiles
    from .log_dirs import LogDir


class Built(NamedTuple):
    """A log opened, not yet the partition's (Partition._build)."""
    plog: Log
    state: ProducerStateManager
    start: int  # where producer state was replayed from
    replayed: int

    def abandon(self) -> None:
        self.plog.abandon()


class OpensOffLoop:
    """Partition's openings in worker threads (its attributes are Partition's)."""

    _log: Log | None
    _deleted: bool
    _snapshots: SnapshotFiles
    _epochs: Any
    _next_flush: asyncio.Future[None] | None
    replication: Any
    dir: str
    log_dir: LogDir
    flushed_offset: int

    def _init_opening(self) -> None:
        # The one opening every caller waits on; bumped by whatever makes an opening under
        # way stale (close, abandon, delete, relocate); what the last opening failed with,
        # until the next; the lock a worker's mkdir and a deletion's rename take
        # (set_aside).
        self._opening: asyncio.Future[None] | None = None
        self._generation = 0
        self._open_error: BaseException | None = None
        self._retry_s = 0.0  # the backoff after the last failure (0: the last one worked)
        self._retry_at = 0.0  # no next try before (monotonic)
        self._dir_lock = threading.Lock()
        self._set_aside = False
        self._shut = False  # the broker's clean shutdown closed it: never opened again

    async def open_async(self) -> None:
        """Open (create, on the first write; recover, after a restart) the log in a worker
        thread (broker/log_opening.py). Every caller waits on one opening; a caller
        cancelled (its request timed out) leaves it running for the others. Raises what
        opening raised (OSError, LogDirOffline; FileNotFoundError for a partition deleted
        meanwhile); nothing is left half-open then."""
        if self._log is not None:
            return
        await asyncio.shield(self.start_opening())

    def start_opening(self, *, now: bool = False) -> asyncio.Future[None]:
        """The opening ``open_async`` waits for, started if none is under way (a caller
        starts several partitions' openings before it waits for the first); done at once
        when the log is open. A caller may have found it not open before an await (produce
        validates its batches first): opened again, a second Log over the same files would
        be installed over the one appended to meanwhile (its producer state and segment
        sizes behind the files: OUT_OF_ORDER_SEQUENCE_NUMBER, and Fetch reading from inside
        a batch). After a failed opening, refused (EAGAIN) until its backoff is over, unless
        ``now`` (a new role: not a retry)."""
        if self._log is not None:
            opened = asyncio.get_running_loop().create_future()
            opened.set_result(None)
            return opened
        if self._deleted:
            raise FileNotFoundError(errno.ENOENT, f"partition {self.name} was deleted")
        if self.log_dir.offline:
            raise self.log_dir.error()
        opening = self._opening
        if opening is None:
            if not now:
                self._refuse_if_backing_off()
            directory, snapshots = self.dir, self._snapshots
            opening = self._begin_opening(
                lambda files: self._build(files, directory, snapshots, self._make_dir))
        return opening

    def _begin_opening(self, build: Callable[[OpenFiles], Built]) -> asyncio.Future[None]:
        self._refuse_if_shut()
        opening = self._opening = asyncio.get_running_loop().create_future()
        self._open_error = None
        log_opening.open_off_loop(self.dir, build,
                                  functools.partial(self._settle, opening, self._generation,
                                                    self.log_dir),
                                  Built.abandon)
        return opening

    def shut(self) -> None:
        """The broker's clean shutdown (TopicManager.close): closed, and never opened again.
        A request still running, its await over (WriteTxnMarkers' openings, a Fetch's
        long poll), is refused rather than opening the closed log and writing to it (its
        clean-shutdown marker then gone: a full recovery at the next start, and a write
        acknowledged by a broker shutting down)."""
        self._shut = True
        if self._log is not None or self.opening:  # an opening under way is refused
            self.close()

    def _backing_off(self) -> bool:
        return self._open_error is not None and _now() < self._retry_at

    def _refuse_if_backing_off(self) -> None:
        if self._backing_off():
            raise OSError(errno.EAGAIN, f"{self.name}: opening its log failed "
                          f"({self._open_error}); tried again in "
                          f"{self._retry_at - _now():.1f}s") from self._open_error

    def _refuse_if_shut(self) -> None:
        if self._shut:
            raise OSError(errno.ESHUTDOWN, f"{self.name}: the broker is shutting down")

    @property
    def needs_open(self) -> bool:
        """Whether a read would open files: a directory (written before, here or before a
        restart) but no log yet, or an opening under way (another request's: a read now
        would be refused, OpenInProgress; a first write's worker may make the directory
        between this answer and the read). (Never written: it reads as empty, nothing to
        open; deleted or offline: its use refuses at once.)"""
        return self._log is None and not self._deleted and not self.log_dir.offline and \
            (self._opening is not None or self.disk.isdir(self.dir))

    @property
    def deleted(self) -> bool:
        return self._deleted

    @property
    def opening(self) -> bool:
        """A worker is opening the log (``open_async``), or closing one it opened that was
        refused."""
        return self._opening is not None or log_opening.busy(self.dir)

    def _settle(self, opening: asyncio.Future[None], generation: int, log_dir: LogDir,
                error: BaseException | None, built: Built | None) -> bool:
        """On the loop, once the worker is done: install the log when the partition is
        still as it was when the opening started (True); else refuse it (False: its files
        are closed in a worker) and fail the waiters."""
        current = generation == self._generation and self._opening is opening
        if current:
            self._opening = None
        if isinstance(error, MetadataUnavailable):
            # The metadata store away (from the producer id bound): an OSError as any
            # failed opening, answered retriable by every use, and kept (_open_error) so
            # that no use repeats the recovery, and its store call, on the loop.
            cause = error
            error = OSError(errno.EAGAIN, f"{self.name}: opening its log failed: {cause}")
            error.__cause__ = cause
        elif error is not None and not isinstance(error, (OSError, LogDirFailure)):
            # A bug: said with its traceback, and kept as it is below (a use after it is
            # refused with it, not retried quietly forever as a retriable failure).
            log.error("%s: opening its log failed", self.name, exc_info=error)
        if isinstance(error, LogDirFailure) and not current and \
                (self._deleted or self._set_aside):
            # Its directory was renamed away under it (a deletion): no failure of the disk.
            log.info("%s: an opening outrun by the partition's deletion failed: %s",
                     self.name, error)
            error = None
        elif isinstance(error, LogDirFailure):  # declared here: its callbacks touch the loop
            error = log_dir.fail(error)  # the directory it opened in (not one moved to)
        elif error is None and current and (self._deleted or self.log_dir.offline):
            current = False
        try:
            if error is None and current:
                assert built is not None
                try:
                    self._install(built)
                except Exception as exc:  # a bug: the waiters are answered all the same
                    log.exception("%s: installing its log failed", self.name)
                    error = exc
                    # Closed here: its segments may be in the loop's bound already, which a
                    # worker must never touch (True: nothing left for the worker to close).
                    built.abandon()
                    return True
                self._retry_s = 0.0
                if not opening.done():
                    opening.set_result(None)
                return True
            if error is not None and current:
                self._open_error = error
                self._retry_s = min(_RETRY_MOST_S, max(_RETRY_FIRST_S, self._retry_s * 2))
                self._retry_at = _now() + self._retry_s
            if isinstance(error, OSError) and current:
                _failed.log(logging.WARNING, "failed opening", "%s: opening its log failed: %s",
                            self.name, error)
        finally:  # whatever happened, the waiters are answered: never left waiting
            failed = error if isinstance(error, OSError) else self._gone()
            if not opening.done():
                opening.set_exception(error if error is not None else failed)
                opening.exception()  # retrieved: its callers may all have gone
            waiting = self._next_flush  # a flush asked for while a cut had the log
            if current and self._log is None and waiting is not None:
                self._next_flush = None
                if not waiting.done():
                    waiting.set_exception(failed)
                    waiting.exception()
        return False

    def _gone(self) -> OSError:
        """What waiters of an opening given up are told."""
        if self._deleted:
            return FileNotFoundError(errno.ENOENT, f"partition {self.name} was deleted")
        if self.log_dir.offline:
            return self.log_dir.error()
        return OSError(errno.EAGAIN, f"partition {self.name} was closed while its log opened")

    def _let_go_of_opening(self) -> None:
        """The partition is closed, abandoned, deleted or moved: an opening under way is
        refused when it lands (``_settle``), and its waiters are answered now."""
        self._generation += 1
        self._open_error = None
        opening, self._opening = self._opening, None
        if opening is not None and not opening.done():
            opening.set_exception(self._gone())
            opening.exception()

    def _make_dir(self, directory: str) -> None:
        """A worker creates the partition's directory only while the partition has not been
        set aside (deleted): never a directory brought back behind a deletion. The lock is
        held for a mkdir here, a rename in ``set_aside``."""
        with self._dir_lock:
            if self._deleted or self._set_aside:
                raise FileNotFoundError(errno.ENOENT, f"partition {self.name} was deleted")
            self.disk.makedirs(directory)

    def set_aside(self, move: Callable[[], None]) -> None:
        """Run ``move`` (the deletion's rename of the directory, or nothing when there is
        none) so that no worker creates the directory after it; raises what ``move`` raised
        (the partition stays as it was)."""
        with self._dir_lock:
            move()
            self._set_aside = True

    def kept(self) -> None:
        """The deletion ``set_aside`` was for did not happen: the directory may be created
        again."""
        with self._dir_lock:
            self._set_aside = False

    def opened_for_a_duty(self) -> bool:
        """For the broker's duties (retention, the cleaner) on the event loop: True when the
        log is not open, its opening then started in a worker (or under way) for a later
        pass to find it open; False when the duty may use the log now (open, or no loop
        runs: a tool opens it in place)."""
        if self._log is not None:
            return False
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self.opening
        if self._backing_off():  # its last opening failed: a pass after the backoff
            return True
        try:
            self.start_opening()
        except OSError:  # deleted, or offline: the duty's own use says so
            return False
        return True

    async def truncate_async(self, offset: int) -> None:
        """``truncate_to`` with its file work (the cut and its fsyncs, the recovery of the
        cut segment, the replay of producer state) in a worker thread: the loop's log is
        closed, the worker cuts the files through a log it opens itself, and the log is
        published again once rebuilt, as an opening is; meanwhile uses wait for it or are
        refused. Raises what the cut or the opening raised; the log is then not open (the
        next use opens it from what is on disk). Cuts nothing when the role it was asked
        for changed during the opening (a leader now, or another epoch: the offset was
        the old leader's answer)."""
        role = self.replication
        epoch = None if role is None else role.leader_epoch
        await self.open_async()
        if self.replication is not role or (role is not None and (
                role.is_leader or role.leader_epoch != epoch)):
            log.info("%s: its role changed while its log opened: no truncation to %d",
                     self.name, offset)
            return
        plog = self._log
        if plog is None or offset >= plog.log_end_offset:
            return
        # The loop's log is closed here, never handed to the worker: code on the loop
        # holding its segments across an await (the cleaner, a coordinator's load) meets a
        # closed segment then, not one in the worker's bound (no lock). The worker cuts
        # the files through a log of its own.
        plog.abandon()
        # The epochs are read again on their first use after, and cut to the log end then
        # (leader_epochs): never cut here once published, after a role given meanwhile
        # wrote its epoch; and cut too when this reopening fails or is refused.
        self._log = self._state = self._epochs = None
        directory, snapshots = self.dir, self._snapshots

        def cut_and_open(worker_files: OpenFiles) -> Built:
            for snap in snapshots.offsets():
                if snap > offset:
                    snapshots.delete(snap)
            cut = Log(directory, self.config, self.disk, worker_files, self._make_dir)
            try:
                cut.truncate_to(offset)
            finally:
                cut.abandon()
            return self._build(worker_files, directory, snapshots, self._make_dir)

        await asyncio.shield(self._begin_opening(cut_and_open))
        self._wake_waiters()


async def open_all(partitions: Iterable[OpensOffLoop | None], writing: bool = False,
                   timeout: float | None = None) -> None:
    """Open in worker threads, side by side, the logs of ``partitions`` a read would open
    (``writing``: every one not open, created if need be), waiting at most ``timeout``
    (the openings go on after it); no await at all when none needs opening. A failure is
    left to the use that follows, which is refused without any file work on the loop
    (``_open``: retriable, the next try started in a worker once its backoff is over) and
    answers it as any: KAFKA_STORAGE_ERROR, or the partition's offline handling."""
    waiting = []
    for p in partitions:
        if p is None or p.is_open or not (writing or p.needs_open):
            continue
        try:
            waiting.append(p.start_opening())
        except OSError:
            continue
    if waiting:
        await asyncio.wait(waiting, timeout=timeout)


def opened_first(partitions: list[OpensOffLoop | None], answer: Callable[[], Any]) -> Any:
    """A handler's ``answer()``: at once when it opens no log, else a coroutine giving it
    once the logs it would open were opened in worker threads (``open_all``). ``answer``
    may itself give a coroutine (a handler that then waits too)."""
    if not any(p is not None and p.needs_open for p in partitions):
        return answer()

    async def opened() -> Any:
        await open_all(partitions)
        answered = answer()
        return await answered if inspect.iscoroutine(answered) else answered

    return opened()
