"""The transaction coordinator against a model of Kafka's rules (hypothesis stateful).

The coordinator runs in process over a ``__transaction_state`` kept in memory whose writes can
be held (an fsync under way) and released, fail, or be lost in a restart (a restart reloads
from the records that were durable), and a marker writer that judges each marker as a
partition does (producer_state's rules M1 and M2) against the data the clients wrote.
InitProducerId (fresh and KIP-360), AddPartitionsToTxn, EndTxn v4 and v5 (and their retries,
and zombies' requests) are sent interleaved, from epochs near 32766 / 32767, with producer id
changes, mixed transaction versions and timeouts. Checked at every answer, whatever the
interleaving:

- fencing: no InitProducerId hands out a (producer id, epoch) twice, nor an epoch past 32766;
- zombies: only the current identity, or the exact retry of the last EndTxn v5, gets NONE;
- a retried EndTxn v5 is never PRODUCER_FENCED;

and once everything is released (settled): nothing stays pending, every transaction the
coordinator completed left no transaction open in any partition (the LSO advances), the
coordinator holds the model's identity and transaction, and when nothing is in flight the
requests a live client makes get NONE.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kio.schema.errors import ErrorCode as E
from support.txn_coordinator_defects_helpers import HeldLog

from oncelog.coordinator.transaction import txn_records as tr
from oncelog.coordinator.transaction.transaction_coordinator import (
    TransactionCoordinator,
    TxnConfig,
)
from oncelog.coordinator.transaction.txn_records import TxnState as S

ID = "tx"
TIMEOUT_MS = 60_000
PARTS = [("t", 0), ("t", 1), ("u", 0)]
IDLE = (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)


class Partitions:
    """The data partitions as far as markers go: per (producer id, partition) the epoch of
    the last write and whether a transaction is open there (Kafka's rules M1, M2)."""

    def __init__(self) -> None:
        self.epochs: dict[tuple[int, tuple[str, int]], int] = {}
        self.open: set[tuple[int, tuple[str, int]]] = set()

    def write(self, pid: int, epoch: int, tp: tuple[str, int]) -> None:
        if epoch >= self.epochs.get((pid, tp), -1):
            self.epochs[(pid, tp)] = epoch
            self.open.add((pid, tp))

    async def __call__(self, pid, epoch, commit, coordinator_epoch, partitions,
                       transaction_version=0, current=None):
        errors = {}
        for tp in partitions:
            last = self.epochs.get((pid, tp), -1)
            if epoch < last or (transaction_version >= 2 and epoch == last
                                and (pid, tp) in self.open):
                errors[tp] = E.invalid_producer_epoch
            else:
                errors[tp] = E.none
                self.epochs[(pid, tp)] = epoch
                self.open.discard((pid, tp))
        return errors


class TxnMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.log = HeldLog()
        self.partitions = Partitions()
        self.ids = itertools.count(1000)
        self.clock = [1_000_000]
        self.c = self._start()
        # The model: the identity the live client holds, its transaction, what was granted.
        self.identity: tuple[int, int] | None = None
        self.ongoing: set[tuple[str, int]] | None = None  # None: no transaction
        self.granted: set[tuple[int, int]] = set()
        self.zombies: list[tuple[int, int]] = []
        # The last EndTxn granted: (identity it named, commit, version, identity after it).
        self.last_end: tuple[tuple[int, int], bool, int, tuple[int, int]] | None = None
        self.maybe_fenced = False  # an abort of the client's transaction may be under way
        # The last KIP-360 InitProducerId granted: (identity it named, identity it gave).
        self.last_named: tuple[tuple[int, int], tuple[int, int]] | None = None
        # The identity the live instance held before its last TV2 end bumped it: an
        # InitProducerId naming it is that instance's (its EndTxn answer was lost), and
        # Kafka's lastProducerEpoch answers it the identity the end gave.
        self.before_bump: tuple[int, int] | None = None
        self.fenced = False
        self.inflight: list[tuple[asyncio.Task, str, tuple]] = []

    # --- plumbing -------------------------------------------------------------------------

    def _start(self) -> TransactionCoordinator:
        c = TransactionCoordinator(self.log, TxnConfig(num_partitions=1),
                                   lambda: next(self.ids), lambda t, p: (t, p) in PARTS,
                                   self.partitions, now_ms=lambda: self.clock[0])
        c.retry_s = 0  # a retry waits one turn of the loop
        self.loop.run_until_complete(c.load_all())
        return c

    def _spin(self, rounds: int = 12) -> None:
        for _ in range(rounds):
            self.loop.run_until_complete(asyncio.sleep(0))
        self._collect()

    def _send(self, kind: str, *args) -> None:
        if kind == "init":
            work = self.c.init_producer_id(ID, TIMEOUT_MS, *args)
        elif kind == "add":
            work = self.c.add_partitions(ID, args[0], args[1], list(args[2]))
        else:
            pid, epoch, commit, version = args
            work = self.c.end_txn(ID, pid, epoch, commit, bump_epoch=version >= 2)
        self.inflight.append((self.loop.create_task(work), kind, args))
        self._spin()

    def _collect(self) -> None:
        # Requests decide in the order they were sent (each decides before its first await),
        # so their answers are checked in that order.
        while self.inflight and self.inflight[0][0].done():
            task, kind, args = self.inflight.pop(0)
            getattr(self, f"_answered_{kind}")(task.result(), *args)

    def _quiet(self) -> bool:
        return not self.inflight and not self.log.hold and not self.log.fail \
            and not any(e.pending for e in self.c.txns.values())

    def teardown(self) -> None:
        self.c.close()
        for task, _, _ in self.inflight:
            task.cancel()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()

    # --- answers checked against the model ------------------------------------------------

    def _grant(self, identity: tuple[int, int]) -> None:
        assert identity not in self.granted, f"{identity} handed out twice"
        self.last_named = None
        assert 0 <= identity[1] <= 32766, identity
        self.granted.add(identity)
        if self.identity is not None:
            self.zombies.append(self.identity)
        self.identity = identity

    def _answered_init(self, answer, pid, epoch) -> None:
        error, new_pid, new_epoch = answer
        if error is E.none:
            if pid >= 0 and self.before_bump == (pid, epoch):
                assert (new_pid, new_epoch) == self.identity, answer
                return
            self.before_bump = None
            if pid >= 0 and self.last_named is not None and self.last_named[0] == (pid, epoch):
                # The retry of a KIP-360 call already answered gets that answer (Kafka's
                # lastProducerEpoch), not another bump.
                assert (new_pid, new_epoch) == self.last_named[1] == self.identity, answer
                return
            self._grant((new_pid, new_epoch))
            self.last_named = ((pid, epoch), self.identity) if pid >= 0 else None
            self.ongoing, self.fenced, self.maybe_fenced = None, False, False
            self.last_end = None
        elif error is E.concurrent_transactions and self.ongoing is not None:
            self.maybe_fenced = True
        elif error is E.producer_fenced and pid < 0:
            raise AssertionError("a fresh InitProducerId was fenced")

    def _answered_add(self, answer, pid, epoch, parts) -> None:
        errors = set(answer.values())
        if errors == {E.none}:
            assert (pid, epoch) == self.identity and not self.fenced, (pid, epoch)
            self.ongoing = (self.ongoing or set()) | set(parts)
            self.last_end = None  # the client moved on: it retries the end no more
            for tp in parts:
                self.partitions.write(pid, epoch, tp)
        elif errors == {E.producer_fenced} and (pid, epoch) == self.identity:
            assert self.maybe_fenced or self.fenced, answer
            self.fenced = True

    def _answered_end(self, answer, pid, epoch, commit, version) -> None:
        error, new_pid, new_epoch = answer
        retry = version >= 2 and self.last_end is not None \
            and self.last_end[:3] == ((pid, epoch), commit, 2) \
            and self.last_end[3] == self.identity
        if retry:
            assert error in (E.none, E.concurrent_transactions), answer
            if error is E.none:
                assert (new_pid, new_epoch) == self.identity, answer
            return
        if version >= 2 and self.before_bump == (pid, epoch) and (
                error is E.concurrent_transactions
                or (error is E.none and (new_pid, new_epoch) == self.identity)):
            # The instance's own end retried from before its bump (a TV 1 end answered in
            # between changed nothing): its identity, nothing decided again.
            return
        if error is E.producer_fenced and (pid, epoch) == self.identity:
            assert self.maybe_fenced or self.fenced, answer
            self.fenced = True
            return
        if error is not E.none:
            return
        if (self.fenced or self.maybe_fenced) and (pid, epoch) == self.identity \
                and version >= 2 and not commit and (new_pid, new_epoch) == (pid, epoch + 1):
            # Kafka's rule: the fenced producer's abort of the transaction the fence aborted
            # reads as the retry of an end (the fence bumped the epoch by one).
            self._grant((new_pid, new_epoch))
            self.fenced = self.maybe_fenced = False
            self.ongoing = None
            self.last_end = ((pid, epoch), commit, version, self.identity)
            return
        assert (pid, epoch) == self.identity and not self.fenced, (answer, pid, epoch)
        if self.ongoing is None:
            # No transaction: a TV1 retry of the last end, or a TV2 abort of nothing.
            assert (version >= 2 and not commit) or (
                version < 2 and self.last_end and self.last_end[1] == commit), answer
        if version >= 2:
            if epoch >= 32766:
                assert new_epoch == 0 and new_pid != pid, answer
            else:
                assert (new_pid, new_epoch) == (pid, epoch + 1), answer
            self._grant((new_pid, new_epoch))
            self.before_bump = (pid, epoch) if new_pid == pid else None
        self.last_end = ((pid, epoch), commit, version, self.identity)
        self.ongoing = None

    # --- rules ----------------------------------------------------------------------------

    @initialize(start=st.sampled_from([None, 0, 32764, 32765, 32766, 32767]),
                version=st.sampled_from([0, 2]), ongoing=st.booleans())
    def seed(self, start, version, ongoing) -> None:
        """Begin as 32k transactions would leave the id (or with no id at all); with
        ``ongoing``, its live client is in a transaction at that epoch."""
        if start is None:
            return
        pid = next(self.ids)
        ongoing = ongoing and start <= 32766
        state = S.ONGOING if ongoing else S.COMPLETE_COMMIT
        parts = (("t", (0, 1)),) if ongoing else ()
        self.log.seed(self.c, ID, tr.TxnValue(pid, start, TIMEOUT_MS, state, parts,
                                              self.clock[0], self.clock[0], -1, -1, version))
        self.granted.add((pid, start))
        if ongoing:
            self.identity, self.ongoing = (pid, start), set(PARTS[:2])
            for tp in PARTS[:2]:
                self.partitions.write(pid, start, tp)
        self.c.close()
        self.c = self._start()

    @rule(named=st.booleans())
    def init(self, named) -> None:
        pid, epoch = self.identity if named and self.identity else (-1, -1)
        self._send("init", pid, epoch)

    @precondition(lambda self: self.identity is not None)
    @rule(parts=st.sets(st.sampled_from(PARTS), min_size=1), zombie=st.integers(0, 3))
    def add(self, parts, zombie) -> None:
        identity = self.identity
        if zombie and self.zombies:
            identity = self.zombies[-min(zombie, len(self.zombies))]
        self._send("add", *identity, frozenset(parts))

    @precondition(lambda self: self.identity is not None)
    @rule(commit=st.booleans(), version=st.sampled_from([0, 2]),
          which=st.sampled_from(["current", "retry", "zombie"]))
    def end(self, commit, version, which) -> None:
        identity = self.identity
        if which == "retry" and self.last_end is not None:
            identity, commit, version = self.last_end[:3]
        elif which == "zombie" and self.zombies:
            identity = self.zombies[-1]
        self._send("end", *identity, commit, version)

    @rule(on=st.booleans())
    def hold_writes(self, on) -> None:
        self.log.hold = on
        self._spin()

    @rule(fail=st.booleans())
    def release_writes(self, fail) -> None:
        self.log.release(fail=fail, count=1)
        self._spin()

    @rule(on=st.booleans())
    def fail_writes(self, on) -> None:
        self.log.fail = on
        self._spin()

    @rule()
    def time_out(self) -> None:
        self.clock[0] += TIMEOUT_MS + 1

        async def sweep() -> int:  # as the broker's timer calls it: on the loop
            return self.c.abort_timed_out()

        if self.loop.run_until_complete(sweep()) and self.ongoing is not None:
            self.maybe_fenced = True
        self._spin()

    @precondition(lambda self: not self.inflight)
    @rule()
    def restart(self) -> None:
        """A crash: what was not durable is lost; the state is read back."""
        self.c.close()
        self.log.release(fail=True)
        self.log.hold = self.log.fail = False
        self.loop.run_until_complete(asyncio.sleep(0))
        self.c = self._start()
        self.last_named = None  # lastProducerEpoch lives in memory only, as in Kafka
        self.before_bump = None
        self._spin()

    @rule()
    def settle(self) -> None:
        self.log.hold = self.log.fail = False
        for _ in range(400):
            self.log.release()
            self._spin()
            if self._quiet():
                break
        assert self._quiet(), (self.inflight, self.c.txns)
        entry = self.c.txns.get(ID)
        open_now = {key for key in self.partitions.open}
        if entry is None:
            assert self.identity is None
            return
        assert entry.state is S.ONGOING or entry.state in IDLE, entry
        if self.identity is None:
            return
        current = (entry.producer_id, entry.epoch)
        if self.ongoing is not None and entry.state in IDLE:
            assert self.maybe_fenced or self.fenced, (entry, self.identity)
            self.fenced = True
            self.ongoing = None
        if self.fenced:
            assert entry.state in IDLE and current != self.identity, entry
        else:
            assert current == self.identity, (entry, self.identity)
            assert (entry.state is S.ONGOING) == (self.ongoing is not None), entry
            if self.ongoing is not None:
                assert entry.partitions == frozenset(self.ongoing), entry
        self.maybe_fenced = False
        # Every transaction the coordinator finished is finished in every partition.
        expected = {(self.identity[0], tp) for tp in self.ongoing or ()}
        assert open_now <= expected, (open_now, expected, entry)

    @precondition(lambda self: not self.fenced and not self.maybe_fenced)
    @rule(commit=st.booleans(), version=st.sampled_from([0, 2]))
    def live_client(self, commit, version) -> None:
        """With nothing in flight, what a live client asks is granted."""
        if not self._quiet():
            return
        if self.identity is None or self.ongoing is None:
            self._send("init", -1, -1)
            assert not self.inflight and self.identity is not None
            self._send("add", *self.identity, frozenset(PARTS[:2]))
            assert not self.inflight and self.ongoing == set(PARTS[:2])
            return
        before = self.identity
        self._send("end", *before, commit, version)
        assert not self.inflight and self.ongoing is None and self.last_end is not None \
            and self.last_end[0] == before
        self.settle()  # its markers are written, its partitions' transactions closed
        if version >= 2:
            self._send("end", *before, commit, version)  # its answer lost: sent again
            assert not self.inflight and self.last_end[0] == before

    @precondition(lambda self: self.identity is not None)
    @rule(hold=st.booleans())
    def two_inits(self, hold) -> None:
        """A new instance's InitProducerId and another's at once, with writes that wait."""
        self.log.hold = hold
        self._send("init", -1, -1)
        self._send("init", -1, -1)
        self.log.release()

    @precondition(lambda self: self.identity is not None)
    @rule()
    def kip360_retry(self) -> None:
        """InitProducerId naming the identity, its answer lost, sent again."""
        self._send("init", *self.identity)
        self._send("init", *self.zombies[-1] if self.zombies else self.identity)

    @invariant()
    def epochs_in_range(self) -> None:
        for entry in self.c.txns.values():
            assert -1 <= entry.epoch <= 32767, entry


TxnMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30,
                                        deadline=None, derandomize=True, database=None)
test_transaction_coordinator_model = TxnMachine.TestCase


# Programs the random search reaches only with many examples, run every time: each is a
# sequence of the machine's own rules, checked by the same model.
PROGRAMS = {
    "tv2 end exhausts the epoch": [
        ("seed", {"start": 32766, "version": 2, "ongoing": True}),
        ("end", {"commit": True, "version": 2, "which": "current"}), ("settle", {}),
        ("live_client", {"commit": True, "version": 2}),
        ("live_client", {"commit": False, "version": 2})],
    "live client from 32765": [
        ("seed", {"start": 32765, "version": 0, "ongoing": False}),
        ("live_client", {"commit": True, "version": 0}),
        ("live_client", {"commit": True, "version": 2}),
        ("end", {"commit": True, "version": 2, "which": "retry"}), ("settle", {})],
    "two adds while a write waits": [
        ("seed", {"start": None, "version": 0, "ongoing": False}),
        ("live_client", {"commit": True, "version": 0}),
        ("live_client", {"commit": True, "version": 2}),
        ("hold_writes", {"on": True}),
        ("add", {"parts": {("t", 0)}, "zombie": 0}),
        ("add", {"parts": {("u", 0)}, "zombie": 0}),
        ("release_writes", {"fail": False}), ("settle", {})],
    "PrepareAbort fails after the fence": [
        ("seed", {"start": 7, "version": 2, "ongoing": True}),
        ("hold_writes", {"on": True}), ("init", {"named": False}),
        ("release_writes", {"fail": False}), ("release_writes", {"fail": True}),
        ("hold_writes", {"on": False}), ("settle", {}),
        ("live_client", {"commit": True, "version": 0})],
    "a zombie's EndTxn v5 after its successor's TV1 end": [
        ("seed", {"start": 3, "version": 2, "ongoing": False}),
        ("init", {"named": False}), ("init", {"named": False}),
        ("add", {"parts": {("t", 0)}, "zombie": 0}),
        ("end", {"commit": True, "version": 0, "which": "current"}), ("settle", {}),
        ("end", {"commit": True, "version": 2, "which": "zombie"}), ("settle", {})],
    "completion write fails, then a restart": [
        ("seed", {"start": 32764, "version": 0, "ongoing": True}),
        ("hold_writes", {"on": True}),
        ("end", {"commit": False, "version": 2, "which": "current"}),
        ("release_writes", {"fail": False}), ("release_writes", {"fail": True}),
        ("restart", {}), ("settle", {}),
        ("end", {"commit": False, "version": 2, "which": "retry"}), ("settle", {})],
}


@pytest.mark.parametrize("program", PROGRAMS)
def test_model_programs(program):
    machine = TxnMachine()
    try:
        for step, arguments in PROGRAMS[program]:
            getattr(machine, step)(**arguments)
            machine.epochs_in_range()
    finally:
        machine.teardown()
