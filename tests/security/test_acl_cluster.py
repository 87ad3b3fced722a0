"""In cluster mode the ACLs live in the cluster's ZooKeeper: an ACL created through one broker
is enforced by the other (which rereads them within a second of a change)."""

from __future__ import annotations

import concurrent.futures
import time

from kio.schema.errors import ErrorCode
from support.acl_wire import ADMIN_HOST, ANONYMOUS, AUTHORIZER, SUBJECT_HOST, Wire

from oncelog.metadata.zookeeper import ZooKeeperStore
from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build
from oncelog.security.acl_store import AclStore
from oncelog.security.acls import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)

SEEN_WITHIN_S = 10.0  # the refresh is every second; generous for a loaded machine


def topic_error(wire: Wire, topic: str) -> ErrorCode:
    response = wire.call(apis.METADATA, lambda m, v: build(
        m.MetadataRequest, topics=(build(m.MetadataRequestTopic, topic_id=None, name=topic),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False,
        include_cluster_authorized_operations=False), 12)
    (answer,) = response.topics
    return answer.error_code


def test_an_acl_made_on_one_broker_is_enforced_by_the_other(zookeeper, start_broker):
    connect = zookeeper.chroot("acl-cluster")
    seed = ZooKeeperStore(connect, 10_000)
    try:  # the admin host may do everything, as an operator seeds a new cluster
        AclStore(seed).create([AclBinding(
            ResourcePattern(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL),
            AccessControlEntry(ANONYMOUS, ADMIN_HOST, AclOperation.ALL,
                               AclPermissionType.ALLOW))])
    finally:
        seed.close()
    with concurrent.futures.ThreadPoolExecutor(2) as starting:  # both at once: half the wait
        brokers = list(starting.map(lambda i: start_broker(**{
            "broker.id": str(i), "zookeeper.connect": connect,
            "authorizer.class.name": AUTHORIZER, "auto.create.topics.enable": "false"}), (1, 2)))
    admin, subject = Wire(brokers[0].port, ADMIN_HOST), Wire(brokers[1].port, SUBJECT_HOST)
    try:
        assert topic_error(subject, "zk-t") == ErrorCode.topic_authorization_failed
        assert admin.create_acls([AclBinding(
            ResourcePattern(ResourceType.TOPIC, "zk-", PatternType.PREFIXED),
            AccessControlEntry(ANONYMOUS, SUBJECT_HOST, AclOperation.DESCRIBE,
                               AclPermissionType.ALLOW))]) == [ErrorCode.none]
        deadline = time.monotonic() + SEEN_WITHIN_S
        while (error := topic_error(subject, "zk-t")) == ErrorCode.topic_authorization_failed:
            assert time.monotonic() < deadline, "broker 2 never saw the ACL made on broker 1"
            time.sleep(0.05)
        # allowed to describe it: and it does not exist
        assert error == ErrorCode.unknown_topic_or_partition
        # a name ZooKeeper would keep as another (a deeper znode) is refused
        assert admin.create_acls([AclBinding(
            ResourcePattern(ResourceType.GROUP, "team/app", PatternType.LITERAL),
            AccessControlEntry(ANONYMOUS, SUBJECT_HOST, AclOperation.READ,
                               AclPermissionType.ALLOW))]) == [ErrorCode.invalid_request]
    finally:
        admin.close()
        subject.close()
