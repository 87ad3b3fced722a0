"""Group configs (the GROUP config resource, type 32, Kafka 4): DescribeConfigs and
IncrementalAlterConfigs serve them, they are checked as Kafka checks them, kept across a
restart, and the consumer-group coordinator honours them per group (the heartbeat interval
it answers, the session it gives)."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode as E
from support.brokers import create_topic

from oncelog.client.network.connection import connect
from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build

GROUP = 32
SET, DELETE = 0, 1


def describe(conn, name: str) -> tuple[E, dict[str, tuple[str, int]]]:
    answer = conn.call(apis.DESCRIBE_CONFIGS, lambda mod, v: build(
        mod.DescribeConfigsRequest, include_synonyms=False, include_documentation=False,
        resources=(build(mod.DescribeConfigsResource, resource_type=GROUP, resource_name=name,
                         configuration_keys=None),)))
    result = answer.results[0]
    return E(result.error_code), {c.name: (c.value, c.config_source) for c in result.configs}


def alter(conn, name: str, ops: list[tuple[str, int, str | None]]) -> E:
    answer = conn.call(apis.INCREMENTAL_ALTER_CONFIGS, lambda mod, v: build(
        mod.IncrementalAlterConfigsRequest, validate_only=False, resources=(build(
            mod.AlterConfigsResource, resource_type=GROUP, resource_name=name, configs=tuple(
                build(mod.AlterableConfig, name=k, config_operation=op, value=val)
                for k, op, val in ops)),)))
    return E(answer.responses[0].error_code)


def heartbeat_interval(conn, group: str) -> int:
    conn.versions[apis.CONSUMER_GROUP_HEARTBEAT] = 1
    answer = conn.call(apis.CONSUMER_GROUP_HEARTBEAT, lambda mod, v:
                       mod.ConsumerGroupHeartbeatRequest(
                           group_id=group, member_id=f"m-{group}-0000000000000000", member_epoch=0,
                           rebalance_timeout=datetime.timedelta(seconds=30),
                           subscribed_topic_names=("t",), topic_partitions=()))
    assert answer.error_code == E.none, answer
    return int(answer.heartbeat_interval.total_seconds() * 1000)


def test_group_configs_are_served_checked_kept_and_honoured(start_broker):
    broker = start_broker(group_consumer_heartbeat_interval_ms=5000)
    create_topic(broker.bootstrap, "t")
    with connect(broker.bootstrap) as conn:
        error, configs = describe(conn, "cg")
        assert error is E.none
        assert configs["consumer.session.timeout.ms"] == ("45000", 5)  # the broker's
        assert configs["consumer.heartbeat.interval.ms"] == ("5000", 5)
        assert "share.auto.offset.reset" in configs
        assert describe(conn, "")[0] is E.invalid_request
        assert alter(conn, "cg", [("consumer.heartbeat.interval.ms", SET, "7000"),
                                  ("consumer.session.timeout.ms", SET, "50000")]) is E.none
        # Kafka's checks: bounds, heartbeat below session, known keys, a group name.
        assert alter(conn, "cg", [("consumer.heartbeat.interval.ms", SET, "1000")]) is \
            E.invalid_config
        assert alter(conn, "cg", [("consumer.session.timeout.ms", SET, "7000")]) is \
            E.invalid_config
        assert alter(conn, "cg", [("no.such.key", SET, "1")]) is E.invalid_config
        assert alter(conn, "", [("consumer.heartbeat.interval.ms", SET, "7000")]) is \
            E.invalid_request
        assert describe(conn, "cg")[1]["consumer.heartbeat.interval.ms"] == ("7000", 8)
        assert heartbeat_interval(conn, "cg") == 7000
        assert heartbeat_interval(conn, "other") == 5000
    broker.restart()
    with connect(broker.bootstrap) as conn:
        assert describe(conn, "cg")[1]["consumer.session.timeout.ms"] == ("50000", 8)
        assert heartbeat_interval(conn, "cg2") == 5000
        assert alter(conn, "cg2", [("consumer.heartbeat.interval.ms", SET, "6000")]) is E.none
        assert heartbeat_interval(conn, "cg2") == 6000
        assert alter(conn, "cg2", [("consumer.heartbeat.interval.ms", DELETE, None)]) is E.none
        assert describe(conn, "cg2")[1]["consumer.heartbeat.interval.ms"] == ("5000", 5)
    broker.restart()
    with connect(broker.bootstrap) as conn:
        assert describe(conn, "cg")[1]["consumer.heartbeat.interval.ms"] == ("7000", 8)
        # The member that joined before the restart is still there: its next heartbeat
        # (epoch 0 again, a rejoin) gets the group's interval too.
        assert heartbeat_interval(conn, "cg") == 7000


def members_of(conn, group: str) -> int:
    conn.versions[apis.CONSUMER_GROUP_DESCRIBE] = 1
    described = conn.call(apis.CONSUMER_GROUP_DESCRIBE, lambda mod, v:
                          mod.ConsumerGroupDescribeRequest(
                              group_ids=(group,), include_authorized_operations=False))
    return len(described.groups[0].members)


def test_a_groups_session_timeout_ends_its_silent_members_sessions(start_broker):
    """consumer.session.timeout.ms of one group: its member that stops heartbeating is
    removed after that group's timeout, while another group's member (the broker's 45 s)
    stays."""
    import time

    broker = start_broker(group_consumer_min_session_timeout_ms=500,
                          group_consumer_min_heartbeat_interval_ms=100)
    create_topic(broker.bootstrap, "t")
    with connect(broker.bootstrap) as conn:
        assert alter(conn, "short", [("consumer.session.timeout.ms", SET, "1000"),
                                     ("consumer.heartbeat.interval.ms", SET, "200")]) is E.none
        assert heartbeat_interval(conn, "short") == 200
        heartbeat_interval(conn, "long")
        deadline = time.monotonic() + 20
        while members_of(conn, "short"):
            assert time.monotonic() < deadline, "the short session never ended"
            time.sleep(0.1)
        assert members_of(conn, "long") == 1
