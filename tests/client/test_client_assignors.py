"""The assignors as pure functions: every partition assigned exactly once, balance,
Kafka's member order, and cooperative-sticky's stickiness and two-step moves (KIP-429)."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.client.consumer.assignors import (
    COOPERATIVE,
    EAGER,
    Member,
    cooperative_sticky_assign,
    current_owners,
    parse_strategy,
    range_assign,
    rebalance_protocol,
    roundrobin_assign,
    sticky_assign,
)
from oncelog.client.topic_partition import TopicPartition as TP

TOPICS = ["a", "b", "c"]
SETTINGS = settings(derandomize=True, database=None, max_examples=300, deadline=None)

counts_st = st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 12), min_size=1)


# What groups() and sticky_rounds() draw from, made once: made per draw, each strategy was
# built, validated and looked up in hypothesis's cache again, most of the tests' CPU.
_MEMBER_COUNT = st.integers(1, 7)
_TOPIC_SET = st.sets(st.sampled_from(TOPICS), min_size=1)
_STATIC = st.booleans()
_MEMBER_NUMBER = st.integers(0, 10**6)
_ONE_OF = [st.sampled_from(range(n)) for n in range(10)]  # _ONE_OF[n]: an index below n


@st.composite
def groups(draw, same_topics: bool = False):
    counts = draw(counts_st)
    n = draw(_MEMBER_COUNT)
    shared = frozenset(draw(_TOPIC_SET))
    members = []
    for i in range(n):
        topics = shared if same_topics else frozenset(draw(_TOPIC_SET))
        static = draw(_STATIC)
        members.append(Member(f"m-{draw(_MEMBER_NUMBER)}-{i}", topics,
                              f"i-{i}" if static else None))
    return members, counts


def all_partitions(members, counts):
    topics = {t for m in members for t in m.topics}
    return {TP(t, p) for t in topics for p in range(counts.get(t, 0))}


def check_exactly_once(members, counts, result):
    assert set(result) == {m.member_id for m in members}
    given_out = [tp for parts in result.values() for tp in parts]
    assert Counter(given_out) == Counter(all_partitions(members, counts))
    topics = {m.member_id: m.topics for m in members}
    assert all(tp.topic in topics[m] for m, parts in result.items() for tp in parts)


@SETTINGS
@given(groups())
def test_range_and_roundrobin_assign_every_partition_once(group):
    members, counts = group
    for assign in (range_assign, roundrobin_assign, sticky_assign):
        check_exactly_once(members, counts, assign(members, counts))


@SETTINGS
@given(groups(same_topics=True))
def test_balance_with_identical_subscriptions(group):
    members, counts = group
    loads = [len(p) for p in roundrobin_assign(members, counts).values()]
    assert max(loads) - min(loads) <= 1
    loads = [len(p) for p in sticky_assign(members, counts).values()]
    assert max(loads) - min(loads) <= 1
    result = range_assign(members, counts)
    for topic in members[0].topics:
        per_topic = [sum(tp.topic == topic for tp in p) for p in result.values()]
        assert max(per_topic) - min(per_topic) <= 1


def test_range_orders_static_members_first_by_instance_id():
    members = [Member("a-dynamic", frozenset("t")), Member("z", frozenset("t"), "i-2"),
               Member("b", frozenset("t"), "i-1")]
    assert range_assign(members, {"t": 5}) == {
        "b": [TP("t", 0), TP("t", 1)], "z": [TP("t", 2), TP("t", 3)], "a-dynamic": [TP("t", 4)]}


def test_roundrobin_passes_over_members_not_subscribed():
    members = [Member("m1", frozenset({"a"})), Member("m2", frozenset({"a", "b"}))]
    assert roundrobin_assign(members, {"a": 2, "b": 2}) == {
        "m1": [TP("a", 0)], "m2": [TP("a", 1), TP("b", 0), TP("b", 1)]}


@st.composite
def sticky_rounds(draw):
    """Members with identical subscriptions, owning disjoint parts of an earlier assignment
    (some partitions owned by members that left, some by nobody)."""
    members, counts = draw(groups(same_topics=True))
    partitions = sorted(all_partitions(members, counts))
    ids = [*(m.member_id for m in members), "gone"]
    choices = [*ids, None]
    owner = {tp: choices[draw(_ONE_OF[len(choices)])] for tp in partitions}
    return [Member(m.member_id, m.topics, m.instance_id,
                   tuple(tp for tp in partitions if owner[tp] == m.member_id), 3)
            for m in members], counts


@SETTINGS
@given(sticky_rounds())
def test_sticky_keeps_what_it_can(group):
    members, counts = group
    result = sticky_assign(members, counts)
    check_exactly_once(members, counts, result)
    floor = len(all_partitions(members, counts)) // len(members)
    for m in members:
        kept = set(m.owned) & set(result[m.member_id])
        assert len(kept) >= min(len(m.owned), floor)


@SETTINGS
@given(sticky_rounds())
def test_cooperative_sticky_moves_in_two_rebalances(group):
    members, counts = group
    first = cooperative_sticky_assign(members, counts)
    owners = current_owners(members, counts)
    given_out = [tp for parts in first.values() for tp in parts]
    assert len(given_out) == len(set(given_out))
    for member_id, parts in first.items():
        # never handed a partition another member still holds
        assert all(owners.get(tp, member_id) == member_id for tp in parts)
    # Each member revokes what it lost and rejoins owning what it was given.
    rejoined = [Member(m.member_id, m.topics, m.instance_id, tuple(first[m.member_id]), 4)
                for m in members]
    second = cooperative_sticky_assign(rejoined, counts)
    check_exactly_once(members, counts, second)
    loads = [len(p) for p in second.values()]
    assert max(loads) - min(loads) <= 1
    for m in rejoined:  # the second rebalance takes nothing away
        assert set(m.owned) <= set(second[m.member_id])


def test_a_joining_member_takes_only_what_moves():
    t = frozenset({"t"})
    owned1 = tuple(TP("t", p) for p in (0, 1, 2))
    owned2 = tuple(TP("t", p) for p in (3, 4, 5))
    members = [Member("m1", t, None, owned1, 1), Member("m2", t, None, owned2, 1),
               Member("m3", t)]
    first = cooperative_sticky_assign(members, {"t": 6})
    assert len(first["m1"]) == len(first["m2"]) == 2 and first["m3"] == []
    assert set(first["m1"]) < set(owned1) and set(first["m2"]) < set(owned2)


def test_claims_of_older_generations_and_ties():
    t = frozenset({"t"})
    members = [Member("new", t, None, (TP("t", 0),), 5), Member("old", t, None, (TP("t", 0),), 4),
               Member("x", t, None, (TP("t", 1),), 5), Member("y", t, None, (TP("t", 1),), 5),
               Member("z", t, None, (TP("t", 9), TP("u", 0)), 5)]
    assert current_owners(members, {"t": 2}) == {TP("t", 0): "new"}


def test_strategy_names_and_protocols():
    assert [a.name for a in parse_strategy("range, cooperative-sticky")] == \
        ["range", "cooperative-sticky"]
    assert rebalance_protocol(parse_strategy("range,cooperative-sticky")) == EAGER
    assert rebalance_protocol(parse_strategy("cooperative-sticky")) == COOPERATIVE
    assert [a.name for a in parse_strategy(
        "org.apache.kafka.clients.consumer.RoundRobinAssignor")] == ["roundrobin"]
    with pytest.raises(ValueError, match="unknown assignor"):
        parse_strategy("sticky")
