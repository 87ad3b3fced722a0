"""Which partitions of its internal topic a coordinator serves, and at which coordinator
epoch: every ownership decision of the group and the transaction coordinators, in one place.

In a cluster the coordinator of a group (a transactional id) is the leader of its partition
of ``__consumer_offsets`` (``__transaction_state``), as in Kafka: the replica manager says
when this broker becomes leader of such a partition at a leader epoch (``elect``) and when it
stops leading it (``resign``); the coordinator loads the partition's records, serves its keys
once they are read, and drops them when it resigns. The leader epoch is Kafka's
``coordinatorEpoch``: it goes with the transaction markers this coordinator writes, so a
deposed coordinator's markers are fenced. On one broker every partition is elected at epoch 0
when the coordinator starts, and none ever resigns.

The partition's facts: its status (not owned, loading with a load ticket, owned, failed: its
last load raised), its epoch, the failed attempts of its current streak, whether a retry is
due (the failure was an I/O fault), and ``seen``, the highest leader epoch any event carried
(-1: none since the partition was dropped). A load runs outside this table (it awaits while
it reads the log); the ticket it was started with says, when it is done, whether its result
may be installed.

    | # | event            | when                           | next                  | action  |
    |---|------------------|--------------------------------|-----------------------|---------|
    |O1 | elect(e)         | e <= seen (stale or repeated)  | unchanged             | IGNORE  |
    |O2 | elect(e)         | not owned or failed, e > seen  | loading(e, new ticket)| LOAD    |
    |O3 | elect(e)         | loading(e0, t), e > seen       | loading(e, t)         | NONE    |
    |O4 | elect(e)         | owned(e0), e > seen            | owned(e)              | NONE    |
    |O5 | resign(e)        | e < seen (stale)               | unchanged             | IGNORE  |
    |O6 | resign(e)        | held (loading, owned, failed), | not owned, seen = e   | UNLOAD  |
    |   |                  | e >= seen                      |                       |         |
    |O7 | resign(e)        | not owned, e >= seen           | not owned, seen = e   | NONE    |
    |O8 | resign(gone)     | held                           | not owned, seen = -1  | UNLOAD  |
    |O9 | resign(gone)     | not owned                      | not owned, seen = -1  | NONE    |
    |O10| loaded(t)        | loading with ticket t          | owned(its epoch),     | INSTALL |
    |   |                  |                                | attempts = 0          |         |
    |O11| loaded(t)        | otherwise (an unload or a newer| unchanged             | DISCARD |
    |   |                  | load came first)               |                       |         |
    |O12| failed(t, io)    | loading with ticket t (the load| failed, attempts + 1, | RETRY   |
    |   |                  | raised OSError or MemoryError) | retry due             |         |
    |O13| failed(t, io)    | owned with ticket t (its       | failed, attempts + 1, | UNLOAD, |
    |   |                  | install raised either of them) | retry due             | RETRY   |
    |O14| failed(t, any)   | not loading or owned with t    | unchanged             | DISCARD |
    |O15| retry(t)         | failed with ticket t, retry due| loading(its epoch,    | LOAD    |
    |   |                  |                                | new ticket)           |         |
    |O16| retry(t)         | otherwise (resigned, elected   | unchanged             | IGNORE  |
    |   |                  | again: O2 loaded it, no retry) |                       |         |
    |O17| failed(t, other) | loading or owned with ticket t,| failed, attempts + 1, | UNLOAD  |
    |   |                  | neither (it raises the         | no retry due          | if owned|
    |   |                  | same at every read)            |                       |         |

O2 from failed carries the streak's attempts over (a retry after it waits as long as the
next one would have). O12-O16, a load that raises OSError (the log unreadable now: a segment
the disk cannot give, no file descriptor left) or MemoryError (the broker short of memory for
a moment: ``retriable``). Kafka's coordinator runtime moves the
partition to FAILED, answers NOT_COORDINATOR and loads it again only when the partition is
elected again at a higher epoch (O2 here too); a client then finds the same leader and is
refused again, for as long as that leader leads, and a single broker is never elected
again. Here the load is also retried (RETRY: ``retry(t)`` after ``retry_delay(attempts)``,
0.5 s doubling up to 30 s, each failure logged) for as long as this broker holds the
partition, so a passing fault (the disk back, descriptors freed) ends without a restart or
a leader change, and one that lasts is said in the broker's log at every attempt, never
held silently. O17: any other exception (a bug, a
record it cannot decode) would be raised again by every read of the same log, each reading
the whole partition: the partition stays failed, as Kafka's, until it is elected again, its
traceback logged once.

O3 and O4 follow Kafka's coordinator runtime: leading again at a higher epoch without having
stopped in between keeps what is loaded (the log is the same log) and takes the new epoch.
O6 at e == seen: losing the lead is believed over keeping it, never the other way round. A
resign without an epoch (O8, O9: the partition's replica is deleted) starts the partition
over, so a recreated topic's epochs, which begin again at 0, are not taken for stale ones.

What a request for a key of the partition is answered (``error``; "named": the epoch at
which the cluster's metadata names this broker the partition's leader, None when it does not):

    | # | status                           | answer                        |
    |---|----------------------------------|-------------------------------|
    |A1 | not owned, named at e > seen     | COORDINATOR_LOAD_IN_PROGRESS  |
    |A2 | not owned otherwise              | NOT_COORDINATOR               |
    |A3 | loading                          | COORDINATOR_LOAD_IN_PROGRESS  |
    |A4 | owned                            | served                        |
    |A5 | failed (retried or not)          | NOT_COORDINATOR               |

A5 is Kafka's answer for a FAILED partition: retriable everywhere (a client finds the
coordinator again and retries), where LOAD_IN_PROGRESS would promise a load under way.

A1: FindCoordinator answers from the metadata cache, which may show a new leader a moment
before that leader's replica manager makes it one (two watches of the same znodes); a client
sent here meanwhile is told to wait and retry here, not to look elsewhere, as Kafka's
leader is told first.

The table is held by tests/coordinator/test_ownership_model.py against a model that reads the
same answers off the events' history.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

log = logging.getLogger(__name__)

GONE = None  # resign's epoch when the partition's replica is deleted
RETRY_BACKOFF_S = 0.5  # before the first retry of a failed load (O12)
RETRY_BACKOFF_MAX_S = 30.0


class Status(enum.Enum):
    NOT_OWNED = "not owned"
    LOADING = "loading"
    OWNED = "owned"
    FAILED = "failed"


class Action(enum.Enum):
    IGNORE = "ignore"  # stale or repeated: nothing changes
    NONE = "none"  # the state changed; nothing to carry out
    LOAD = "load"  # read the partition's records, then report loaded(ticket)
    UNLOAD = "unload"  # drop the partition's keys (fail waiters, cancel timers)
    INSTALL = "install"  # the load's result becomes what the coordinator serves
    DISCARD = "discard"  # the load's result is thrown away
    RETRY = "retry"  # the load failed: report retry(ticket) after retry_delay(attempts)


@dataclass(frozen=True)
class Held:
    status: Status = Status.NOT_OWNED
    epoch: int = -1  # the coordinator epoch while loading or owned
    ticket: int = 0  # the load under way (loading), installed (owned) or failed (failed)
    seen: int = -1
    attempts: int = 0  # loads of this streak that failed (O12, O13, O17)
    retry_due: bool = False  # failed by an I/O fault: a retry(ticket) is coming (O12, O13)


_NOBODY = Held()


def elect(held: Held, epoch: int, new_ticket: int) -> tuple[Held, Action]:
    if epoch <= held.seen:
        return held, Action.IGNORE  # O1
    if held.status in (Status.NOT_OWNED, Status.FAILED):
        return Held(Status.LOADING, epoch, new_ticket, epoch, held.attempts), Action.LOAD  # O2
    return Held(held.status, epoch, held.ticket, epoch, held.attempts), Action.NONE  # O3, O4


def resign(held: Held, epoch: int | None) -> tuple[Held, Action]:
    if epoch is GONE:
        return _NOBODY, Action.NONE if held.status is Status.NOT_OWNED else Action.UNLOAD
    if epoch < held.seen:
        return held, Action.IGNORE  # O5
    action = Action.NONE if held.status is Status.NOT_OWNED else Action.UNLOAD  # O7, O6
    return Held(seen=epoch), action


def loaded(held: Held, ticket: int) -> tuple[Held, Action]:
    if held.status is Status.LOADING and held.ticket == ticket:
        return Held(Status.OWNED, held.epoch, ticket, held.seen), Action.INSTALL  # O10
    return held, Action.DISCARD  # O11


def failed(held: Held, ticket: int, io: bool) -> tuple[Held, tuple[Action, ...]]:
    if held.status not in (Status.LOADING, Status.OWNED) or held.ticket != ticket:
        return held, (Action.DISCARD,)  # O14
    after = Held(Status.FAILED, held.epoch, ticket, held.seen, held.attempts + 1, io)
    unload = (Action.UNLOAD,) if held.status is Status.OWNED else ()
    if not io:
        return after, unload  # O17
    return after, (*unload, Action.RETRY)  # O12, O13


def retry(held: Held, ticket: int, new_ticket: int) -> tuple[Held, Action]:
    if held.status is Status.FAILED and held.ticket == ticket and held.retry_due:
        return Held(Status.LOADING, held.epoch, new_ticket, held.seen,
                    held.attempts), Action.LOAD  # O15
    return held, Action.IGNORE  # O16


def retry_delay(attempts: int) -> float:
    """Seconds before the retry of a load that failed ``attempts`` times in a row."""
    return min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_S * 2 ** min(attempts - 1, 16))


def error(held: Held, named: int | None = None) -> ErrorCode | None:
    if held.status is Status.NOT_OWNED:
        if named is not None and named > held.seen:
            return ErrorCode.coordinator_load_in_progress  # A1
        return ErrorCode.not_coordinator
    if held.status is Status.LOADING:
        return ErrorCode.coordinator_load_in_progress  # A3
    if held.status is Status.FAILED:
        return ErrorCode.not_coordinator  # A5
    return None


@dataclass(frozen=True)
class Load:
    """A load to carry out: read ``partition`` and report ``loaded(partition, ticket)``."""

    partition: int
    ticket: int
    epoch: int


class Ownership:
    """The table's state for every partition of one internal topic."""

    def __init__(self, named=None) -> None:
        self._held: dict[int, Held] = {}
        self._tickets = itertools.count(1)
        # partition -> the leader epoch the cluster's metadata names this broker at, or
        # None (A1); one broker: nobody else is ever named
        self.named = named or (lambda partition: None)

    def held(self, partition: int) -> Held:
        return self._held.get(partition, _NOBODY)

    def _set(self, partition: int, held: Held) -> None:
        if held == _NOBODY:
            self._held.pop(partition, None)
        else:
            self._held[partition] = held

    def elect(self, partition: int, epoch: int) -> Load | None:
        """This broker leads ``partition`` at ``epoch``: the load to start, if any."""
        held, action = elect(self.held(partition), epoch, next(self._tickets))
        self._set(partition, held)
        return Load(partition, held.ticket, epoch) if action is Action.LOAD else None

    def resign(self, partition: int, epoch: int | None) -> bool:
        """This broker stopped leading ``partition`` (at ``epoch``; GONE: deleted): True
        when what it holds of the partition must be dropped."""
        held, action = resign(self.held(partition), epoch)
        self._set(partition, held)
        return action is Action.UNLOAD

    def loaded(self, load: Load) -> bool:
        """The load is read: True when its result is to be installed (now owned)."""
        held, action = loaded(self.held(load.partition), load.ticket)
        self._set(load.partition, held)
        return action is Action.INSTALL

    def failed(self, load: Load, io: bool) -> tuple[bool, bool, float | None]:
        """The load raised, a passing fault (``io``: ``retriable``) or not (O12-O14,
        O17): (whether it was this partition's load, whether what it installed must be
        dropped, seconds before ``retry``: None, not to be retried)."""
        held, actions = failed(self.held(load.partition), load.ticket, io)
        self._set(load.partition, held)
        return (Action.DISCARD not in actions, Action.UNLOAD in actions,
                retry_delay(held.attempts) if Action.RETRY in actions else None)

    def retry(self, load: Load) -> Load | None:
        """The retry of the failed ``load`` is due (O15, O16): the load to start, if any."""
        held, action = retry(self.held(load.partition), load.ticket, next(self._tickets))
        self._set(load.partition, held)
        return Load(load.partition, held.ticket, held.epoch) if action is Action.LOAD \
            else None

    def error(self, partition: int) -> ErrorCode | None:
        held = self.held(partition)
        return error(held, self.named(partition) if held.status is Status.NOT_OWNED else None)

    def incomplete(self, partitions: int) -> ErrorCode | None:
        """What a listing of every key this coordinator serves (ListTransactions,
        ListGroups) is answered while it cannot list them all, or None: the error of the
        first of the topic's ``partitions`` that is loading, failed, or named this broker's
        by the cluster's metadata but not held (A1; a resign seen before the metadata moved
        on). Kafka answers such a listing COORDINATOR_LOAD_IN_PROGRESS while a partition
        loads: a client that took what is listed meanwhile for all would miss the keys
        still being read (the Spark sink's recovery, an open transaction never ended)."""
        for partition in range(partitions):
            held = self.held(partition)
            if held.status is Status.OWNED:
                continue
            named = self.named(partition) if held.status is Status.NOT_OWNED else None
            if held.status is Status.NOT_OWNED and named is None:
                continue
            return error(held, named) or ErrorCode.coordinator_load_in_progress
        return None

    def status(self, partition: int) -> Status:
        return self.held(partition).status

    def epoch(self, partition: int) -> int:
        """The coordinator epoch of a partition held (-1: not owned)."""
        held = self.held(partition)
        return -1 if held.status is Status.NOT_OWNED else held.epoch

    def ticket(self, partition: int) -> int:
        """The ticket of the partition's ownership (0: not owned): the same from its load
        on, across higher epochs (O3, O4), until it resigns, a load is retried (O15) or a
        failed partition is elected again (O2)."""
        held = self.held(partition)
        return 0 if held.status is Status.NOT_OWNED else held.ticket

    def owns(self, partition: int, ticket: int) -> bool:
        """Still owned since the load of ``ticket`` (a step started then may go on)."""
        held = self.held(partition)
        return held.status is Status.OWNED and held.ticket == ticket


async def load_retrying(ownership: Ownership, load: Load,
                        read: Callable[[Load], Awaitable[None]], drop: Callable[[int], None],
                        background: Callable[[Awaitable[None]], None], topic: str) -> None:
    """Carry ``load`` out with ``read``; when it raises, O12-O14, O17: ``drop`` what it
    installed, log, and, for a passing fault (``retriable``), ``retry`` it in the
    ``background`` after the table's delay, as long as the partition is still held by this
    load's streak. Never raises: a ``drop`` or ``background`` that raises (a bug) is logged
    and the partition stays failed without a retry, as O17."""
    try:
        await read(load)
    except Exception as exc:
        taken, unload, delay = ownership.failed(load, retriable(exc))
        try:
            if unload:
                drop(load.partition)
            if taken and delay is not None:
                _retry_later(ownership, load, read, drop, background, topic, exc, delay)
        except Exception:
            log.exception("%s-%d: cleaning up after a failed load raised: it answers "
                          "NOT_COORDINATOR until the partition is elected again", topic,
                          load.partition)
            return
        if not taken:
            log.warning("%s-%d: a load no longer wanted failed: %s", topic, load.partition,
                        exc)
            return
        if delay is None:
            log.exception("%s-%d: loading failed, not an I/O fault: it answers "
                          "NOT_COORDINATOR until the partition is elected again (a restart "
                          "of a single broker)", topic, load.partition)
            return


def _retry_later(ownership: Ownership, load: Load, read: Callable[[Load], Awaitable[None]],
                 drop: Callable[[int], None],
                 background: Callable[[Awaitable[None]], None], topic: str,
                 exc: Exception, delay: float) -> None:
    attempts = ownership.held(load.partition).attempts
    log.error("%s-%d: loading failed (attempt %d): %s; it answers NOT_COORDINATOR "
              "until a load succeeds, retried in %.1f s", topic, load.partition,
              attempts, exc, delay, exc_info=attempts == 1)

    async def later() -> None:
        await asyncio.sleep(delay)
        again = ownership.retry(load)
        if again is not None:
            log.info("%s-%d: loading again (attempt %d)", topic, load.partition,
                     attempts + 1)
            await load_retrying(ownership, again, read, drop, background, topic)
    work = later()
    try:
        background(work)
    except BaseException:
        work.close()  # never started: no "never awaited" warning
        raise


def retriable(exc: BaseException) -> bool:
    """O12/O13's "io": a fault that may pass (the disk, descriptors, memory), so the load
    is retried; anything else would raise again at every read (O17)."""
    return isinstance(exc, (OSError, MemoryError))


async def load_each(ownership: Ownership, loads: list[Load | None],
                    load_logged: Callable[[Load], Awaitable[None]], topic: str) -> None:
    """Every load carried out in turn, each on its own guard: one raising past
    ``load_retrying``'s (a bug) is logged and its partition failed (O17), and the loads
    after it still run (before, they stayed LOAD_IN_PROGRESS for good)."""
    for load in loads:
        if load is None:
            continue
        try:
            await load_logged(load)
        except Exception:
            ownership.failed(load, False)
            log.exception("%s-%d: loading raised: it answers NOT_COORDINATOR until the "
                          "partition is elected again", topic, load.partition)
