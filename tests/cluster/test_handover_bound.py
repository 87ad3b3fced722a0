"""H3's bound (leader_election.py) is kept without a request polling for it: the controller's
loop wakes when the next outstanding ask reaches it (HandoverClock.next_due through
wakeups.woken), where before the pass that took H3 for a rebalance's or a reassignment's
handover was the first one after the bound that a watch or the recheck (a third of the
session timeout) happened to start: about 12 s, up to 16 s, with an 18 s session (found by a
review). And the bound is never shorter than the time a leader cut off from ZooKeeper takes
to fence itself (half its session timeout, membership.py's V3): before it, H3 could move a
leadership while the leader, which never read the ask, still answered acks=1 on the append."""

from __future__ import annotations

import threading

from support.zookeepers import registered_member

from oncelog.cluster import znodes as zn
from oncelog.cluster.controller import handover_bound_s
from oncelog.cluster.leader_election import HANDOVER_TIMEOUT_S, HandoverClock
from oncelog.cluster.wakeups import woken

ASKED = zn.PartitionState(2, 1, (2, 1, 3), 1, zn.HANDOVER_PREFERRED, False)
READY = zn.PartitionState(2, 1, (2, 1, 3), 1, zn.HANDOVER_PREFERRED, True)


def test_the_next_ask_due_is_the_first_seen():
    clock = HandoverClock()
    assert clock.next_due(0.0, 10.0) is None
    clock.waited(("t", 0), ASKED, 100.0)
    clock.waited(("t", 1), ASKED, 103.0)
    assert clock.next_due(104.0, 10.0) == 6.0
    clock.waited(("t", 0), READY, 105.0)  # said ready: no longer due
    assert clock.next_due(105.0, 10.0) == 8.0
    # past its bound (the pass that saw it so decided H3): not due again and again
    assert clock.next_due(113.5, 10.0) is None


def test_the_loop_wakes_when_an_ask_is_due_not_at_its_recheck():
    stopped, wake = threading.Event(), threading.Event()
    passes = []

    def run() -> None:
        for _ in woken(stopped, wake, 3600.0, lambda: None if passes else 0.05):
            passes.append(1)
            stopped.set()

    loop = threading.Thread(target=run, daemon=True)
    loop.start()
    loop.join(30)  # bounded: the recheck alone would take an hour
    assert passes == [1]


def test_the_bound_outlasts_a_cut_off_leader_fencing_itself():
    assert handover_bound_s(18_000) == HANDOVER_TIMEOUT_S  # 9 s to fence: 10 s
    assert handover_bound_s(6_000) == HANDOVER_TIMEOUT_S
    assert handover_bound_s(30_000) == 16.0  # fenced after 15 s: moved after


class _Clock:
    """controller.py's ``time``, with a monotonic clock the test moves."""

    def __init__(self) -> None:
        import time

        self._time, self.now = time, 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(self._time, name)


def test_a_controller_elected_mid_handover_counts_h3_afresh_and_moves_it(zookeeper,
                                                                          monkeypatch):
    """Controller 3 asks broker 2 to hand t-0 over to its preferred replica 1 (H4), then its
    session closes: broker 1 becomes controller with a clock of its own. Its passes wait
    (H5) and move the leadership (H3) only once its own clock reaches the bound from its
    first look at the ask, not at once and not never (the review checked this by reading
    only: no controller restart in the models)."""
    from oncelog.cluster import controller as controller_module
    from oncelog.cluster.controller import Controller
    from oncelog.cluster.leader_election import Ask
    from oncelog.cluster.membership import ClusterMember
    from oncelog.cluster.topic_admin import TopicAdmin

    clock = _Clock()
    monkeypatch.setattr(controller_module, "time", clock)
    connect = zookeeper.chroot("handover-new-controller")
    members: dict[int, ClusterMember] = {}

    try:
        for b in (3, 1, 2):  # 3 first: the controller
            members[b] = registered_member(connect, b)
        assert members[3].is_controller
        zk, path = members[3].zk, zn.partition_state_path("t", 0)
        admin = TopicAdmin(members[3].store)
        admin.ensure_paths()
        admin.create_topic("t", zn.TopicAssignment("AAAAAAAAAAAAAAAAAAAAAA", {0: (1, 2, 3)},
                                                   {}, {}), {})
        first = Controller(members[3], lambda: False)
        first.pass_once()  # N1: broker 1 leads
        _, stat = zk.get(path)
        zk.set(path, zn.PartitionState(2, 1, (2, 1, 3), 1).encode(), version=stat.version)

        def state() -> zn.PartitionState:
            return zn.PartitionState.decode(members[1].zk.get(path)[0])

        _, waiting = first.elect([("t", 0)], Ask.PREFERRED)
        assert waiting == [("t", 0)] and state().handover_for  # H4: asked
        members.pop(3).close()  # its session closed: /controller goes
        members[1].pass_once()
        assert members[1].is_controller
        second = Controller(members[1], lambda: False)
        bound = second.handover_bound_s
        for elapsed in (0.0, bound / 2, bound - 0.5):
            clock.now = 1000.0 + elapsed
            second.pass_once()
            assert state().leader == 2, f"moved {elapsed} s after the new controller saw it"
        clock.now = 1000.0 + bound
        second.pass_once()
        assert state().leader == 1 and not state().handover_for  # H3
    finally:
        for member in members.values():
            member.close()
