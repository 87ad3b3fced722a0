"""The controller's decision table (cluster/leader_election.py, rows N1-L2) held by a
model-based test on the real ZooKeeper: brokers (ClusterMembers in this process, each with
its own session, each with a Controller) join and die, begin a controlled shutdown, topics
are created (some with unclean.leader.election.enable) and deleted, leaders add caught-up
replicas back to the ISR (as a replica manager does, by a conditional write), the
controller is deposed; after every step the partition states in ZooKeeper are checked:

- the leader is a member of the ISR, or -1;
- a leader's epoch never goes down, and goes up whenever the leader changes;
- a new leader comes from the ISR last seen, unless its topic enables unclean election;
- after the controller's passes, a partition has a live leader whenever a live replica of
  its ISR could lead, and its leader is live or -1;
- a deposed controller that does not know it yet writes nothing (ControllerMoved).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kazoo.exceptions import NodeExistsError, NoNodeError
from support.zookeepers import registered_member

from oncelog.cluster import znodes as zn
from oncelog.cluster.controller import Controller
from oncelog.cluster.membership import ClusterMember, ControllerMoved
from oncelog.cluster.metadata_cache import encode_topic_id
from oncelog.cluster.placement import Candidate, assign
from oncelog.cluster.topic_admin import TopicAdmin
from oncelog.metadata.zookeeper import ZooKeeperStore

SESSION_MS = 4000
BROKER_IDS = st.integers(1, 4)
PASSES = 8  # a pass that wrote is followed by another; the table settles well within this


class ControllerModel(RuleBasedStateMachine):
    zookeeper = None

    @initialize()
    def fresh_cluster(self):
        import uuid

        self.uuid = uuid
        self.connect = self.zookeeper.chroot("controller-model")
        self.observer = ZooKeeperStore(self.connect, SESSION_MS)
        self.zk = self.observer.client
        self.admin = TopicAdmin(self.observer)
        self.admin.ensure_paths()
        self.members: dict[int, tuple[ClusterMember, Controller]] = {}
        self.topics: dict[str, bool] = {}  # name -> unclean enabled
        self.seen: dict[tuple[str, int], zn.PartitionState] = {}
        self.count = 0
        for broker_id in (1, 2, 3):
            self.join(broker_id)

    def teardown(self):
        for member, controller in self.members.values():
            controller.close()
            member.close()
        if hasattr(self, "observer"):
            self.observer.close()

    # --- the world -------------------------------------------------------------------------

    @rule(broker_id=BROKER_IDS)
    def join(self, broker_id):
        if broker_id in self.members:
            return
        member = ClusterMember(ZooKeeperStore(self.connect, SESSION_MS), broker_id, None)
        member.start("127.0.0.1", 9000 + broker_id, background=False)
        self.members[broker_id] = (member, Controller(member, lambda: False))
        self.settle()

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def die(self, data):
        broker_id = data.draw(st.sampled_from(sorted(self.members)))
        member, controller = self.members.pop(broker_id)
        controller.close()
        member.close()
        self.settle()

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def begin_controlled_shutdown(self, data):
        broker_id = data.draw(st.sampled_from(sorted(self.members)))
        member, _ = self.members[broker_id]
        try:
            member.zk.create(f"{zn.CONTROLLED_SHUTDOWN}/{broker_id}", b"", ephemeral=True)
        except NodeExistsError:
            pass
        self.settle()

    @precondition(lambda self: self.members)
    @rule(partitions=st.integers(1, 3), rf=st.integers(2, 3), unclean=st.booleans(),
          start=st.integers(0, 3))
    def create_topic(self, partitions, rf, unclean, start):
        live = sorted(self.members)
        rf = min(rf, len(live))
        self.count += 1
        name = f"t{self.count}"
        placed = assign([Candidate(b) for b in live], partitions, rf, start=start)
        assignment = zn.TopicAssignment(encode_topic_id(self.uuid.UUID(int=self.count)),
                                        dict(enumerate(placed)), {}, {})
        self.admin.create_topic(name, assignment, {
            "unclean.leader.election.enable": str(unclean).lower()})
        self.topics[name] = unclean
        self.settle()

    @precondition(lambda self: self.topics)
    @rule(data=st.data())
    def delete_topic(self, data):
        name = data.draw(st.sampled_from(sorted(self.topics)))
        self.admin.delete_topic(name)
        self.settle()

    @precondition(lambda self: self.seen)
    @rule(data=st.data())
    def leader_adds_a_caught_up_replica(self, data):
        """What a leader's replica manager does: a live follower back in the ISR, leader
        and leader epoch kept, at the version read."""
        topic, p = data.draw(st.sampled_from(sorted(self.seen)))
        try:
            raw, stat = self.zk.get(zn.partition_state_path(topic, p))
            replicas = zn.TopicAssignment.decode(self.zk.get(zn.topic_path(topic))[0]) \
                .partitions[p]
        except NoNodeError:
            return
        state = zn.PartitionState.decode(raw)
        behind = [b for b in replicas if b in self.members and b not in state.isr]
        if state.leader not in self.members or not behind:
            return
        new = zn.PartitionState(state.leader, state.leader_epoch, (*state.isr, behind[0]),
                                state.controller_epoch)
        self.zk.set(zn.partition_state_path(topic, p), new.encode(), version=stat.version)
        self.settle()

    def _controller(self):
        for member, _ in self.members.values():
            member.pass_once()
        for member, controller in self.members.values():
            if member.is_controller:
                return member, controller
        return None

    def settle(self):
        """The controller reacts (its watches would wake it): passes until nothing is left
        to write. What the step itself did is checked first."""
        self.partition_states_follow_the_rules()
        found = self._controller()
        if found is None:
            return
        _, controller = found
        for _ in range(PASSES):
            if not controller.pass_once():
                break
        else:
            raise AssertionError("the controller did not settle")
        self.check_settled(controller)

    @precondition(lambda self: len(self.members) >= 2)
    @rule()
    def controller_deposed_unaware(self):
        """Its /controller goes (its session ended while it was paused) and another broker
        wins a higher epoch before it looks again: its writes are refused by ZooKeeper."""
        found = self._controller()
        if found is None:
            return
        old, old_controller = found
        self.zk.delete(zn.CONTROLLER)
        for member, _ in self.members.values():
            if member is not old:
                member.pass_once()
                if member.is_controller:
                    break
        assert old.is_controller  # it has not looked since
        before = self.states()
        with pytest.raises(ControllerMoved):
            old.controller_transaction(lambda txn: txn.create("/zombie", b""))
        try:
            old_controller.pass_once()
        except ControllerMoved:
            pass
        assert self.zk.exists("/zombie") is None
        assert self.states() == before
        old.pass_once()
        assert not old.is_controller

    # --- what is checked -------------------------------------------------------------------

    def states(self) -> dict[tuple[str, int], tuple[bytes, int]]:
        out = {}
        for topic in self.zk.get_children(zn.BROKER_TOPICS):
            try:
                partitions = self.zk.get_children(zn.partitions_path(topic))
            except NoNodeError:
                continue
            for p in partitions:
                try:
                    data, stat = self.zk.get(zn.partition_state_path(topic, int(p)))
                except NoNodeError:
                    continue
                out[(topic, int(p))] = (data, stat.mzxid)
        return out

    def check_settled(self, controller: Controller):
        live = controller.live_brokers()
        shutting = controller.shutting_down()
        deleting = set(self.zk.get_children(zn.DELETE_TOPICS))
        assert not deleting, f"deletions left undone: {deleting}"
        for topic in controller.read_topics():
            unclean = self.topics[topic.name]
            for p, replicas in topic.assignment.partitions.items():
                found = topic.states.get(p)
                eligible = [b for b in replicas if b in live and b not in shutting]
                if found is None:
                    assert not eligible, f"{topic.name}-{p} has no state but could lead"
                    continue
                state = found[0]
                assert state.leader == zn.NO_LEADER or state.leader in live
                if state.leader == zn.NO_LEADER:
                    assert not [b for b in state.isr if b in eligible]
                    assert not (unclean and eligible)
                elif state.leader in shutting:
                    assert not [b for b in state.isr if b in eligible]
                else:
                    assert all(b in live and b not in shutting for b in state.isr)
        for name in list(self.topics):
            if self.zk.exists(zn.topic_path(name)) is None:
                del self.topics[name]

    @invariant()
    def partition_states_follow_the_rules(self):
        if not hasattr(self, "zk"):
            return
        now = {key: zn.PartitionState.decode(data) for key, (data, _) in self.states().items()}
        for key, state in now.items():
            assert state.leader == zn.NO_LEADER or state.leader in state.isr, (key, state)
            assert state.isr, (key, state)
            before = self.seen.get(key)
            if before is None:
                assert state.leader_epoch == 0
                continue
            assert state.leader_epoch >= before.leader_epoch, (key, before, state)
            if state.leader != before.leader:
                assert state.leader_epoch > before.leader_epoch, (key, before, state)
                if state.leader != zn.NO_LEADER and not self.topics.get(key[0], False):
                    assert state.leader in before.isr, ("unclean election", key, before, state)
        self.seen = now


@pytest.mark.timeout(240)
def test_controller_model(zookeeper):
    ControllerModel.zookeeper = zookeeper
    run = ControllerModel.TestCase
    run.settings = settings(max_examples=8, stateful_step_count=15, deadline=None,
                            suppress_health_check=[HealthCheck.too_slow])
    run().runTest()


def test_a_deposed_controllers_election_never_lands(zookeeper):
    """Broker 1 is controller (epoch 1); broker 2, leader of a partition, dies; before broker
    1 acts, its /controller goes (its session ended while it was paused) and broker 3 wins
    epoch 2. Broker 1's pass, which would elect a new leader, is refused by ZooKeeper (the
    epoch check in the same transaction): the state znode is untouched; broker 3's pass
    elects at leader_epoch 1 with its own controller epoch."""
    connect = zookeeper.chroot("deposed")
    observer = ZooKeeperStore(connect, SESSION_MS)
    members = {}
    try:
        for broker_id in (1, 2, 3):
            members[broker_id] = ClusterMember(ZooKeeperStore(connect, SESSION_MS), broker_id,
                                               None)
            members[broker_id].start("127.0.0.1", 9000 + broker_id, background=False)
        one, three = (Controller(members[b], lambda: False) for b in (1, 3))
        admin = TopicAdmin(observer)
        admin.ensure_paths()
        admin.create_topic("t", zn.TopicAssignment("AAAAAAAAAAAAAAAAAAAAAA", {0: (2, 1, 3)},
                                                   {}, {}), {})
        assert members[1].is_controller
        one.pass_once()
        path = zn.partition_state_path("t", 0)
        assert zn.PartitionState.decode(observer.client.get(path)[0]) == \
            zn.PartitionState(2, 0, (2, 1, 3), 1)
        members.pop(2).close()
        observer.client.delete(zn.CONTROLLER)
        members[3].pass_once()
        assert members[3].is_controller and members[3].controller.epoch == 2
        before = observer.client.get(path)
        with pytest.raises(ControllerMoved):
            one.pass_once()
        assert observer.client.get(path) == before
        three.pass_once()
        assert zn.PartitionState.decode(observer.client.get(path)[0]) == \
            zn.PartitionState(1, 1, (1, 3), 2)
    finally:
        for member in members.values():
            member.close()
        observer.close()


def test_config_change_notifications_are_purged(zookeeper):
    """/config/changes keeps the newest CONFIG_CHANGES_KEPT notifications (Kafka purges them
    by age); every broker's cache reads only those newer than the last it read."""
    from oncelog.cluster.controller import CONFIG_CHANGES_KEPT

    connect = zookeeper.chroot("purge")
    member = ClusterMember(ZooKeeperStore(connect, SESSION_MS), 1, None)
    try:
        member.start("127.0.0.1", 9001, background=False)
        TopicAdmin(member.store).ensure_paths()
        for _ in range(CONFIG_CHANGES_KEPT + 5):
            member.zk.create(f"{zn.CONFIG_CHANGES}/config_change_",
                             zn.encode_config_change("topics/t"), sequence=True)
        newest = sorted(member.zk.get_children(zn.CONFIG_CHANGES))[-CONFIG_CHANGES_KEPT:]
        Controller(member, lambda: False).pass_once()
        assert sorted(member.zk.get_children(zn.CONFIG_CHANGES)) == newest
    finally:
        member.close()


def test_auto_leader_rebalance(zookeeper):
    """Rows RB1-RB3 through the controller: broker 1 is the preferred replica of two
    partitions and leads neither (after a failover); with auto.leader.rebalance.enable and
    leader.imbalance.per.broker.percentage 10 the controller's check elects it back (P2,
    leader_epoch + 1); disabled, or at a percentage the imbalance does not pass, nothing
    moves."""
    connect = zookeeper.chroot("rebalance")
    member = ClusterMember(ZooKeeperStore(connect, SESSION_MS), 1, None)
    two = ClusterMember(ZooKeeperStore(connect, SESSION_MS), 2, None)
    try:
        member.start("127.0.0.1", 9001, background=False)
        two.start("127.0.0.1", 9002, background=False)
        client = member.zk
        admin = TopicAdmin(member.store)
        admin.ensure_paths()
        admin.create_topic("t", zn.TopicAssignment("AAAAAAAAAAAAAAAAAAAAAA",
                                                   {0: (1, 2), 1: (1, 2)}, {}, {}), {})
        Controller(member, lambda: False).pass_once()  # N1: broker 1 leads both
        for p in (0, 1):  # a failover to broker 2 (as F1 would write it), back in the ISR
            client.set(zn.partition_state_path("t", p),
                       zn.PartitionState(2, 1, (2, 1), 1).encode())

        def leaders() -> list[tuple[int, int]]:
            return [(s.leader, s.leader_epoch) for s in (zn.PartitionState.decode(
                client.get(zn.partition_state_path("t", p))[0]) for p in (0, 1))]

        for configs in ((False, 0, 10), (True, 0, 100), (True, 3600, 10)):
            Controller(member, lambda: False, lambda c=configs: c).pass_once()
            assert leaders() == [(2, 1), (2, 1)], configs  # RB1, RB3, not due yet
        controller = Controller(member, lambda: False, lambda: (True, 0, 10))
        controller.pass_once()
        # RB2: a preferred election each, of a live leader: asked to hand over first (H4)
        assert leaders() == [(2, 1), (2, 1)]
        for p in (0, 1):
            data, stat = client.get(zn.partition_state_path("t", p))
            state = zn.PartitionState.decode(data)
            assert (state.handover_for, state.handover_ready) == (zn.HANDOVER_PREFERRED, False)
            client.set(zn.partition_state_path("t", p), zn.PartitionState(  # as its leader
                2, 1, state.isr, state.controller_epoch, state.handover_for, True).encode(),
                version=stat.version)  # says once its ISR holds what it acknowledged (H7)
        controller.pass_once()  # H2: elected, the ask gone with the old state
        assert leaders() == [(1, 2), (1, 2)]
        assert not zn.PartitionState.decode(
            client.get(zn.partition_state_path("t", 0))[0]).handover_for
    finally:
        two.close()
        member.close()


def test_a_bounced_broker_is_out_of_every_isr_until_its_leader_adds_it_back(zookeeper):
    """Broker 3 killed and started again between two passes (its registration's czxid is
    newer: it may be back with a wiped disk): the next pass counts it dead, as Kafka's
    controller its bounced brokers, so it leaves every ISR (L1) and its leadership moves
    (F1); the pass after leaves it be, and once its leader has put it back in the ISR (as a
    replica manager does when it caught up) the controller keeps it there."""
    connect = zookeeper.chroot("bounce")
    members = {}
    try:
        for b in (1, 2, 3):
            members[b] = registered_member(connect, b, SESSION_MS)
        client = members[1].zk
        admin = TopicAdmin(members[1].store)
        admin.ensure_paths()
        admin.create_topic("t", zn.TopicAssignment("AAAAAAAAAAAAAAAAAAAAAA",
                                                   {0: (1, 2, 3), 1: (3, 1, 2)}, {}, {}), {})
        controller = Controller(members[1], lambda: False)

        def states() -> list[tuple[int, int, tuple[int, ...]]]:
            return [(s.leader, s.leader_epoch, s.isr) for s in (zn.PartitionState.decode(
                client.get(zn.partition_state_path("t", p))[0]) for p in (0, 1))]

        controller.pass_once()  # N1
        assert states() == [(1, 0, (1, 2, 3)), (3, 0, (3, 1, 2))]
        members[3].close()  # killed, and registered again before the next pass
        members[3] = registered_member(connect, 3, SESSION_MS)
        controller.pass_once()
        assert states() == [(1, 0, (1, 2)), (1, 1, (1, 2))]  # L1, F1
        controller.pass_once()
        assert states() == [(1, 0, (1, 2)), (1, 1, (1, 2))]
        client.set(zn.partition_state_path("t", 0), zn.PartitionState(1, 0, (1, 2, 3), 1)
                   .encode())  # caught up: its leader adds it back
        controller.pass_once()
        assert states() == [(1, 0, (1, 2, 3)), (1, 1, (1, 2))]
        # a broker seen dead by a pass and then back is no bounce: it stays as it is
        members[2].close()
        controller.pass_once()
        assert states() == [(1, 0, (1, 3)), (1, 1, (1,))]
        members[2] = registered_member(connect, 2, SESSION_MS)
        client.set(zn.partition_state_path("t", 0), zn.PartitionState(1, 0, (1, 3, 2), 1)
                   .encode())
        controller.pass_once()
        assert states()[0] == (1, 0, (1, 3, 2))
    finally:
        for member in members.values():
            member.close()


def test_a_bounce_an_election_request_finds_during_a_pass_is_not_forgotten(zookeeper):
    """Broker 3 bounces while a pass is under way, and an ElectLeaders request (on another
    thread) reads the brokers first and finds it: the pass's decisions, taken before, all
    land, yet the next pass still counts broker 3 dead and takes it out of the ISR."""
    connect = zookeeper.chroot("bounce-race")
    members = {}
    try:
        for b in (1, 2, 3):
            members[b] = registered_member(connect, b, SESSION_MS)
        client = members[1].zk
        admin = TopicAdmin(members[1].store)
        admin.ensure_paths()
        admin.create_topic("t", zn.TopicAssignment("AAAAAAAAAAAAAAAAAAAAAA",
                                                   {0: (1, 2, 3)}, {}, {}), {})

        class Interleaved(Controller):
            bounce_during_write = False

            def write(self, chosen):
                if self.bounce_during_write:
                    self.bounce_during_write = False
                    members[3].close()
                    members[3] = registered_member(connect, 3, SESSION_MS)
                    self.live_brokers()  # what elect() reads first, on its own thread
                return super().write(chosen)

        controller = Interleaved(members[1], lambda: False)
        controller.pass_once()  # N1
        controller.bounce_during_write = True
        controller.pass_once()  # nothing to decide; broker 3 bounces meanwhile

        def isr() -> tuple[int, ...]:
            return zn.PartitionState.decode(client.get(zn.partition_state_path("t", 0))[0]).isr

        assert isr() == (1, 2, 3)
        controller.pass_once()
        assert isr() == (1, 2)  # L1: counted dead by the pass after the one it bounced in
    finally:
        for member in members.values():
            member.close()


def test_isr_change_notifications_do_not_pile_up(zookeeper):
    """Leaders write Kafka's ``/isr_change_notification/isr_change_<seq>`` with each ISR
    change; Kafka's controller deletes them once read. Before, nothing deleted them: one
    znode per ISR change, kept in ZooKeeper for as long as the cluster ran."""
    connect = zookeeper.chroot("isr-notes")
    member = registered_member(connect, 1, SESSION_MS)
    try:
        client = member.zk
        TopicAdmin(member.store).ensure_paths()
        controller = Controller(member, lambda: False)
        controller.pass_once()  # none yet: nothing to delete, nothing fails
        for _ in range(3):
            client.create("/isr_change_notification/isr_change_", b'{"version":1,'
                          b'"partitions":[{"topic":"t","partition":0}]}', sequence=True,
                          makepath=True)
        controller.pass_once()
        assert client.get_children("/isr_change_notification") == []
    finally:
        member.close()
