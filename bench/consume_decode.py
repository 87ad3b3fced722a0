"""The consumer's per-record work alone: a fetched record set walked (protocol/batches.py) and
turned into ConsumerRecords, as oncelog.Consumer does with each Fetch answer. No broker, no
socket: CPU time per record, for 100 B and 1 KiB values in 16 KiB batches (the clients
benchmark's producer batches), CRCs checked.

    .venv/bin/python bench/consume_decode.py [--rounds 40]
    .venv/bin/python bench/consume_decode.py --against /tmp/main_consumer.py

``--against FILE`` also times an older ``client/consumer.py`` whose ``Consumer._decode_into``
did this work (before the walk existed: ``git show 904648a:src/oncelog/client/consumer.py >
/tmp/main_consumer.py``), loaded into this tree's package so both run on the same codec, in
one process, rounds interleaved; it prints the median of the paired ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time

from _support import wait_for_quiet

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


def walk(data: bytes) -> list:
    out: list = []
    for batch in RecordSetWalk(data, 0, check_crcs=True):
        batch.append_records(out, ConsumerRecord, "t", 0)
    return out


def older(path: str):
    """The ``_decode_into`` of an older consumer.py, as a function of the record set."""
    spec = importlib.util.spec_from_file_location("oncelog.client._older_consumer", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
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
    parser.add_argument("--against", metavar="FILE", help="an older client/consumer.py")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="first wait up to this long for other processes to use under "
                             "5%% of the CPUs (as every module run by make bench takes it)")
    args = parser.parse_args()
    if args.wait_quiet:
        wait_for_quiet(0.05, args.wait_quiet)
    paths = {"walk": walk}
    if args.against:
        paths["older"] = older(args.against)
    for size in (100, 1024):
        data, count = record_set(size)
        results = {name: fn(data) for name, fn in paths.items()}
        assert all(len(r) == count and r == results["walk"] for r in results.values())
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
