"""A broker bounce whose gap only an ElectLeaders round (or a pass whose write lost a race)
saw is still a bounce (controller.py's ``_live_and_absent`` and ``_forget``).

Controller.live_brokers() is read by the pass and by every ElectLeaders round, and
ClusterMode.elect polls a round every 0.1 s for up to 15 s while a leader hands over (E4).
It used to forget a broker's registration as soon as any reader found it unregistered
("seen dead: its return is no bounce"), which is sound only when that reader acted on it (a
pass whose L1/F1 landed). Back with a new czxid (perhaps a wiped disk), the broker was not
counted bounced: it stayed in every ISR and kept leading what it led.

Expected (leader_election.py's *live*): the pass after the bounce takes broker 3 out of every
ISR (L1) and moves its leadership (F1). Found by a review; both cases failed before.
"""

from __future__ import annotations

import pytest
from support.zookeepers import registered_member

from oncelog.cluster import znodes as zn
from oncelog.cluster.controller import Controller
from oncelog.cluster.leader_election import Ask
from oncelog.cluster.membership import ClusterMember
from oncelog.cluster.topic_admin import TopicAdmin

pytestmark = pytest.mark.xdist_group("zookeeper")

SESSION_MS = 4000
TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"


def _three(connect: str, members: dict[int, ClusterMember]):
    """Brokers 1-3 registered (into ``members``, for the caller to close), and broker 1's
    ZooKeeper client and topic admin."""
    for b in (1, 2, 3):
        members[b] = registered_member(connect, b, SESSION_MS)
    admin = TopicAdmin(members[1].store)
    admin.ensure_paths()
    return members[1].zk, admin


@pytest.mark.parametrize("round_in_gap", [False, True], ids=["control", "round-in-gap"])
def test_a_bounce_whose_gap_an_election_round_saw_is_still_a_bounce(zookeeper, round_in_gap):
    """``control``: the same bounce without an ElectLeaders round in its gap;
    ``round-in-gap``: one round read the brokers while broker 3 was gone."""
    connect = zookeeper.chroot("review-bounce-poll")
    members: dict[int, ClusterMember] = {}
    try:
        client, admin = _three(connect, members)
        admin.create_topic("t", zn.TopicAssignment(TOPIC_ID, {0: (1, 2, 3), 1: (3, 1, 2)},
                                                   {}, {}), {})
        # "h": a partition whose preferred replica (1) does not lead: the preferred
        # election asked below waits for broker 2's handover (H4, then E4 rounds)
        admin.create_topic("h", zn.TopicAssignment("BAAAAAAAAAAAAAAAAAAAAA", {0: (1, 2, 3)},
                                                   {}, {}), {})
        controller = Controller(members[1], lambda: False)
        controller.pass_once()  # N1
        path_h = zn.partition_state_path("h", 0)
        _, stat = client.get(path_h)
        client.set(path_h, zn.PartitionState(2, 1, (2, 1, 3), 1).encode(),
                   version=stat.version)  # after a failover broker 2 leads h-0

        def states() -> list[tuple[int, int, tuple[int, ...]]]:
            return [(s.leader, s.leader_epoch, s.isr) for s in (zn.PartitionState.decode(
                client.get(zn.partition_state_path("t", p))[0]) for p in (0, 1))]

        assert states() == [(1, 0, (1, 2, 3)), (3, 0, (3, 1, 2))]
        # ElectLeaders for h-0: broker 2 is asked to hand over (H4); the request waits (E4)
        answers, waiting = controller.elect([("h", 0)], Ask.PREFERRED)
        assert waiting == [("h", 0)], answers
        # broker 3 killed; the next 0.1 s round of the waiting ElectLeaders reads the
        # brokers while its registration is gone ...
        members.pop(3).close()
        if round_in_gap:
            controller.elect(waiting, Ask.PREFERRED, True)
        # ... and broker 3 is back (a new session, perhaps a wiped disk) before any pass ran
        members[3] = registered_member(connect, 3, SESSION_MS)
        controller.elect(waiting, Ask.PREFERRED, True)  # another round: it is back
        controller.pass_once()
        # as when a pass itself finds the newer czxid: counted dead, out of every ISR (L1)
        # and its leadership moved (F1)
        assert states() == [(1, 0, (1, 2)), (1, 1, (1, 2))], \
            "the bounced broker 3 stays in the ISRs and keeps leading t-1"
    finally:
        for member in members.values():
            member.close()


def test_a_broker_seen_dead_by_a_pass_whose_removal_lost_a_race_is_forgotten(zookeeper):
    """The same root cause on the pass itself (older than the handover): a pass finds broker
    3 gone and decides L1 for t-0, but that write loses to the leader's concurrent ISR write
    (BadVersion; the next pass is to read again). live_brokers() has already forgotten
    broker 3's registration, so when it is back before the next pass (a new czxid) nothing
    counts it as bounced, and it stays in t-0's ISR with whatever log it came back with.

    Expected: broker 3 out of t-0's ISR after the next pass."""
    connect = zookeeper.chroot("review-bounce-lost")
    members: dict[int, ClusterMember] = {}
    try:
        client, admin = _three(connect, members)
        admin.create_topic("t", zn.TopicAssignment(TOPIC_ID, {0: (1, 2, 3)}, {}, {}), {})
        path = zn.partition_state_path("t", 0)

        class LosesItsWrite(Controller):
            race = False

            def write(self, chosen):
                if self.race:  # t-0's leader writes its ISR (a shrink of 2 and back, say)
                    self.race = False
                    data, stat = client.get(path)
                    client.set(path, data, version=stat.version)
                return super().write(chosen)

        controller = LosesItsWrite(members[1], lambda: False)
        controller.pass_once()  # N1

        def isr() -> tuple[int, ...]:
            return zn.PartitionState.decode(client.get(path)[0]).isr

        assert isr() == (1, 2, 3)
        members.pop(3).close()  # broker 3 killed
        controller.race = True
        controller.pass_once()  # sees it gone, decides L1: lost to the leader's write
        assert isr() == (1, 2, 3)
        members[3] = registered_member(connect, 3, SESSION_MS)  # back, before the next pass
        for _ in range(3):
            controller.pass_once()
        assert isr() == (1, 2), "broker 3, seen dead and back, stays in the ISR"
    finally:
        for member in members.values():
            member.close()
