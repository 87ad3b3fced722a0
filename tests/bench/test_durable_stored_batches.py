"""bench/durable_produce.py counts the batches a broker stored from its segment files, so
that the broker of another checkout (``--src``, with or without a metrics listener) is
measured the same way; and ``--src`` takes a checkout's root or its ``src/``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _support import REPO, source_tree
from durable_produce import stored_batches

from oncelog.protocol.records import encode_batch


def test_batches_are_counted_across_segments(tmp_path):
    sizes = [(1, 3), (5, 1), (2, 40)]  # (records, value bytes) per batch
    batches = [encode_batch([(None, b"v" * size, [], 1_700_000_000_000)] * records,
                            base_offset=i * 100) for i, (records, size) in enumerate(sizes)]
    partition = tmp_path / "t-0"
    partition.mkdir()
    (partition / "00000000000000000000.log").write_bytes(batches[0] + batches[1])
    (partition / "00000000000000000200.log").write_bytes(batches[2])
    (partition / "00000000000000000000.index").write_bytes(b"\0" * 8)  # not a segment
    assert stored_batches(partition) == (sum(map(len, batches)), 3)


def test_src_is_a_checkout_or_its_src(tmp_path):
    (tmp_path / "src" / "oncelog").mkdir(parents=True)
    assert source_tree(tmp_path) == tmp_path / "src"
    assert source_tree(tmp_path / "src") == tmp_path / "src"
    assert source_tree(None) == REPO / "src"
