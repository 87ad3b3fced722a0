"""ACLs in the metadata store (oncelog.security.acl_store): Kafka's paths and JSON, on the
local file store and on a real ZooKeeper, and concurrent writers that lose nothing."""

from __future__ import annotations

import threading

import pytest

from oncelog.broker.authorize import make_authorizer
from oncelog.broker.config import BrokerConfig, ConfigError
from oncelog.metadata.store import LocalFileStore
from oncelog.metadata.zookeeper import ZooKeeperStore
from oncelog.security.acl_store import AclStore
from oncelog.security.acls import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)

Op, Rt, Pt, Perm = AclOperation, ResourceType, PatternType, AclPermissionType


def acl(rtype, name, op, principal="User:alice", pattern=Pt.LITERAL, perm=Perm.ALLOW):
    return AclBinding(ResourcePattern(rtype, name, pattern),
                      AccessControlEntry(principal, "*", op, perm))


ALL = AclBindingFilter(Rt.ANY, None, Pt.ANY, None, None, Op.ANY, Perm.ANY)


def test_kafka_paths_and_json(tmp_path):
    store = LocalFileStore(str(tmp_path))
    acls = AclStore(store)
    acls.create([acl(Rt.TOPIC, "orders", Op.READ),
                 acl(Rt.TOPIC, "orders", Op.WRITE, perm=Perm.DENY, principal="User:bob"),
                 acl(Rt.GROUP, "app-", Op.READ, pattern=Pt.PREFIXED),
                 acl(Rt.TRANSACTIONAL_ID, "tx", Op.TWO_PHASE_COMMIT),
                 acl(Rt.GROUP, "team/app", Op.READ)])  # a "/" the file store keeps
    assert store.get("kafka-acl/Topic/orders")[0] == {"version": 1, "acls": [
        {"principal": "User:alice", "permissionType": "Allow", "operation": "Read",
         "host": "*"},
        {"principal": "User:bob", "permissionType": "Deny", "operation": "Write",
         "host": "*"}]}
    assert store.get("kafka-acl-extended/prefixed/Group/app-")[0]["acls"][0]["operation"] \
        == "Read"
    assert store.get("kafka-acl/TransactionalId/tx")[0]["acls"][0]["operation"] \
        == "TwoPhaseCommit"
    # read back by a broker starting on the same store
    assert set(AclStore(store).index.bindings()) == set(acls.index.bindings())
    # deleting the last ACL of a pattern removes its path
    deleted = acls.delete([AclBindingFilter(Rt.GROUP, None, Pt.PREFIXED, None, None, Op.ANY,
                                            Perm.ANY)])
    assert deleted == [[acl(Rt.GROUP, "app-", Op.READ, pattern=Pt.PREFIXED)]]
    assert store.get("kafka-acl-extended/prefixed/Group/app-")[0] is None


def test_concurrent_creations_lose_nothing(tmp_path):
    """Two brokers' copies over one store, each adding ACLs of the same topic at once: the
    compare-and-set makes every one of them stay, and each copy sees the other's."""
    store_dir = str(tmp_path)
    brokers = [AclStore(LocalFileStore(store_dir)) for _ in range(2)]
    wanted = [[acl(Rt.TOPIC, "shared", Op.READ, principal=f"User:b{b}-{i}") for i in range(15)]
              for b in range(2)]
    start = threading.Barrier(2)

    def run(b: int) -> None:
        start.wait(timeout=10)
        for binding in wanted[b]:
            brokers[b].create([binding])

    threads = [threading.Thread(target=run, args=(b,)) for b in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    everything = set(wanted[0]) | set(wanted[1])
    for copy in brokers:
        copy.refresh()
        assert set(copy.index.bindings()) == everything
    assert len(AclStore(LocalFileStore(store_dir)).index.matching(ALL)) == 30


def test_on_zookeeper_every_broker_sees_the_same(zookeeper):
    connect = zookeeper.chroot("acls")
    one, two = (ZooKeeperStore(connect, 10_000) for _ in range(2))
    try:
        first, second = AclStore(one), AclStore(two)
        first.create([acl(Rt.TOPIC, "t", Op.WRITE),
                      acl(Rt.CLUSTER, "kafka-cluster", Op.IDEMPOTENT_WRITE)])
        data, _ = one.client.get("/kafka-acl/Topic/t")
        assert data == (b'{"version":1,"acls":[{"principal":"User:alice",'
                        b'"permissionType":"Allow","operation":"Write","host":"*"}]}')
        second.refresh()
        assert set(second.index.bindings()) == set(first.index.bindings())
        second.delete([ALL])
        first.refresh()
        assert list(first.index.bindings()) == []
    finally:
        one.close()
        two.close()


def test_authorizer_configs(tmp_path):
    """authorizer.class.name: empty is no authorizer (everything allowed), Kafka's two class
    names enable ours, anything else is refused; super.users is Kafka's ';' list."""
    store = LocalFileStore(str(tmp_path))
    assert make_authorizer(BrokerConfig({}), store, shared=False) is None
    for name in ("kafka.security.authorizer.AclAuthorizer",
                 "org.apache.kafka.metadata.authorizer.StandardAuthorizer"):
        authorizer = make_authorizer(BrokerConfig({
            "authorizer.class.name": name, "super.users": "User:admin; User:ops",
            "allow.everyone.if.no.acl.found": "true"}), store, shared=False)
        assert authorizer.decision.super_users == {"User:admin", "User:ops"}
        assert authorizer.decision.allow_everyone_if_no_acl_found is True
        assert authorizer.decision.authorize("User:ops", "h", Op.ALTER, Rt.CLUSTER,
                                             "kafka-cluster")
    with pytest.raises(ConfigError):
        BrokerConfig({"authorizer.class.name": "com.example.MyAuthorizer"}).check()
