"""The offset records written with precompiled struct layouts (group_records.offset_key,
offset_value, offset_value_of) are byte for byte what the general _Writer gives for the same
fields (the encoding they replaced on the commit path), and read back to the same values."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.coordinator.group import group_records as rec

INT16 = st.integers(-(1 << 15), (1 << 15) - 1)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
# Short texts, and long ones of 1- to 4-byte characters on either side of the STRING bound.
LONG = st.builds(lambda c, n: c * (n // len(c.encode())), st.sampled_from("aé€\U0001d11e"),
                 st.integers(rec.MAX_STRING_BYTES - 8, rec.MAX_STRING_BYTES + 8))
TEXT = st.one_of(st.text(max_size=40), LONG)
MAYBE_TEXT = st.one_of(st.none(), TEXT)


def _writer_key(group, topic, partition) -> bytes:
    return (rec._Writer().int16(rec.OFFSET_KEY_VERSION).string(group).string(topic)
            .int32(partition).done())


def _writer_value(offset, epoch, metadata, commit, expire) -> bytes:
    if expire >= 0:
        return (rec._Writer().int16(1).int64(offset).string(metadata).int64(commit)
                .int64(expire).done())
    return (rec._Writer().int16(rec.OFFSET_VALUE_VERSION).int64(offset).int32(epoch)
            .string(metadata).int64(commit).done())


def _outcome(encode, *args):
    """The bytes, or the kind of error raised (out of range, or a string too long)."""
    try:
        return encode(*args)
    except (ValueError, struct.error) as exc:
        return type(exc)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(MAYBE_TEXT, MAYBE_TEXT, st.one_of(INT32, st.integers(-(1 << 40), 1 << 40)))
def test_offset_key_matches_the_writer(group, topic, partition) -> None:
    assert _outcome(rec.offset_key, group, topic, partition) == \
        _outcome(_writer_key, group, topic, partition)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.one_of(INT64, st.integers(-(1 << 70), 1 << 70)), st.one_of(INT32, INT16),
       MAYBE_TEXT, INT64, st.one_of(st.just(-1), INT64))
def test_offset_value_matches_the_writer(offset, epoch, metadata, commit, expire) -> None:
    expected = _outcome(_writer_value, offset, epoch, metadata, commit, expire)
    assert _outcome(rec.offset_value_of, offset, epoch, metadata, commit, expire) == expected
    value = rec.OffsetValue(offset, epoch, metadata, commit, expire)
    assert _outcome(rec.offset_value, value) == expected
    if isinstance(expected, bytes) and metadata is not None:
        back = rec.read_offset_value(expected, 7)
        # Version 1 (with an expiry) has no leader epoch, version 3 no expiry: -1 when read.
        assert back == rec.OffsetValue(offset, epoch if expire < 0 else -1, metadata, commit,
                                       max(expire, -1))
        assert back.record_offset == 7

@pytest.mark.parametrize("text", ["x" * rec.MAX_STRING_BYTES, "é" * 16384])
def test_the_string_bound_is_kept(text) -> None:
    assert _outcome(rec.offset_key, "g", text, 0) == _outcome(_writer_key, "g", text, 0)
    assert _outcome(rec.offset_value_of, 0, -1, text, 0) == \
        _outcome(_writer_value, 0, -1, text, 0, -1)
