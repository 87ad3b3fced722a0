"""The decision tables of cluster/leader_election.py (rows T1-T2, X1, N1-L2, D1, P1-P3, U1-U4;
RB1-RB3 below) held by a model-based test of the table alone (no ZooKeeper, so thousands of
steps cost a second; test_controller_model.py runs the same table through the real controller on
ZooKeeper): brokers die and come back (a restart recovers its failed log directories), bounce
(counted dead for each partition until a decision on it lands: never left leader or, but for
F3/F4/S1, in the ISR by that decision), partitions' znodes become unreadable (X1: nothing
decided, ElectLeaders answers UNKNOWN_SERVER_ERROR) and readable again, assignments lose their
topic_id (T1: named by the next pass, X1 until then), begin controlled shutdowns, have a
replica's log directory fail, leaders add caught-up replicas back to the ISR, partitions are
reassigned, preferred and unclean elections are asked, leaders asked to hand over say ready,
time passes; the controller's pass is applied after each step until nothing is left to write.
A live, eligible leader loses its leadership only once it said ready or the handover's bound
passed (H2, H3), and after the passes a handover is asked only for a move that still applies
(H6). Checked after every step: the leader is in the ISR or
-1, the ISR is never empty, leader epochs never go down and go up with every leader change, a
leader outside the last ISR only by unclean election (enabled, or asked), and after the passes
every partition that could have a clean leader has one, which is live and not shutting down when
another could lead.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from kio.schema.errors import ErrorCode

from oncelog.cluster.leader_election import (
    HANDOVER_TIMEOUT_S,
    Ask,
    Facts,
    HandoverClock,
    decide,
    election_answer,
    election_decision,
    name_topic,
    pass_decision,
    rebalance,
)
from oncelog.cluster.znodes import (
    HANDOVER_PREFERRED,
    HANDOVER_REASSIGNMENT,
    NO_LEADER,
    PartitionState,
    decode_topic_id,
)

BROKERS = (1, 2, 3, 4)
PARTITIONS = 4
CONTROLLER_EPOCH = 7


class Table(RuleBasedStateMachine):
    @initialize(data=st.data())
    def cluster(self, data):
        self.live = set(BROKERS)
        self.shutting: set[int] = set()
        self.offline: set[tuple[int, int]] = set()  # (broker, partition) on a failed dir
        self.replicas = {p: tuple(data.draw(st.permutations(BROKERS))[:data.draw(
            st.integers(1, 3))]) for p in range(PARTITIONS)}
        self.unclean = {p: data.draw(st.booleans()) for p in range(PARTITIONS)}
        self.targets: dict[int, tuple[int, ...]] = {}
        self.states: dict[int, PartitionState | None] = dict.fromkeys(self.replicas)
        self.seen = dict(self.states)
        self.asked_unclean: set[int] = set()
        # X1: partitions whose znodes cannot be read; *live*: brokers counted dead for a
        # partition since they bounced, until a decision on it lands
        self.unreadable: set[int] = set()
        self.owed: dict[int, set[int]] = {p: set() for p in self.replicas}
        # T1: partitions (each its own topic here) whose assignment lacks only its topic_id
        self.unnamed: set[int] = set()
        self.named: dict[int, str] = {}
        # H rows: the controller's clock, when it first saw each handover asked
        self.now = 0.0
        self.handovers = HandoverClock()
        self.settle()

    def facts(self, p: int) -> Facts:
        return Facts(self.replicas[p], self.states[p], frozenset(self.live),
                     frozenset(self.shutting & self.live), self.unclean[p], self.targets.get(p),
                     frozenset(b for b, q in self.offline if q == p),
                     frozenset(self.owed[p]), "NoAuth" if p in self.unreadable else
                     "no topic_id" if p in self.unnamed else None)

    def eligible(self, p: int, broker: int) -> bool:
        return broker in self.live and broker not in self.shutting and \
            (broker, p) not in self.offline and broker not in self.owed[p]

    def apply(self, p: int, ask: Ask):
        facts, before = self.facts(p), self.states[p]
        waited = self.handovers.waited(("t", p), before, self.now)
        row, decision = pass_decision(facts, waited, CONTROLLER_EPOCH) if ask is Ask.PASS \
            else election_decision(facts, ask, waited, CONTROLLER_EPOCH)
        new = decision.state
        if before is not None and new is not None and new.leader != before.leader and \
                before.leader != NO_LEADER and self.eligible(p, before.leader):
            # a live leader's leadership moves only once it said ready, or at the bound
            assert row in ("H2", "H3"), (row, before, new)
            assert before.handover_ready or waited >= HANDOVER_TIMEOUT_S, (before, waited)
        if row == "H4":  # never over another's ask: two askers would take turns for ever
            assert not before.handover_for, before
            assert new.leader == before.leader and new.handover_for and not new.handover_ready
        if row in ("H4", "H5"):  # the move waits: the ISR still sheds what is not eligible
            assert new is None or new.isr == tuple(b for b in before.isr
                                                   if self.eligible(p, b))
        if decision.state is not None:
            self.states[p] = decision.state
        if decision.replicas is not None:
            self.replicas[p] = decision.replicas
            self.targets.pop(p, None)
        return decision

    def settle(self):
        self.check()
        for p in sorted(self.unnamed):  # T1 before any partition of it is decided
            assert decide(self.facts(p), Ask.PASS, CONTROLLER_EPOCH).row == "X1"
            known = self.named.get(p)
            assert name_topic(True, True, known) is None  # T2: a deletion goes first
            topic_id = name_topic(True, False, known)
            assert topic_id is not None and decode_topic_id(topic_id)
            if known is not None:  # rewritten by an old tool: its logs keep their id
                assert topic_id == known
            else:  # a new id, never another topic's
                assert topic_id not in self.named.values()
            self.named[p] = topic_id
            self.unnamed.discard(p)
        for p in self.replicas:
            for _ in range(5):
                before = self.states[p]
                decision = self.apply(p, Ask.PASS)
                if decision.row == "X1":  # nothing decided on what cannot be read
                    assert decision.state is None and self.states[p] == before
                    break
                state, owed = self.states[p], self.owed[p]
                if owed and state is not None:  # the decision that lands on it pays them
                    assert state.leader not in owed, (owed, before, state)
                    assert state.leader == NO_LEADER or state.leader in self.shutting or \
                        not owed & set(state.isr), (owed, before, state)
                owed.clear()
                if decision.state is None:
                    break
            else:
                raise AssertionError(f"partition {p} did not settle")
        self.check()
        for p, state in self.states.items():
            if p in self.unreadable:
                continue
            eligible = [b for b in self.replicas[p] if b in self.live and b not in self.shutting
                        and (b, p) not in self.offline]
            if state is None:
                assert not eligible
                continue
            clean = [b for b in state.isr if b in eligible]
            if state.handover_for:  # H6 took back every ask whose move no longer applies
                assert self.eligible(p, state.leader), state

                def in_sync(b: int, state=state, p=p) -> bool:
                    return b in state.isr and self.eligible(p, b)

                if state.handover_for == HANDOVER_PREFERRED:
                    assert self.replicas[p][0] != state.leader and \
                        in_sync(self.replicas[p][0]), (state, self.replicas[p])
                else:
                    assert state.handover_for == HANDOVER_REASSIGNMENT
                    target = self.targets.get(p)
                    assert target and state.leader not in target and \
                        all(in_sync(b) for b in target), (state, target)
            if state.leader == NO_LEADER:
                assert not clean and not (self.unclean[p] and eligible)
            else:
                assert state.leader in self.live
                if state.leader in self.shutting:
                    assert not [b for b in clean if b != state.leader]
                else:
                    assert (state.leader, p) not in self.offline  # D1, F3
                    assert all(b in self.live and b not in self.shutting and
                               (b, p) not in self.offline for b in state.isr)

    @rule(broker=st.sampled_from(BROKERS))
    def dies(self, broker):
        self.live.discard(broker)
        self.shutting.discard(broker)
        self.settle()

    @rule(broker=st.sampled_from(BROKERS))
    def comes_back(self, broker):
        if broker not in self.live:  # restarted: its failed directories recovered
            self.offline = {(b, p) for b, p in self.offline if b != broker}
        self.live.add(broker)
        self.settle()

    @rule(broker=st.sampled_from(BROKERS))
    def bounces(self, broker):
        """Registered again within the session timeout, perhaps with a wiped disk: counted
        dead for every partition until a decision on it lands (an unreadable one's waits)."""
        if broker in self.live:
            for owed in self.owed.values():
                owed.add(broker)
        self.settle()

    @rule(p=st.integers(0, PARTITIONS - 1), readable=st.booleans())
    def znodes_become(self, p, readable):
        (self.unreadable.discard if readable else self.unreadable.add)(p)
        self.settle()

    @rule(p=st.integers(0, PARTITIONS - 1))
    def written_by_old_tooling(self, p):
        """Its assignment written again without a topic_id (pre-2.8 tooling): T1 names it
        at the next pass, and only then are its partitions decided again."""
        known = self.named.get(p)
        self.unnamed.add(p)
        self.settle()
        assert p in self.named and name_topic(False, False) is None  # T2
        assert known is None or self.named[p] == known

    @rule(broker=st.sampled_from(BROKERS), p=st.integers(0, PARTITIONS - 1))
    def log_dir_fails(self, broker, p):
        if broker in self.live:
            self.offline.add((broker, p))
        self.settle()

    @rule(broker=st.sampled_from(BROKERS))
    def begins_controlled_shutdown(self, broker):
        if broker in self.live:
            self.shutting.add(broker)
        self.settle()

    @rule(p=st.integers(0, PARTITIONS - 1), data=st.data())
    def leader_adds_a_caught_up_replica(self, p, data):
        state = self.states[p]
        if state is None or state.leader not in self.live:
            return
        behind = [b for b in self.replicas[p] if b in self.live and b not in state.isr]
        if behind:
            added = data.draw(st.sampled_from(behind))
            self.states[p] = PartitionState(state.leader, state.leader_epoch,
                                            (*state.isr, added), state.controller_epoch,
                                            state.handover_for, state.handover_ready)
        self.settle()

    @rule(p=st.integers(0, PARTITIONS - 1), data=st.data())
    def reassigned(self, p, data):
        target = tuple(data.draw(st.permutations(BROKERS))[:data.draw(st.integers(1, 3))])
        original = tuple(b for b in self.replicas[p] if b not in self.targets.get(p, ()))
        self.replicas[p] = target + tuple(b for b in original if b not in target)
        self.targets[p] = target
        self.settle()

    @rule(p=st.integers(0, PARTITIONS - 1), unclean=st.booleans())
    def elect_leaders(self, p, unclean):
        if p in self.unreadable:
            decision = self.apply(p, Ask.UNCLEAN if unclean else Ask.PREFERRED)
            assert decision.row == "X1" and decision.state is None
            assert decision.error == ErrorCode.unknown_server_error
            return
        if unclean:
            decision = self.apply(p, Ask.UNCLEAN)
            if decision.row == "U3":
                self.asked_unclean.add(p)
        else:
            before = self.states[p]
            decision = self.apply(p, Ask.PREFERRED)
            if decision.row in ("H4", "H5"):  # a live leader hands over first
                assert before is not None and before.leader != self.replicas[p][0]
            elif decision.state is not None:
                assert decision.state.leader == self.replicas[p][0]
        self.settle()

    @rule(data=st.data())
    def leader_says_ready(self, data):
        """H7: a leader asked to hand over writes its state ready once its ISR holds
        everything it acknowledged (at the version it read: ISR and epoch as they are)."""
        asked = [p for p, s in self.states.items() if s is not None and s.handover_for
                 and not s.handover_ready and s.leader in self.live]
        if asked:
            p = data.draw(st.sampled_from(asked))
            state = self.states[p]
            self.states[p] = PartitionState(state.leader, state.leader_epoch, state.isr,
                                            state.controller_epoch, state.handover_for, True)
        self.settle()

    @rule(p=st.integers(0, PARTITIONS - 1), data=st.data())
    def led_by_another_in_sync_replica(self, p, data):
        """As after a failover whose old leader caught up again: another ISR member leads,
        the preferred replica in sync (a preferred election or a reassignment then moves
        a live leader: the H rows)."""
        state = self.states[p]
        if state is None or state.leader == NO_LEADER or state.leader not in self.live:
            return
        others = [b for b in state.isr if b != state.leader and self.eligible(p, b)]
        if others:
            self.states[p] = PartitionState(data.draw(st.sampled_from(others)),
                                            state.leader_epoch + 1, state.isr,
                                            state.controller_epoch)
        self.settle()
        if data.draw(st.booleans()):  # and the preferred replica asked back at once,
            self.elect_leaders(p, False)
            then = data.draw(st.sampled_from(["ready", "silent", "later"]))
            if then == "ready":  # its leader saying ready at once (H2)
                self.leader_says_ready(data)
            elif then == "silent":  # or never, past the bound (H3)
                self.now += HANDOVER_TIMEOUT_S
                self.settle()

    @rule()
    def time_passes(self):
        """H3's bound: a leader that never says ready loses its leadership all the same."""
        self.now += HANDOVER_TIMEOUT_S / 2
        self.settle()

    def check(self):
        for p, state in self.states.items():
            if state is None:
                continue
            assert state.isr, state
            assert state.leader == NO_LEADER or state.leader in state.isr, state
            before = self.seen[p]
            if before is None:
                assert state.leader_epoch == 0
                continue
            assert state.leader_epoch >= before.leader_epoch
            if state.leader != before.leader:
                assert state.leader_epoch > before.leader_epoch
                if state.leader != NO_LEADER and not self.unclean[p] \
                        and p not in self.asked_unclean:
                    assert state.leader in before.isr, ("unclean election", before, state)
        self.seen = dict(self.states)
        self.asked_unclean.clear()

    @invariant()
    def holds(self):
        self.check()


def test_leader_election_table():
    run = Table.TestCase
    run.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)
    run().runTest()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(BROKERS), st.sampled_from(BROKERS)), max_size=12),
       st.booleans(), st.integers(0, 100))
def test_auto_leader_rebalance_table(partitions, enabled, percentage):
    asked = rebalance(partitions, enabled, percentage)
    if not enabled:
        assert asked == []  # RB1
        return
    for broker in BROKERS:
        mine = [i for i, (preferred, _) in enumerate(partitions) if preferred == broker]
        away = [i for i in mine if partitions[i][1] != broker]
        expected = away if mine and len(away) / len(mine) > percentage / 100 else []
        assert [i for i in asked if i in mine] == expected  # RB2, RB3


@pytest.mark.parametrize("landed", [False, True])
@pytest.mark.parametrize("handing_over", [False, True])
def test_election_answer_table(landed, handing_over):
    """E1-E4: written (or, asked about again, elected by a pass) is NONE; a write lost
    while this request waits for a handover is looked at again, otherwise answered."""
    answer = election_answer(landed, handing_over)
    if landed:
        assert answer == (ErrorCode.none, None)  # E1, E3
    elif handing_over:
        assert answer is None  # E4
    else:
        assert answer[0] == ErrorCode.eligible_leaders_not_available  # E2
