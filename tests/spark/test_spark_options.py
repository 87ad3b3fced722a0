"""The options of format("oncelog") and the offset arithmetic, without Spark or a broker."""

from __future__ import annotations

import itertools

import pytest

from oncelog.spark.offsets import OffsetRange, from_json, rate_limit, split, to_json
from oncelog.spark.options import SINK_BATCH_SIZE, OptionError, read_options, write_options

B = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_kafka_source_options_as_spark_hands_them_over():
    opts = read_options({**B, "subscribe": "a, b,a", "startingoffsets": "latest",
                         "maxoffsetspertrigger": "100", "minpartitions": "4",
                         "includeheaders": "TRUE", "failondataloss": "false",
                         "checkpointlocation": "/tmp/x"}, streaming=True)
    assert (opts.subscribe, opts.starting, opts.max_offsets_per_trigger, opts.min_partitions,
            opts.include_headers, opts.fail_on_data_loss) == (("a", "b"), "latest", 100, 4,
                                                              True, False)
    opts = read_options({"bootstrap.servers": "h:1", "assign": '{"t": [1, 0, 1]}',
                         "startingOffsets": '{"t": {"0": 5, "1": -2}}',
                         "endingOffsets": '{"t": {"1": -1}}'}, streaming=False)
    assert opts.assign == {"t": (0, 1)}
    assert (opts.starting, opts.ending) == ({"t": {0: 5, 1: -2}}, {"t": {1: -1}})
    assert read_options({**B, "subscribePattern": "t-[0-9]+"}, streaming=False).wants("t-12")
    assert read_options({**B, "subscribe": "t"}, streaming=False).poll_timeout_ms == 120_000
    assert read_options({**B, "subscribe": "t", "kafkaconsumer.polltimeoutms": "1500"},
                        streaming=True).poll_timeout_ms == 1500
    assert not read_options({**B, "subscribe": "t"}, streaming=False).read_committed
    for name in ("isolation.level", "kafka.isolation.level"):
        for streaming, level in ((False, "read_committed"), (True, "read_committed"),
                                 (True, "read_uncommitted")):
            opts = read_options({**B, "subscribe": "t", name: level}, streaming=streaming)
            assert opts.read_committed == (level == "read_committed")


@pytest.mark.parametrize(("options", "streaming", "message"), [
    ({"subscribe": "t"}, False, "option bootstrap.servers: required"),
    ({**B, "bootstrap.servers": "h:1", "subscribe": "t"}, False, "given twice"),
    ({"bootstrap.servers": "nohost", "subscribe": "t"}, False,
     "option bootstrap.servers: bootstrap server 'nohost' is not host:port"),
    ({**B}, False, "option subscribe: give exactly one of"),
    ({**B, "subscribe": " , "}, False, "option subscribe: names no topic"),
    ({**B, "subscribePattern": "("}, False, "option subscribePattern: '(' is not a regular"),
    ({**B, "assign": "[1]"}, False, "option assign: must be a JSON object"),
    ({**B, "assign": '{"t": []}'}, False, "option assign: topic 't' needs a non-empty list"),
    ({**B, "assign": '{"t": ["x"]}'}, False, "option assign: partition 'x' of topic 't'"),
    ({**B, "assign": '{"t": [0]}', "startingOffsets": '{"t": {"1": 0}}'}, False,
     "option startingOffsets: names t-1, which assign does not"),
    ({**B, "subscribe": "t", "startingOffsets": '{"u": {"0": 0}}'}, False,
     "option startingOffsets: names topic 'u', which this query does not read"),
    ({**B, "subscribe": "t", "startingOffsets": "latest"}, False,
     "option startingOffsets: latest is not allowed here"),
    ({**B, "subscribe": "t", "startingOffsets": '{"t": {"0": -1}}'}, False,
     "offset -1 of t-0 must be an offset of 0 or more or -2 (earliest)"),
    ({**B, "subscribe": "t", "endingOffsets": "earliest"}, False,
     "option endingOffsets: earliest is not allowed here"),
    ({**B, "subscribe": "t", "endingOffsets": "{oops"}, False,
     "option endingOffsets: is neither earliest/latest nor JSON"),
    ({**B, "subscribe": "t", "endingOffsets": "latest"}, True,
     "option endingOffsets: applies to batch reads"),
    ({**B, "subscribe": "t", "maxOffsetsPerTrigger": "-3"}, True,
     "option maxOffsetsPerTrigger: must be a whole number of 1 or more, not '-3'"),
    ({**B, "subscribe": "t", "kafkaConsumer.pollTimeoutMs": "0"}, False,
     "option kafkaConsumer.pollTimeoutMs: must be a whole number of 1 or more, not '0'"),
    ({**B, "subscribe": "t", "includeHeaders": "yes"}, True,
     "option includeHeaders: must be true or false, not 'yes'"),
    ({**B, "subscribe": "t", "kafka.enable.auto.commit": "true"}, True,
     "option kafka.enable.auto.commit: unknown option"),
    ({**B, "subscribe": "t", "kafka.isolation.level": "serializable"}, True,
     "option isolation.level: 'serializable' is not an isolation level (allowed: "
     "read_uncommitted, read_committed)"),
])
def test_bad_read_options(options, streaming, message):
    with pytest.raises(OptionError) as failed:
        read_options(options, streaming=streaming)
    assert message in str(failed.value)
    assert str(failed.value).startswith('format("oncelog") option ')


def test_write_options():
    opts = write_options({**B, "topic": "out", "kafka.linger.ms": "20",
                          "compression.type": "ZSTD", "kafka.acks": "all"})
    assert (opts.topic, opts.producer) == ("out", {
        "bootstrap.servers": "127.0.0.1:9092", "enable.idempotence": "true", "acks": "all",
        "linger.ms": "20", "compression.type": "ZSTD", "batch.size": SINK_BATCH_SIZE})
    # The sink's batch.size is a default: the user's wins.
    assert write_options({**B, "kafka.batch.size": "16384"}).producer["batch.size"] == "16384"
    assert write_options(B).topic is None
    for options, message in [
        ({**B, "kafka.enable.idempotence": "false"}, "option enable.idempotence: the oncelog "
                                                     "sink always writes with an idempotent"),
        ({**B, "acks": "1"}, "option acks: '1': an idempotent producer needs acks=all"),
        ({**B, "batch.size": "0"}, "option batch.size: 0 is below the minimum 1"),
        ({**B, "compression.type": "brotli"}, "option compression.type: 'brotli' must be one"),
        ({**B, "topic": " "}, "option topic: is empty"),
        ({**B, "subscribe": "t"}, "option subscribe: unknown option"),
    ]:
        with pytest.raises(OptionError, match=message):
            write_options(options)


def test_offsets_json_round_trip():
    offsets = {("b", 1): 7, ("a", 10): 3, ("a", 2): 0}
    assert to_json(offsets) == {"a": {"2": 0, "10": 3}, "b": {"1": 7}}
    assert from_json(to_json(offsets)) == offsets


def test_min_partitions_cuts_ranges_in_proportion():
    ranges = [OffsetRange("t", 0, 0, 900), OffsetRange("t", 1, 50, 150),
              OffsetRange("t", 2, 5, 5)]
    assert split(ranges, None) == ranges[:2]
    assert split(ranges, 2) == ranges[:2]
    cut = split(ranges, 10)
    assert [(r.partition, r.start, r.end) for r in cut if r.partition == 1] == [(1, 50, 150)]
    zero = [r for r in cut if r.partition == 0]
    assert len(zero) == 9 and zero[0].start == 0 and zero[-1].end == 900
    assert all(a.end == b.start for a, b in itertools.pairwise(zero))
    assert split([OffsetRange("t", 0, 0, 3)], 10) == [OffsetRange("t", 0, i, i + 1)
                                                      for i in range(3)]


def test_max_offsets_per_trigger_is_shared_in_proportion_and_exactly():
    start = {("t", 0): 0, ("t", 1): 100}
    latest = {("t", 0): 50, ("t", 1): 150, ("t", 2): 30}  # t-2 is new: starts at latest
    assert rate_limit(start, latest, 1000) == latest
    assert rate_limit(start, {("t", 0): 50, ("t", 1): 150}, 30) == {("t", 0): 15, ("t", 1): 115}
    ends = rate_limit(start, {("t", 0): 100, ("t", 1): 101}, 10)
    assert sum(ends[tp] - start[tp] for tp in ends) == 10
    assert ends[("t", 1)] == 101 or ends[("t", 1)] == 100
    # Fewer offsets than partitions with data: some partitions still move on.
    many = {("t", p): 0 for p in range(5)}
    ends = rate_limit(many, {tp: 10 for tp in many}, 3)
    assert sorted(ends.values()) == [0, 0, 1, 1, 1]
