"""The membership tables of cluster/membership.py (R1-R3, E1-E3, V1-V4) held by a model-based test:
brokers (ClusterMembers in this process, each with its own session on the real ZooKeeper)
join, make passes, die, and have their sessions expired by ZooKeeper itself, in any order;
after every step ZooKeeper and each broker's view agree with a model of who is registered,
who is controller and at which epoch."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from oncelog.cluster import znodes as zn
from oncelog.cluster.membership import (
    NO_CONTROLLER,
    ClusterMember,
    ControllerMoved,
    Standing,
    standing_step,
)
from oncelog.metadata.zookeeper import ZooKeeperStore

SESSION_MS = 4000
BROKER_IDS = st.integers(1, 3)
RECONNECT_TIMEOUT = 15.0


def expire_session(connect: str, client: KazooClient) -> None:
    """ZooKeeper expires a session when another connection takes it over and closes it: the
    server deletes its ephemeral znodes and tells the first client its session is gone."""
    twin = KazooClient(hosts=connect, client_id=client.client_id, timeout=SESSION_MS / 1000)
    twin.start(timeout=RECONNECT_TIMEOUT)
    twin.stop()
    twin.close()


class Membership(RuleBasedStateMachine):
    zookeeper = None  # the session's server, set by the test

    @initialize()
    def fresh_cluster(self):
        self.connect = self.zookeeper.chroot("model")
        self.zk = ZooKeeperStore(self.connect, SESSION_MS)  # the observer
        self.members: dict[int, ClusterMember] = {}
        self.registered: set[int] = set()  # the model
        self.controller: int | None = None
        self.epoch = zn.INITIAL_CONTROLLER_EPOCH
        self.winners: dict[int, int] = {}  # epoch -> the broker that won it
        self.writes = 0
        self.zk.client.ensure_path("/fenced")

    def teardown(self):
        for member in self.members.values():
            member.close()
        if hasattr(self, "zk"):
            self.zk.close()

    @rule(broker_id=BROKER_IDS)
    def join(self, broker_id):
        if broker_id in self.members:
            return
        member = ClusterMember(ZooKeeperStore(self.connect, SESSION_MS), broker_id, None)
        member.start("127.0.0.1", 9000 + broker_id, background=False)
        self.members[broker_id] = member
        self._passed(broker_id)

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def make_a_pass(self, data):
        broker_id = data.draw(st.sampled_from(sorted(self.members)))
        self.members[broker_id].pass_once()
        self._passed(broker_id)

    def _passed(self, broker_id):
        self.registered.add(broker_id)  # R1 (or R2: already)
        if self.controller is None:  # E1 won: nobody else claimed in between
            self.controller = broker_id
            self.epoch += 1
            self.winners[self.epoch] = broker_id

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def die(self, data):
        broker_id = data.draw(st.sampled_from(sorted(self.members)))
        self.members.pop(broker_id).close()
        self._gone(broker_id)

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def session_expires(self, data):
        broker_id = data.draw(st.sampled_from(sorted(self.members)))
        member = self.members[broker_id]
        old = member.zk.client_id[0]
        expire_session(self.connect, member.zk)
        deadline = time.monotonic() + RECONNECT_TIMEOUT
        while not (member.zk.connected and member.zk.client_id[0] != old):
            assert time.monotonic() < deadline, "no new session after the expiry"
            time.sleep(0.01)
        self._gone(broker_id)

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def write_as_controller(self, data):
        """Only the model's controller writes; everyone else is refused, nothing written."""
        broker_id = data.draw(st.sampled_from(sorted(self.members)))
        self.writes += 1
        path = f"/fenced/{self.writes}"
        write = lambda txn: txn.create(path, b"")  # noqa: E731
        if broker_id == self.controller:
            self.members[broker_id].controller_transaction(write)
            assert self.zk.client.exists(path) is not None
        else:
            with pytest.raises(ControllerMoved):
                self.members[broker_id].controller_transaction(write)
            assert self.zk.client.exists(path) is None

    def _gone(self, broker_id):
        self.registered.discard(broker_id)
        if self.controller == broker_id:
            self.controller = None

    @invariant()
    def zookeeper_holds_the_model(self):
        if not hasattr(self, "zk"):
            return
        client = self.zk.client
        assert sorted(self.zk.children(zn.BROKER_IDS)) == sorted(map(str, self.registered))
        try:
            data, _ = client.get(zn.CONTROLLER)
            controller = zn.decode_controller(data)
        except NoNodeError:
            controller = None
        assert controller == self.controller
        try:
            epoch = zn.decode_epoch(client.get(zn.CONTROLLER_EPOCH)[0])
        except NoNodeError:
            epoch = zn.INITIAL_CONTROLLER_EPOCH
        assert epoch == self.epoch

    @invariant()
    def a_broker_vouches_while_registered_by_its_session(self):
        """The standing table on a connected session: V1 once registered, V4 from an
        expiry until the pass that registers it again."""
        for broker_id, member in self.members.items():
            assert member.vouches == (broker_id in self.registered), broker_id
            # V3 never turns on a member whose heartbeat ZooKeeper answers, however long
            # the steps between its passes take
            assert (member.vouch_left_s() > 0) == member.vouches, broker_id

    @invariant()
    def one_broker_believes_it_is_controller(self):
        if not hasattr(self, "zk"):
            return
        believers = [b for b, m in self.members.items() if m.is_controller]
        assert believers == ([] if self.controller is None else [self.controller])
        for member in self.members.values():
            view = member.controller
            # A view may be stale (a dead controller, until the next pass), never ahead, and
            # it never pairs an epoch with a broker that did not win it: a broker that wins
            # again (epoch 3 after epoch 1) may still be seen at its older epoch by another.
            assert view.epoch <= self.epoch
            if view.controller_id != NO_CONTROLLER:
                assert view.controller_id == self.winners.get(view.epoch)


@pytest.mark.timeout(240)
def test_membership_model(zookeeper):
    Membership.zookeeper = zookeeper
    run = Membership.TestCase
    run.settings = settings(max_examples=12, stateful_step_count=10, deadline=None,
                            suppress_health_check=[HealthCheck.too_slow])
    run().runTest()


def test_a_deposed_controller_that_does_not_know_it_is_fenced(zookeeper):
    """Broker 1 wins epoch 1; its /controller goes (as when its session ends while it is
    paused) and broker 2 wins epoch 2 before broker 1 looks again. Broker 1 still believes it
    is controller, and its write is refused by ZooKeeper (the epoch check), not by belief."""
    connect = zookeeper.chroot("zombie")
    observer = ZooKeeperStore(connect, SESSION_MS)
    one = ClusterMember(ZooKeeperStore(connect, SESSION_MS), 1, None)
    two = ClusterMember(ZooKeeperStore(connect, SESSION_MS), 2, None)
    try:
        one.start("127.0.0.1", 9001, background=False)
        two.start("127.0.0.1", 9002, background=False)
        assert one.is_controller and one.controller.epoch == 1 and not two.is_controller
        observer.client.delete(zn.CONTROLLER)
        two.pass_once()
        assert two.is_controller and two.controller.epoch == 2
        assert one.is_controller  # it has not looked since
        with pytest.raises(ControllerMoved):
            one.controller_transaction(lambda txn: txn.create("/zombie-write", b""))
        assert observer.client.exists("/zombie-write") is None
        two.controller_transaction(lambda txn: txn.create("/controller-write", b""))
        assert observer.client.exists("/controller-write") is not None
        one.pass_once()
        assert not one.is_controller and one.controller.epoch == 2
    finally:
        for store in (one.store, two.store, observer):
            store.close()


@given(st.one_of(st.none(), st.integers(1, 3)), st.one_of(st.none(), st.integers(1, 3)),
       st.integers(0, 5000), st.integers(1000, 4000))
def test_standing_table(registered_session, our_session, silent_ms, timeout_ms):
    """``our_session`` None: disconnected, kazoo names no session then; ``silent_ms``: since
    the latest request ZooKeeper answered was sent."""
    standing = standing_step(registered_session, our_session, silent_ms, timeout_ms)
    if registered_session is None or our_session not in (None, registered_session):
        assert standing is Standing.FENCED  # V4: expired, or not registered again yet
    elif 2 * silent_ms > timeout_ms:
        # V3: ZooKeeper may expire the session at a full timeout of silence; fenced with
        # at least half of it to spare, connected as kazoo believes or not
        assert standing is Standing.FENCED
    else:
        assert standing is Standing.VOUCH  # V1, V2


def test_a_broker_zookeeper_does_not_answer_stops_vouching_while_kazoo_is_connected(zookeeper):
    """V3 counts from the latest answered request, not from kazoo noticing a lost connection:
    with its heartbeat stopped and no pass made, a registered broker stops vouching once half
    its session timeout has gone by, though kazoo still says connected (its own pings are
    answered); a pass answered vouches again. A broker whose heartbeat runs never stops."""
    session_ms = 1000
    connect = zookeeper.chroot("silent")
    quiet = ClusterMember(ZooKeeperStore(connect, session_ms), 1, None)
    beating = ClusterMember(ZooKeeperStore(connect, session_ms), 2, None)
    try:
        quiet.start("127.0.0.1", 9001, background=False)
        beating.start("127.0.0.1", 9002, background=False)
        quiet.heartbeat.close()
        assert quiet.vouches and beating.vouches
        deadline = time.monotonic() + 10 * session_ms / 1000
        while quiet.vouches:
            assert time.monotonic() < deadline, "still vouching with nothing answered"
            assert beating.vouches  # its heartbeat keeps it in V1
            time.sleep(0.01)
        assert quiet.standing() is Standing.FENCED and quiet.vouch_left_s() == 0
        assert quiet.zk.connected
        assert beating.vouches
        quiet.pass_once()
        assert quiet.vouches
    finally:
        quiet.close()
        beating.close()
