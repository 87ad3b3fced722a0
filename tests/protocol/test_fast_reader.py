"""protocol/fast_reader.py decodes what kio decodes, value for value, and refuses nothing the
general path (frame check + kio) would not refuse in the same words: random well-formed and
broken frames of every version of every API it compiles (fast_reader.HOT)."""
from __future__ import annotations

import dataclasses
import random
import struct
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import get_field_tag
from support.request_frames import broken_frames, random_entity, with_size

from oncelog.protocol import fast_reader
from oncelog.protocol.api_versions import SUPPORTED_VERSIONS
from oncelog.protocol.errors import ProtocolError
from oncelog.protocol.messages import (
    decode_general,
    decode_request,
    encode_request,
    peek_header,
    request_schema,
)

HOT_VERSIONS = [(key, version) for key in sorted(fast_reader.HOT)
                for version in range(SUPPORTED_VERSIONS[key][0], SUPPORTED_VERSIONS[key][1] + 1)]


def _outcome(decode, frame):
    try:
        return decode(frame)
    except ProtocolError as exc:
        return type(exc), str(exc)


def _general(frame):
    return decode_general(frame, *peek_header(frame))


def _untagged(entity):
    """The entity with every tagged field at its default, at every level: what clients send."""
    if not dataclasses.is_dataclass(entity):
        return entity
    changes = {}
    for field in dataclasses.fields(entity):
        value = getattr(entity, field.name)
        if get_field_tag(field) is not None:
            changes[field.name] = field.default if field.default is not dataclasses.MISSING \
                else get_tagged_field_default(field)
        elif isinstance(value, tuple):
            changes[field.name] = tuple(_untagged(item) for item in value)
        else:
            changes[field.name] = _untagged(value)
    return dataclasses.replace(entity, **changes)


def _same_request(key: int, version: int, rng: random.Random) -> None:
    entity = random_entity(request_schema(key, version), rng)
    for body in (entity, _untagged(entity)):
        frame = encode_request(key, version, rng.randint(0, 2**31 - 1), "fuzz", body)[4:]
        for buf in (frame, memoryview(frame).toreadonly()):
            assert decode_request(buf) == _general(frame)
    frame = encode_request(key, version, 7, rng.choice((None, "", "ü-client")),
                           _untagged(entity))[4:]
    client_id, body, elements = fast_reader.reader(key, version)(frame)
    general = _general(frame)
    assert (client_id, body, elements) == (general.client_id, general.body, general.elements)


def _same_answers(key: int, version: int, rng: random.Random, broken: int) -> None:
    flexible = request_schema(key, version).__flexible__
    frames = broken_frames(key, version, flexible, rng, 1, likely=True)
    frames = rng.sample(frames, min(broken, len(frames)))
    for _ in range(broken // 3):
        frame = bytearray(rng.choice(frames))
        for _ in range(rng.randint(1, 3)):
            if len(frame) > 12:
                frame[rng.randrange(12, len(frame))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF))
        frames.append(with_size(frame))
    for frame in frames:
        frame = frame[4:]
        assert _outcome(decode_request, frame) == _outcome(_general, frame), frame.hex()


def test_every_version_once():
    """Every version of every API in HOT, well-formed and broken (see below)."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    for key, version in HOT_VERSIONS:
        _same_request(key, version, rng)
        _same_answers(key, version, rng, 15)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(api=st.sampled_from(HOT_VERSIONS), seed=st.integers(0, 2**32))
def test_the_same_request_as_kio(api, seed):
    """Well-formed frames (with and without tagged fields, as bytes and as the read-only
    memoryview a large frame arrives in): the same Request as the general path; without
    tagged fields the fast reader takes every one of them itself."""
    _same_request(*api, random.Random(seed))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(api=st.sampled_from(HOT_VERSIONS), seed=st.integers(0, 2**32))
def test_broken_frames_get_the_general_paths_answer(api, seed):
    """Every count, length and varint at its limits, every truncation, random padding, and
    random bytes overwritten: the same Request, or the same ProtocolError and message."""
    _same_answers(*api, random.Random(seed), 60)


def _header(api_key: int, version: int, flexible: bool) -> bytes:
    return struct.pack(">hhih", api_key, version, 7, -1) + (b"\x00" if flexible else b"")


@pytest.mark.parametrize(("name", "frame"), [
    ("Metadata v12, compact count 2^32-2",
     _header(3, 12, True) + b"\xff\xff\xff\xff\x0f" + b"\x00\x00\x00"),
    ("FindCoordinator v4, compact count 2^32-2",
     _header(10, 4, True) + b"\x00" + b"\xff\xff\xff\xff\x0f" + b"\x00"),
    ("Metadata v4, int32 count 2^31-1", _header(3, 4, False) + struct.pack(">i", 2**31 - 1)),
    ("OffsetFetch v7, partition count 2^31-1", _header(9, 7, True) + b"\x02g\x02\x02t"
     + b"\xff\xff\xff\xff\x07" + b"\x00\x00\x00"),
    ("Heartbeat v4, group id of 2^31 bytes", _header(12, 4, True) + b"\x80\x80\x80\x80\x08"),
    ("Heartbeat v3, null member id", _header(12, 3, False) + b"\x00\x01g" + b"\x00" * 4
     + b"\xff\xff\xff\xff"),
    ("OffsetCommit v8, varint past 32 bits",
     _header(8, 8, True) + b"\xff\xff\xff\xff\xff\x01"),
])
def test_hostile_frames_are_left_to_the_general_path(name, frame):
    """Counts and lengths the frame cannot hold are refused before anything is allocated
    for them; the general path then says what is wrong, as before."""
    key, version = struct.unpack_from(">hh", frame)
    read = fast_reader.reader(key, version)
    tracemalloc.start()
    try:
        with pytest.raises(fast_reader.FALLBACK):
            read(frame)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 10, f"{name}: {peak} bytes allocated"
    with pytest.raises(ProtocolError, match=f"malformed api key {key} v{version} request"):
        decode_request(frame)
