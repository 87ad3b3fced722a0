"""cluster/departed_brokers.py's rows D1-D4, each reached, and a model run over random
registrations, leaderships and clocks: Metadata names every registered broker, a departed
one while it leads and for GRACE_S after it left or last led, and never one longer."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.cluster.departed_brokers import GRACE_S, DepartedBrokers
from oncelog.cluster.znodes import BrokerRegistration


def _reg(broker_id: int, port: int | None = None) -> BrokerRegistration:
    return BrokerRegistration(broker_id, "127.0.0.1", port or 9000 + broker_id)


def _ids(named) -> list[int]:
    return [b.broker_id for b in named]


def test_d1_the_registered_are_named_as_registered():
    d = DepartedBrokers()
    brokers = (_reg(1), _reg(2))
    d.observe(brokers, 0.0)
    assert d.named(brokers, 0.0) is brokers


def test_d2_a_departed_leader_is_named_until_its_partitions_move_then_d3_then_d4():
    d = DepartedBrokers()
    d.observe((_reg(1), _reg(2), _reg(3)), 0.0)
    left = (_reg(2), _reg(3))
    d.observe(left, 10.0)  # broker 1's session expired; no election yet
    d.leaders({1}, 10.0)
    assert _ids(d.named(left, 10.0 + 5 * GRACE_S)) == [1, 2, 3]  # D2: as long as it leads
    d.leaders(set(), 30.0)  # the controller moved its leaderships
    assert _ids(d.named(left, 30.0 + GRACE_S - 0.01)) == [1, 2, 3]  # D3
    assert d.named(left, 30.0 + GRACE_S)[0].port == 9002  # D4: forgotten
    assert not d.departed


def test_d3_one_killed_while_leading_nothing_is_named_for_the_grace():
    d = DepartedBrokers()
    d.observe((_reg(1), _reg(2)), 0.0)
    d.observe((_reg(2),), 1.0)
    d.leaders(set(), 1.0)
    assert _ids(d.named((_reg(2),), 1.0 + GRACE_S - 0.01)) == [1, 2]
    assert _ids(d.named((_reg(2),), 1.0 + GRACE_S)) == [2]


def test_d4_one_stopped_cleanly_leading_nothing_is_not_named():
    """Its controlled shutdown moved its leaderships before it left: no answer can race."""
    d = DepartedBrokers()
    d.observe((_reg(1), _reg(2)), 0.0)
    d.observe((_reg(2),), 1.0, cleanly={1})
    d.leaders(set(), 1.0)
    assert _ids(d.named((_reg(2),), 1.0)) == [2]
    assert not d.departed


def test_d2_one_stopped_cleanly_still_leading_is_named_until_its_move_and_the_grace():
    """Its controlled shutdown gave up before every leadership moved: the failover after
    it races as a crash's does."""
    d = DepartedBrokers()
    d.observe((_reg(1), _reg(2)), 0.0)
    d.observe((_reg(2),), 1.0, cleanly={1})
    d.leaders({1}, 1.0)
    assert _ids(d.named((_reg(2),), 5.0)) == [1, 2]
    d.leaders(set(), 5.0)
    assert _ids(d.named((_reg(2),), 5.0 + GRACE_S - 0.01)) == [1, 2]
    assert _ids(d.named((_reg(2),), 5.0 + GRACE_S)) == [2]


def test_d4_one_registered_again_is_named_as_registered_now():
    d = DepartedBrokers()
    d.observe((_reg(1), _reg(2)), 0.0)
    d.observe((_reg(2),), 1.0)
    back = (_reg(1, 7777), _reg(2))
    d.observe(back, 1.5)  # restarted on another port within the grace
    named = d.named(back, 1.5)
    assert [(b.broker_id, b.port) for b in named] == [(1, 7777), (2, 9002)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.frozensets(st.integers(1, 4)),  # registered
                          st.frozensets(st.integers(1, 4)),  # of those gone: stopped cleanly
                          st.frozensets(st.integers(1, 4)),  # named leader by some state
                          st.floats(0, 2 * GRACE_S)),  # time passing before the step
                min_size=1, max_size=30))
def test_model(steps):
    """Each step: the registrations observed (with the clean stops), then the leaders read,
    then the answer."""
    d = DepartedBrokers()
    now = 0.0
    ever: dict[int, BrokerRegistration] = {}
    registered_before: frozenset[int] = frozenset()
    # the model, for each departed broker still remembered: named until (inf while leading)
    until: dict[int, float] = {}
    for registered, cleanly, leading, elapsed in steps:
        now += elapsed
        brokers = tuple(_reg(b) for b in sorted(registered))
        ever.update({b.broker_id: b for b in brokers})
        for b in registered_before - registered:
            until[b] = now if b in cleanly else now + GRACE_S  # D4 or D3
        for b in registered:
            until.pop(b, None)
        registered_before = registered
        d.observe(brokers, now, cleanly)
        d.leaders(leading, now)
        for b in list(until):
            if b in leading:
                until[b] = float("inf")  # D2
            elif until[b] == float("inf"):
                until[b] = now + GRACE_S  # D3
        until = {b: t for b, t in until.items() if t > now}  # D4
        named = set(_ids(d.named(brokers, now)))
        assert registered <= named  # D1
        assert named - registered <= set(ever)
        assert named - registered == set(until), (steps, now)
