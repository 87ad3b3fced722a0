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
