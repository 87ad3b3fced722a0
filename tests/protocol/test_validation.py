"""Record validation on the produce path (protocol/validation.py): what Kafka's LogValidator
refuses is refused with its error, the stored header is made true, and the compiled walk
(_records.check_records) and its Python twin give the same answer for any bytes."""

from __future__ import annotations

import random

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from support import crafted
from support.crafted import record, with_payload

from oncelog.protocol import records, validation
from oncelog.protocol.record_batch import (
    CONTROL_BIT,
    HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    InvalidBatch,
    pack_header,
    read_header,
    split_batches,
)
from oncelog.protocol.records import CODECS, compress, decode_batch, encode_batch
from oncelog.protocol.validation import (
    LONG_MAX,
    LONG_MIN,
    MAX_RECORD_ERRORS,
    RecordRules,
    _check_records,
    validate_batches,
)
from oncelog.protocol.varint import varint_bytes

COMPILED = records.compiled
NOW = 1_800_000_000_000
HOUR = 3_600_000
ANY = RecordRules(timestamp_after_max_ms=LONG_MAX)


def walks():
    """The walks to hold to the same answers: the compiled one (when built) and the twin."""
    return [_check_records] + ([COMPILED.check_records] if COMPILED is not None else [])


@pytest.fixture(params=["compiled", "python"])
def codec_impl(request, monkeypatch):
    """Run a test with the compiled codec and again with the Python rules alone."""
    if request.param == "compiled":
        assert COMPILED is not None, "the compiled codec was not built"
    else:
        monkeypatch.setattr(records, "compiled", None)
    return request.param


def batch_of(payload: bytes, count: int, base_ts: int = NOW, **fields) -> bytes:
    return crafted.batch_of(payload, count, base_ts, **fields)


def validate(buf: bytes, rules: RecordRules = ANY, now: int = NOW) -> list[BatchHeader]:
    return validate_batches(buf, split_batches(buf, 1 << 30), rules, now)


def refused(buf: bytes, rules: RecordRules = ANY, now: int = NOW) -> InvalidBatch:
    with pytest.raises(InvalidBatch) as info:
        validate(buf, rules, now)
    return info.value


def stored_bytes(buf: bytes, header: BatchHeader) -> bytes:
    """What the log stores for a one-batch ``buf`` given its validated header."""
    return pack_header(header) + buf[HEADER_SIZE:]


# --- the structure of the records --------------------------------------------------------------

STRUCTURE = {
    "count says 3, one record inside": (record(0), 3, "batch says 3 records but holds 1"),
    "a huge count": (record(0), 2**31 - 1, f"batch says {2**31 - 1} records but holds 1"),
    "count says 1, two records inside": (record(0) + record(1), 1,
                                         "batch says 1 records but more bytes follow them"),
    "length runs past the batch": (record(0, length=200), 1,
                                   "record 0: length 200 runs past the end of the batch"),
    "length shorter than the fields": (record(0, length=4) + b"\x00" * 5, 1,
                                       "record 0: a field runs past the end of the record"),
    "length longer than the fields": (record(0, body=record(0)[1:] + b"\x00"), 1,
                                      "record 0: length 9 does not match its fields (8 bytes)"),
    "negative length": (varint_bytes(-3) + record(0)[1:], 1, "record 0: negative length -3"),
    "empty record": (record(0, body=b""), 1, "record 0: a field runs past the end of the record"),
    "a 6-byte varint": (record(0, body=b"\x00\x00" + b"\x80" * 5 + b"\x00" + b"\x00\x00\x00"),
                        1, "record 0: a varint is too long"),
    "a 32-bit varint with bits past 32": (
        record(0, body=b"\x00\x00\x80\x80\x80\x80\x10\x02\x02k\x02v\x00"), 1,
        "record 0: a varint is too long"),
    "an 11-byte timestamp delta": (record(0, body=b"\x00" + b"\x80" * 10 + b"\x00" * 5), 1,
                                   "record 0: a varint is too long"),
    "a varint cut short": (record(0, body=b"\x00\x00\x80"), 1, "record 0: a varint is cut short"),
    "offset deltas 0, 2": (record(0) + record(2), 2, "record 1: offset delta 2, expected 1"),
    "offset deltas 1, 0": (record(1) + record(0), 2, "record 0: offset delta 1, expected 0"),
    "a key past the record": (record(0, body=b"\x00\x00\x00\x14k"), 1,
                              "record 0: a field runs past the end of the record"),
    "a negative header count": (record(0, body=b"\x00\x00\x00\x01\x01\x03"), 1,
                                "record 0: negative header count -2"),
    "a null header key": (record(0, headers=[(None, b"x")]), 1, "record 0: a header key is null"),
    "a huge header count": (record(0, body=b"\x00\x00\x00\x01\x01\xfe\xff\xff\xff\x07"), 1,
                            "record 0: a varint is cut short"),
    "a timestamp overflowing": (record(0, ts_delta=LONG_MAX), 1,
                                f"record 0: timestamp delta {LONG_MAX} overflows"),
}


@pytest.mark.parametrize("case", list(STRUCTURE))
def test_records_that_do_not_parse_are_invalid_record(case, codec_impl):
    payload, count, message = STRUCTURE[case]
    for codec in (0, CODECS["zstd"]):  # checked the same inside a compressed batch
        error = refused(batch_of(payload, count, codec=codec))
        assert error.error == ErrorCode.invalid_record
        assert str(error) == f"Invalid record structure: {message}"
        assert error.record_errors == ()


def test_what_kafka_accepts_passes():
    """Non-minimal varints (Kafka reads them), negative lengths other than -1 as null, a
    negative timestamp, null header values, empty keys and values."""
    payload = (record(0, body=b"\x00\x80\x00\x80\x00\x02k\x02v\x00")
               + record(1, key=b"", value=None, headers=[(b"h", None), (b"", b"")])
               + record(2, body=b"\x00\x00\x04\x05\x05\x00"))  # key and value of length -3
    for walk in walks():
        assert walk(payload, 3, NOW, False, LONG_MIN, LONG_MAX) == (NOW, None)
    assert validate(batch_of(payload, 3))[0].max_timestamp == NOW
    assert validate(batch_of(record(0, ts_delta=-5), 1, base_ts=0, max_ts=-5))[0] \
        .max_timestamp == -1  # Kafka's running maximum starts at -1 (no timestamp)


# --- the batch ---------------------------------------------------------------------------------


def test_control_batches_and_transactional_ones_without_producer_are_refused(codec_impl):
    control = refused(batch_of(record(0), 1, attributes=CONTROL_BIT, producer_id=5))
    assert (control.error, str(control)) == (ErrorCode.invalid_record,
                                             "Clients are not allowed to write control records")
    # A transactional batch is judged by producer state (rows T1-T4), not here; without a
    # producer id it is no transaction's.
    txn = batch_of(record(0), 1, attributes=TRANSACTIONAL_BIT, producer_id=5)
    assert validate_batches(txn, split_batches(txn, 1 << 20), ANY, NOW)[0].is_transactional
    no_pid = refused(batch_of(record(0), 1, attributes=TRANSACTIONAL_BIT, producer_id=-1))
    assert (no_pid.error, str(no_pid)) == (ErrorCode.invalid_record,
                                           "a transactional batch needs a producer id")
    bad = refused(batch_of(record(0), 2, attributes=TRANSACTIONAL_BIT, producer_id=5))
    assert bad.error == ErrorCode.invalid_record


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_garbage_with_a_right_crc_is_corrupt_message(codec):
    good = compress(CODECS[codec], record(0) * 1)
    noise = random.Random(12).randbytes(64)
    for garbage in (good[:-3], bytes(reversed(good)), b"\xff" * 40, noise):
        buf = batch_of(b"", 1)
        header = read_header(buf)._replace(attributes=CODECS[codec])
        error = refused(with_payload(header, garbage))
        assert error.error in (ErrorCode.corrupt_message, ErrorCode.message_too_large), error
        assert f"{codec} batch" in str(error)


def test_unknown_codec_and_decompression_bomb(monkeypatch):
    header = read_header(batch_of(record(0), 1))
    unknown = refused(with_payload(header._replace(attributes=6), record(0)))
    assert unknown.error == ErrorCode.invalid_record
    assert "compression codec 6, which does not exist" in str(unknown)
    monkeypatch.setattr(validation, "MAX_UNCOMPRESSED_BYTES", 1 << 20)
    for codec in ("gzip", "snappy", "lz4", "zstd"):
        big = record(0, value=bytes(2 << 20))  # zeros: compresses to almost nothing
        error = refused(batch_of(big, 1, codec=CODECS[codec]))
        assert error.error == ErrorCode.message_too_large, codec
        assert "more than 1048576" in str(error)


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_every_codec_validates_and_keeps_the_bytes(codec, codec_impl):
    batch = encode_batch([(b"k%d" % i, b"v" * i, [("h", b"x")], NOW - 10 * i)
                          for i in range(50)], CODECS[codec])
    (header,) = validate(batch)
    assert header == read_header(batch)  # nothing to change: the same header, same CRC


# --- timestamps --------------------------------------------------------------------------------


def test_max_timestamp_is_recomputed_and_the_crc_with_it(codec_impl):
    # librdkafka writes max timestamp 0 when its records carry none (-1).
    no_timestamps = batch_of(record(0) + record(1), 2, base_ts=-1, max_ts=0)
    (header,) = validate(no_timestamps)
    assert header.max_timestamp == -1
    stored = stored_bytes(no_timestamps, header)
    assert header.crc == crc32c.crc32c(stored[21:]) != read_header(no_timestamps).crc
    assert [r.timestamp for r in decode_batch(stored)[1]] == [-1, -1]
    # A header claiming less than its records hold is corrected the same way.
    (header,) = validate(batch_of(record(0) + record(1, ts_delta=500), 2, max_ts=NOW))
    assert header.max_timestamp == NOW + 500


def test_log_append_time_stamps_the_broker_clock(codec_impl):
    rules = RecordRules(log_append_time=True)
    old = encode_batch([(b"k", b"a", (), 1_000), (b"k", b"b", (), 2_000)], CODECS["lz4"])
    (header,) = validate(old, rules)  # no bounds: any CreateTime is replaced
    assert header.attributes == CODECS["lz4"] | TIMESTAMP_TYPE_BIT
    assert header.base_timestamp == header.max_timestamp == NOW
    stored = stored_bytes(old, header)
    assert header.crc == crc32c.crc32c(stored[21:])
    assert stored[HEADER_SIZE:] == old[HEADER_SIZE:]


def test_a_client_claiming_log_append_time_is_refused_per_record():
    error = refused(batch_of(record(0, key=None) + record(1), 2, attributes=TIMESTAMP_TYPE_BIT),
                    RecordRules(keys_required=True))
    assert error.error == ErrorCode.invalid_timestamp
    assert error.record_errors == (
        (0, "Compacted topic cannot accept message without key"),
        (1, "Invalid timestamp type in message 1. Producer should not set timestamp type to "
            "LogAppendTime."))


def test_timestamp_bounds_kip_937(codec_impl):
    rules = RecordRules(timestamp_before_max_ms=HOUR, timestamp_after_max_ms=60_000)
    deltas = [0, -HOUR, -HOUR - 1, 60_000, 60_001, -NOW - 1]  # the last one is -1: no timestamp
    payload = b"".join(record(i, ts_delta=d) for i, d in enumerate(deltas))
    error = refused(batch_of(payload, len(deltas)), rules)
    assert error.error == ErrorCode.invalid_timestamp
    low, high = NOW - HOUR, NOW + 60_000
    assert error.record_errors == tuple(
        (i, f"Timestamp {NOW + deltas[i]} of message with offset {i} is out of range. The "
            f"timestamp should be within [{low}, {high}]") for i in (2, 4))
    assert str(error).startswith("One or more records have been rejected due to invalid "
                                 "timestamp: 2 in total, the first ones: record 2: Timestamp")
    # Within the bounds, and LogAppendTime topics ignore them (as Kafka's do).
    validate(batch_of(record(0) + record(1, ts_delta=-HOUR), 2), rules)
    rules_lat = RecordRules(log_append_time=True, timestamp_after_max_ms=0)
    assert validate(batch_of(payload, len(deltas)), rules_lat)[0].max_timestamp == NOW


def test_defaults_refuse_the_future_only():
    ancient = encode_batch([(b"k", b"v", (), 0)])
    validate(ancient, RecordRules())
    future = encode_batch([(b"k", b"v", (), NOW + HOUR + 1)])
    assert refused(future, RecordRules()).error == ErrorCode.invalid_timestamp
    validate(encode_batch([(b"k", b"v", (), NOW + HOUR)]), RecordRules())


# --- keys on compacted topics -------------------------------------------------------------------


def test_compacted_topics_need_keys(codec_impl):
    rules = RecordRules(keys_required=True)
    payload = record(0) + record(1, key=None) + record(2, key=b"") + record(3, key=None)
    error = refused(batch_of(payload, 4, codec=CODECS["snappy"]), rules)
    assert error.error == ErrorCode.invalid_record
    assert error.record_errors == ((1, "Compacted topic cannot accept message without key"),
                                   (3, "Compacted topic cannot accept message without key"))
    assert str(error) == (
        "One or more records have been rejected due to record errors: 2 in total, the first "
        "ones: record 1: Compacted topic cannot accept message without key; record 3: "
        "Compacted topic cannot accept message without key")
    validate(batch_of(payload, 4), RecordRules())  # keyless records are fine elsewhere


def test_record_errors_are_capped():
    n = MAX_RECORD_ERRORS + 10
    payload = b"".join(record(i, key=None) for i in range(n))
    error = refused(batch_of(payload, n), RecordRules(keys_required=True))
    assert len(error.record_errors) == MAX_RECORD_ERRORS
    assert f"{n} in total" in str(error)


# --- the twin: the compiled walk and the Python one agree on any bytes -------------------------

records_st = st.lists(st.tuples(st.none() | st.binary(max_size=12),
                                st.none() | st.binary(max_size=30),
                                st.lists(st.tuples(st.binary(max_size=4),
                                                   st.none() | st.binary(max_size=4)),
                                         max_size=2),
                                st.integers(-3, 2**40)),
                      min_size=1, max_size=8)


def _payload(recs) -> bytes:
    base = recs[0][3]
    return b"".join(record(i, k, v, ts - base, hs) for i, (k, v, hs, ts) in enumerate(recs))


@settings(max_examples=400, deadline=None, derandomize=True)
@given(recs=records_st, data=st.data())
def test_twin_agrees_on_random_and_mutated_batches(recs, data):
    payload = bytearray(_payload(recs))
    for _ in range(data.draw(st.integers(0, 3))):
        kind = data.draw(st.sampled_from(["flip", "set", "insert", "delete", "cut"]))
        if not payload:
            break
        at = data.draw(st.integers(0, len(payload) - 1))
        if kind == "flip":
            payload[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set":
            payload[at] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, 0x0F, 0x10]))
        elif kind == "insert":
            payload[at:at] = data.draw(st.binary(min_size=1, max_size=6))
        elif kind == "delete":
            del payload[at:at + data.draw(st.integers(1, 6))]
        else:
            del payload[at:]
    count = data.draw(st.sampled_from([len(recs), len(recs) - 1, len(recs) + 1, 0, 2**31 - 1]))
    base_ts = data.draw(st.sampled_from([recs[0][3], -1, LONG_MAX - 5, LONG_MIN]))
    need_key = data.draw(st.booleans())
    low = data.draw(st.sampled_from([LONG_MIN, 0, 2**39]))
    high = data.draw(st.sampled_from([LONG_MAX, 2**39, 2**40]))
    assert COMPILED is not None, "the compiled codec was not built"
    answers = []
    for walk in walks():
        try:
            answers.append(("ok", walk(bytes(payload), count, base_ts, need_key, low, high)))
        except ValueError as exc:
            answers.append(("error", str(exc)))
    assert answers[0] == answers[1]


@settings(max_examples=100, deadline=None, derandomize=True)
@given(recs=records_st, codec=st.sampled_from(sorted(CODECS)))
def test_valid_batches_pass_with_their_max_timestamp(recs, codec):
    recs = [(k, v, [(hk.decode("latin-1"), hv) for hk, hv in hs], ts) for k, v, hs, ts in recs]
    batch = encode_batch(recs, CODECS[codec])
    (header,) = validate(batch)
    assert header.max_timestamp == max(max(ts for *_, ts in recs), -1)
