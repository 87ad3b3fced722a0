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

The partition's facts: its status (not owned, loading with a load ticket, owned), its epoch,
and ``seen``, the highest leader epoch any event carried (-1: none since the partition was
dropped). A load runs outside this table (it awaits while it reads the log); the ticket it was
started with says, when it is done, whether its result may be installed.

    | # | event            | when                           | next                  | action  |
    |---|------------------|--------------------------------|-----------------------|---------|
    |O1 | elect(e)         | e <= seen (stale or repeated)  | unchanged             | IGNORE  |
    |O2 | elect(e)         | not owned, e > seen            | loading(e, new ticket)| LOAD    |
    |O3 | elect(e)         | loading(e0, t), e > seen       | loading(e, t)         | NONE    |
    |O4 | elect(e)         | owned(e0), e > seen            | owned(e)              | NONE    |
    |O5 | resign(e)        | e < seen (stale)               | unchanged             | IGNORE  |
    |O6 | resign(e)        | loading or owned, e >= seen    | not owned, seen = e   | UNLOAD  |
    |O7 | resign(e)        | not owned, e >= seen           | not owned, seen = e   | NONE    |
    |O8 | resign(gone)     | loading or owned               | not owned, seen = -1  | UNLOAD  |
    |O9 | resign(gone)     | not owned                      | not owned, seen = -1  | NONE    |
    |O10| loaded(t)        | loading with ticket t          | owned(its epoch)      | INSTALL |
    |O11| loaded(t)        | otherwise (an unload or a newer| unchanged             | DISCARD |
    |   |                  | load came first)               |                       |         |

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

A1: FindCoordinator answers from the metadata cache, which may show a new leader a moment
before that leader's replica manager makes it one (two watches of the same znodes); a client
sent here meanwhile is told to wait and retry here, not to look elsewhere, as Kafka's
leader is told first.

The table is held by tests/coordinator/test_ownership_model.py against a model that reads the
same answers off the events' history.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

GONE = None  # resign's epoch when the partition's replica is deleted


class Status(enum.Enum):
    NOT_OWNED = "not owned"
    LOADING = "loading"
    OWNED = "owned"


class Action(enum.Enum):
    IGNORE = "ignore"  # stale or repeated: nothing changes
    NONE = "none"  # the state changed; nothing to carry out
    LOAD = "load"  # read the partition's records, then report loaded(ticket)
    UNLOAD = "unload"  # drop the partition's keys (fail waiters, cancel timers)
    INSTALL = "install"  # the load's result becomes what the coordinator serves
    DISCARD = "discard"  # the load's result is thrown away


@dataclass(frozen=True)
class Held:
    status: Status = Status.NOT_OWNED
    epoch: int = -1  # the coordinator epoch while loading or owned
    ticket: int = 0  # the load under way (loading), or the one installed (owned)
    seen: int = -1


_NOBODY = Held()


def elect(held: Held, epoch: int, new_ticket: int) -> tuple[Held, Action]:
    if epoch <= held.seen:
        return held, Action.IGNORE  # O1
    if held.status is Status.NOT_OWNED:
        return Held(Status.LOADING, epoch, new_ticket, epoch), Action.LOAD  # O2
    return Held(held.status, epoch, held.ticket, epoch), Action.NONE  # O3, O4


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


def error(held: Held, named: int | None = None) -> ErrorCode | None:
    if held.status is Status.NOT_OWNED:
        if named is not None and named > held.seen:
            return ErrorCode.coordinator_load_in_progress  # A1
        return ErrorCode.not_coordinator
    if held.status is Status.LOADING:
        return ErrorCode.coordinator_load_in_progress
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

    def error(self, partition: int) -> ErrorCode | None:
        held = self.held(partition)
        return error(held, self.named(partition) if held.status is Status.NOT_OWNED else None)

    def status(self, partition: int) -> Status:
        return self.held(partition).status

    def epoch(self, partition: int) -> int:
        """The coordinator epoch of a partition loading or owned (-1: not owned)."""
        held = self.held(partition)
        return -1 if held.status is Status.NOT_OWNED else held.epoch

    def ticket(self, partition: int) -> int:
        """The ticket of the partition's ownership (0: not owned): the same from its load
        on, across higher epochs (O3, O4), until it resigns."""
        held = self.held(partition)
        return 0 if held.status is Status.NOT_OWNED else held.ticket

    def owns(self, partition: int, ticket: int) -> bool:
        """Still owned since the load of ``ticket`` (a step started then may go on)."""
        held = self.held(partition)
        return held.status is Status.OWNED and held.ticket == ticket
