"""KIP-848's online migration (group_migration.py, rows M1-M9) against a model (hypothesis
stateful): members of both protocols join, heartbeat, rejoin, commit and leave one group,
interleaved, under each ``group.consumer.migration.policy``, with restarts (a new coordinator
loading the same log, tests/coordinator/test_group_model.py's ModelLog).

The model says what kind the group is (none, classic, consumer), who its members are and
which protocol each speaks, what is committed, and which requests are refused: a
consumer-protocol member joining a classic group with members upgrades it when the policy
allows and the group fits group.consumer.max.size (else GROUP_ID_NOT_FOUND); a classic
member joining a consumer group with members becomes a classic member of it (refused under
``disabled``); the last consumer-protocol member leaving, with classic members left,
downgrades it when the policy allows. After every step the coordinator's group is the
model's, committed offsets are the model's, and no partition is held by two clients (what
each client was last given, as a client holds it).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kio.schema.consumer_protocol_assignment.v0.data import (
    TopicPartition as OwnedPartitionsAssignment,
)
from kio.schema.consumer_protocol_subscription.v1.data import TopicPartition as OwnedPartitions
from kio.schema.errors import ErrorCode as E
from support.group_model_helpers import ModelLog

from oncelog.coordinator.group.consumer_group import (
    ConsumerGroup,
    ConsumerGroupConfig,
    HeartbeatRequest,
)
from oncelog.coordinator.group.group_coordinator import (
    GroupConfig,
    GroupCoordinator,
    OffsetCommitPartition,
)
from oncelog.coordinator.group.group_migration import POLICIES
from oncelog.protocol import consumer_protocol as cp

G = "g"
TOPIC_ID = uuid.UUID(int=7)
PARTITIONS = 4
LONG_MS = 60_000  # no session or rebalance timer fires within a test
MAX_SIZE = 3  # group.consumer.max.size and group.max.size: the size checks are reached


@dataclass
class Client:
    protocol: str  # "classic" or "consumer"
    generation: int = -1  # the classic generation or member epoch it was last given
    held: frozenset[int] = frozenset()  # the partitions it consumes


@dataclass
class Model:
    kind: str | None = None  # None, "classic", "consumer"
    clients: dict[str, Client] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)


class MigrationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.log = ModelLog()
        self.m = Model()
        self.policy = "bidirectional"
        self.names = 0
        self.c: GroupCoordinator | None = None

    @initialize(policy=st.sampled_from(["bidirectional", *POLICIES]))  # Kafka 4's, twice
    def start(self, policy):
        self.policy = policy
        self.c = self._start()

    def _start(self) -> GroupCoordinator:
        c = GroupCoordinator(
            self.log, GroupConfig(num_partitions=1, initial_rebalance_delay_ms=0,
                                  max_size=MAX_SIZE),
            lambda t, p: t == "t" and 0 <= p < PARTITIONS,
            consumer_config=ConsumerGroupConfig(session_timeout_ms=LONG_MS,
                                                max_size=MAX_SIZE,
                                                migration_policy=self.policy),
            topic_image={"t": (TOPIC_ID, PARTITIONS)})
        self.run(c.load_all())
        return c

    def teardown(self) -> None:
        if self.c is not None:
            self.c.close()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()

    def run(self, coro):
        return self.loop.run_until_complete(asyncio.wait_for(coro, 5))

    def now(self, call):
        async def made():
            return call()
        return self.run(made())

    # --- what a client sends ------------------------------------------------------------

    @staticmethod
    def _subscription(held: frozenset[int]) -> bytes:
        owned = (OwnedPartitions(topic="t", partitions=tuple(sorted(held))),) if held else ()
        return cp.write_subscription(1, topics=("t",), user_data=None, owned_partitions=owned)

    def _protocols(self, held: frozenset[int]):
        return [("cooperative-sticky", self._subscription(held))]

    def _group(self):
        return self.c.groups.get(G)

    def _is_consumer_group(self) -> bool:
        return isinstance(self._group(), ConsumerGroup)

    # --- a classic group's rebalance, driven to its end -----------------------------------

    def _classic_rebalance(self, newcomer: str | None = None) -> str | None:
        """Every classic member (and a newcomer) joins at once, the leader assigns, all
        sync: the generation every client then holds. Returns the newcomer's member id."""
        m = self.m
        ids = [x for x, cl in m.clients.items() if cl.protocol == "classic"]
        for x in ids:
            m.clients[x].held = frozenset()  # an eager rejoin gives everything up

        async def rebalance():
            # The newcomer first: the others' rejoins then complete one rebalance.
            joins = [self.c.join(G, x, None, "cl", "/h", LONG_MS, LONG_MS, "consumer",
                                 self._protocols(frozenset()), False, True) for x in ids]
            if newcomer is not None:
                joins.insert(0, self.c.join(G, "", None, newcomer, "/h", LONG_MS, LONG_MS,
                                            "consumer", self._protocols(frozenset()), False,
                                            True))
            return await asyncio.gather(*joins)

        answers = self.run(rebalance())
        assert all(a.error is E.none for a in answers), answers
        generation = answers[0].generation
        assert {a.generation for a in answers} == {generation}
        members = [a.member_id for a in answers]
        leader = answers[0].leader
        assert leader in members
        split = {x: frozenset(p for p in range(PARTITIONS) if p % len(members) == i)
                 for i, x in enumerate(members)}
        assignments = [(x, cp.write_assignment(0, assigned_partitions=(
            OwnedPartitionsAssignment(topic="t", partitions=tuple(sorted(ps))),),
            user_data=None)) for x, ps in split.items()]

        async def sync():
            first = await self.c.sync(G, generation, leader, None, "consumer",
                                      "cooperative-sticky", assignments)
            rest = [await self.c.sync(G, generation, x, None, "consumer",
                                      "cooperative-sticky", []) for x in members
                    if x != leader]
            return [first, *rest]

        for answer in self.run(sync()):
            assert answer.error is E.none, answer
        new_id = members[0] if newcomer is not None else None
        if new_id is not None:
            m.clients[new_id] = Client("classic")
        for x in members:
            m.clients[x].generation = generation
            m.clients[x].held = split[x]
        m.kind = "classic"
        return new_id

    # --- a classic member of a consumer group ---------------------------------------------

    def _classic_join_consumer_group(self, member_id: str) -> E:
        """JoinGroup then SyncGroup, as a cooperative client: it drops what the SyncGroup
        no longer gives it."""
        client = self.m.clients.get(member_id) or Client("classic")
        joined = self.run(self.c.join(G, member_id, None, "cl", "/h", LONG_MS, LONG_MS,
                                      "consumer", self._protocols(client.held), False, True))
        if joined.error is not E.none:
            return joined.error
        assert joined.leader == "" and joined.protocol == "cooperative-sticky"
        self.m.clients.setdefault(joined.member_id, client)
        client.generation = joined.generation
        synced = self.run(self.c.sync(G, joined.generation, joined.member_id, None,
                                      "consumer", "cooperative-sticky", []))
        if synced.error is E.none:
            client.held = frozenset(p for _, p in cp.assigned_partitions(synced.assignment))
        else:
            assert synced.error is E.rebalance_in_progress, synced
        return E.none

    # --- rules ----------------------------------------------------------------------------

    @precondition(lambda self: len(self.m.clients) < MAX_SIZE + 1)
    @rule()
    def a_classic_member_joins(self):
        m = self.m
        group = self._group()
        if isinstance(group, ConsumerGroup) and group.members:
            before = set(group.members)
            error = self._classic_join_consumer_group("")  # M4 not asked: v3 and older
            if self.policy == "disabled":
                assert error is E.inconsistent_group_protocol  # M3 (KAFKA-20640)
            elif len(before) >= MAX_SIZE:
                assert error is E.group_max_size_reached  # M3
            else:
                assert error is E.none
                assert len(set(self._group().members) - before) == 1
            return
        if sum(1 for cl in m.clients.values() if cl.protocol == "classic") >= MAX_SIZE:
            return  # group.max.size: Kafka's classic rule, held by test_group_model.py
        self._classic_rebalance(newcomer=f"cl{self.names}")
        self.names += 1

    @precondition(lambda self: len(self.m.clients) < MAX_SIZE + 1)
    @rule()
    def a_consumer_member_joins(self):
        m = self.m
        member_id = f"k{self.names}"
        self.names += 1
        answer = self.run(self.c.consumer_groups.heartbeat(HeartbeatRequest(
            G, member_id, 0, rebalance_timeout_ms=LONG_MS, subscribed_topic_names=("t",),
            owned={})))
        classic_members = [x for x, cl in m.clients.items() if cl.protocol == "classic"]
        if m.kind == "classic" and classic_members:
            if self.policy not in ("upgrade", "bidirectional"):
                assert answer.error is E.group_id_not_found  # M2
                return
            if len(classic_members) >= MAX_SIZE:  # M1 allows it, K6 then refuses it
                assert answer.error is E.group_max_size_reached
                return
        elif m.kind == "consumer" and len(m.clients) >= MAX_SIZE:
            assert answer.error is E.group_max_size_reached  # K6
            return
        assert answer.error is E.none, answer
        if m.kind == "classic" and classic_members:
            event("upgraded")
        m.kind = "consumer"
        m.clients[member_id] = Client("consumer", answer.member_epoch,
                                      frozenset(answer.assignment.get(TOPIC_ID, ()))
                                      if answer.assignment else frozenset())

    @precondition(lambda self: any(cl.protocol == "consumer" for cl in self.m.clients.values()))
    @rule(data=st.data())
    def a_consumer_member_heartbeats(self, data):
        m = self.m
        member_id = data.draw(st.sampled_from(
            sorted(x for x, cl in m.clients.items() if cl.protocol == "consumer")))
        client = m.clients[member_id]
        answer = self.run(self.c.consumer_groups.heartbeat(HeartbeatRequest(
            G, member_id, client.generation,
            owned={TOPIC_ID: client.held} if client.held else {})))
        assert answer.error is E.none, answer
        client.generation = answer.member_epoch
        if answer.assignment is not None:
            client.held = frozenset(answer.assignment.get(TOPIC_ID, ()))

    @precondition(lambda self: self._is_consumer_group() and any(
        cl.protocol == "classic" for cl in self.m.clients.values()))
    @rule(data=st.data())
    def a_classic_member_heartbeats_and_rejoins_when_told(self, data):
        m = self.m
        member_id = data.draw(st.sampled_from(
            sorted(x for x, cl in m.clients.items() if cl.protocol == "classic")))
        client = m.clients[member_id]
        error = self.now(lambda: self.c.heartbeat(G, client.generation, member_id, None))
        group = self._group()
        member = group.members[member_id]
        rejoin = member.member_epoch < group.group_epoch or member.state.value == 1 or (
            member.state.value == 2 and not _waiting(group, member))
        assert error is (E.rebalance_in_progress if rejoin else E.none)  # M7
        if rejoin:
            event("a classic member of a consumer group rejoined")
            assert self._classic_join_consumer_group(member_id) is E.none  # M5

    @precondition(lambda self: self.m.clients)
    @rule(data=st.data())
    def a_member_leaves(self, data):
        self._leave(data.draw(st.sampled_from(sorted(self.m.clients))))

    @precondition(lambda self: any(cl.protocol == "consumer" for cl in self.m.clients.values())
                  and any(cl.protocol == "classic" for cl in self.m.clients.values()))
    @rule(data=st.data())
    def a_consumer_member_of_a_mixed_group_leaves(self, data):
        self._leave(data.draw(st.sampled_from(
            sorted(x for x, cl in self.m.clients.items() if cl.protocol == "consumer"))))

    def _leave(self, member_id: str) -> None:
        m = self.m
        client = m.clients.pop(member_id)
        others_classic = [x for x, cl in m.clients.items() if cl.protocol == "classic"]
        if client.protocol == "consumer":
            answer = self.run(self.c.consumer_groups.heartbeat(HeartbeatRequest(
                G, member_id, -1)))
            assert answer.error is E.none, answer
            everyone_classic = all(cl.protocol == "classic" for cl in m.clients.values())
            if m.clients and everyone_classic and self.policy in ("downgrade",
                                                                  "bidirectional"):
                group = self._group()  # M9: downgraded, rebalancing
                assert not isinstance(group, ConsumerGroup)
                assert group.state.value == "PreparingRebalance"
                event("downgraded")
                self._classic_rebalance()
        else:
            assert self.now(lambda: self.c.leave(G, [(member_id, None)])) == (E.none,
                                                                              [E.none])
            if m.kind == "classic" and others_classic:
                self._classic_rebalance()

    @precondition(lambda self: self.m.clients)
    @rule(data=st.data(), partition=st.integers(0, PARTITIONS - 1), offset=st.integers(0, 99))
    def a_member_commits(self, data, partition, offset):
        m = self.m
        member_id = data.draw(st.sampled_from(sorted(m.clients)))
        client = m.clients[member_id]
        errors = self.run(self.c.commit(G, client.generation, member_id, None, -1,
                                        [OffsetCommitPartition("t", partition, offset, -1,
                                                               "")]))
        assert errors == [E.none], (errors, member_id, client)
        m.committed[partition] = offset

    @rule()
    def the_broker_restarts(self):
        self.c.close()
        self.c = self._start()

    # --- what must hold -------------------------------------------------------------------

    @invariant()
    def the_group_is_the_models(self):
        if self.c is None:
            return
        m = self.m
        group = self._group()
        members = dict(group.members) if group is not None else {}
        assert set(members) == set(m.clients), (members.keys(), m.clients.keys())
        if m.clients:
            assert isinstance(group, ConsumerGroup) == (m.kind == "consumer"), m.kind
        if isinstance(group, ConsumerGroup):
            for x, member in members.items():
                assert (member.classic is not None) == (m.clients[x].protocol == "classic")
        offsets = group.offsets if group is not None else {}
        assert {p: v.offset for (_, p), v in offsets.items()} == m.committed

    @invariant()
    def no_partition_is_held_twice(self):
        seen: set[int] = set()
        for client in self.m.clients.values():
            assert not seen & client.held, self.m.clients
            seen |= client.held


def _waiting(group: ConsumerGroup, member) -> bool:
    for topic_id, partitions in group.target.get(member.member_id, {}).items():
        for p in partitions - member.assigned.get(topic_id, frozenset()):
            if group.owners.get((topic_id, p)) not in (None, member.member_id):
                return True
    return False

MigrationMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30,
                                              deadline=None)
test_online_migration_follows_kafkas_rules = MigrationMachine.TestCase


def test_a_static_classic_member_of_a_consumer_group_is_fenced_or_replaced():
    """M4's static rows: a JoinGroup naming another member id for a held instance is
    FENCED_INSTANCE_ID; a restarted instance (no member id) takes the old id's place and
    partitions, as in a classic group."""
    machine = MigrationMachine()
    try:
        machine.start("bidirectional")
        c = machine.c
        answer = machine.run(c.consumer_groups.heartbeat(HeartbeatRequest(
            G, "k", 0, rebalance_timeout_ms=LONG_MS, subscribed_topic_names=("t",), owned={})))
        assert answer.error is E.none

        def join(member_id: str):
            return machine.run(c.join(G, member_id, "instance", "cl", "/h", LONG_MS, LONG_MS,
                                      "consumer", machine._protocols(frozenset()), False,
                                      True))

        first = join("")
        assert first.error is E.none
        # "k" gives up the classic member's share; the classic member rejoins for it.
        owned = answer.assignment
        for _ in range(2):
            answer = machine.run(c.consumer_groups.heartbeat(HeartbeatRequest(
                G, "k", answer.member_epoch, owned=owned)))
            owned = answer.assignment if answer.assignment is not None else owned
        assert join(first.member_id).error is E.none
        group = machine._group()
        held = group.members[first.member_id]
        assert held.classic is not None and held.instance_id == "instance" and held.assigned
        assert join("someone-else").error is E.fenced_instance_id
        again = join("")
        assert again.error is E.none and again.member_id != first.member_id
        group = machine._group()
        assert first.member_id not in group.members
        assert group.members[again.member_id].instance_id == "instance"
        assert group.members[again.member_id].assigned == held.assigned, (group, held)
        # A restart reads the replacement back.
        c.close()
        machine.c = machine._start()
        assert set(machine._group().members) == {"k", again.member_id}
    finally:
        machine.teardown()


def test_a_classic_member_told_to_rejoin_that_does_not_is_removed():
    """M7's join timer: a classic member of a consumer group answered REBALANCE_IN_PROGRESS
    that keeps heartbeating without rejoining is removed after its rebalance timeout (it
    would otherwise hold partitions others wait for); one that rejoins stays."""
    machine = MigrationMachine()
    try:
        machine.start("bidirectional")
        c = machine.c
        machine.run(c.consumer_groups.heartbeat(HeartbeatRequest(
            G, "k", 0, rebalance_timeout_ms=LONG_MS, subscribed_topic_names=("t",), owned={})))

        def join(member_id: str):
            return machine.run(c.join(G, member_id, None, "cl", "/h", LONG_MS, 50, "consumer",
                                      machine._protocols(frozenset()), False, True))

        stays, goes = join(""), join("")
        # The consumer-protocol member changes its subscription: the group epoch moves past
        # both.
        epoch = machine._group().members["k"].member_epoch
        answer = machine.run(c.consumer_groups.heartbeat(HeartbeatRequest(
            G, "k", epoch, subscribed_topic_names=("t", "u"))))
        assert answer.error is E.none
        for joined in (stays, goes):
            assert machine.now(lambda j=joined: c.heartbeat(G, j.generation, j.member_id,
                                                            None)) is E.rebalance_in_progress
        assert join(stays.member_id).error is E.none

        async def until_removed():
            while goes.member_id in machine._group().members:
                await asyncio.sleep(0.01)

        machine.run(until_removed())  # bounded by run's 5 s
        assert stays.member_id in machine._group().members
    finally:
        machine.teardown()


def test_an_upgrade_during_a_classic_rebalance_tells_the_waiting_members_to_rejoin():
    """M1 on a classic group in PreparingRebalance: the waiting JoinGroup is answered
    REBALANCE_IN_PROGRESS, and the member rejoins as a classic member of the consumer group
    from the generation it had."""
    machine = MigrationMachine()
    try:
        machine.start("bidirectional")
        c = machine.c
        first = machine._classic_rebalance(newcomer="cl")
        generation = machine.m.clients[first].generation

        async def upgrade_while_waiting():
            waiting = asyncio.ensure_future(c.join(
                G, "", None, "cl2", "/h", LONG_MS, LONG_MS, "consumer",
                machine._protocols(frozenset()), False, True))
            for _ in range(5):
                await asyncio.sleep(0)
            assert machine._group().state.value == "PreparingRebalance"
            answer = await c.consumer_groups.heartbeat(HeartbeatRequest(
                G, "k", 0, rebalance_timeout_ms=LONG_MS, subscribed_topic_names=("t",),
                owned={}))
            return answer, await waiting

        answer, waited = machine.run(upgrade_while_waiting())
        assert answer.error is E.none and waited.error is E.rebalance_in_progress
        group = machine._group()
        # The joining member is one of the converted group's classic members, told its id.
        assert isinstance(group, ConsumerGroup)
        assert set(group.members) == {first, waited.member_id, "k"}
        assert group.members[first].member_epoch == generation
        machine.m.clients[waited.member_id] = Client("classic")
        for member_id in (first, waited.member_id):
            assert machine._classic_join_consumer_group(member_id) is E.none
    finally:
        machine.teardown()


def test_a_consumer_member_whose_session_ends_downgrades_the_group():
    """M9 from a timer: the consumer-protocol member's session ends (its process died), the
    classic member is left: the group is classic again, rebalancing, and a restart reads it
    back classic."""
    machine = MigrationMachine()
    try:
        machine.start("bidirectional")
        machine.c.close()
        machine.c = c = GroupCoordinator(
            machine.log, GroupConfig(num_partitions=1, initial_rebalance_delay_ms=0),
            lambda t, p: t == "t" and 0 <= p < PARTITIONS,
            consumer_config=ConsumerGroupConfig(session_timeout_ms=50),
            topic_image={"t": (TOPIC_ID, PARTITIONS)})
        machine.run(c.load_all())
        classic = machine._classic_rebalance(newcomer="cl")
        answer = machine.run(c.consumer_groups.heartbeat(HeartbeatRequest(
            G, "k", 0, rebalance_timeout_ms=LONG_MS, subscribed_topic_names=("t",), owned={})))
        assert answer.error is E.none and machine._is_consumer_group()

        async def until_classic():
            while machine._is_consumer_group():
                await asyncio.sleep(0.01)

        machine.run(until_classic())  # bounded by run's 5 s
        group = machine._group()
        assert list(group.members) == [classic] and group.state.value == "PreparingRebalance"
        c.close()
        machine.c = machine._start()
        assert not machine._is_consumer_group() and list(machine._group().members) == [classic]
    finally:
        machine.teardown()
