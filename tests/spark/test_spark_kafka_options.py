"""The options of Spark's Kafka source beyond topics and offsets (spark/source_options.py) and
the driver's rules they feed (spark/offsets.py, spark/progress.py), without Spark: names,
defaults, Spark's precedence, errors naming the option; splitting by maxRecordsPerPartition;
minOffsetsPerTrigger / maxTriggerDelay admission; the lag metrics; fetchOffset retries
against a port nobody listens on."""

from __future__ import annotations

import logging
import socket

import pytest

from oncelog import KafkaError
from oncelog.spark.offsets import Cluster, OffsetRange, split, with_retries
from oncelog.spark.options import OptionError, read_options
from oncelog.spark.progress import Admission, behind
from oncelog.spark.source_options import ByTimestamp

B = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}


def test_defaults_are_sparks():
    opts = read_options(B, streaming=True)
    assert (opts.starting, opts.min_offsets_per_trigger, opts.max_trigger_delay_ms,
            opts.max_records_per_partition, opts.group_id, opts.group_id_prefix,
            opts.fetch_retries, opts.fetch_retry_interval_ms) == (
        "latest", None, 15 * 60_000, None, None, "spark-kafka-source", 3, 1000)


def test_timestamps_take_precedence_as_in_spark():
    # startingTimestamp > startingOffsetsByTimestamp > startingOffsets (Spark's order).
    opts = read_options({**B, "startingTimestamp": "1000", "startingOffsets": "earliest",
                         "startingOffsetsByTimestamp": '{"t": {"0": 5}}'}, streaming=False)
    assert opts.starting == ByTimestamp("startingTimestamp", every=1000)
    opts = read_options({**B, "startingOffsetsByTimestamp": '{"t": {"0": 5, "1": 7}}',
                         "startingoffsetsbytimestampstrategy": "LATEST",
                         "startingOffsets": "earliest"}, streaming=True)
    assert opts.starting == ByTimestamp("startingOffsetsByTimestamp",
                                        partitions={"t": {0: 5, 1: 7}}, latest_if_none=True)
    assert opts.starting.wanted(("t", 1)) == 7 and opts.starting.wanted(("t", 2)) is None
    # An end found by time with no record that late is the latest offset, always.
    opts = read_options({**B, "endingTimestamp": "9", "endingOffsets": '{"t": {"0": 1}}',
                         "endingOffsetsByTimestamp": '{"t": {"0": 3}}'}, streaming=False)
    assert opts.ending == ByTimestamp("endingTimestamp", every=9, latest_if_none=True)
    opts = read_options({**B, "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "10",
                         "maxTriggerDelay": "30s", "maxRecordsPerPartition": "4",
                         "kafka.group.id": "mine", "groupIdPrefix": "ignored",
                         "fetchOffset.numRetries": "5", "fetchoffset.retryintervalms": "0"},
                        streaming=True)
    assert (opts.min_offsets_per_trigger, opts.max_trigger_delay_ms,
            opts.max_records_per_partition, opts.group_id, opts.fetch_retries,
            opts.fetch_retry_interval_ms) == (10, 30_000, 4, "mine", 5, 0)
    assert [read_options({**B, "maxTriggerDelay": d}, streaming=True).max_trigger_delay_ms
            for d in ("500ms", "2m", "1h", "250", "3 min")] == [500, 120_000, 3_600_000, 250,
                                                                 180_000]


def test_stream_only_options_are_ignored_by_a_batch_read_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, "oncelog.spark.options"):
        opts = read_options({**B, "maxOffsetsPerTrigger": "5", "minOffsetsPerTrigger": "1",
                             "maxTriggerDelay": "1m"}, streaming=False)
    assert opts.starting == "earliest"
    assert sorted(r.getMessage() for r in caplog.records) == [
        "maxOffsetsPerTrigger option ignored in batch queries",
        "maxTriggerDelay option ignored in batch queries",
        "minOffsetsPerTrigger option ignored in batch queries"]


@pytest.mark.parametrize(("options", "streaming", "message"), [
    ({"startingTimestamp": "yesterday"}, False,
     "option startingTimestamp: expected a single long value, got 'yesterday'"),
    ({"startingTimestamp": "-1"}, True, "option startingTimestamp: expected a single long"),
    ({"startingOffsetsByTimestamp": "{"}, False, "option startingOffsetsByTimestamp: is not "
                                                 "JSON"),
    ({"startingOffsetsByTimestamp": '{"t": {"0": "x"}}'}, False,
     "option startingOffsetsByTimestamp: timestamp 'x' of t-0 must be milliseconds"),
    ({"startingOffsetsByTimestamp": '{"u": {"0": 1}}'}, False,
     "option startingOffsetsByTimestamp: names topic 'u', which this query does not read"),
    ({"startingOffsetsByTimestampStrategy": "earliest"}, False,
     "option startingOffsetsByTimestampStrategy: 'earliest' is not a strategy (allowed: "
     "error, latest)"),
    ({"endingTimestamp": "5"}, True, "option endingTimestamp: applies to batch reads"),
    ({"endingOffsetsByTimestamp": '{"t": {"0": 1}}'}, True,
     "option endingOffsetsByTimestamp: applies to batch reads"),
    ({"startingTimestamp": "10", "endingTimestamp": "5"}, False,
     "option endingTimestamp: 5 is before startingTimestamp 10"),
    ({"minOffsetsPerTrigger": "11", "maxOffsetsPerTrigger": "10"}, True,
     "option minOffsetsPerTrigger: the value of minOffsetsPerTrigger (11) is higher than the "
     "maxOffsetsPerTrigger (10)"),
    ({"minOffsetsPerTrigger": "0"}, True,
     "option minOffsetsPerTrigger: must be a whole number of 1 or more, not '0'"),
    ({"maxTriggerDelay": "soon"}, True, "option maxTriggerDelay: 'soon' is not a duration"),
    ({"maxTriggerDelay": "5 weeks"}, True, "option maxTriggerDelay: '5 weeks' is not a"),
    ({"maxRecordsPerPartition": "0"}, False,
     "option maxRecordsPerPartition: must be a whole number of 1 or more, not '0'"),
    ({"groupIdPrefix": "a b"}, True, "option groupIdPrefix: 'a b' must be letters"),
    ({"kafka.group.id": " "}, True, "option kafka.group.id: is empty"),
    ({"fetchOffset.numRetries": "0"}, True,
     "option fetchOffset.numRetries: must be a whole number of 1 or more, not '0'"),
    ({"fetchOffset.retryIntervalMs": "-5"}, True,
     "option fetchOffset.retryIntervalMs: must be a whole number of 0 or more, not '-5'"),
    ({"kafka.auto.offset.reset": "earliest"}, True, "option kafka.auto.offset.reset: unknown "
                                                     "option"),
])
def test_bad_options_name_the_option(options, streaming, message):
    with pytest.raises(OptionError) as failed:
        read_options({**B, **options}, streaming=streaming)
    assert message in str(failed.value)


def test_max_records_per_partition_cuts_before_min_partitions():
    ranges = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 5, 8)]
    cut = split(ranges, None, 4)
    assert [(r.partition, r.start, r.end) for r in cut] == [
        (0, 0, 3), (0, 3, 6), (0, 6, 10), (1, 5, 8)]
    assert all(r.size <= 4 for r in cut)
    # maxRecordsPerPartition gives 4 parts; minPartitions 8 then cuts again in proportion.
    assert len(split(ranges, 8, 4)) >= 8
    assert len(split(ranges, 3, 4)) == 4


def test_min_offsets_per_trigger_waits_until_enough_or_the_delay():
    admission = Admission(min_offsets=10, max_delay_ms=1000)
    start = {("t", 0): 0}
    assert not admission.hold(start, {("t", 0): 1}, now_ms=5_000)  # the first trigger runs
    assert admission.hold({("t", 0): 1}, {("t", 0): 5}, now_ms=5_100)  # 4 < 10: wait
    assert not admission.hold({("t", 0): 1}, {("t", 0): 11}, now_ms=5_200)  # 10: run
    assert admission.hold({("t", 0): 11}, {("t", 0): 12}, now_ms=6_100)  # 1 < 10, 900 ms
    assert not admission.hold({("t", 0): 11}, {("t", 0): 12}, now_ms=6_200)  # delay passed


def test_lag_metrics_have_sparks_names():
    end = {("t", 0): 10, ("t", 1): 50, ("u", 0): 7}
    latest = {("t", 0): 30, ("t", 1): 50, ("u", 0): 8}
    sizes = {("t", 0): (4000, 40), ("t", 1): (100, 50)}  # u-0's size unknown
    assert behind(end, latest, sizes) == {
        "minOffsetsBehindLatest": "0", "maxOffsetsBehindLatest": "20",
        "avgOffsetsBehindLatest": "7.0", "estimatedTotalBytesBehindLatest": "2000"}
    assert behind({}, latest, sizes) == {}


def test_fetch_offset_retries_try_numretries_times_then_fail(caplog):
    with socket.socket() as s:  # a loopback port with no listener: connections refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = read_options({**B, "kafka.bootstrap.servers": f"127.0.0.1:{port}",
                         "fetchOffset.numRetries": "3", "fetchOffset.retryIntervalMs": "10"},
                        streaming=True)

    def look():
        with Cluster(opts, timeout=2.0) as cluster:
            return cluster.partitions(must_exist=False)

    with caplog.at_level(logging.WARNING, "oncelog.spark.offsets"), \
            pytest.raises(KafkaError):
        with_retries(opts, "looking up partitions", look)
    tries = [r.getMessage() for r in caplog.records if "fetchOffset.numRetries" in
             r.getMessage()]
    assert [m.split("(attempt ")[1][:6] for m in tries] == ["1 of 3", "2 of 3"]
