"""The pure parts of configuration after creation: IncrementalAlterConfigs' rules, the broker's
config layers, kafka-configs.sh's --add-config syntax, recompression of a batch, and producer
state taking new limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from oncelog.broker.config import BROKER_CONFIGS, TOPIC_CONFIGS, BrokerConfig
from oncelog.broker.dynamic_config import (
    APPEND,
    DELETE,
    DYNAMIC_BROKER_KEYS,
    SET,
    SUBTRACT,
    AlterError,
    incremental,
)
from oncelog.cli.configs import parse_add_config
from oncelog.producer_state.manager import ProducerStateManager, StateLimits
from oncelog.producer_state.rules import Append, BatchIdentity
from oncelog.protocol import records
from oncelog.protocol.recompression import recompress
from oncelog.protocol.record_batch import InvalidBatch, split_batches
from oncelog.protocol.validation import RecordRules, validate_batches


def _default(key):
    return {"cleanup.policy": "delete", "retention.ms": 604800000}[key]


def test_incremental_operations():
    current = {"retention.ms": "1000"}
    assert incremental(current, [("segment.bytes", SET, "2000")], TOPIC_CONFIGS, _default) == \
        {"retention.ms": "1000", "segment.bytes": "2000"}
    assert incremental(current, [("retention.ms", DELETE, None)], TOPIC_CONFIGS, _default) == {}
    # APPEND starts from the value in effect, SUBTRACT from the override
    appended = incremental(current, [("cleanup.policy", APPEND, "compact")], TOPIC_CONFIGS,
                           _default)
    assert appended["cleanup.policy"] == "delete,compact"
    again = incremental(appended, [("cleanup.policy", APPEND, "compact")], TOPIC_CONFIGS,
                        _default)
    assert again["cleanup.policy"] == "delete,compact"
    assert incremental(appended, [("cleanup.policy", SUBTRACT, "delete")], TOPIC_CONFIGS,
                       _default)["cleanup.policy"] == "compact"
    assert current == {"retention.ms": "1000"}  # never changed in place


@pytest.mark.parametrize("ops, error", [
    ([("retention.ms", APPEND, "5")], ErrorCode.invalid_config),
    ([("nope", SET, "5")], ErrorCode.invalid_config),
    ([("retention.ms", SET, None)], ErrorCode.invalid_config),
    ([("retention.ms", SET, "1"), ("retention.ms", DELETE, None)], ErrorCode.invalid_request),
    ([("retention.ms", 9, "1")], ErrorCode.invalid_request),
])
def test_incremental_refusals(ops, error):
    with pytest.raises(AlterError) as caught:
        incremental({}, ops, TOPIC_CONFIGS, _default)
    assert caught.value.error == error and ops[0][0] in str(caught.value)


def test_broker_layers_in_order():
    config = BrokerConfig({"message.max.bytes": "500", "log.retention.hours": "10"})
    assert config.source("message.max.bytes") == "STATIC_BROKER_CONFIG"
    config.dynamic_default["message.max.bytes"] = 600
    assert (config.get("message.max.bytes"), config.source("message.max.bytes")) == \
        (600, "DYNAMIC_DEFAULT_BROKER_CONFIG")
    config.dynamic_broker["message.max.bytes"] = 700
    assert config.layers("message.max.bytes") == [
        ("DYNAMIC_BROKER_CONFIG", 700), ("DYNAMIC_DEFAULT_BROKER_CONFIG", 600),
        ("STATIC_BROKER_CONFIG", 500), ("DEFAULT_CONFIG", 1_048_588)]
    assert config.topic_default("max.message.bytes") == 700
    config.dynamic_default["log.retention.ms"] = 5000
    assert config.topic_default("retention.ms") == 5000  # ms wins over the static hours
    assert config.get("advertised.listeners") is None
    assert config.topic_default("remote.storage.enable") is False


def test_dynamic_keys_are_broker_keys_and_topic_keys_have_defaults():
    assert DYNAMIC_BROKER_KEYS <= BROKER_CONFIGS.keys()
    assert "listeners" not in DYNAMIC_BROKER_KEYS and "log.dirs" not in DYNAMIC_BROKER_KEYS
    config = BrokerConfig()
    for key in TOPIC_CONFIGS:
        config.topic_default(key)  # every topic key has a value to fall back to


def test_add_config_syntax():
    assert parse_add_config("a=1,cleanup.policy=[delete,compact], b = x=y") == {
        "a": "1", "cleanup.policy": "delete,compact", "b": "x=y"}
    with pytest.raises(SystemExit):
        parse_add_config("novalue")


_CODECS = [records.NONE, records.GZIP, records.SNAPPY, records.LZ4, records.ZSTD]


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.binary(max_size=300), min_size=1, max_size=20),
       source=st.sampled_from(_CODECS), target=st.sampled_from(_CODECS),
       level=st.sampled_from([None, 1, 5]))
def test_recompressed_batches_keep_records_and_identity(values, source, target, level):
    now = 1_700_000_000_000
    batch = records.encode_batch([(b"k", v, (("h", b"v"),), now + i)
                                  for i, v in enumerate(values)],
                                 compression=source, producer_id=7, producer_epoch=2,
                                 base_sequence=40, transactional=True)
    headers = validate_batches(batch, split_batches(batch, 1 << 20), RecordRules(), now)
    stored, new_headers = recompress(batch, headers, target, level, 1 << 20)
    [again] = split_batches(stored, 1 << 20)  # a valid batch: lengths and CRC check
    assert again == new_headers[0]
    assert again.compression == target
    keep = ("producer_id", "producer_epoch", "base_sequence", "records_count",
            "last_offset_delta", "base_timestamp", "max_timestamp")
    assert all(getattr(again, f) == getattr(headers[0], f) for f in keep)
    assert again.is_transactional
    _, decoded = records.decode_batch(stored)
    assert [r.value for r in decoded] == values


def test_recompression_too_large_is_refused():
    now = 1_700_000_000_000
    batch = records.encode_batch([(None, bytes(range(256)) * 20, (), now)],
                                 compression=records.ZSTD)
    headers = split_batches(batch, 1 << 20)
    with pytest.raises(InvalidBatch) as caught:
        recompress(batch, headers, records.NONE, None, len(batch) + 100)
    assert caught.value.error == ErrorCode.message_too_large


def test_producer_state_takes_new_limits():
    state = ProducerStateManager(StateLimits(batches_to_retain=5))
    last = -1
    for seq in range(0, 50, 10):
        decision = state.validate(BatchIdentity(1, 0, seq, seq + 9), lambda pid: True)
        assert isinstance(decision, Append)
        last += 10
        state.apply(decision, last, 0, 0)
    assert len(state.entry(1).batches) == 5
    state.set_limits(StateLimits(batches_to_retain=2))
    decision = state.validate(BatchIdentity(1, 0, 50, 59), lambda pid: True)
    state.apply(decision, last + 10, 0, 0)
    assert [b.first_seq for b in state.entry(1).batches] == [40, 50]
