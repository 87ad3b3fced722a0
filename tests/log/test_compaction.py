"""The log cleaner against a model (tests/support/compaction_model.py): any sequence of appends,
rolls, clock steps, cleans and reopens leaves a log that reads as compaction allows, and a
clean leaves its section compacted. Plus the rules one by one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.compaction_model import Harness, read_all

from oncelog.log import cleaning
from oncelog.log.compaction import (
    LONG_MAX,
    CompactionConfig,
    OffsetMap,
    Rules,
    SegmentSummary,
    batch_payload,
    clean_batch,
    cleanable,
    joins_group,
    record_facts,
    record_spans,
)
from oncelog.protocol import records as codec
from oncelog.protocol.record_batch import read_header
from oncelog.protocol.records import CODECS, decode_batch, encode_batch

KEYS = [b"a", b"b", b"c", b"d", b"e", b"f"]

configs = st.builds(
    CompactionConfig,
    delete_retention_ms=st.sampled_from([0, 50, 1000]),
    min_cleanable_dirty_ratio=st.sampled_from([0.0, 0.5, 1.0]),
    min_compaction_lag_ms=st.sampled_from([0, 100]),
    max_compaction_lag_ms=st.sampled_from([LONG_MAX, 300]),
)
records = st.lists(st.tuples(st.sampled_from(KEYS),
                             st.one_of(st.none(), st.binary(min_size=0, max_size=30))),
                   min_size=1, max_size=4)
operations = st.lists(st.one_of(
    st.tuples(st.just("append"), records, st.sampled_from([-1, -1, 1, 2]),
              st.sampled_from(sorted(CODECS.values()))),
    st.tuples(st.just("roll")),
    st.tuples(st.just("tick"), st.integers(1, 400)),
    st.tuples(st.just("clean"), st.sampled_from([1 << 20, 250])),
    st.tuples(st.just("reopen"), st.booleans()),
), min_size=5, max_size=80)


@settings(max_examples=300, deadline=None)
@given(configs, st.sampled_from([300, 1000]), operations)
def test_the_cleaner_keeps_what_the_model_says(config, segment_bytes, ops):
    h = Harness(config, segment_bytes)
    for op, *args in ops:
        if op == "append":
            h.append(*args)
        elif op == "roll":
            h.roll()
        elif op == "tick":
            h.clock += args[0]
        elif op == "clean":
            if h.clean(args[0]) is not None:
                h.model.check_cleaned(h.log, h.clock)
        else:
            h.reopen(args[0])
        h.model.check(h.log)
    # At the end, with every segment sealed and the lags behind: cleans until nothing is due
    # leave one record per key, tombstones only within their horizon.
    h.roll()
    h.append([(b"end", b"x")])
    h.roll()
    h.clock += 10_000
    for _ in range(3):
        h.clean()
        h.model.check(h.log)
    _, found = read_all(h.log)
    keys = [key for offset, key, _, _ in found if offset < h.log.first_dirty_offset]
    assert len(keys) == len(set(keys))


def test_a_clean_keeps_the_latest_value_of_each_key_at_its_offset():
    h = Harness(CompactionConfig(min_cleanable_dirty_ratio=0.0), segment_bytes=300)
    for i in range(30):
        h.append([(KEYS[i % 3], b"v%d" % i)])
    h.roll()
    result = h.clean()
    assert result is not None and result.records_removed == 27
    _, found = read_all(h.log)
    assert [(o, k, v) for o, k, v, _ in found] == [
        (27, b"a", b"v27"), (28, b"b", b"v28"), (29, b"c", b"v29")]
    assert h.log.log_end_offset == 30 and h.log.log_start_offset == 0
    h.model.check(h.log)


def test_the_active_segment_is_never_cleaned():
    h = Harness(CompactionConfig(min_cleanable_dirty_ratio=0.0), segment_bytes=1 << 20)
    for i in range(10):
        h.append([(b"k", b"v%d" % i)])
    assert h.clean() is None  # one segment: nothing sealed, nothing due
    assert len(read_all(h.log)[1]) == 10


def test_tombstones_stay_for_delete_retention_after_their_first_clean():
    h = Harness(CompactionConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=1000),
                segment_bytes=300)
    h.append([(b"k", b"v")])
    h.append([(b"k", None)])
    h.roll()
    h.append([(b"other", b"x")])
    h.roll()
    h.clean()
    headers, found = read_all(h.log)
    assert [(k, v) for _, k, v, _ in found] == [(b"k", None), (b"other", b"x")]
    horizon = next(hd for hd in headers if hd.records_count and hd.base_offset == 1)
    assert horizon.base_timestamp == h.clock + 1000  # the delete horizon, KIP-534
    h.clock += 999
    h.clean()  # due only by the horizon, which has not passed
    assert [(k, v) for _, k, v, _ in read_all(h.log)[1]] == [(b"k", None), (b"other", b"x")]
    h.clock += 1
    assert h.clean() is not None  # the horizon passed: due although nothing is dirty
    assert [(k, v) for _, k, v, _ in read_all(h.log)[1]] == [(b"other", b"x")]
    h.model.check(h.log)


def test_record_timestamps_survive_a_delete_horizon_and_a_removed_first_record():
    h = Harness(CompactionConfig(min_cleanable_dirty_ratio=0.0), segment_bytes=1 << 20)
    h.append([(b"gone", b"1")])
    h.clock += 5
    h.append([(b"gone", b"2"), (b"t", None), (b"kept", b"3")], compression=CODECS["zstd"])
    h.clock += 7
    h.append([(b"gone", b"4")])
    h.roll()
    h.clean()
    h.model.check(h.log)  # checks every record's timestamp against what was appended


def test_each_producers_last_batch_stays_even_when_emptied():
    h = Harness(CompactionConfig(min_cleanable_dirty_ratio=0.0), segment_bytes=300)
    h.append([(b"k", b"from-1")], producer_id=1)
    h.append([(b"k", b"from-1-again")], producer_id=1)
    h.append([(b"k", b"from-2")], producer_id=2)
    h.roll()
    h.clean()
    headers, found = read_all(h.log)
    assert [(k, v) for _, k, v, _ in found] == [(b"k", b"from-2")]
    # producer 1's last batch is there, empty, with its offsets and sequence; its first
    # batch (not its last) went
    empty = [hd for hd in headers if hd.producer_id == 1]
    assert [(hd.base_offset, hd.last_offset, hd.base_sequence, hd.records_count)
            for hd in empty] == [(1, 1, 1, 0)]
    h.model.check(h.log)


def test_keyless_records_of_a_compacted_log_are_removed():
    batch = encode_batch([(None, b"x", (), 1), (b"k", b"y", (), 1)], base_offset=10)
    header = read_header(batch)
    outcome = clean_batch(batch, header, OffsetMap(0, 1 << 20), Rules(2, 0, {}))
    assert outcome.removed == 1
    _, kept = decode_batch(outcome.data)
    assert [(r.offset, r.key) for r in kept] == [(11, b"k")]


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_a_rewritten_batch_keeps_offsets_and_producer_fields_in_every_codec(codec):
    records = [(b"k%d" % (i % 3), b"v%d" % i, (("h", b"1"),), 100 + i) for i in range(9)]
    batch = encode_batch(records, CODECS[codec], base_offset=500, producer_id=7,
                         producer_epoch=3, base_sequence=40)
    header = read_header(batch)
    offsets = OffsetMap(500, 1 << 20)
    facts = record_facts(batch_payload(batch, header), header.records_count)
    assert offsets.add(header, facts)
    outcome = clean_batch(batch, header, offsets, Rules(1000, 0, {}))
    new, kept = decode_batch(outcome.data)
    assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in kept] == [
        (506, b"k0", b"v6", 106, (("h", b"1"),)), (507, b"k1", b"v7", 107, (("h", b"1"),)),
        (508, b"k2", b"v8", 108, (("h", b"1"),))]
    assert (new.base_offset, new.last_offset, new.producer_id, new.producer_epoch,
            new.base_sequence, new.records_count, new.compression) == (
        500, 508, 7, 3, 40, 3, CODECS[codec])
    assert new.last_sequence == header.last_sequence
    assert new.base_timestamp == 106 and new.max_timestamp == 108


def test_the_dirty_ratio_and_the_lags_decide_what_is_due():
    config = CompactionConfig(min_cleanable_dirty_ratio=0.5, min_compaction_lag_ms=100,
                              max_compaction_lag_ms=1000)
    segments = [SegmentSummary(0, 10, 600, 50, 10), SegmentSummary(10, 20, 300, 150, 110),
                SegmentSummary(20, 30, 300, 950, 900), SegmentSummary(30, 30, 0, -1, -1)]
    # clean below 10; the segment at 20 is younger than the min lag at 1000
    where = cleanable(segments, 10, 1000, config)
    assert (where.first_dirty, where.first_uncleanable) == (10, 20)
    assert (where.clean_bytes, where.dirty_bytes) == (600, 300)
    assert not where.due(config)  # a third dirty, under the ratio, not overdue
    later = cleanable(segments, 10, 1200, config)
    assert later.overdue and later.due(config)  # the segment at 10 waited more than 1000
    assert later.first_uncleanable == 30
    # a checkpoint outside the log (before a deletion) counts from the log start
    assert cleanable(segments, 99, 1000, config).first_dirty == 0


def test_segments_join_a_group_while_its_cleaned_size_fits_segment_bytes():
    segment = SegmentSummary(100, 200, 400, 0, 0)
    assert joins_group(600, segment, 0, 1000, 1 << 31)
    assert not joins_group(601, segment, 0, 1000, 1 << 31)
    assert not joins_group(0, segment, 0, 1000, 198)  # offsets 0..199 would not fit


def test_segments_emptied_by_a_clean_go_into_the_next_group():
    h = Harness(CompactionConfig(min_cleanable_dirty_ratio=0.0), segment_bytes=400)
    for i in range(60):
        h.append([(b"k", b"v%d" % i)])
    h.roll()
    assert len(h.log.segments) > 10
    h.clean()
    assert len(h.log.segments) == 2  # one cleaned segment holding the one record, the active
    h.model.check(h.log)


def test_the_offset_map_stops_at_its_capacity_and_the_clean_covers_only_that():
    h = Harness(CompactionConfig(min_cleanable_dirty_ratio=0.0), segment_bytes=300)
    for i in range(40):
        h.append([(b"key-%d" % i, b"v")])
    h.roll()
    result = h.clean(map_capacity=500)  # room for about 4 keys
    assert result is not None and 0 < result.first_dirty < 40
    assert h.log.first_dirty_offset == result.first_dirty
    h.model.check(h.log)
    while (result := h.clean(map_capacity=500)) is not None:
        h.model.check(h.log)
    assert h.log.first_dirty_offset == h.log.segments[-1].base_offset


def test_a_clean_groups_small_segments_and_reopens_the_same():
    h = Harness(CompactionConfig(min_cleanable_dirty_ratio=0.0), segment_bytes=400)
    for i in range(60):
        h.append([(KEYS[i % 2], b"v%d" % i)])
    h.roll()
    before = len(h.log.segments)
    h.clean()  # each segment cleaned on its own: as large as segment.bytes before
    h.append([(b"more", b"m")])
    h.roll()
    h.clean()  # the small cleaned ones go together now
    assert len(h.log.segments) < before
    expected = read_all(h.log)
    h.reopen(clean_shutdown=True)
    assert read_all(h.log) == expected
    h.reopen(clean_shutdown=False)
    assert read_all(h.log) == expected
    h.model.check(h.log)


def test_the_steps_pause_between_slices():
    h = Harness(CompactionConfig(min_cleanable_dirty_ratio=0.0), segment_bytes=1 << 20)
    for i in range(2000):
        h.append([(b"k%d" % (i % 50), b"x" * 300)])
    h.roll()
    steps = h.clean_steps()
    kinds = []
    try:
        step = next(steps)
        while True:
            kinds.append("pause" if step is None else "offload")
            step = steps.send(step.call() if step is not None else None)
    except StopIteration:
        pass
    assert kinds.count("pause") > 4 and kinds.count("offload") == 1
    h.model.last_clean_ms = h.clock
    h.model.check(h.log)


def test_reading_at_any_offset_of_a_cleaned_log_gets_the_next_record():
    h = Harness(CompactionConfig(min_cleanable_dirty_ratio=0.0), segment_bytes=300)
    for i in range(30):
        h.append([(KEYS[i % 4], b"v%d" % i)])
    h.roll()
    h.clean()
    _, found = read_all(h.log)
    present = [o for o, *_ in found]
    for offset in range(30):
        data = h.log.read(offset, 1).records
        header = read_header(data)
        assert header.last_offset >= offset
        _, batch = decode_batch(data)
        assert min(r.offset for r in batch if r.offset >= offset) == \
            min(o for o in present if o >= offset)


def test_run_drives_a_clean_that_is_not_due_to_none():
    h = Harness(CompactionConfig(min_cleanable_dirty_ratio=1.0), segment_bytes=300)
    h.append([(b"k", b"v")])
    assert cleaning.run(h.clean_steps()) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=20)),
                          st.one_of(st.none(), st.binary(max_size=50)),
                          st.lists(st.tuples(st.text(max_size=5),
                                             st.one_of(st.none(), st.binary(max_size=5))),
                                   max_size=2),
                          st.integers(-(1 << 40), 1 << 40)), min_size=1, max_size=20))
def test_the_compiled_and_the_python_record_readers_agree(records):
    batch = encode_batch(records)
    payload = batch_payload(batch, read_header(batch))
    compiled = record_facts(payload, len(records))
    spans = record_spans(payload, len(records))
    assert compiled == [(s.offset_delta, s.key, s.tombstone) for s in spans]
    assert [(s.offset_delta, s.key, s.tombstone) for s in spans] == [
        (i, key, value is None) for i, (key, value, _, _) in enumerate(records)]
    assert codec.compiled is not None  # the compiled path is the one compared here


def test_reads_and_appends_between_the_steps_of_a_clean_see_and_keep_everything():
    """Between any two steps (where the broker serves requests): the log reads as the model
    allows, and what is appended meanwhile (rolls included) is there after the clean."""
    h = Harness(CompactionConfig(min_cleanable_dirty_ratio=0.0), segment_bytes=4000)
    for i in range(3000):
        h.append([(KEYS[i % 6] + b"%d" % (i % 40), b"v%d" % i + b"x" * 60)])
    h.roll()
    h.model.last_clean_ms = h.clock
    steps = h.clean_steps()
    reply, taken, i = None, 0, 0
    while True:
        try:
            step = steps.send(reply)
        except StopIteration as done:
            assert done.value is not None
            break
        reply = step.call() if step is not None else None
        taken += 1
        h.model.check(h.log)
        h.append([(b"during", b"%d" % i)], producer_id=1)
        i += 1
    assert taken > 3
    h.model.check(h.log)
    _, found = read_all(h.log)
    assert found[-1][1:3] == (b"during", b"%d" % (i - 1))
