"""The authorizer's decision (oncelog.security.acls) against its docstring's tables: each row
by a case, and the whole decision against a plain model (every ACL scanned, Kafka's rules
spelled out) over random ACL sets, added and removed as a state machine."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from oncelog.security.acls import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclIndex,
    AclOperation,
    AclPermissionType,
    Authorizer,
    InvalidAcl,
    PatternType,
    ResourcePattern,
    ResourceType,
    validate_binding,
)

Op, Rt, Pt, Perm = AclOperation, ResourceType, PatternType, AclPermissionType
ALICE, BOB = "User:alice", "User:bob"


def acl(rtype, name, op, perm=Perm.ALLOW, principal=ALICE, host="*", pattern=Pt.LITERAL):
    return AclBinding(ResourcePattern(rtype, name, pattern),
                      AccessControlEntry(principal, host, op, perm))


def authorizer(*bindings, super_users=(), allow_everyone=False) -> Authorizer:
    return Authorizer(AclIndex(bindings), super_users, allow_everyone)


# (row, ACLs, super users, allow.everyone, principal, host, operation, resource, allowed)
ROWS = [
    ("A2 super user", [acl(Rt.TOPIC, "t", Op.ALL, Perm.DENY)], [ALICE], False,
     ALICE, "h", Op.WRITE, (Rt.TOPIC, "t"), True),
    ("A3 deny wins", [acl(Rt.TOPIC, "t", Op.WRITE), acl(Rt.TOPIC, "t", Op.WRITE, Perm.DENY)],
     [], False, ALICE, "h", Op.WRITE, (Rt.TOPIC, "t"), False),
    ("A3 deny All", [acl(Rt.TOPIC, "t", Op.WRITE), acl(Rt.TOPIC, "t", Op.ALL, Perm.DENY)],
     [], False, ALICE, "h", Op.WRITE, (Rt.TOPIC, "t"), False),
    ("A3 deny by prefix", [acl(Rt.TOPIC, "t", Op.READ),
                           acl(Rt.TOPIC, "t", Op.READ, Perm.DENY, pattern=Pt.PREFIXED)],
     [], False, ALICE, "h", Op.READ, (Rt.TOPIC, "t"), False),
    ("A3 deny User:*", [acl(Rt.TOPIC, "t", Op.READ),
                        acl(Rt.TOPIC, "t", Op.READ, Perm.DENY, principal="User:*")],
     [], False, ALICE, "h", Op.READ, (Rt.TOPIC, "t"), False),
    ("A3 deny Read does not deny Describe", [acl(Rt.TOPIC, "t", Op.DESCRIBE),
                                             acl(Rt.TOPIC, "t", Op.READ, Perm.DENY)],
     [], False, ALICE, "h", Op.DESCRIBE, (Rt.TOPIC, "t"), True),
    ("A3 deny of another host", [acl(Rt.TOPIC, "t", Op.READ),
                                 acl(Rt.TOPIC, "t", Op.READ, Perm.DENY, host="10.0.0.1")],
     [], False, ALICE, "h", Op.READ, (Rt.TOPIC, "t"), True),
    ("A4 allow", [acl(Rt.TOPIC, "t", Op.READ)], [], False, ALICE, "h", Op.READ,
     (Rt.TOPIC, "t"), True),
    ("A4 wildcard name", [acl(Rt.TOPIC, "*", Op.READ)], [], False, ALICE, "h", Op.READ,
     (Rt.TOPIC, "any"), True),
    ("A4 prefix", [acl(Rt.GROUP, "app-", Op.READ, pattern=Pt.PREFIXED)], [], False, ALICE,
     "h", Op.READ, (Rt.GROUP, "app-1"), True),
    ("A4 Describe implied by Write", [acl(Rt.TOPIC, "t", Op.WRITE)], [], False, ALICE, "h",
     Op.DESCRIBE, (Rt.TOPIC, "t"), True),
    ("A4 DescribeConfigs implied by AlterConfigs", [acl(Rt.TOPIC, "t", Op.ALTER_CONFIGS)],
     [], False, ALICE, "h", Op.DESCRIBE_CONFIGS, (Rt.TOPIC, "t"), True),
    ("A4 All", [acl(Rt.CLUSTER, CLUSTER_NAME, Op.ALL)], [], False, ALICE, "h",
     Op.IDEMPOTENT_WRITE, (Rt.CLUSTER, CLUSTER_NAME), True),
    ("A4 host", [acl(Rt.TOPIC, "t", Op.READ, host="10.0.0.1")], [], False, ALICE,
     "10.0.0.1", Op.READ, (Rt.TOPIC, "t"), True),
    ("A6 Read does not imply Write", [acl(Rt.TOPIC, "t", Op.READ)], [], False, ALICE, "h",
     Op.WRITE, (Rt.TOPIC, "t"), False),
    ("A6 another principal's ACL", [acl(Rt.TOPIC, "t", Op.READ, principal=BOB)], [], True,
     ALICE, "h", Op.READ, (Rt.TOPIC, "t"), False),
    ("A6 another host", [acl(Rt.TOPIC, "t", Op.READ, host="10.0.0.1")], [], False, ALICE,
     "10.0.0.2", Op.READ, (Rt.TOPIC, "t"), False),
    ("A6 prefix is not a literal", [acl(Rt.TOPIC, "tx", Op.READ, pattern=Pt.PREFIXED)], [],
     False, ALICE, "h", Op.READ, (Rt.TOPIC, "t"), False),
    ("A6 other resource type", [acl(Rt.GROUP, "t", Op.READ)], [], False, ALICE, "h",
     Op.READ, (Rt.TOPIC, "t"), False),
    ("A5 no ACL, allow.everyone", [acl(Rt.TOPIC, "u", Op.READ, principal=BOB)], [], True,
     ALICE, "h", Op.READ, (Rt.TOPIC, "t"), True),
    ("A6 no ACL", [], [], False, ALICE, "h", Op.READ, (Rt.TOPIC, "t"), False),
]


@pytest.mark.parametrize(("row", "bindings", "supers", "everyone", "principal", "host", "op",
                          "resource", "allowed"), ROWS, ids=[r[0] for r in ROWS])
def test_decision_table(row, bindings, supers, everyone, principal, host, op, resource,
                        allowed):
    decision = authorizer(*bindings, super_users=supers, allow_everyone=everyone)
    assert decision.authorize(principal, host, op, *resource) is allowed


# (row, ACLs, allow.everyone, allowed): Write on some topic for ALICE from host h
BY_TYPE_ROWS = [
    ("T1 allow.everyone, no ACL", [], True, True),
    ("T2 deny on *", [acl(Rt.TOPIC, "t", Op.WRITE), acl(Rt.TOPIC, "*", Op.WRITE, Perm.DENY)],
     False, False),
    ("T3 allow on *", [acl(Rt.TOPIC, "*", Op.WRITE)], False, True),
    ("T4 allow on one topic", [acl(Rt.TOPIC, "t", Op.WRITE)], False, True),
    ("T4 denied literally", [acl(Rt.TOPIC, "t", Op.WRITE),
                             acl(Rt.TOPIC, "t", Op.WRITE, Perm.DENY)], False, False),
    ("T4 denied by a prefix", [acl(Rt.TOPIC, "team-a", Op.WRITE, pattern=Pt.PREFIXED),
                               acl(Rt.TOPIC, "team", Op.ALL, Perm.DENY, pattern=Pt.PREFIXED)],
     False, False),
    ("T4 a prefix allowed", [acl(Rt.TOPIC, "team-", Op.WRITE, pattern=Pt.PREFIXED)], False,
     True),
    ("T5 Read only", [acl(Rt.TOPIC, "t", Op.READ)], False, False),
    ("T5 nothing", [], False, False),
]


@pytest.mark.parametrize(("row", "bindings", "everyone", "allowed"), BY_TYPE_ROWS,
                         ids=[r[0] for r in BY_TYPE_ROWS])
def test_by_resource_type_table(row, bindings, everyone, allowed):
    decision = authorizer(*bindings, allow_everyone=everyone)
    assert decision.authorize_by_resource_type(ALICE, "h", Op.WRITE, Rt.TOPIC) is allowed


def test_authorized_operations_field():
    decision = authorizer(acl(Rt.TOPIC, "t", Op.WRITE), acl(Rt.TOPIC, "t", Op.ALTER_CONFIGS))
    field = decision.authorized_operations(ALICE, "h", Rt.TOPIC, "t")
    assert {op for op in Op if field >> op & 1} == {
        Op.WRITE, Op.DESCRIBE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS}


FILTER_CASES = [
    # (filter resource type, name, pattern type, binding pattern, matches)
    (Rt.ANY, None, Pt.ANY, (Rt.GROUP, "g", Pt.PREFIXED), True),
    (Rt.TOPIC, None, Pt.ANY, (Rt.GROUP, "g", Pt.LITERAL), False),
    (Rt.TOPIC, "t", Pt.ANY, (Rt.TOPIC, "t", Pt.PREFIXED), True),
    (Rt.TOPIC, "t1", Pt.ANY, (Rt.TOPIC, "t", Pt.PREFIXED), False),
    (Rt.TOPIC, "t1", Pt.MATCH, (Rt.TOPIC, "t", Pt.PREFIXED), True),
    (Rt.TOPIC, "t1", Pt.MATCH, (Rt.TOPIC, "*", Pt.LITERAL), True),
    (Rt.TOPIC, "t1", Pt.MATCH, (Rt.TOPIC, "t2", Pt.LITERAL), False),
    (Rt.TOPIC, "t", Pt.LITERAL, (Rt.TOPIC, "t", Pt.PREFIXED), False),
    (Rt.TOPIC, "t", Pt.PREFIXED, (Rt.TOPIC, "t", Pt.PREFIXED), True),
    (Rt.TOPIC, "*", Pt.LITERAL, (Rt.TOPIC, "t", Pt.LITERAL), False),
]


@pytest.mark.parametrize(("rtype", "name", "ptype", "pattern", "matches"), FILTER_CASES)
def test_filter_patterns(rtype, name, ptype, pattern, matches):
    f = AclBindingFilter(rtype, name, ptype, None, None, Op.ANY, Perm.ANY)
    assert f.matches_pattern(ResourcePattern(*pattern)) is matches


def test_filter_entries():
    entry = AccessControlEntry(ALICE, "*", Op.READ, Perm.ALLOW)
    f = AclBindingFilter(Rt.ANY, None, Pt.ANY, ALICE, "*", Op.READ, Perm.ALLOW)
    assert f.matches_entry(entry)
    for other in (f.__class__(Rt.ANY, None, Pt.ANY, BOB, None, Op.ANY, Perm.ANY),
                  f.__class__(Rt.ANY, None, Pt.ANY, None, "h", Op.ANY, Perm.ANY),
                  f.__class__(Rt.ANY, None, Pt.ANY, None, None, Op.WRITE, Perm.ANY),
                  f.__class__(Rt.ANY, None, Pt.ANY, None, None, Op.ANY, Perm.DENY)):
        assert not other.matches_entry(entry)
    with pytest.raises(InvalidAcl):
        AclBindingFilter(Rt.UNKNOWN, None, Pt.ANY, None, None, Op.ANY, Perm.ANY).check()


@pytest.mark.parametrize(("binding", "message"), [
    (acl(Rt.ANY, "t", Op.READ), "Invalid resourceType ANY"),
    (acl(Rt.TOPIC, "t", Op.READ, pattern=Pt.MATCH), "Invalid patternType MATCH"),
    (acl(Rt.TOPIC, "t", Op.ANY), "Invalid operation ANY"),
    (acl(Rt.TOPIC, "t", Op.READ, Perm.ANY), "Invalid permissionType ANY"),
    (acl(Rt.CLUSTER, "c", Op.ALTER), "The only valid name for the CLUSTER resource is"),
    (acl(Rt.TOPIC, "", Op.READ), "Invalid empty resource name"),
    (acl(Rt.TOPIC, "t", Op.READ, principal="alice"), "Could not parse principal"),
])
def test_invalid_bindings(binding, message):
    with pytest.raises(InvalidAcl, match=message):
        validate_binding(binding)


# --- the decision against a plain model ----------------------------------------------------

NAMES = ["a", "ab", "abc", "b", "*"]
PRINCIPALS = [ALICE, BOB, "User:*"]
HOSTS = ["*", "h1", "h2"]
OPS = [Op.ALL, Op.READ, Op.WRITE, Op.DESCRIBE, Op.ALTER, Op.DELETE, Op.ALTER_CONFIGS,
       Op.DESCRIBE_CONFIGS, Op.IDEMPOTENT_WRITE]
bindings = st.builds(
    acl, st.sampled_from([Rt.TOPIC, Rt.GROUP]), st.sampled_from(NAMES), st.sampled_from(OPS),
    st.sampled_from([Perm.ALLOW, Perm.DENY]), st.sampled_from(PRINCIPALS),
    st.sampled_from(HOSTS), st.sampled_from([Pt.LITERAL, Pt.PREFIXED]))


def model_authorize(acls: set[AclBinding], everyone: bool, principal: str, host: str,
                    op: AclOperation, rtype: ResourceType, name: str) -> bool:
    def on_resource(p: ResourcePattern) -> bool:
        if p.resource_type != rtype:
            return False
        if p.pattern_type == Pt.LITERAL:
            return p.name == name or p.name == "*"
        return name.startswith(p.name)

    matching = [b for b in acls if on_resource(b.pattern)]
    if not matching:
        return everyone
    mine = [b.entry for b in matching if b.entry.principal in (principal, "User:*")
            and b.entry.host in (host, "*")]
    if any(e.permission == Perm.DENY and e.operation in (op, Op.ALL) for e in mine):
        return False
    implied = {op, Op.ALL}
    if op == Op.DESCRIBE:
        implied |= {Op.READ, Op.WRITE, Op.DELETE, Op.ALTER}
    if op == Op.DESCRIBE_CONFIGS:
        implied.add(Op.ALTER_CONFIGS)
    return any(e.permission == Perm.ALLOW and e.operation in implied for e in mine)


class AuthorizerMachine(RuleBasedStateMachine):
    @initialize(everyone=st.booleans())
    def start(self, everyone):
        self.acls: set[AclBinding] = set()
        self.index = AclIndex()
        self.decision = Authorizer(self.index, (), everyone)
        self.everyone = everyone

    @rule(binding=bindings)
    def add(self, binding):
        self.acls.add(binding)
        self.index.add(binding)

    @rule(data=st.data())
    def remove(self, data):
        if self.acls:
            binding = data.draw(st.sampled_from(sorted(self.acls, key=repr)))
            self.acls.discard(binding)
            self.index.remove(binding)

    @rule(principal=st.sampled_from([ALICE, BOB]), host=st.sampled_from(["h1", "h2"]),
          op=st.sampled_from(OPS[1:]), rtype=st.sampled_from([Rt.TOPIC, Rt.GROUP]),
          name=st.sampled_from(["a", "ab", "abc", "abd", "b", "c"]))
    def check(self, principal, host, op, rtype, name):
        assert self.decision.authorize(principal, host, op, rtype, name) == model_authorize(
            self.acls, self.everyone, principal, host, op, rtype, name)

    @invariant()
    def same_bindings(self):
        if hasattr(self, "index"):
            assert set(self.index.bindings()) == self.acls


TestAuthorizerModel = AuthorizerMachine.TestCase
TestAuthorizerModel.settings = settings(max_examples=60, stateful_step_count=25,
                                        deadline=None, derandomize=True)
