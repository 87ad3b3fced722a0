"""client/topic_reader.py: a read of [start, end) gets the whole range or says why not. Only
records proven deleted are data loss; a log that does not (yet) hold the range is waited for,
within the poll timeout, then an error naming the offsets."""

from __future__ import annotations

import pytest
from support import txn_topic
from support.brokers import create_topic, produce_batches, wait_for_log_start

import oncelog
from oncelog.client.topic_reader import (
    DELETED,
    TOPIC_GONE,
    Lost,
    ReadTimeout,
    TopicReader,
    UnknownTopicOrPartition,
)


def offsets_read(read) -> list[int]:
    return [b.header.base_offset + f[0] for b in read for f in b.record_fields()]


def test_a_range_past_the_log_end_is_waited_for_then_an_error_not_data_loss(broker):
    create_topic(broker.bootstrap, "short")
    produce_batches(broker.bootstrap, "short", 0, 2)
    lost: list[Lost] = []
    with TopicReader(broker.bootstrap, "short") as reader:
        read = reader.read(0, 5, 25, poll_timeout=0.5, on_loss=lost.append)
        got: list[int] = []
        with pytest.raises(ReadTimeout, match=r"reading offsets 5\.\.24 of short-0: no "
                                              r"progress at offset 20 in 0\.5s; the log holds "
                                              r"offsets 0\.\.19"):
            for batch in read:
                got += [batch.header.base_offset + f[0] for f in batch.record_fields()]
        assert got == list(range(5, 20)) and read.position == 20 and lost == []


def test_deleted_records_and_a_deleted_topic_are_reported_and_skipped(start_broker):
    broker = start_broker(**{"log.internal.segment.bytes": "3000",
                             "log.retention.check.interval.ms": "100"})
    with oncelog.Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topic("going", 1, configs={"retention.bytes": "3500"})
    produce_batches(broker.bootstrap, "going", 0, 6)  # segments of 20 records; 2 are kept
    low = wait_for_log_start(broker.bootstrap, "going", 0)
    assert low == 20
    with TopicReader(broker.bootstrap, "going") as reader:
        read = reader.read(0, 5, 50)  # no on_loss: logged and skipped
        assert offsets_read(read) == list(range(20, 50))
        assert read.lost == [Lost(0, 5, 20, DELETED)]
        assert read.lost[0].describe("going") == \
            "offsets 5..19 of going-0 were deleted (the log start moved past them) before " \
            "they were read"

        with oncelog.Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            admin.delete_topic("going")
        lost: list[Lost] = []
        read = reader.read(0, 30, 60, poll_timeout=10, on_loss=lost.append)
        assert offsets_read(read) == [] and lost == [Lost(0, 30, 60, TOPIC_GONE)]
    with pytest.raises(UnknownTopicOrPartition, match="topic 'going' does not exist"):
        TopicReader(broker.bootstrap, "going")


def test_read_committed_ends_at_the_last_stable_offset_without_aborted_records(broker):
    open_one = txn_topic.write(broker.bootstrap, "txn")
    with TopicReader(broker.bootstrap, "txn") as reader:
        start, end = reader.offsets(0)
        lso = reader.last_stable_offset(0)
        assert start == 0 and lso < end

        def values(stop: int, isolation_level: int) -> list[bytes]:
            return [f[3] for b in reader.read(0, 0, stop, poll_timeout=30,
                                              isolation_level=isolation_level)
                    for f in b.record_fields()]

        assert values(lso, 1) == txn_topic.BEFORE_OPEN
        assert sorted(values(end, 0)) == sorted(
            txn_topic.COMMITTED + txn_topic.ABORTED + txn_topic.OPEN)
        open_one.commit_transaction(txn_topic.TIMEOUT)  # its marker takes an offset
        end = reader.offsets(0)[1]
        assert reader.last_stable_offset(0) == end
        assert sorted(values(end, 1)) == sorted(txn_topic.COMMITTED + txn_topic.OPEN)


def test_a_read_over_many_fetches_shares_the_reader_with_other_calls(broker):
    """Each Fetch answer's batches go out while the next Fetch is on its way: other calls on
    the same reader in between (another read, ListOffsets), a read left unfinished, and
    records read again all get their own answers."""
    create_topic(broker.bootstrap, "many")
    produce_batches(broker.bootstrap, "many", 0, 10)  # 10 batches of 10 records
    with TopicReader(broker.bootstrap, "many", max_bytes=1500) as reader:  # ~1 batch a Fetch
        got: list[int] = []
        for batch in reader.read(0, 3, 97):
            got += [batch.header.base_offset + f[0] for f in batch.record_fields()
                    if 3 <= batch.header.base_offset + f[0] < 97]
            assert reader.offsets(0) == (0, 100)
            assert offsets_read(reader.read(0, 40, 45)) == list(range(40, 45))
        assert got == list(range(3, 97))
        left = reader.read(0, 0, 100)
        assert next(iter(left)).header.base_offset == 0  # abandoned with a Fetch ahead
        record = reader.record_at(0, 77)
        assert record is not None and record.offset == 77
        assert offsets_read(reader.read(0, 0, 100)) == list(range(100))


def test_a_broker_dying_mid_read_is_an_error_within_the_poll_timeout(start_broker):
    broker = start_broker()
    create_topic(broker.bootstrap, "dies")
    produce_batches(broker.bootstrap, "dies", 0, 10)
    with TopicReader(broker.bootstrap, "dies", timeout=2, max_bytes=1500) as reader:
        read = reader.read(0, 0, 100, poll_timeout=3)
        batches = iter(read)
        next(batches)  # the next Fetch is sent ahead by now
        broker.kill()
        with pytest.raises(ReadTimeout, match=r"reading offsets 0\.\.99 of dies-0: no progress "
                                              r"at offset \d+ in 3s.*last error"):
            for _ in batches:
                pass


def test_a_kept_receive_buffer_is_reused_only_once_nothing_refers_to_it(broker):
    create_topic(broker.bootstrap, "kept")
    produce_batches(broker.bootstrap, "kept", 0, 400)  # 4000 records, about 440 KB
    with TopicReader(broker.bootstrap, "kept") as reader:
        held = [reader.fetch(0, offset, 300_000) for offset in (0, 400, 800, 1200)]
        copies = [bytes(result.records) for result in held]
        for offset in (200, 600, 1000, 0):  # answers as large, received after them
            assert len(reader.fetch(0, offset, 300_000).records) > 256 << 10
        assert [bytes(result.records) for result in held] == copies
        assert offsets_read(reader.read(0, 0, 4000)) == list(range(4000))
