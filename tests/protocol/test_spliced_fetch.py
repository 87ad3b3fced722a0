"""protocol/spliced.py: a Fetch answer whose records are file regions is, piece by piece, the
frame kio encodes with the records in memory, for every Fetch version the broker answers."""
from __future__ import annotations

import dataclasses
import os
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_response_schema
from support.request_frames import random_entity

from oncelog.log.regions import FileRegion
from oncelog.protocol.api_versions import FETCH, SUPPORTED_VERSIONS
from oncelog.protocol.messages import encode_response
from oncelog.protocol.spliced import SplicedAnswer, encode_spliced

VERSIONS = range(SUPPORTED_VERSIONS[FETCH][0], SUPPORTED_VERSIONS[FETCH][1] + 1)


def _with_regions(body, path: str, every: int):
    """``body`` with the records of every ``every``-th partition as regions of ``path``."""
    count = 0
    topics = []
    for topic in body.responses:
        partitions = []
        for p in topic.partitions:
            count += 1
            if p.records is not None and count % every == 0:
                with open(path, "ab") as f:
                    position = f.tell()
                    f.write(p.records)
                region = FileRegion(os.open(path, os.O_RDONLY), position, len(p.records), path)
                p = dataclasses.replace(p, records=region)
            partitions.append(p)
        topics.append(dataclasses.replace(topic, partitions=tuple(partitions)))
    return dataclasses.replace(body, responses=tuple(topics))


@settings(max_examples=120, deadline=None, derandomize=True)
@given(version=st.sampled_from(VERSIONS), seed=st.integers(0, 2**32), every=st.integers(1, 3),
       correlation_id=st.integers(-(2**31), 2**31 - 1))
def test_the_pieces_are_kios_frame(tmp_path_factory, version, seed, every, correlation_id):
    body = random_entity(load_response_schema(FETCH, version), random.Random(seed))
    expected = encode_response(FETCH, version, correlation_id, body)
    path = str(tmp_path_factory.mktemp("regions") / "segment")
    spliced = encode_spliced(FETCH, version, correlation_id, _with_regions(body, path, every))
    if isinstance(spliced, bytes):  # no partition had records to put in a region
        assert spliced == expected
        return
    assert isinstance(spliced, SplicedAnswer) and len(spliced) == len(expected)
    assert any(isinstance(p, FileRegion) for p in spliced.pieces)
    assert spliced.materialize() == expected
    assert all(p.fd < 0 for p in spliced.pieces if isinstance(p, FileRegion))  # closed
