"""The consumer group protocol's decisions (coordinator/consumer_group.py), without I/O.

A model of clients drives one group through random joins, heartbeats (some of whose answers
are lost), leaves, session expiries, new topics and restarts (the group rebuilt from its
records' bytes). Throughout, no partition is held by two live clients at once; at the end,
after a few quiet rounds, every member holds exactly its target and the group is Stable.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from oncelog.coordinator.group import consumer_group as cg
from oncelog.coordinator.group import consumer_records as cr
from oncelog.coordinator.group.consumer_coordinator import ConsumerGroupCoordinator
from oncelog.coordinator.group.consumer_group import ConsumerGroupConfig, HeartbeatRequest, Refusal

E = ErrorCode
T1, T2, T3 = (uuid.UUID(int=i) for i in (1, 2, 3))
CFG = ConsumerGroupConfig(session_timeout_ms=45_000, heartbeat_interval_ms=5_000)


@dataclass
class Client:
    member_id: str
    topics: tuple[str, ...]
    regex: str | None = None
    epoch: int = 0
    owned: dict = field(default_factory=dict)
    zombie: bool = False  # the coordinator removed it; it does not know yet


class Driver:
    """The coordinator's part, synchronously: plan, write (as bytes), replay."""

    def __init__(self, image: dict) -> None:
        self.image = image
        self.group: cg.ConsumerGroup | None = None
        self.log: list[tuple[bytes, bytes | None]] = []
        self.now = 0

    def apply(self, plan: cg.HeartbeatPlan) -> None:
        if self.group is None:
            self.group = cg.ConsumerGroup("g")
        for record in plan.records:
            key, value = cr.to_bytes(record)
            self.log.append((key, value))
            # What is replayed is what is read back: the bytes round trip.
            assert cr.from_bytes(key, value) == record
            self.group.replay(record)
        if plan.resolved_regexes is not None:
            self.group.resolved_regexes = plan.resolved_regexes
            self.group.regexes_resolved_at = (self.now, len(self.image))

    def heartbeat(self, req: HeartbeatRequest) -> cg.HeartbeatPlan:
        cg.validate(req, CFG)
        plan = cg.heartbeat(self.group, req, self.image, CFG, self.now)
        self.apply(plan)
        return plan

    def expire(self, member_id: str) -> None:
        member = self.group.members[member_id]
        self.apply(cg.HeartbeatPlan(cg.fence_records(self.group, member, self.image),
                                    member_id, -1, 0))

    def restart(self) -> None:
        rebuilt = ConsumerGroupCoordinator.rebuild(self.log, self.now, 0).get("g")
        live = self.group
        if live is None or (not live.members and not live.group_epoch):
            assert rebuilt is None or not rebuilt.members
        else:
            assert rebuilt is not None
            assert rebuilt.group_epoch == live.group_epoch
            assert rebuilt.assignment_epoch == live.assignment_epoch
            assert rebuilt.members == live.members
            assert rebuilt.target == live.target
            assert rebuilt.subscription_metadata == live.subscription_metadata
            assert rebuilt.owners == live.owners
        self.group = rebuilt


def request(c: Client, full: bool) -> HeartbeatRequest:
    joining = c.epoch == 0
    return HeartbeatRequest(
        "g", c.member_id, c.epoch,
        rebalance_timeout_ms=30_000 if joining or full else -1,
        subscribed_topic_names=c.topics if joining or full else None,
        subscribed_topic_regex=c.regex if joining or full else None,
        owned={} if joining else ({t: frozenset(ps) for t, ps in c.owned.items()}
                                   if full else None))


def beat(driver: Driver, c: Client, full: bool = False, lose: bool = False) -> None:
    try:
        plan = driver.heartbeat(request(c, full))
    except Refusal as exc:
        assert exc.error in (E.fenced_member_epoch, E.unknown_member_id), exc.message
        c.epoch, c.owned, c.zombie = 0, {}, False  # give up everything, rejoin
        return
    if lose:
        return
    c.epoch = plan.member_epoch
    if plan.assignment is not None:
        c.owned = {t: set(ps) for t, ps in plan.assignment.items() if ps}


def check_no_double_ownership(clients: dict[str, Client]) -> None:
    seen = {}
    for c in clients.values():
        if c.zombie:
            continue
        for t, ps in c.owned.items():
            for p in ps:
                assert (t, p) not in seen, f"{t}-{p} held by {seen[t, p]} and {c.member_id}"
                seen[t, p] = c.member_id


actions = st.lists(st.tuples(
    st.sampled_from(["join", "beat", "beat", "beat", "lose", "leave", "expire", "topic",
                     "restart"]),
    st.integers(0, 5), st.booleans()), max_size=80)


@settings(max_examples=300, deadline=None)
@given(actions, st.sampled_from(["uniform", "range"]))
def test_reconciliation_never_gives_a_partition_to_two_members(steps, assignor):
    image = {"a": (T1, 6), "b": (T2, 3)}
    driver = Driver(image)
    cfg_assignor = assignor
    clients: dict[str, Client] = {}
    for action, n, flag in steps:
        driver.now += 1000
        if action == "join":
            name = f"m{n}"
        else:  # the others act on a client that exists, if any
            names = sorted(clients)
            name = names[n % len(names)] if names else ""
        c = clients.get(name)
        if action == "join" and c is None:
            c = clients[name] = Client(name, ("a",) if flag else ("a", "b"),
                                       regex="c.*" if n == 5 else None)
            plan = driver.heartbeat(HeartbeatRequest(
                "g", name, 0, rebalance_timeout_ms=30_000, subscribed_topic_names=c.topics,
                subscribed_topic_regex=c.regex, server_assignor=cfg_assignor, owned={}))
            c.epoch = plan.member_epoch
            c.owned = {t: set(ps) for t, ps in (plan.assignment or {}).items() if ps}
        elif action in ("beat", "lose") and c is not None:
            beat(driver, c, full=flag, lose=action == "lose")
        elif action == "leave" and c is not None and not c.zombie:
            try:
                driver.heartbeat(HeartbeatRequest("g", name, -1))
            except Refusal as exc:
                assert exc.error is E.unknown_member_id
            del clients[name]
        elif action == "expire" and c is not None and driver.group is not None \
                and name in driver.group.members:
            driver.expire(name)
            c.zombie = True
        elif action == "topic":
            if "c1" not in image:
                image["c1"] = (T3, 2)
            else:
                image["c1"] = (T3, image["c1"][1] + 1)  # it grows
        elif action == "restart" and driver.group is not None:
            driver.restart()
        check_no_double_ownership(clients)
    # Quiet rounds: everybody heartbeats (owned partitions reported) until settled.
    for _ in range(12):
        for c in list(clients.values()):
            beat(driver, c, full=True)
            check_no_double_ownership(clients)
    group = driver.group
    if clients:
        assert group.state is cg.ConsumerGroupState.STABLE
        for c in clients.values():
            member = group.members[c.member_id]
            target = {t: set(ps) for t, ps in group.target.get(c.member_id, {}).items() if ps}
            assert c.owned == target == {t: set(ps) for t, ps in member.assigned.items()}
            assert c.epoch == member.member_epoch == group.assignment_epoch
        held = {(t, p) for c in clients.values() for t, ps in c.owned.items() for p in ps}
        subscribed = set()
        for c in clients.values():
            subscribed |= set(c.topics) | ({n for n in image if n.startswith("c")}
                                           if c.regex else set())
        assert held == {(image[n][0], p) for n in subscribed if n in image
                        for p in range(image[n][1])}
        driver.restart()


def joined(driver: Driver, member_id: str, topics=("a",), **kw) -> cg.HeartbeatPlan:
    return driver.heartbeat(HeartbeatRequest("g", member_id, 0, rebalance_timeout_ms=5000,
                                             subscribed_topic_names=topics, owned={}, **kw))


def test_a_new_member_takes_partitions_only_after_their_owner_revoked_them():
    driver = Driver({"a": (T1, 4)})
    first = joined(driver, "m1")
    assert first.assignment == {T1: frozenset(range(4))} and first.member_epoch == 1
    second = joined(driver, "m2")
    assert second.member_epoch == 2 and second.assignment == {}  # still owned by m1
    assert driver.group.members["m2"].state is cg.MemberState.UNRELEASED_PARTITIONS
    # m1 is told to give two back; it keeps its epoch until it has.
    plan = driver.heartbeat(HeartbeatRequest("g", "m1", 1, owned={T1: frozenset(range(4))}))
    assert plan.member_epoch == 1 and len(plan.assignment[T1]) == 2
    kept = plan.assignment[T1]
    assert driver.group.members["m1"].state is cg.MemberState.UNREVOKED_PARTITIONS
    # m2 still waits.
    assert driver.heartbeat(HeartbeatRequest("g", "m2", 2, owned={})).assignment is None
    plan = driver.heartbeat(HeartbeatRequest("g", "m1", 1, owned={T1: kept}))
    assert plan.member_epoch == 2 and plan.assignment is None  # nothing new for m1
    plan = driver.heartbeat(HeartbeatRequest("g", "m2", 2, owned={}))
    assert plan.assignment == {T1: frozenset(range(4)) - kept}
    assert driver.group.state is cg.ConsumerGroupState.STABLE


def refused(driver: Driver, req: HeartbeatRequest) -> Refusal:
    with pytest.raises(Refusal) as info:
        driver.heartbeat(req)
    return info.value


def test_member_epochs_are_fenced_as_kafka_does():
    driver = Driver({"a": (T1, 2)})
    joined(driver, "m1")
    assert refused(driver, HeartbeatRequest("g", "m1", 5, owned={})).error \
        is E.fenced_member_epoch
    joined(driver, "m2")  # epoch 2 for the group; m1 is at 1
    plan = driver.heartbeat(HeartbeatRequest("g", "m1", 1, owned={T1: frozenset({0, 1})}))
    assert plan.member_epoch == 1  # revoking first
    driver.heartbeat(HeartbeatRequest("g", "m1", 1, owned={T1: plan.assignment[T1]}))
    assert driver.group.members["m1"].member_epoch == 2
    # The answer raising it to 2 was lost: epoch 1 is still accepted with what it holds ...
    ok = driver.heartbeat(HeartbeatRequest("g", "m1", 1, owned={T1: plan.assignment[T1]}))
    assert ok.member_epoch == 2
    # ... but not while it claims more than it is assigned.
    assert refused(driver, HeartbeatRequest("g", "m1", 1, owned={T1: frozenset({0, 1})})
                   ).error is E.fenced_member_epoch
    assert refused(driver, HeartbeatRequest("g", "nobody", 3, owned={})).error \
        is E.unknown_member_id
    assert refused(Driver({}), HeartbeatRequest("g", "m1", 3, owned={})).error \
        is E.group_id_not_found


def test_static_members_leave_for_a_while_and_come_back():
    driver = Driver({"a": (T1, 2)})
    first = joined(driver, "m1", instance_id="i1")
    joined(driver, "m2", instance_id="i2")
    assert refused(driver, HeartbeatRequest("g", "other", 0, instance_id="i1",
                                            rebalance_timeout_ms=5000,
                                            subscribed_topic_names=("a",), owned={})
                   ).error is E.unreleased_instance_id
    assert refused(driver, HeartbeatRequest("g", "other", 1, instance_id="i1", owned={})
                   ).error is E.fenced_instance_id
    driver.heartbeat(HeartbeatRequest("g", "m1", -2, instance_id="i1"))
    held = driver.group.members["m1"].assigned
    assert driver.group.members["m1"].member_epoch == -2 and held
    back = joined(driver, "m1-new", instance_id="i1")
    assert "m1" not in driver.group.members
    # It is back with its old target at once (m1 never gave partition 1 to m2, so its
    # successor is asked to, as m1 would have been).
    target = driver.group.target["m1-new"]
    assert back.assignment == target == driver.group.members["m1-new"].assigned
    assert target and target[T1] <= held[T1]
    assert first.member_epoch <= back.member_epoch
    driver.restart()


@pytest.mark.parametrize("req, error", [
    (HeartbeatRequest("g", "", 1), E.invalid_request),
    (HeartbeatRequest("g", "m" * 2000, 0, rebalance_timeout_ms=1, subscribed_topic_names=(),
                      owned={}), E.invalid_request),
    (HeartbeatRequest("", "m", 0, rebalance_timeout_ms=1, subscribed_topic_names=(),
                      owned={}), E.invalid_request),
    (HeartbeatRequest("g", "m", 0, subscribed_topic_names=(), owned={}), E.invalid_request),
    (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, owned={}), E.invalid_request),
    (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, subscribed_topic_names=("a",),
                      owned={T1: frozenset({0})}), E.invalid_request),
    (HeartbeatRequest("g", "m", -3), E.invalid_request),
    (HeartbeatRequest("g", "m", -2), E.invalid_request),
    (HeartbeatRequest("g", "m", 0, instance_id="", rebalance_timeout_ms=1,
                      subscribed_topic_names=(), owned={}), E.invalid_request),
    (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, subscribed_topic_names=("a",),
                      server_assignor="sticky", owned={}), E.unsupported_assignor),
    (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, subscribed_topic_regex="a(",
                      owned={}), E.invalid_regular_expression),
])
def test_bad_requests_get_kafkas_errors(req, error):
    with pytest.raises(Refusal) as info:
        cg.validate(req, CFG)
    assert info.value.error is error


def test_regex_subscriptions_follow_new_topics():
    image = {"logs-1": (T1, 2), "other": (T2, 2)}
    driver = Driver(image)
    plan = driver.heartbeat(HeartbeatRequest("g", "m1", 0, rebalance_timeout_ms=5000,
                                             subscribed_topic_regex="logs-.*", owned={}))
    assert plan.assignment == {T1: frozenset({0, 1})}
    image["logs-2"] = (T3, 1)
    driver.now += cg.REGEX_REFRESH_MS  # the number of topics changed anyway
    plan = driver.heartbeat(HeartbeatRequest("g", "m1", plan.member_epoch,
                                             owned={T1: frozenset({0, 1})}))
    assert plan.assignment == {T1: frozenset({0, 1}), T3: frozenset({0})}


def test_a_grown_topic_is_assigned():
    image = {"a": (T1, 1)}
    driver = Driver(image)
    plan = joined(driver, "m1")
    image["a"] = (T1, 3)
    plan = driver.heartbeat(HeartbeatRequest("g", "m1", plan.member_epoch,
                                             owned={T1: frozenset({0})}))
    assert plan.assignment == {T1: frozenset({0, 1, 2})}


def test_offset_commits_check_the_member_epoch():
    driver = Driver({"a": (T1, 1)})
    group = driver.group
    joined(driver, "m1")
    group = driver.group
    assert group.commit_error("m1", 1) is None
    assert group.commit_error("m1", 0) is E.stale_member_epoch
    assert group.commit_error("x", 1) is E.unknown_member_id
    assert group.commit_error("", -1) is E.unknown_member_id  # the group has members
    assert group.fetch_error(None, -1) is None
    assert group.fetch_error("m1", 7) is E.stale_member_epoch
    driver.heartbeat(HeartbeatRequest("g", "m1", -1))
    assert group.commit_error("", -1) is None and group.state is cg.ConsumerGroupState.EMPTY
