"""Broker configuration: .properties parsing, Kafka key names, clear errors."""

import subprocess

import pytest
from support.broker_forks import run_oncelog

from oncelog.broker.config import (
    BrokerConfig,
    ConfigError,
    is_compacted,
    parse_properties,
    validate_topic_configs,
)


def test_properties_format():
    text = """
# a comment
! another comment
listeners=PLAINTEXT://127.0.0.1:19092
log.dirs = /tmp/x
num.partitions: 4
auto.create.topics.enable false
log.retention.ms=\\
   60000
"""
    assert parse_properties(text) == {
        "listeners": "PLAINTEXT://127.0.0.1:19092",
        "log.dirs": "/tmp/x",
        "num.partitions": "4",
        "auto.create.topics.enable": "false",
        "log.retention.ms": "60000",
    }


def test_values_are_typed_and_derived_keys_follow_kafka():
    config = BrokerConfig({"listeners": "PLAINTEXT://127.0.0.1:19092", "num.partitions": "4",
                           "log.retention.minutes": "2", "log.roll.hours": "1"})
    assert (config.listener.host, config.listener.port) == ("127.0.0.1", 19092)
    assert config.get("num.partitions") == 4
    assert config.retention_ms == 120_000
    assert config.roll_ms == 3_600_000
    assert config.topic_default("retention.ms") == 120_000
    assert BrokerConfig({"log.retention.ms": "5", "log.retention.hours": "9"}).retention_ms == 5


def test_record_validation_keys_default_as_in_kafka_4():
    config = BrokerConfig()
    assert config.topic_default("message.timestamp.type") == "CreateTime"
    assert config.topic_default("message.timestamp.before.max.ms") == 2**63 - 1
    assert config.topic_default("message.timestamp.after.max.ms") == 3_600_000
    assert config.topic_default("cleanup.policy") == "delete"
    config = BrokerConfig({"log.message.timestamp.type": "LogAppendTime",
                           "log.message.timestamp.after.max.ms": "0",
                           "log.cleanup.policy": "compact, delete"})
    assert config.topic_default("message.timestamp.type") == "LogAppendTime"
    assert config.topic_default("message.timestamp.after.max.ms") == 0
    assert config.topic_default("cleanup.policy") == "compact,delete"
    parsed = validate_topic_configs({"cleanup.policy": "compact",
                                     "message.timestamp.before.max.ms": "60000"})
    assert parsed == {"cleanup.policy": "compact", "message.timestamp.before.max.ms": 60000}
    assert is_compacted("compact,delete") and is_compacted("compact")
    assert not is_compacted("delete")
    with pytest.raises(ConfigError, match=r"cleanup\.policy: expected delete, compact or both"):
        validate_topic_configs({"cleanup.policy": "delete,,compact"})


@pytest.mark.parametrize(("values", "message"), [
    ({"no.such.key": "1"}, "unknown config key 'no.such.key'"),
    ({"num.partitions": "zero"}, "num.partitions: expected an integer"),
    ({"num.partitions": "0"}, "num.partitions: 0 is outside"),
    ({"auto.create.topics.enable": "yes"}, "auto.create.topics.enable: expected true or false"),
    ({"listeners": "http://x"}, "listeners: expected PLAINTEXT://host:port"),
    ({"log.dirs": "/a,/b,/a/"}, "a directory is named twice"),
    ({"log.dirs": "/a,,/b"}, "an empty directory name"),
    ({"log.cleanup.policy": "compress"}, "log.cleanup.policy: expected delete, compact"),
    ({"log.message.timestamp.type": "createtime"},
     "log.message.timestamp.type: expected one of CreateTime, LogAppendTime"),
    ({"log.message.timestamp.after.max.ms": "-1"},
     "log.message.timestamp.after.max.ms: -1 is outside"),
])
def test_bad_values_name_the_key(values, message):
    with pytest.raises(ConfigError, match=message):
        BrokerConfig(values)


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return run_oncelog(*args, timeout=timeout)


def test_broker_refuses_an_unknown_key_before_starting(tmp_path):
    result = run_cli("broker", "--set", f"log.dirs={tmp_path}", "--set", "log.segmnet.bytes=5")
    assert result.returncode == 2
    assert "unknown config key 'log.segmnet.bytes'" in result.stderr


def test_broker_reads_a_properties_file(tmp_path):
    props = tmp_path / "server.properties"
    props.write_text(f"log.dirs={tmp_path}/data\nnum.partitions=oops\n")
    result = run_cli("broker", "--config", str(props))
    assert result.returncode == 2
    assert "num.partitions: expected an integer" in result.stderr
    missing = run_cli("broker", "--config", str(tmp_path / "nope.properties"))
    assert missing.returncode == 2 and "cannot read config file" in missing.stderr


@pytest.mark.parametrize("command", [
    [], ["broker"], ["topics"], ["topics", "create"], ["topics", "list"], ["topics", "describe"],
    ["topics", "delete"], ["produce"], ["consume"],
])
def test_every_command_has_help(command):
    result = run_cli(*command, "--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: oncelog")


def test_bad_arguments_are_refused_with_usage():
    result = run_cli("topics", "create")
    assert result.returncode == 2
    assert "the following arguments are required: --topic" in result.stderr
    result = run_cli("consume", "--topic", "x", "--offset", "soon", "--bootstrap-server",
                     "127.0.0.1:1")
    assert result.returncode != 0


def test_group_consumer_migration_policy_is_kafkas():
    """KIP-848's online migration: Kafka 4's default, its four values, case insensitive."""
    from oncelog.broker.apis.consumer_groups import consumer_group_config

    assert consumer_group_config(BrokerConfig()).migration_policy == "bidirectional"
    for value in ("UPGRADE", "downgrade", "Disabled", "bidirectional"):
        config = BrokerConfig({"group.consumer.migration.policy": value})
        assert consumer_group_config(config).migration_policy == value.lower()
    with pytest.raises(ConfigError, match=r"group\.consumer\.migration\.policy"):
        BrokerConfig({"group.consumer.migration.policy": "both"})
