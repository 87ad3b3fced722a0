"""The ownership table of the coordinators (coordinator/ownership.py) against a model that
reads each answer off the history of events, not off a running state (hypothesis stateful).

The model: since the partition was last dropped (resign without an epoch), let M be the
highest epoch any elect or resign carried. The partition is held (loading or owned) iff an
elect carried M and no resign did. Its epoch is M. The load it serves is the one started by
the first elect that came after the last resign that took effect (a resign takes effect when
no earlier event carried a higher epoch), and that carried an epoch above every earlier one;
the partition is owned iff that load's loaded() has arrived since, and a loaded() installs
only then and only once. Stale loads (of an earlier streak) never install.

Failed loads (O12-O16, A5): the load served is the last one started since that elect (by an
elect or a retry). Once it failed it is failed (NOT_COORDINATOR) until a retry of it, or an
elect at a higher epoch, starts the next; a failure is taken once, only of that load, drops
what it installed, and is retried after the delay of the failures in a row of the streak
(since its start or its last install); a retry starts a load only of that failed load.

Mutants of the table this test was run against, each caught: O1 as ``epoch < held.seen``
(a repeated elect after a resign at the same epoch takes the lead back), O3 starting a new
load (the running load no longer installs), O5 as ``epoch <= held.seen`` (a resign at the
epoch just elected is ignored), O6 keeping ``seen`` (a stale elect after it loads again),
O8 keeping ``seen`` (a recreated topic's epoch 0 is ignored), O10 without the ticket check
(a stale load installs after an unload), O4 reloading (a second load while one is held), A1
as ``named >= seen`` or without A1 (the answer to a broker named leader before its election
arrives), O12-O14 without the ticket check (a stale load's failure fails the current one), O15
without it (a stale retry starts a second load), O2 without FAILED (a higher elect after a
failure waits for the retry)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kio.schema.errors import ErrorCode

from oncelog.coordinator.ownership import GONE, Load, Ownership, Status, retry_delay

P = 0
epochs = st.integers(min_value=0, max_value=6)


@dataclass
class Event:
    kind: str  # "elect", "resign", "gone", "loaded", "failed", "retry"
    epoch: int | None = None
    ticket: int = 0


class OwnershipMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.named: int | None = None  # the epoch the metadata names this broker at
        self.sut = Ownership(lambda partition: self.named)
        self.history: list[Event] = []
        self.loads: list[Load] = []  # every load the table started
        self.load_of: dict[int, int] = {}  # ticket -> index in history of its elect
        self.installed: set[int] = set()
        self.failed: set[int] = set()  # tickets whose failure was taken (O12, O13, O17)
        self.broken: set[int] = set()  # of those, failed by no I/O fault: never retried
        self.installs: list[int] = []  # history indexes of the loaded() that installed
        self.failures: list[int] = []  # history indexes of the failures taken

    # --- the model --------------------------------------------------------------------

    def _since_gone(self) -> list[tuple[int, Event]]:
        start = max((i + 1 for i, e in enumerate(self.history) if e.kind == "gone"),
                    default=0)
        return [(i, e) for i, e in enumerate(self.history) if i >= start]

    def _top(self) -> int | None:
        carried = [e.epoch for _, e in self._since_gone() if e.kind in ("elect", "resign")]
        return max(carried) if carried else None

    def _held(self) -> bool:
        top = self._top()
        events = [e for _, e in self._since_gone()]
        return top is not None and \
            any(e.kind == "elect" and e.epoch == top for e in events) and \
            not any(e.kind == "resign" and e.epoch == top for e in events)

    def _streak_start(self) -> int | None:
        """History index of the elect that started the load being served."""
        events = self._since_gone()
        last_resign, highest = None, -1
        for i, e in events:
            if e.kind == "resign" and e.epoch >= highest:
                last_resign = i
            if e.kind in ("elect", "resign"):
                highest = max(highest, e.epoch)
        highest = -1
        for i, e in events:
            if e.kind == "elect" and (last_resign is None or i > last_resign) and \
                    e.epoch > highest:
                return i
            if e.kind in ("elect", "resign"):
                highest = max(highest, e.epoch)
        return None

    def _current_ticket(self) -> int | None:
        """The last load started since the streak's elect (by it, an elect, or a retry)."""
        start = self._streak_start()
        if start is None:
            return None
        return max((t for t, i in self.load_of.items() if i >= start), default=None)

    def _failed(self) -> bool:
        ticket = self._current_ticket()
        return self._held() and ticket is not None and ticket in self.failed

    def _owned(self) -> bool:
        ticket = self._current_ticket()
        if not self._held() or ticket is None or ticket in self.failed:
            return False
        start = self.load_of[ticket]
        return any(e.kind == "loaded" and e.ticket == ticket
                   for e in self.history[start:])

    def _attempts(self) -> int:
        """Failures taken in a row in this streak (since its start or its last install)."""
        since = max([self._streak_start() or 0,
                     *(i for i in self.installs if i >= (self._streak_start() or 0))])
        return sum(1 for i in self.failures if i >= since)

    # --- events -----------------------------------------------------------------------

    @rule(epoch=epochs)
    def elect(self, epoch: int) -> None:
        was_held, was_failed, top = self._held(), self._failed(), self._top()
        load = self.sut.elect(P, epoch)
        self.history.append(Event("elect", epoch))
        if load is not None:
            assert not was_held or was_failed, "a second load while one is held"
            assert load.epoch == epoch
            self.loads.append(load)
            self.load_of[load.ticket] = len(self.history) - 1
        # a load starts at the elect that begins a streak, or a newer one after a failure (O2)
        begins = self._streak_start() == len(self.history) - 1
        assert (load is not None) == (begins or (was_failed and epoch > top))

    @rule(epoch=epochs)
    def resign(self, epoch: int) -> None:
        was = self.sut.status(P)
        unload = self.sut.resign(P, epoch)
        self.history.append(Event("resign", epoch))
        dropped = was is not Status.NOT_OWNED and self.sut.status(P) is Status.NOT_OWNED
        assert unload == dropped

    @rule()
    def gone(self) -> None:
        was = self.sut.status(P)
        assert self.sut.resign(P, GONE) == (was is not Status.NOT_OWNED)
        self.history.append(Event("gone"))

    @rule(data=st.data())
    def finish_a_load(self, data) -> None:
        if not self.loads:
            return
        load = data.draw(st.sampled_from(self.loads))
        expected = self._current_ticket() == load.ticket and self._held() and \
            load.ticket not in self.installed and load.ticket not in self.failed
        install = self.sut.loaded(load)
        self.history.append(Event("loaded", ticket=load.ticket))
        assert install == expected, (load, self.history)
        if install:
            self.installed.add(load.ticket)
            self.installs.append(len(self.history) - 1)

    @rule(data=st.data(), io=st.booleans())
    def fail_a_load(self, data, io: bool) -> None:
        if not self.loads:
            return
        load = data.draw(st.sampled_from(self.loads))
        taken = self._held() and self._current_ticket() == load.ticket and \
            load.ticket not in self.failed
        installed = load.ticket in self.installed
        answer = self.sut.failed(load, io)
        self.history.append(Event("failed", ticket=load.ticket))
        if not taken:
            assert answer == (False, False, None)  # O14
            return
        self.failed.add(load.ticket)
        if not io:
            self.broken.add(load.ticket)
        self.failures.append(len(self.history) - 1)
        assert answer == (True, installed,  # O13, O12, O17
                          retry_delay(self._attempts()) if io else None)

    @rule(data=st.data())
    def retry_a_load(self, data) -> None:
        if not self.loads:
            return
        load = data.draw(st.sampled_from(self.loads))
        due = self._failed() and self._current_ticket() == load.ticket and \
            load.ticket not in self.broken
        again = self.sut.retry(load)
        self.history.append(Event("retry", ticket=load.ticket))
        assert (again is not None) == due  # O15, O16
        if again is not None:
            assert again.epoch == self._top() and again.ticket not in self.load_of
            self.loads.append(again)
            self.load_of[again.ticket] = len(self.history) - 1

    @rule(epoch=st.none() | epochs)
    def metadata_names(self, epoch: int | None) -> None:
        self.named = epoch

    # --- what requests are answered -----------------------------------------------------

    @invariant()
    def answers_follow_the_history(self) -> None:
        if not self._held():
            assert self.sut.status(P) is Status.NOT_OWNED
            # A1: named leader at an epoch no event has reached yet: its election is coming
            top = self._top()
            coming = self.named is not None and (top is None or self.named > top)
            assert self.sut.error(P) == (ErrorCode.coordinator_load_in_progress if coming
                                         else ErrorCode.not_coordinator)
            assert self.sut.epoch(P) == -1 and self.sut.ticket(P) == 0
            return
        assert self.sut.epoch(P) == self._top()
        assert self.sut.ticket(P) == self._current_ticket()
        if self._failed():
            assert self.sut.status(P) is Status.FAILED
            assert self.sut.error(P) == ErrorCode.not_coordinator  # A5
            assert not self.sut.owns(P, self.sut.ticket(P))
        elif self._owned():
            assert self.sut.status(P) is Status.OWNED
            assert self.sut.error(P) is None
            assert self.sut.owns(P, self._current_ticket())
        else:
            assert self.sut.status(P) is Status.LOADING
            assert self.sut.error(P) == ErrorCode.coordinator_load_in_progress
            assert not self.sut.owns(P, self.sut.ticket(P))


OwnershipMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=25,
                                              deadline=None, derandomize=True)
test_ownership_model = OwnershipMachine.TestCase


def test_a_load_of_an_older_epoch_after_a_newer_one_does_not_win() -> None:
    owner = Ownership()
    first = owner.elect(P, 1)
    assert owner.resign(P, 2)  # unloaded while loading
    second = owner.elect(P, 3)
    assert not owner.loaded(first)  # the old load finishes late: thrown away
    assert owner.error(P) == ErrorCode.coordinator_load_in_progress
    assert owner.loaded(second) and owner.error(P) is None and owner.epoch(P) == 3
    assert owner.elect(P, 2) is None and owner.epoch(P) == 3  # a stale elect changes nothing


def test_retry_delay_doubles_from_half_a_second_up_to_30() -> None:
    assert [retry_delay(n) for n in (1, 2, 3, 4, 5, 6, 7, 8, 100)] == \
        [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
