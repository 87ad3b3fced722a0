"""log/regions.py's fetch_records finds, without reading them, exactly the batches the copying
path returned: Log.read, then (read_committed) the cut before the last stable offset."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog.log import regions
from oncelog.log.log import Log, LogConfig
from oncelog.protocol.record_batch import assign_offsets, scan_batches, split_batches
from oncelog.protocol.records import encode_batch

_logs = st.fixed_dictionaries({
    "batches": st.lists(st.tuples(st.integers(1, 4), st.integers(0, 2500), st.integers(0, 3)),
                        min_size=1, max_size=30),
    "segment_bytes": st.integers(1500, 40_000),
    "index_interval": st.integers(1, 5000),
})
_reads = st.lists(st.tuples(st.floats(0, 1), st.integers(0, 30_000), st.booleans(),
                            st.floats(0, 1)), min_size=1, max_size=12)


def _build(path: str, spec: dict) -> Log:
    log = Log(path, LogConfig(segment_bytes=spec["segment_bytes"],
                              index_interval_bytes=spec["index_interval"]))
    for i, (count, size, gap) in enumerate(spec["batches"]):
        batch = encode_batch([(None, bytes([i % 251]) * size, (), 1000 + i)] * count)
        headers = split_batches(batch, 1 << 30)
        if log.should_roll(headers, 2000):
            log.roll()
        # A gap before the batch, as compaction leaves them (offsets only rise).
        headers, parts = assign_offsets(batch, headers, log.log_end_offset + gap, 0)
        log.append(parts, headers)
    return log


def _below(records: bytes, end: int) -> tuple[bytes, int]:
    """What the copying Fetch did after Log.read: keep the whole batches starting before
    ``end``; the offset after the last of them."""
    upper, cut = -1, 0
    for pos, header in scan_batches(records):
        if header.base_offset >= end:
            break
        cut, upper = pos + header.size, header.last_offset + 1
    return records[:cut], upper


def _bytes(records) -> bytes:
    return records.read() if isinstance(records, regions.FileRegion) else records


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=_logs, reads=_reads, splice_min=st.sampled_from([0, 1000, regions.SPLICE_MIN]))
def test_the_regions_are_the_batches_the_copying_read_returns(tmp_path_factory, spec, reads,
                                                              splice_min, monkeypatch):
    monkeypatch.setattr(regions, "SPLICE_MIN", splice_min)
    log = _build(str(tmp_path_factory.mktemp("log")), spec)
    try:
        end = log.log_end_offset
        for where, max_bytes, min_one, stable in reads:
            offset = min(end - 1, int(where * end))
            stable_end = offset + 1 + int(stable * (end - offset - 1))
            expected, upper = _below(log.read(offset, max_bytes, min_one).records, stable_end)
            records, got_upper = regions.fetch_records(log, offset, max_bytes, min_one,
                                                       stable_end)
            assert (_bytes(records), got_upper) == (expected, upper), \
                (offset, max_bytes, min_one, stable_end)
    finally:
        log.close()


def test_a_region_outlives_its_segment_and_says_when_the_file_was_cut(tmp_path, monkeypatch):
    monkeypatch.setattr(regions, "SPLICE_MIN", 0)
    log = _build(str(tmp_path / "log"), {"batches": [(1, 5000, 0)] * 4,
                                         "segment_bytes": 1 << 20, "index_interval": 4096})
    expected = log.read(0, 1 << 20).records
    kept, _ = regions.fetch_records(log, 0, 1 << 20, True, log.log_end_offset)
    cut, _ = regions.fetch_records(log, 0, 1 << 20, True, log.log_end_offset)
    path = log.segments[0].path
    log.delete()  # retention: the files go, the regions' descriptors keep the bytes
    assert not os.path.exists(path)
    assert not kept.truncated() and kept.read() == expected
    writable = os.open(f"/proc/self/fd/{cut.fd}", os.O_WRONLY)  # the deleted file
    os.ftruncate(writable, 100)
    os.close(writable)
    assert cut.truncated()
    try:
        cut.read()
    except regions.TruncatedRegion:
        pass
    else:
        raise AssertionError("a short read passed as the region")
