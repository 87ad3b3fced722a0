"""Configs a real broker takes from real clients: an empty cleanup.policy (KIP-1161), every
broker key Kafka 4.1 knows, and the internal topics' configs, which nobody may break
(issue 21, issue 28 #8)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    NewTopic,
    ResourceType,
)
from confluent_kafka.admin import ConfigResource as CResource
from kio.schema.errors import ErrorCode
from support.brokers import create_topic
from support.config_hygiene_helpers import TIMEOUT, _commit, _committed, _describe

from oncelog import Admin, ConfigResource


def _incremental(admin, kind, name, *entries) -> None:
    resource = CResource(kind, name, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=op) for key, op, value in entries])
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT)


def _records(bootstrap: str, topic: str) -> tuple[int, int]:
    from oncelog import Consumer, TopicPartition
    with Consumer({"bootstrap.servers": bootstrap}) as c:
        c.assign([TopicPartition(topic, 0)])
        return c.watermarks(TopicPartition(topic, 0))


def test_empty_cleanup_policy_keeps_everything(start_broker):
    """KIP-1161: an empty cleanup.policy is neither delete nor compact: retention never
    deletes (as retention.ms=-1 and retention.bytes=-1), keys are not required."""
    broker = start_broker(log_retention_check_interval_ms="100")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = "empty-policy"
    futures = admin.create_topics([NewTopic(topic, 1, 1, config={
        "cleanup.policy": "", "retention.ms": "1", "segment.bytes": "1048576",
        "segment.ms": "1"})])
    futures[topic].result(TIMEOUT)
    assert _describe(admin, ResourceType.TOPIC, topic)["cleanup.policy"] == ""
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(20):
        producer.produce(topic, value=b"v%d" % i)  # no key: fine without compact
        producer.flush(TIMEOUT)
    time.sleep(1.0)  # ten retention checks with retention.ms=1
    assert _records(broker.bootstrap, topic) == (0, 20)

    create_topic(broker.bootstrap, "set-empty")
    _incremental(admin, ResourceType.TOPIC, "set-empty",
                 ("cleanup.policy", AlterConfigOpType.SET, ""))
    assert _describe(admin, ResourceType.TOPIC, "set-empty")["cleanup.policy"] == ""

    create_topic(broker.bootstrap, "subtract-empty")
    _incremental(admin, ResourceType.TOPIC, "subtract-empty",
                 ("cleanup.policy", AlterConfigOpType.SUBTRACT, "delete"))
    assert _describe(admin, ResourceType.TOPIC, "subtract-empty")["cleanup.policy"] == ""
    broker.restart()
    assert _describe(admin, ResourceType.TOPIC, "subtract-empty")["cleanup.policy"] == ""
    assert _records(broker.bootstrap, topic) == (0, 20)


def _refused(call, *args) -> ErrorCode:
    with pytest.raises(KafkaException) as caught:
        call(*args)
    return ErrorCode(caught.value.args[0].code())


def test_segments_of_less_than_1_mib_are_refused_but_for_tests(broker):
    """KIP-1030: segment.bytes and log.segment.bytes are at least 1 MiB (INVALID_CONFIG):
    a segment per record costs a file and a descriptor each. internal.segment.bytes (Kafka's
    key for tests) goes lower and is shown only where set."""
    from oncelog.broker.config import BrokerConfig, ConfigError

    with pytest.raises(ConfigError, match=r"log\.segment\.bytes"):
        BrokerConfig({"log.segment.bytes": "1048575"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic("tiny-segments", 1, 1, config={
        "segment.bytes": "14"})])
    assert _refused(futures["tiny-segments"].result, TIMEOUT) == ErrorCode.invalid_config
    admin.create_topics([NewTopic("small-segments", 1, 1, config={
        "segment.bytes": "1048576"})])["small-segments"].result(TIMEOUT)
    code = _refused(_incremental, admin, ResourceType.TOPIC, "small-segments",
                    ("segment.bytes", AlterConfigOpType.SET, "1048575"))
    assert code == ErrorCode.invalid_config
    assert "internal.segment.bytes" not in _describe(admin, ResourceType.TOPIC,
                                                     "small-segments")
    _incremental(admin, ResourceType.TOPIC, "small-segments",
                 ("internal.segment.bytes", AlterConfigOpType.SET, "100"))
    assert _describe(admin, ResourceType.TOPIC, "small-segments")[
        "internal.segment.bytes"] == "100"


def test_clients_cannot_create_internal_topics(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for name in ("__consumer_offsets", "__transaction_state"):
        futures = admin.create_topics([NewTopic(name, 1, 1, config={
            "cleanup.policy": "delete", "retention.ms": "0"})])
        assert _refused(futures[name].result, TIMEOUT) == ErrorCode.invalid_request
    # the broker still creates __consumer_offsets itself, as it must be
    create_topic(broker.bootstrap, "t")
    _commit(broker.bootstrap, "g", "t", 7)
    described = _describe(admin, ResourceType.TOPIC, "__consumer_offsets")
    assert described["cleanup.policy"] == "compact"
    assert _committed(broker.bootstrap, "g", "t") == 7


def test_internal_topics_stay_compacted(start_broker):
    broker = start_broker(log_retention_check_interval_ms="100")
    create_topic(broker.bootstrap, "t")
    _commit(broker.bootstrap, "g", "t", 42)
    _commit(broker.bootstrap, "g2", "t", 1)  # __transaction_state exists once a txn starts
    txn = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "x"})
    txn.init_transactions(TIMEOUT)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    hostile = [
        [("cleanup.policy", AlterConfigOpType.SET, "delete")],
        [("cleanup.policy", AlterConfigOpType.SET, "compact,delete")],
        [("cleanup.policy", AlterConfigOpType.SET, "")],
        [("cleanup.policy", AlterConfigOpType.APPEND, "delete")],
        [("cleanup.policy", AlterConfigOpType.DELETE, None)],  # back to the broker's delete
        [("segment.bytes", AlterConfigOpType.SET, "14")],
        [("internal.segment.bytes", AlterConfigOpType.SET, "14")],
        [("retention.ms", AlterConfigOpType.SET, "0"),
         ("cleanup.policy", AlterConfigOpType.SET, "delete")],
    ]
    for name in ("__consumer_offsets", "__transaction_state"):
        for ops in hostile:
            code = _refused(_incremental, admin, ResourceType.TOPIC, name, *ops)
            assert code == ErrorCode.invalid_config, (name, ops, code)
        # AlterConfigs replaces the whole set: without cleanup.policy it would be delete
        # (kafka-python fills in the current overrides first; oncelog's Admin sends as told)
        with Admin({"bootstrap.servers": broker.bootstrap}) as ours:
            res = ConfigResource("topic", name)
            error = ours.alter_configs({res: {"retention.ms": "0"}})[res]
        assert error is not None and error.code() == ErrorCode.invalid_config, error
        # what keeps the guarantees is still accepted
        _incremental(admin, ResourceType.TOPIC, name,
                     ("retention.ms", AlterConfigOpType.SET, "0"),
                     ("segment.bytes", AlterConfigOpType.SET, str(64 << 20)))
        assert _describe(admin, ResourceType.TOPIC, name)["cleanup.policy"] == "compact"
    time.sleep(0.5)  # retention.ms=0 under five retention checks: compact keeps the offsets
    broker.restart()
    assert _committed(broker.bootstrap, "g", "t") == 42


def test_every_kafka_broker_key_is_accepted_checked_and_described(start_broker):
    """Issue 21: broker keys Kafka 4.1 has were refused as unknown. Each is accepted,
    type-checked as Kafka checks it, and shown by DescribeConfigs (its Kafka type; a
    password never shown)."""
    from oncelog.broker.config import BrokerConfig, ConfigError
    from oncelog.broker.kafka_broker_keys import KAFKA_ONLY_BROKER_KEYS

    for bad in ({"background.threads": "0"}, {"background.threads": "many"},
                {"sasl.kerberos.ticket.renew.jitter": "x"},
                {"ssl.client.auth": "sometimes"}, {"auto.leader.rebalance.enable": "yes"},
                {"group.share.delivery.count.limit": "11"}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            BrokerConfig(bad)
    broker = start_broker(background_threads="12",
                          sasl_kerberos_min_time_before_relogin="70000",
                          ssl_key_password="secret")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = CResource(ResourceType.BROKER, "0")
    entries = admin.describe_configs([resource], request_timeout=TIMEOUT)[resource].result(
        TIMEOUT)
    for name, *_ in KAFKA_ONLY_BROKER_KEYS:
        assert name in entries, name
    assert entries["background.threads"].value == "12"
    assert entries["sasl.kerberos.min.time.before.relogin"].value == "70000"
    assert entries["num.io.threads"].value == "8"  # Kafka's default
    assert entries["ssl.key.password"].value is None and entries["ssl.key.password"].is_sensitive
    # a key Kafka changes without a restart changes here too; a read-only one does not
    _incremental(admin, ResourceType.BROKER, "0",
                 ("background.threads", AlterConfigOpType.SET, "7"))
    assert _describe(admin, ResourceType.BROKER, "0")["background.threads"] == "7"
    code = _refused(_incremental, admin, ResourceType.BROKER, "0",
                    ("node.id", AlterConfigOpType.SET, "3"))
    assert code == ErrorCode.invalid_config
    code = _refused(_incremental, admin, ResourceType.BROKER, "0",
                    ("background.threads", AlterConfigOpType.SET, "-1"))
    assert code == ErrorCode.invalid_config


def test_hostile_overrides_stored_by_an_older_version_are_corrected(start_broker):
    """An older version let clients store cleanup.policy=delete on __consumer_offsets; at
    the next start the coordinator's needs win (compact, segment.bytes restored)."""
    import json

    broker = start_broker(log_retention_check_interval_ms="100")
    create_topic(broker.bootstrap, "t")
    _commit(broker.bootstrap, "g", "t", 9)
    broker.stop()
    stored = broker.data_dir / ".oncelog-metadata" / "topics%2F__consumer_offsets.json"
    entry = json.loads(stored.read_text())
    entry["value"]["configs"] = {"cleanup.policy": "delete", "retention.ms": "0",
                                 "segment.bytes": "14"}
    stored.write_text(json.dumps(entry))
    broker.start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = _describe(admin, ResourceType.TOPIC, "__consumer_offsets")
    assert described["cleanup.policy"] == "compact"
    assert described["segment.bytes"] == str(100 << 20)
    time.sleep(0.5)  # retention checks with retention.ms=0: compact applies none
    broker.restart()
    assert _committed(broker.bootstrap, "g", "t") == 9
    assert "must stay compact" in broker.log_text()
