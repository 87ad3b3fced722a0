"""The server-side assignors of consumer groups (KIP-848), as pure functions: every partition
of a subscribed topic goes to exactly one of its subscribers, the uniform assignor is
balanced and sticky, the range assignor gives consecutive ranges of equal size."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.coordinator.group.assignors import MemberSpec, range_, uniform

TOPICS = [uuid.UUID(int=i + 1) for i in range(4)]


# The strategies groups() draws from, made once: made inside it they were built, validated
# and looked up in hypothesis's strategy cache on every draw, two thirds of the test's CPU
# (the assignors themselves: under 1%).
_TOPIC = st.sampled_from(TOPICS)
_TOPIC_LIST = st.lists(_TOPIC, min_size=1, max_size=4, unique=True)
_PARTITION_COUNT = st.integers(0, 12)
_NAMES = st.lists(st.text("abcdef", min_size=1, max_size=3), min_size=1, max_size=7,
                  unique=True)
_SHARED = st.sets(_TOPIC, min_size=1)
_SUBSCRIBED = st.sets(_TOPIC)
_CURRENT_TOPICS = st.sets(_TOPIC, max_size=3)
_CURRENT_PARTITIONS = st.sets(st.integers(0, 14), max_size=6)
_INSTANCE = st.none() | st.text("xyz", min_size=1, max_size=2)


@st.composite
def groups(draw, homogeneous: bool = False):
    topics = {t: draw(_PARTITION_COUNT) for t in draw(_TOPIC_LIST)}
    names = draw(_NAMES)
    shared = frozenset(draw(_SHARED))
    members = {}
    for name in names:
        subscribed = shared if homogeneous else frozenset(draw(_SUBSCRIBED))
        # A current assignment that may be stale: unknown topics, partitions out of range,
        # partitions held twice, topics no longer subscribed.
        current = {t: frozenset(draw(_CURRENT_PARTITIONS)) for t in draw(_CURRENT_TOPICS)}
        instance = draw(_INSTANCE)
        members[name] = MemberSpec(subscribed, instance, current)
    return members, topics


def owners(result):
    seen: dict[tuple[uuid.UUID, int], str] = {}
    for member, assignment in result.items():
        for topic_id, partitions in assignment.items():
            for p in partitions:
                assert (topic_id, p) not in seen, f"{topic_id}-{p} assigned twice"
                seen[topic_id, p] = member
    return seen


def check_complete(members, topics, result) -> dict[tuple[uuid.UUID, int], str]:
    assert set(result) == set(members)
    seen = owners(result)
    expected = {(t, p) for t, n in topics.items() for p in range(n)
                if any(t in m.subscribed for m in members.values())}
    assert set(seen) == expected
    for (topic_id, _), member in seen.items():
        assert topic_id in members[member].subscribed
    return seen


def loads(result) -> dict[str, int]:
    return {m: sum(len(ps) for ps in a.values()) for m, a in result.items()}


@settings(max_examples=300, deadline=None)
@given(groups())
def test_uniform_assigns_every_partition_once_and_is_balanced(group):
    members, topics = group
    result = uniform(members, topics)
    seen = check_complete(members, topics, result)
    load = loads(result)
    # Kafka's balance: no partition could move to another subscriber holding two fewer.
    for (topic_id, _), owner in seen.items():
        for other, spec in members.items():
            if topic_id in spec.subscribed:
                assert load[other] >= load[owner] - 1


@settings(max_examples=300, deadline=None)
@given(groups(homogeneous=True))
def test_uniform_with_one_subscription_is_even_and_sticky(group):
    members, topics = group
    result = uniform(members, topics)
    check_complete(members, topics, result)
    load = loads(result)
    assert max(load.values()) - min(load.values()) <= 1
    # Sticky: a member keeps what it held (and may still hold) up to its new share.
    claimed: set[tuple[uuid.UUID, int]] = set()
    for name in sorted(members):
        spec = members[name]
        valid = {(t, p) for t, ps in spec.current.items() for p in ps
                 if t in spec.subscribed and p < topics.get(t, 0)} - claimed
        claimed |= valid
        kept = {(t, p) for t, ps in result[name].items() for p in ps} & valid
        assert len(kept) >= min(len(valid), load[name])


@settings(max_examples=200, deadline=None)
@given(groups(homogeneous=True))
def test_uniform_keeps_a_balanced_assignment_as_it_is(group):
    members, topics = group
    first = uniform(members, topics)
    again = uniform({m: MemberSpec(s.subscribed, s.instance_id, first[m])
                     for m, s in members.items()}, topics)
    assert again == first


@settings(max_examples=300, deadline=None)
@given(groups())
def test_range_gives_consecutive_ranges(group):
    members, topics = group
    result = range_(members, topics)
    check_complete(members, topics, result)
    for topic_id, count in topics.items():
        subscribers = [m for m in members if topic_id in members[m].subscribed]
        if not subscribers:
            continue
        sizes = []
        for m in subscribers:
            partitions = sorted(result[m].get(topic_id, ()))
            assert partitions == list(range(partitions[0], partitions[0] + len(partitions))) \
                if partitions else True
            sizes.append(len(partitions))
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == count


def test_range_co_partitions_topics_of_equal_size():
    a, b = TOPICS[:2]
    members = {m: MemberSpec(frozenset({a, b})) for m in ("m1", "m2", "m3")}
    result = range_(members, {a: 7, b: 7})
    for m in members:
        assert result[m][a] == result[m][b]
    assert result["m1"][a] == frozenset({0, 1, 2})


def test_uniform_moves_only_what_a_new_member_needs():
    topic = TOPICS[0]
    three = {m: MemberSpec(frozenset({topic})) for m in ("a", "b", "c")}
    before = uniform(three, {topic: 6})
    four = {m: MemberSpec(frozenset({topic}), None, before[m]) for m in three}
    four["d"] = MemberSpec(frozenset({topic}))
    after = uniform(four, {topic: 6})
    moved = sum(len(before[m][topic] - after[m].get(topic, frozenset())) for m in three)
    assert moved == 1 and len(after["d"][topic]) == 1
