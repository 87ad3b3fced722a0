"""The consumer's per-record work alone: a fetched record set walked (protocol/batches.py) and
turned into ConsumerRecords, as oncelog.Consumer does with each Fetch answer. No broker, no
socket: CPU time per record, for 100 B and 1 KiB values in 16 KiB batches (the clients
benchmark's producer batches), CRCs checked.

    .venv/bin/python bench/consume_decode.py [--rounds 40]
    .venv/bin/python bench/consume_decode.py --against /tmp/old-904648a

``--against DIR`` also times another checkout (its root or its ``src/``), of any layout: its
``oncelog`` package is loaded beside this tree's under another name, and its consumer's
decoding runs in the same process, rounds interleaved; it prints the median of the paired
ratios. An older consumer whose ``Consumer._decode_into`` did this work (before the walk
existed, e.g. 904648a) is timed through that method, a newer one through its own walk. Build
its codec first, so that both run compiled:

    git worktree add /tmp/old-904648a 904648a
    (cd /tmp/old-904648a && "$OLDPWD/.venv/bin/python" setup.py build_ext --inplace)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics
import sys
import time
from pathlib import Path

from _support import add_quiet_arguments, wait_if_asked

from oncelog.client.consumer.consumer import ConsumerRecord
from oncelog.protocol.batches import RecordSetWalk
from oncelog.protocol.records import encode_batch

REPS = 10  # walks of the record set per timed round


def record_set(size: int) -> tuple[bytes, int]:
    """About 1 MiB of 16 KiB batches of ``size``-byte values; and how many records."""
    value = bytes((i * 7919) % 251 for i in range(size))
    per_batch = max(1, 16384 // (size + 10))
    data, offset = bytearray(), 0
    while len(data) < 1 << 20:
        data += encode_batch([(None, value, (), 1_700_000_000_000)] * per_batch,
                             base_offset=offset, producer_id=5, producer_epoch=0,
                             base_sequence=offset)
        offset += per_batch
    return bytes(data), offset


def walk(data: bytes, walk_type=RecordSetWalk, record_type=ConsumerRecord) -> list:
    out: list = []
    for batch in walk_type(data, 0, check_crcs=True):
        batch.append_records(out, record_type, "t", 0)
    return out


AGAINST = "oncelog_against"  # the name the other checkout's package is loaded under


def load_checkout(path: str):
    """The ``oncelog`` package of the checkout at ``path`` (its root or its src/), loaded
    as AGAINST: its own relative imports resolve inside it, whatever its layout."""
    root = Path(path).resolve()
    package = next((p for p in (root / "src" / "oncelog", root / "oncelog")
                    if (p / "__init__.py").is_file()), None)
    if package is None:
        raise SystemExit(f"--against {path}: no src/oncelog/__init__.py there (a checkout's "
                         f"root or its src/)")
    spec = importlib.util.spec_from_file_location(
        AGAINST, package / "__init__.py", submodule_search_locations=[str(package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[AGAINST] = module
    spec.loader.exec_module(module)
    return module


def _consumer_module(package):
    """The checkout's consumer module: client/consumer/consumer.py, or the flat layout's
    client/consumer.py."""
    flat = importlib.import_module(f"{package.__name__}.client.consumer")
    if hasattr(flat, "Consumer"):
        return flat
    return importlib.import_module(f"{package.__name__}.client.consumer.consumer")


def compiled_codec(records_module) -> bool:
    return records_module.compiled is not None


def older(path: str):
    """The other checkout's per-record work, as a function of the record set: its
    ``Consumer._decode_into`` where it has one, else its own walk."""
    package = load_checkout(path)
    records = importlib.import_module(f"{AGAINST}.protocol.records")
    if compiled_codec(records) != compiled_codec(importlib.import_module(
            "oncelog.protocol.records")):
        raise SystemExit(f"--against {path}: one checkout runs the compiled codec and the "
                         f"other does not; build the other's (setup.py build_ext --inplace)")
    module = _consumer_module(package)
    if not hasattr(module.Consumer, "_decode_into"):
        batches = importlib.import_module(f"{AGAINST}.protocol.batches")
        return lambda data: walk(data, batches.RecordSetWalk, module.ConsumerRecord)
    consumer = object.__new__(module.Consumer)
    consumer.config = {"check.crcs": True}
    tp = module.TopicPartition("t", 0)

    def decode(data: bytes) -> list:
        out: list = []
        consumer._decode_into(out, tp, data, 0)
        return out

    return decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--against", metavar="DIR",
                        help="another checkout (its root or its src/) to time beside this one")
    add_quiet_arguments(parser, repeats=False)
    args = parser.parse_args()
    wait_if_asked(args)
    paths = {"walk": walk}
    if args.against:
        paths["older"] = older(args.against)
    for size in (100, 1024):
        data, count = record_set(size)
        results = {name: fn(data) for name, fn in paths.items()}
        # Records of two checkouts are of two classes: compared as tuples.
        assert all(len(r) == count and list(map(tuple, r)) == list(map(tuple, results["walk"]))
                   for r in results.values())
        times: dict[str, list[float]] = {name: [] for name in paths}
        for r in range(args.rounds):
            order = list(paths.items())
            for name, fn in order if r % 2 else order[::-1]:
                started = time.process_time()
                for _ in range(REPS):
                    fn(data)
                times[name].append((time.process_time() - started) / (REPS * count) * 1e9)
        line = f"{size:>5} B values, {16384 // (size + 10)} records a batch: " + ", ".join(
            f"{name} {statistics.median(t):.1f} ns/record (min {min(t):.1f})"
            for name, t in times.items())
        if args.against:
            ratios = [o / w for o, w in zip(times["older"], times["walk"], strict=True)]
            line += f"; older / walk, median of paired ratios: {statistics.median(ratios):.3f}"
        print(line)


if __name__ == "__main__":
    main()
