"""Opening a partition's log in a worker thread, never on the event loop.

Opening a log is file work: creating it (the directory, ``partition.metadata`` and the first
segment, each made durable with an fsync) or recovering it after a restart (reading its
segments, rebuilding indexes, loading producer-state snapshots and replaying the log after
them). Tens of milliseconds to seconds a partition: on the event loop, a producer spreading
over 1,000 fresh partitions froze every other client for 16 s.

The rules an opening here keeps (the review of the first attempt, docs/benchmarks.md):

* The worker opens against an OpenFiles of its own (``OpenFiles(WORKER_OPEN_FILES)``),
  never the process's: that bound has no lock, and a worker evicting a descriptor the loop
  was using let a reused descriptor number write one partition's batch into another's file.
  It closes them all once the log is built; the segments join the process's bound on the
  loop thread (``Log.adopt``, in the owner's ``install``) and open again at their next use.
* Nothing is locked while the worker opens: the owner's ``settle`` runs on the loop once the
  worker is done and either installs the log (publishes it) or refuses it, when the
  partition was closed, deleted or abandoned meanwhile; a refused log's files are then
  closed in a worker (``close``), and it is never published.
* One opening at a time per directory: an opening of a directory whose previous opening
  (maybe refused, its files still being closed) is not over waits for it, so that a topic
  deleted and created again never has two openings in one directory.
* The worker's result is handed to the loop with ``call_soon_threadsafe``; a loop already
  gone (the broker stopping) gets nothing, and the worker closes what it opened itself.

The owner (broker/partition.py) shares one opening between its callers, and keeps a
synchronous opening on the loop from racing one here (``busy``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import logging
from collections.abc import Callable
from typing import Any

from ..log.open_files import OpenFiles

log = logging.getLogger(__name__)

# The descriptors one opening may hold at once (its own LRU: a recovery of many segments
# closes the least recently used of them, as the process's bound does).
WORKER_OPEN_FILES = 8

# Opens run in a pool of their own: a burst of first writes does not queue the group
# commits' fsyncs (the default executor) behind it; a few threads, as openings of one disk
# gain little beyond that (mostly fsyncs, which let go of the GIL).
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="oncelog-open")

# directory -> done once the last opening started there is over (installed, failed, or its
# files closed); the event loop's alone.
_busy: dict[str, asyncio.Future[None]] = {}
_running: set[asyncio.Task] = set()  # held: the loop keeps only weak references to tasks


class OpenInProgress(OSError):
    """A synchronous opening asked for while a worker opens the same directory: the caller
    is answered a retriable error rather than two logs opened over one directory."""

    def __init__(self, directory: str) -> None:
        super().__init__(errno.EAGAIN, f"{directory}: the log is being opened; retry")


def busy(directory: str) -> bool:
    """Whether an opening of ``directory`` is under way (or its refused files are closing)."""
    return directory in _busy


def open_off_loop(directory: str, build: Callable[[OpenFiles], Any],
                  settle: Callable[[BaseException | None, Any], bool],
                  close: Callable[[Any], None]) -> None:
    """Run ``build(files)`` in a worker thread, once any earlier opening of ``directory`` is
    over, then ``settle(error, built)`` on the loop: True when it installed ``built``;
    False, and ``close(built)`` runs in a worker, when it refused it. Call on the loop."""
    loop = asyncio.get_running_loop()
    before = _busy.get(directory)
    over = loop.create_future()
    _busy[directory] = over
    task = loop.create_task(_run(loop, directory, before, over, build, settle, close))
    _running.add(task)
    task.add_done_callback(_running.discard)


async def _run(loop: asyncio.AbstractEventLoop, directory: str,
               before: asyncio.Future[None] | None, over: asyncio.Future[None],
               build: Callable[[OpenFiles], Any],
               settle: Callable[[BaseException | None, Any], bool],
               close: Callable[[Any], None]) -> None:
    try:
        if before is not None:
            await asyncio.shield(before)
        landed: asyncio.Future[tuple[BaseException | None, Any]] = loop.create_future()

        def hand_over(error: BaseException | None, built: Any) -> None:
            if not landed.done():
                landed.set_result((error, built))
            elif built is not None:  # the wait was cancelled (the loop shutting down)
                _POOL.submit(_close_quietly, close, built)

        def job() -> None:
            if landed.done() or loop.is_closed():
                # The loop ended (the broker stopped) while this waited for a worker: no
                # one takes it, and the process's exit would otherwise run every one queued.
                return
            error, built = None, None
            files = OpenFiles(WORKER_OPEN_FILES)
            try:
                built = build(files)
            except BaseException as exc:  # the owner answers it
                error = exc
            # A built log waits for the loop to install it with no descriptor held: while
            # the loop is busy, workers go on finishing others, and their descriptors,
            # counted in no bound, ran a broker with a low RLIMIT_NOFILE out of them (a
            # restart's retention pass opens every partition). Reopened by name on use.
            files.release_all()
            try:
                loop.call_soon_threadsafe(hand_over, error, built)
            except RuntimeError:  # the loop is gone (the broker stopped): nobody takes it
                if built is not None:
                    _close_quietly(close, built)

        _POOL.submit(job)
        error, built = await landed
        installed = False
        try:
            installed = settle(error, built)
        except Exception:  # settle answers its waiters whatever happens; this is a bug
            log.exception("settling the opening of %s failed", directory)
        finally:
            if built is not None and not installed:
                await loop.run_in_executor(_POOL, _close_quietly, close, built)
    finally:
        if _busy.get(directory) is over:
            del _busy[directory]
        over.set_result(None)


def _close_quietly(close: Callable[[Any], None], built: Any) -> None:
    try:
        close(built)
    except Exception:
        log.exception("closing a log opened for a partition closed meanwhile")
