"""Client quotas in a cluster: AlterClientQuotas on one broker is kept in ZooKeeper at
Kafka's path with Kafka's JSON, notified under /config/changes, and the other broker follows
it (describes and enforces it) without being asked."""

from __future__ import annotations

import json

from support.waits import wait_for
from support.zookeepers import observer

from oncelog.client.admin import admin_quotas
from oncelog.client.network.connection import connect
from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build

TIMEOUT = 30.0
FOLLOW_TIMEOUT = 10.0  # each broker looks for notifications every second


def _wait_for(condition, what: str):
    return wait_for(condition, FOLLOW_TIMEOUT, what, interval=0.05)


def test_a_quota_set_on_one_broker_holds_on_the_other(zookeeper, start_broker):
    connect_string = zookeeper.chroot("quotas")
    chroot = connect_string[len(zookeeper.connect):]
    brokers = [start_broker(**{"broker.id": str(i), "zookeeper.connect": connect_string})
               for i in (1, 2)]
    zk = observer(zookeeper.connect)
    one = connect(brokers[0].bootstrap, client_id="quota-admin")
    two = connect(brokers[1].bootstrap, client_id="chatty")
    try:
        assert admin_quotas.alter_client_quotas(
            one, [({"client-id": "chatty"}, {"request_percentage": 0.01})]) == [None]
        data, _ = zk.get(f"{chroot}/config/clients/chatty")
        assert json.loads(data) == {"version": 1, "config": {"request_percentage": "0.01"}}
        changes = zk.get_children(f"{chroot}/config/changes")
        assert len(changes) == 1 and changes[0].startswith("config_change_")
        data, _ = zk.get(f"{chroot}/config/changes/{changes[0]}")
        assert json.loads(data) == {"version": 2, "entity_path": "clients/chatty"}
        _wait_for(lambda: admin_quotas.describe_client_quotas(two) == [
            ({"client-id": "chatty"}, {"request_percentage": 0.01})], "broker 2 follows")

        def throttled() -> bool:
            answer = two.call(apis.METADATA, lambda mod, v: build(
                mod.MetadataRequest, topics=(), allow_auto_topic_creation=False,
                include_topic_authorized_operations=False))
            return answer.throttle_time.total_seconds() > 0

        _wait_for(throttled, "broker 2 throttles the client")
    finally:
        one.close()
        two.close()
        zk.stop()
        zk.close()
