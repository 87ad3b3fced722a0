"""protocol/fast_writer.py writes what kio writes, byte for byte, for random entities of every
request and response version the broker supports."""
from __future__ import annotations

import io
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_writer
from support.request_frames import random_entity

from oncelog.protocol.api_versions import SUPPORTED_VERSIONS
from oncelog.protocol.fast_writer import writer

SCHEMAS = [(load, key, version) for key, (low, high) in sorted(SUPPORTED_VERSIONS.items())
           for version in range(low, high + 1)
           for load in (load_request_schema, load_response_schema)]


def _both(cls, entity) -> tuple[bytes, bytes]:
    ours, theirs = io.BytesIO(), io.BytesIO()
    writer(cls)(ours, entity)
    entity_writer(cls)(theirs, entity)
    return ours.getvalue(), theirs.getvalue()


@settings(max_examples=150, deadline=None, derandomize=True)
@given(schema=st.sampled_from(SCHEMAS), seed=st.integers(0, 2**32))
def test_the_same_bytes_as_kio(schema, seed):
    load, key, version = schema
    cls = load(key, version)
    entity = random_entity(cls, random.Random(seed))
    ours, theirs = _both(cls, entity)
    assert ours == theirs, (cls.__module__, entity)


def test_every_supported_schema_compiles_and_matches_once():
    rng = random.Random(26)
    for load, key, version in SCHEMAS:
        cls = load(key, version)
        entity = random_entity(cls, rng)
        ours, theirs = _both(cls, entity)
        assert ours == theirs, cls.__module__
