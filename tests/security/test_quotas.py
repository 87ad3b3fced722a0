"""security/quotas.py and security/quota_configs.py against Kafka's rules: the resolution
table against KIP-55's flat precedence list, the rate's sampling held by a model of every
value recorded, the throttle formula on Kafka's own numbers, and the alteration and filter
tables row by row."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from oncelog.security import quota_configs as qc
from oncelog.security import quotas as q
from oncelog.security.quotas import entity

USERS = ["alice", "bob"]
CLIENTS = ["c1", "c2", ""]


def _kip55(configured, user: str, client: str):
    """KIP-55's precedence as its text lists it: the first entity that exists."""
    order = [entity(user, client), entity(user, None), entity(user), entity(None, client),
             entity(None, None), entity(None), entity(client_id=client),
             entity(client_id=None)]
    for candidate in order:
        if candidate in configured:
            return configured[candidate]
    return None


_entities = st.sampled_from(
    [entity(u, c) for u in [*USERS, None] for c in [*CLIENTS[:2], None]]
    + [entity(u) for u in [*USERS, None]] + [entity(client_id=c) for c in [*CLIENTS[:2], None]])


@settings(max_examples=120, deadline=None, derandomize=True)
@given(st.dictionaries(_entities, st.integers(1, 10**6), max_size=8),
       st.sampled_from(USERS), st.sampled_from(CLIENTS))
def test_resolution_is_kip55s_precedence(configured, user, client):
    tags, quota = q.resolve(configured, user, client)
    if client == "":  # row 9: looked up as a user's quota, or none
        assert quota in (configured.get(entity(user)), configured.get(entity(None)))
        assert quota == (configured.get(entity(user)) or configured.get(entity(None))
                         if tags[0] else None)
    else:
        assert quota == _kip55(configured, user, client)
    # the sensor: shared by every client of the user exactly when a user-level entity
    # (rows 3, 6) decided it, by every user of the client id when a client one did
    if quota is not None and tags[1] == "":
        assert entity(user) in configured or entity(None) in configured
    if tags[0] == "":
        assert not any(e in configured for e in (entity(user, client), entity(user, None),
                                                  entity(user), entity(None, client),
                                                  entity(None, None), entity(None)))


def test_resolution_rows():
    rows = [  # (configured, user, client, expected sensor, expected quota)
        ({entity(client_id="c1"): 10}, "alice", "c1", ("", "c1"), 10),
        ({entity(client_id=None): 7}, "alice", "c9", ("", "c9"), 7),
        ({entity(client_id=None): 7}, "alice", "", ("", ""), None),
        ({entity("alice"): 5, entity(client_id="c1"): 10}, "alice", "c1", ("alice", ""), 5),
        ({entity("alice", None): 3, entity("alice"): 5}, "alice", "c1", ("alice", "c1"), 3),
        ({entity(None, "c1"): 4, entity(None): 6}, "bob", "c1", ("bob", "c1"), 4),
        ({entity(None): 6, entity(client_id="c1"): 10}, "bob", "c1", ("bob", ""), 6),
        ({entity("alice", "c1"): 1}, "bob", "c1", ("", "c1"), None),
    ]
    for configured, user, client, tags, quota in rows:
        assert q.resolve(configured, user, client) == (tags, quota), (configured, user, client)


class RateModel(RuleBasedStateMachine):
    """Every value recorded, kept with its time: what the samples sum to is bounded by the
    values of the last windows, and the rate is never measured over less than num - 1
    windows."""

    def __init__(self) -> None:
        super().__init__()
        self.rate = q.Rate(3, 1000)
        self.now = 0
        self.events: list[tuple[int, int]] = []

    @rule(ms=st.integers(0, 2500))
    def wait(self, ms):
        self.now += ms

    @rule(value=st.integers(0, 5000))
    def record(self, value):
        self.rate.record(value, self.now)
        self.events.append((self.now, value))

    @invariant()
    def sums_within_the_span(self):
        window = self.rate.window_size(self.now)
        total = self.rate.total()
        n, w = self.rate.samples, self.rate.window_ms
        recent = sum(v for t, v in self.events if t > self.now - (n - 1) * w)
        kept_at_most = sum(v for t, v in self.events if t >= self.now - (n + 1) * w)
        assert recent <= total <= kept_at_most
        assert window >= (n - 1) * w
        assert len(self.rate._samples) <= n + 1  # constant memory
        assert self.rate.measure(self.now) == pytest.approx(total / (window / 1000))


TestRate = RateModel.TestCase
TestRate.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                             derandomize=True)


def test_throttle_on_kafkas_numbers():
    """11 windows of 1 s, 1000 B/s: a new client may send 10 s of quota at once (the rate
    is measured over 10 windows at least); 1 byte more is throttled (O - T) / T * W."""
    rate = q.Rate(11, 1000)
    rate.record(10_000, 0)
    assert q.throttle_ms(rate, 1000, 0) == 0
    rate.record(1000, 0)
    assert q.throttle_ms(rate, 1000, 0) == 1000  # O = 1100: 0.1 of 10 s
    # half a window later, the same bytes over 10.5 s: (11000/10.5 - 1000)/1000 * 10500
    assert q.throttle_ms(rate, 1000, 500) == 500
    # the request quota's bound: one window
    assert q.throttle_ms(rate, 1, 0, bound_ms=1000) == 1000


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 10**6)), max_size=20),
       st.integers(1, 10**5))
def test_throttle_brings_the_rate_back_to_the_quota(steps, quota):
    """Waiting the throttle time, with nothing more recorded, measures within the quota
    (Kafka's derivation: O * W / (W + X) = T), once the rate spans its whole window."""
    rate = q.Rate(11, 1000)
    now = 0
    for wait, value in steps:
        now += wait
        rate.record(value, now)
    wait = q.throttle_ms(rate, quota, now)
    assert (wait == 0) == (rate.measure(now) <= quota)
    if wait and rate.window_size(now) > 10_000 and wait < 1000:
        assert rate.measure(now + wait) <= quota * 1.01


ALTER_ROWS = [  # (entity parts, ops, error or None)
    ([], [], "Invalid empty client quota entity"),
    ([("user", "a"), ("user", "b")], [], "duplicate entity entry"),
    ([("group", "g")], [], "Unhandled client quota entity type"),
    ([("user", "")], [], "Empty user not supported"),
    ([("ip", "1.2.3.4"), ("user", "a")], [], "IP entity should not be combined"),
    ([("ip", "not-an-ip")], [], "not a valid IP"),
    ([("client-id", "c")], [("producer_byte_rate", 1, False)] * 2, "Duplicate quota key"),
    ([("client-id", "c")], [("connection_creation_rate", 1, False)],
     "Invalid configuration key"),
    ([("ip", None)], [("producer_byte_rate", 1, False)], "Invalid configuration key"),
    ([("client-id", "c")], [("producer_byte_rate", 0, False)], "must be greater than 0"),
    ([("client-id", "c")], [("producer_byte_rate", 1.5, False)], "fractional"),
    ([("client-id", "c")], [("producer_byte_rate", 1e30, False)], "too large"),
    ([("client-id", "c")], [("request_percentage", 12.5, False)], None),
    ([("client-id", "c")], [("no_such_key", 0, True)], None),  # removing: nothing to check
    ([("user", None), ("client-id", "c")], [("consumer_byte_rate", 1024, False)], None),
    ([("ip", "::1")], [("connection_creation_rate", 5, False)], None),
]


@pytest.mark.parametrize(("parts", "ops", "error"), ALTER_ROWS)
def test_alteration_rows(parts, ops, error):
    try:
        qc.validate_ops(qc.validate_entity(parts), ops)
    except qc.QuotaError as exc:
        assert error is not None and error in str(exc), str(exc)
        assert exc.error == qc.INVALID_REQUEST
    else:
        assert error is None


def test_filters():
    users_c = ((q.CLIENT_ID, "c"), (q.USER, "u"))
    client_c = ((q.CLIENT_ID, "c"),)
    default_user = ((q.USER, None),)
    f = qc.parse_filter([("client-id", qc.MATCH_EXACT, "c")], False)
    assert qc.matches(users_c, f) and qc.matches(client_c, f)
    assert not qc.matches(default_user, f)
    f = qc.parse_filter([("client-id", qc.MATCH_EXACT, "c")], True)
    assert not qc.matches(users_c, f) and qc.matches(client_c, f)
    f = qc.parse_filter([("user", qc.MATCH_DEFAULT, None)], False)
    assert qc.matches(default_user, f) and not qc.matches(users_c, f)
    f = qc.parse_filter([("user", qc.MATCH_SPECIFIED, None)], False)
    assert qc.matches(users_c, f) and qc.matches(default_user, f)
    assert qc.matches(client_c, qc.parse_filter([], False))
    assert not qc.matches(client_c, qc.parse_filter([], True))
    for components, error in [
            ([("", 0, "x")], qc.INVALID_REQUEST),
            ([("user", 0, "a"), ("user", 2, None)], qc.INVALID_REQUEST),
            ([("topic", 0, "a")], qc.UNSUPPORTED_VERSION),
            ([("user", 0, None)], qc.INVALID_REQUEST),
            ([("user", 1, "a")], qc.INVALID_REQUEST),
            ([("user", 2, "a")], qc.INVALID_REQUEST),
            ([("user", 7, None)], qc.INVALID_REQUEST),
            ([("ip", 2, None), ("user", 2, None)], qc.INVALID_REQUEST)]:
        with pytest.raises(qc.QuotaError) as raised:
            qc.parse_filter(components, False)
        assert raised.value.error == error, components


def test_paths_are_kafkas():
    assert qc.entity_path(((q.CLIENT_ID, None), (q.USER, "a b*"))) == \
        "config/users/a%20b%2A/clients/<default>"
    assert qc.entity_path(((q.CLIENT_ID, "x~y"),)) == "config/clients/x%7Ey"
    assert qc.encode_config({"producer_byte_rate": 1024.0, "request_percentage": 12.5}) == \
        {"version": 1, "config": {"producer_byte_rate": "1024", "request_percentage": "12.5"}}
    assert qc.decode_config({"version": 1, "config": {"producer_byte_rate": "1024",
                                                      "bad": "x"}}) == \
        {"producer_byte_rate": 1024.0}


def test_stored_values_that_do_not_parse_are_left_out():
    for stored in (None, [], "x", {"config": []}, {"config": {"k": "nan?"}},
                   {"config": {"k": -1}}, {"config": {"k": None}}):
        assert qc.decode_config(stored) == {}, stored
