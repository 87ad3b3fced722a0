"""Compaction's configs, as Kafka names and checks them: the broker's log.cleaner.* keys,
the topic keys that fall back to them, and what a compacted topic's log is given."""

from __future__ import annotations

import re

import pytest
from support.compaction_config_helpers import NoProducers

from oncelog.broker.config import BrokerConfig, ConfigError, validate_topic_configs
from oncelog.broker.topics import TopicError, TopicManager
from oncelog.log.compaction import LONG_MAX
from oncelog.metadata.store import LocalFileStore


def topics(tmp_path, **settings: str) -> TopicManager:
    config = BrokerConfig({"log.dirs": str(tmp_path / "data"), **settings})
    return TopicManager(config, LocalFileStore(str(tmp_path / "meta")), NoProducers())


def test_broker_defaults_are_kafkas():
    config = BrokerConfig({})
    assert config.get("log.cleaner.enable") is True
    assert config.get("log.cleaner.backoff.ms") == 15_000
    assert config.get("log.cleaner.delete.retention.ms") == 86_400_000
    assert config.get("log.cleaner.min.cleanable.ratio") == 0.5
    assert config.get("log.cleaner.min.compaction.lag.ms") == 0
    assert config.get("log.cleaner.max.compaction.lag.ms") == LONG_MAX


@pytest.mark.parametrize("values,message", [
    ({"log.cleaner.min.cleanable.ratio": "1.5"}, "log.cleaner.min.cleanable.ratio"),
    ({"log.cleaner.min.cleanable.ratio": "half"}, "expected a number"),
    ({"log.cleaner.backoff.ms": "-1"}, "log.cleaner.backoff.ms"),
    ({"log.cleaner.max.compaction.lag.ms": "0"}, "log.cleaner.max.compaction.lag.ms"),
    ({"log.cleaner.min.compaction.lag.ms": "5000", "log.cleaner.max.compaction.lag.ms": "10"},
     "min.compaction.lag.ms (5000) is more than max.compaction.lag.ms (10)"),
])
def test_bad_broker_values_name_the_key(values, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        BrokerConfig(values)


@pytest.mark.parametrize("configs", [
    {"min.cleanable.dirty.ratio": "-0.1"},
    {"delete.retention.ms": "-5"},
    {"max.compaction.lag.ms": "0"},
])
def test_bad_topic_values_are_refused(configs):
    with pytest.raises(ConfigError, match=re.escape(next(iter(configs)))):
        validate_topic_configs(configs)


def test_a_compacted_topics_log_gets_its_compaction_settings(tmp_path):
    manager = topics(tmp_path, **{"log.cleaner.delete.retention.ms": "1234",
                                  "log.roll.ms": "60000"})
    plain = manager.create("plain", 1, 1, {})
    assert plain.partitions[0].config.compaction is None
    topic = manager.create("c", 1, 1, {"cleanup.policy": "compact",
                                       "min.cleanable.dirty.ratio": "0.25",
                                       "max.compaction.lag.ms": "5000"})
    config = topic.partitions[0].config
    assert config.compaction is not None
    assert config.compaction.delete_retention_ms == 1234  # the broker's default
    assert config.compaction.min_cleanable_dirty_ratio == 0.25
    assert config.compaction.max_compaction_lag_ms == 5000
    assert config.segment_ms == 5000  # rolls by the time its records must be compacted
    assert config.retention_ms == -1  # compact alone deletes nothing by age
    both = manager.create("cd", 1, 1, {"cleanup.policy": "compact,delete"})
    assert both.partitions[0].config.compaction is not None
    assert both.partitions[0].config.retention_ms > 0
    manager.close()


def test_a_topic_with_min_lag_over_max_lag_is_refused(tmp_path):
    manager = topics(tmp_path, **{"log.cleaner.max.compaction.lag.ms": "1000"})
    with pytest.raises(TopicError, match=re.escape("more than max.compaction.lag.ms")):
        manager.create("c", 1, 1, {"cleanup.policy": "compact",
                                   "min.compaction.lag.ms": "2000"})
    manager.close()
