"""protocol/batches.py: the one walk over fetched record batches that every reader uses."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.record_sets import T0, control_batch, craft_batch, data_batch

from oncelog import ConsumerRecord
from oncelog.protocol import records as codec
from oncelog.protocol.batches import CorruptBatch, RecordSetWalk, UnsupportedFormat
from oncelog.protocol.record_batch import ATTRIBUTES_OFFSET, CRC_OFFSET, HEADER_SIZE, crc_of
from oncelog.protocol.records import encode_batch


def offsets(data: bytes, position: int, end: int | None = None) -> tuple[list[int], int]:
    """Offsets of the records a reader gets from ``data``, and the next position."""
    walk = RecordSetWalk(data, position, end)
    out: list = []
    for batch in walk:
        batch.append_records(out, ConsumerRecord, "t", 0)
    return [r.offset for r in out], walk.position


def test_a_control_batch_moves_the_position_and_delivers_nothing():
    data = data_batch(0, [b"a", b"b", b"c"], producer_id=5, producer_epoch=0, base_sequence=0,
                      transactional=True) + control_batch(3, producer_id=5)
    assert offsets(data, 0) == ([0, 1, 2], 4)
    assert offsets(control_batch(3), 3) == ([], 4)
    walk = RecordSetWalk(data, 0)
    assert [b.header.base_offset for b in walk] == [0]  # the marker is not handed out


def test_compacted_batches_move_the_position_past_their_last_offset():
    # Offsets 10..19 with records at 10, 13 and 15 only (the rest compacted away), then a
    # batch at 20: the position after the first is 20, not 16.
    compacted = craft_batch(10, [(0, b"k", b"a"), (3, b"k", b"b"), (5, b"k", b"c")],
                            last_offset_delta=9)
    data = compacted + data_batch(20, [b"d"])
    assert offsets(data, 10) == ([10, 13, 15, 20], 21)
    assert offsets(compacted, 10) == ([10, 13, 15], 20)
    # Wanted from 16: the batch's records all lie below it, and the position still moves on.
    assert offsets(compacted, 16) == ([], 20)
    assert offsets(compacted, 14) == ([15], 20)


def test_a_gap_between_batches_moves_the_position_to_the_next_batch():
    data = data_batch(0, [b"a", b"b"]) + data_batch(7, [b"c"])
    assert offsets(data, 0) == ([0, 1, 7], 8)
    assert offsets(data, 3) == ([7], 8)
    # Reading [0, 5): offsets 2..4 are not in the log, so the range is done at the next batch.
    walk = RecordSetWalk(data, 0, end=5)
    assert [b.header.base_offset for b in walk] == [0]
    assert walk.position == 7 and walk.done


def test_a_partial_batch_at_the_end_is_left_for_the_next_fetch():
    first, second = data_batch(0, [b"a", b"b"]), data_batch(2, [b"c" * 100])
    for cut in (1, 12, 60, 61, len(second) - 1):
        walk = RecordSetWalk(first + second[:cut], 0)
        assert [b.header.base_offset for b in walk] == [0]
        assert walk.partial and walk.position == 2
    walk = RecordSetWalk(second[:80], 2)
    assert list(walk) == [] and walk.partial and walk.position == 2
    walk = RecordSetWalk(first + second, 0)
    assert len(list(walk)) == 2 and not walk.partial and walk.position == 3


def test_positions_inside_batches_and_an_end_bound():
    data = data_batch(0, [b"%d" % i for i in range(5)]) + data_batch(5, [b"x"] * 5)
    assert offsets(data, 3) == ([3, 4, *range(5, 10)], 10)
    assert offsets(data, 5) == ([5, 6, 7, 8, 9], 10)
    assert offsets(data, 10) == ([], 10)
    got, position = offsets(data, 2, end=7)
    assert got == [2, 3, 4, 5, 6] and position == 10  # the batch holding 6 was walked whole
    walk = RecordSetWalk(data, 0, end=5)
    assert [b.header.base_offset for b in walk] == [0] and walk.done
    fields = [f for b in RecordSetWalk(data, 2, end=7) for f in b.record_fields()]
    assert [f[3] for f in fields] == [b"2", b"3", b"4", b"x", b"x"]


def test_a_bad_crc_is_an_error_or_skipped_and_counted():
    good = data_batch(0, [b"a"])
    bad = bytearray(data_batch(1, [b"b", b"c"]))
    bad[-1] ^= 0xFF
    data = good + bytes(bad) + data_batch(3, [b"d"])
    with pytest.raises(CorruptBatch, match="batch at offset 1 fails its CRC32C check") as exc:
        offsets(data, 0)
    assert exc.value.offset == 1
    walk = RecordSetWalk(data, 0, skip_corrupt=True)
    assert [b.header.base_offset for b in walk] == [0, 3]
    assert walk.corrupt_batches == 1 and walk.position == 4
    # Unchecked, the damaged batch is handed out; its records do not parse.
    walk = RecordSetWalk(data, 1, check_crcs=False)
    with pytest.raises(CorruptBatch, match="batch at offset 1: record batch does not parse"):
        for batch in walk:
            batch.record_fields()


@pytest.mark.parametrize("codec_id", [codec.GZIP, codec.SNAPPY, codec.LZ4, codec.ZSTD])
def test_compressed_garbage_with_a_right_crc_is_a_corrupt_batch(codec_id):
    batch = bytearray(data_batch(0, [b"a" * 50]))
    batch[HEADER_SIZE:] = b"\x00not compressed at all" * 3
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    batch[ATTRIBUTES_OFFSET + 1] |= codec_id
    struct.pack_into(">I", batch, CRC_OFFSET, crc_of(batch, 0, len(batch)))
    (found,) = RecordSetWalk(bytes(batch), 0)
    with pytest.raises(CorruptBatch, match="batch at offset 0: "):
        found.append_records([], ConsumerRecord, "t", 0)
    with pytest.raises(CorruptBatch, match="batch at offset 0: "):
        found.record_fields()


def test_old_message_formats_and_impossible_lengths_are_refused():
    v1 = bytearray(data_batch(0, [b"a"]))
    v1[16] = 1
    with pytest.raises(UnsupportedFormat, match="message format v1 at offset 0"):
        list(RecordSetWalk(bytes(v1), 0))
    short = bytearray(data_batch(0, [b"a"]))
    struct.pack_into(">i", short, 8, 20)
    with pytest.raises(CorruptBatch, match="has length 20"):
        list(RecordSetWalk(bytes(short), 0))


def _batch(base_offset, records, log_append_time=False, **identity):
    batch = bytearray(encode_batch(records, base_offset=base_offset, **identity))
    if log_append_time:
        batch[ATTRIBUTES_OFFSET + 1] |= 0x08
        struct.pack_into(">I", batch, CRC_OFFSET, crc_of(batch, 0, len(batch)))
    return bytes(batch)


def test_compiled_and_python_record_building_agree(monkeypatch):
    """The compiled codec builds ConsumerRecords itself (protocol/_records.c); the Python path
    must build the very same ones: offsets from a position inside a batch, sequences that wrap
    at 2^31 - 1, no producer, log-append time, transactional batches, headers, nulls, an end
    inside a batch."""
    records = [(b"k%d" % i if i % 3 else None, None if i == 4 else b"v" * i,
                [("h", b"%d" % i)] if i % 2 else [], T0 + i) for i in range(8)]
    data = b"".join([
        _batch(100, records, producer_id=7, producer_epoch=2, base_sequence=2**31 - 3),
        _batch(108, records),
        _batch(116, records, log_append_time=True, producer_id=9, producer_epoch=0,
               base_sequence=0, transactional=True),
    ])

    def build(position: int, end: int | None) -> list:
        out: list = []
        for batch in RecordSetWalk(data, position, end):
            batch.append_records(out, ConsumerRecord, "any", 3)
        return out

    assert codec.compiled is not None
    for position, end in ((0, None), (100, None), (103, None), (108, 120), (119, 122),
                          (124, None)):
        compiled = build(position, end)
        monkeypatch.setattr(codec, "compiled", None)
        python = build(position, end)
        monkeypatch.undo()
        assert compiled == python
        assert [type(r) for r in compiled] == [ConsumerRecord] * len(python)
        assert [r.offset for r in compiled] == list(range(max(position, 100), end or 124))
        if position == 0:
            every = compiled
    assert [r.sequence for r in every[:4]] == [2**31 - 3, 2**31 - 2, 2**31 - 1, 0]
    assert {r.sequence for r in every[8:16]} == {-1}
    assert {r.timestamp for r in every[16:]} == {T0 + 7}
    assert {(r.timestamp_type, r.is_transactional) for r in every[16:]} == \
        {("LogAppendTime", True)}


# --- any log, any cut ----------------------------------------------------------------------

@st.composite
def logs(draw):
    """A partition's batches as a log may hold them: data batches, compacted ones (records
    skipping offsets), control batches, and gaps between batches (whole batches compacted
    away). Returns (batches as bytes, the offsets holding records, the log end offset)."""
    offset = draw(st.integers(0, 5))
    batches, held = [], []
    for _ in range(draw(st.integers(1, 8))):
        offset += draw(st.sampled_from([0, 0, 0, 1, 3]))
        kind = draw(st.sampled_from(["data", "data", "compacted", "control"]))
        if kind == "control":
            batches.append(control_batch(offset))
            offset += 1
            continue
        span = draw(st.integers(1, 6))
        deltas = list(range(span)) if kind == "data" else sorted(draw(st.sets(
            st.integers(0, span - 1), min_size=1)))
        batches.append(craft_batch(offset, [(d, None, b"%d" % (offset + d)) for d in deltas],
                                   last_offset_delta=span - 1))
        held += [offset + d for d in deltas]
        offset += span
    return batches, held, offset


@settings(max_examples=300, deadline=None)
@given(logs(), st.data())
def test_fetching_from_each_position_reads_every_record_once_and_ends_at_the_log_end(
        log, data):
    """A reader that fetches from its position and gets whole batches from the one holding it
    (cut anywhere, as a byte limit cuts a Fetch answer) reads every record once, in order,
    and its position reaches the log end: nothing is read twice, skipped, or waited for."""
    batches, held, log_end = log
    start = data.draw(st.integers(0, log_end), label="start")
    position, got = start, []
    for _ in range(4 * len(batches) + 4):
        if position >= log_end:
            break
        first = next(i for i, b in enumerate(batches)
                     if struct.unpack_from(">q", b)[0] + struct.unpack_from(">i", b, 23)[0]
                     >= position)
        answer = b"".join(batches[first:])
        whole = len(batches[first])
        cut = data.draw(st.integers(whole, len(answer)), label="cut")  # KIP-74: one whole
        walk = RecordSetWalk(answer[:cut], position)
        out: list = []
        for batch in walk:
            batch.append_records(out, ConsumerRecord, "t", 0)
        got += [r.offset for r in out]
        assert walk.position > position
        position = walk.position
    assert position == log_end
    assert got == [o for o in held if o >= start]
