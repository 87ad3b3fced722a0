"""Model test of the transaction coordinator's marker rounds (txn_rules.py rows M1-M3,
``after_markers``): a decided transaction's markers go to its partitions round after round;
a round where a partition refused its marker as fenced (INVALID_PRODUCER_EPOCH,
TRANSACTION_COORDINATOR_FENCED) stops them for good, the id left pending (Kafka's
TransactionMarkerRequestCompletionHandler); partitions that took it or whose topic is gone are
done; the others go again, each round with the coordinator epoch the coordinator holds then,
and only while it is still the id's coordinator at that epoch (``current``). A coordinator
deposed (resign) sends nothing more; elected again it loads the Prepare* record and sends
every marker again (L1). A round of an ownership that ended may be answered only after the
partition is led here again (``stale``): whatever it says, it changes nothing, the new lead's
round alone decides (each step goes on only under the ownership it began in)."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kio.schema.errors import ErrorCode as E
from support.group_coordinator_helpers import MemoryOffsetsLog

from oncelog.coordinator.transaction.transaction_coordinator import (
    TransactionCoordinator,
    TxnConfig,
)
from oncelog.coordinator.transaction.txn_records import TxnState as S

ID = "tx"
PARTS = [("t", 0), ("t", 1), ("u", 0)]
ANSWERS = [E.none, E.unknown_topic_or_partition, E.not_leader_or_follower,
           E.network_exception, E.request_timed_out, E.invalid_producer_epoch,
           E.transaction_coordinator_fenced]
FENCED = (E.invalid_producer_epoch, E.transaction_coordinator_fenced)
DONE = (E.none, E.unknown_topic_or_partition)


class Round:
    def __init__(self, coordinator_epoch: int, partitions: list, current) -> None:
        self.coordinator_epoch = coordinator_epoch
        self.partitions = partitions
        self.current = current
        self.answer: asyncio.Future = asyncio.get_running_loop().create_future()


class MarkerRounds(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.log = MemoryOffsetsLog()
        self.ids = itertools.count(1000)
        self.rounds: list[Round] = []
        self.stale: list[Round] = []  # out when their ownership ended, not answered yet
        self.c = self._start()
        self.epoch = 0  # the coordinator epoch (the partition's leader epoch)
        self._on_loop(self.c.elect, 0, self.epoch)
        self.owned = True
        # the model: the transaction being completed, the partitions its next round names
        self.expected: list | None = None  # None: no round expected
        self.state = S.EMPTY
        self.stopped = False  # M2: the id left pending, nothing sent any more
        self.pid = -1
        self.producer_epoch = -1

    def _start(self) -> TransactionCoordinator:
        async def write_markers(pid, epoch, commit, coordinator_epoch, partitions, version,
                                current):
            sent = Round(coordinator_epoch, sorted(partitions), current)
            self.rounds.append(sent)
            return dict(zip(sent.partitions, await sent.answer, strict=True))

        c = TransactionCoordinator(self.log, TxnConfig(num_partitions=1),
                                   lambda: next(self.ids), lambda t, p: True, write_markers,
                                   owns_all=False)
        c.retry_s = 0
        return c

    def _spin(self) -> None:
        for _ in range(20):
            self.loop.run_until_complete(asyncio.sleep(0))

    def _on_loop(self, call, *args) -> None:
        """``call`` made on the loop (the coordinator's background loads start there)."""
        async def made() -> None:
            call(*args)
        self.loop.run_until_complete(made())
        self._spin()

    def _run(self, work):
        return self.loop.run_until_complete(asyncio.wait_for(work, 5))

    def teardown(self) -> None:
        self.c.close()
        self._spin()
        self.loop.close()

    @rule()
    def elect(self) -> None:
        """Led at a higher leader epoch: loaded (O2) when not owned, else the epoch moves
        on under what is loaded (O4)."""
        self.epoch += 1
        self._on_loop(self.c.elect, 0, self.epoch)
        if not self.owned and self.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            self.expected = self.partitions  # L1: every marker again
            self.stopped = False
        self.owned = True

    @precondition(lambda self: self.owned)
    @rule(answered=st.booleans())
    def resign(self, answered) -> None:
        """What it had sent is answered now (nothing follows), or left out, to be answered
        at any later time (``answer_stale``)."""
        self.epoch += 1
        self._on_loop(self.c.resign, 0, self.epoch)
        self.owned = False
        self.expected = None
        for sent in self._waiting():
            assert not sent.current()
            if answered:
                sent.answer.set_result([E.network_exception] * len(sent.partitions))
            else:
                self.stale.append(sent)
        self._spin()

    @precondition(lambda self: any(not r.answer.done() for r in self.stale))
    @rule(data=st.data())
    def answer_stale(self, data) -> None:
        """A round of an ended ownership comes back, whatever it says: nothing changes."""
        sent = next(r for r in self.stale if not r.answer.done())
        sent.answer.set_result([data.draw(st.sampled_from(ANSWERS)) for _ in sent.partitions])
        self._spin()

    def _waiting(self) -> list[Round]:
        return [r for r in self.rounds if not r.answer.done() and r not in self.stale]

    @precondition(lambda self: self.owned and self.c.ownership.error(0) is None
                  and self.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT))
    @rule(parts=st.lists(st.sampled_from(PARTS), min_size=1, max_size=3, unique=True),
          commit=st.booleans())
    def transaction(self, parts, commit) -> None:
        error, self.pid, self.producer_epoch = self._run(
            self.c.init_producer_id(ID, 60_000, self.pid, self.producer_epoch))
        assert error is E.none
        assert self._run(self.c.add_partitions(ID, self.pid, self.producer_epoch, parts)) \
            == dict.fromkeys(parts, E.none)
        assert self._run(self.c.end_txn(ID, self.pid, self.producer_epoch, commit,
                                        False))[0] is E.none
        self._spin()
        self.partitions = sorted(parts)
        self.state = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        self.expected = self.partitions

    @precondition(lambda self: self._waiting())
    @rule(data=st.data())
    def answer(self, data) -> None:
        sent = self._waiting()[0]
        errors = [data.draw(st.sampled_from(ANSWERS)) for _ in sent.partitions]
        sent.answer.set_result(errors)
        self._spin()
        if any(e in FENCED for e in errors):
            self.stopped, self.expected = True, None  # M2
        else:
            left = [tp for tp, e in zip(sent.partitions, errors, strict=True)
                    if e not in DONE]
            self.expected = left or None  # M3 / M1
            if not left:
                self.state = S.COMPLETE_COMMIT if self.state is S.PREPARE_COMMIT \
                    else S.COMPLETE_ABORT

    @invariant()
    def rounds_as_the_model_says(self) -> None:
        assert not any(r.current() for r in self.stale)
        waiting = self._waiting()
        assert len(waiting) <= 1
        if self.expected is None:
            assert not waiting or not waiting[0].current()
            return
        assert len(waiting) == 1, (self.expected, self.rounds)
        sent = waiting[0]
        assert sent.partitions == self.expected
        # each round carries the coordinator epoch it was sent at; ``current``: still the
        # coordinator at that epoch (an election at a higher one, O4, ends it)
        assert sent.coordinator_epoch <= self.epoch
        assert sent.current() == (sent.coordinator_epoch == self.epoch)

    @invariant()
    def state_as_the_model_says(self) -> None:
        if not self.owned or self.c.ownership.error(0) is not None or self.state is S.EMPTY:
            return
        entry = self.c.txns[ID]
        assert entry.state is self.state
        assert entry.pending == (self.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT))


MarkerRounds.TestCase.settings = settings(max_examples=30, stateful_step_count=20,
                                          deadline=None)
TestMarkerRounds = MarkerRounds.TestCase


def test_a_fenced_marker_stops_the_rounds_for_good():
    """M2 on its own: after INVALID_PRODUCER_EPOCH from one partition no round follows,
    the transaction stays PrepareCommit and pending, whatever the others answered."""
    machine = MarkerRounds()
    try:
        machine.elect()
        machine.transaction(PARTS, True)
        sent = machine.rounds[-1]
        sent.answer.set_result([E.none, E.invalid_producer_epoch, E.network_exception])
        machine._spin()
        assert len(machine.rounds) == 1
        entry = machine.c.txns[ID]
        assert entry.state is S.PREPARE_COMMIT and entry.pending
    finally:
        machine.teardown()


def test_a_round_of_an_ended_ownership_answered_late_changes_nothing():
    """The lead goes with a round out and comes back (L1: a new round at the new epoch);
    the old round then comes back, every marker taken: the old lead's step ends without
    completing the transaction, which stays PrepareCommit and pending until the new lead's
    round is answered (before, it was completed and released under the new lead)."""
    machine = MarkerRounds()
    try:
        machine.elect()
        machine.transaction(PARTS, True)
        machine.resign(answered=False)
        machine.elect()
        old, new = machine.stale[0], machine._waiting()[0]
        assert new.coordinator_epoch == machine.epoch > old.coordinator_epoch
        old.answer.set_result([E.none] * len(old.partitions))
        machine._spin()
        machine.state_as_the_model_says()
        machine.rounds_as_the_model_says()
        entry = machine.c.txns[ID]
        assert entry.state is S.PREPARE_COMMIT and entry.pending
    finally:
        machine.teardown()
