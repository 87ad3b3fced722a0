"""The broker's own cost of idempotence per batch: Partition.append_records, plain / idempotent.

    .venv/bin/python bench/idempotence_append.py [--batches 2000] [--repeats 9] [--no-instructions]

No network and no client: the same records, encoded once as plain batches and once as
idempotent batches (one producer, consecutive sequences: the common case, rule 7), are
appended to a fresh Partition, and the two are compared. Two measurements:

* CPU time per batch (process CPU time, user + system, so time the machine gives other
  processes does not count), the modes alternating within each repetition; the median of
  the per-repetition ratios plain / idempotent (= idempotent / plain throughput) is printed;
* instructions per batch, counted by valgrind (``cachegrind``, no cache simulation), which is
  repeatable to a few instructions whatever else the machine does. A worker process appends
  the first ``n`` of the same batches for two values of ``n``; the difference divided by the
  difference in ``n`` leaves out start-up, set-up and the first, dearer, batches. Kernel
  instructions (the writev to the page cache) are not counted, so this ratio is a lower bound
  of the CPU-time one.

Batch sizes: 1 record (the per-batch cost alone), 16 records of 1 KiB (librdkafka with
batch.size=16384) and 967 records of 1 KiB (librdkafka's default batch.size=1000000, what the
end-to-end benchmark's default batching sends). Large batches are fewer per run (at most
``--megabytes`` per run). Target (issue 3): >= 0.97.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from oncelog.broker.partition import Partition
from oncelog.log.log import LogConfig
from oncelog.producer_state.manager import StateLimits
from oncelog.protocol.record_batch import scan_batches

RECORDS_PER_BATCH = (1, 16, 967)
MIN_BATCHES = 16
PRODUCER_ID = 1000
# Now: a timestamp older than segment.ms would roll a segment at every batch.
TIMESTAMP = int(time.time() * 1000)
VALGRIND_TIMEOUT = 900.0
_I_REFS = re.compile(rb"I\s+refs:\s+([\d,]+)")


class EveryIdIssued:
    def is_issued(self, producer_id: int) -> bool:
        return True

    def highest_claimed(self) -> int:
        return PRODUCER_ID


def encode(records: int, count: int, idempotent: bool) -> list[bytes]:
    """``count`` batches of ``records`` 1 KiB records; idempotent ones carry consecutive
    sequences from 0, as one producer sends them."""
    from produce_consume import PAYLOAD  # the produce benchmarks' fixed 1 KiB value

    from oncelog.protocol.records import encode_batch

    rows = [(None, PAYLOAD, (), TIMESTAMP + i) for i in range(records)]
    if not idempotent:
        plain = encode_batch(rows)
        return [bytes(memoryview(plain)) for _ in range(count)]  # as many objects as the others
    return [encode_batch(rows, producer_id=PRODUCER_ID, producer_epoch=0,
                         base_sequence=i * records) for i in range(count)]


def batches_per_run(records: int, most: int, megabytes: float) -> int:
    """``most`` batches, fewer when they would hold more than ``megabytes``."""
    size = len(encode(records, 1, True)[0])
    return max(MIN_BATCHES, min(most, int(megabytes * 2**20) // size))


def open_partition(directory: str) -> Partition:
    return Partition("bench", 0, directory, LogConfig(segment_bytes=1 << 30), 1 << 24,
                     StateLimits(), EveryIdIssued())


def append_all(batches: list, root: str) -> int:
    """Append ``batches`` to a new partition under ``root``; CPU nanoseconds it took."""
    directory = tempfile.mkdtemp(prefix="p-", dir=root)
    partition = open_partition(directory)
    assert partition.log.log_end_offset == 0  # opened outside the measurement
    append = partition.append_records
    # Everything alive so far out of the collector's way: a full collection walks every object
    # (modules, the batches), and whether one falls inside a run would swing the count by
    # more than idempotence costs. Young objects are still collected as in a broker.
    gc.collect()
    gc.freeze()
    start = time.process_time_ns()
    for batch in batches:
        append(batch)
    elapsed = time.process_time_ns() - start
    gc.unfreeze()
    partition.close()
    shutil.rmtree(directory)
    return elapsed


def cpu_time(records: int, count: int, repeats: int) -> tuple[float, float, float]:
    """Median CPU us per batch (plain, idempotent) and the median of the paired ratios."""
    batches = {mode: encode(records, count, mode == "idempotent")
               for mode in ("plain", "idempotent")}
    per_batch: dict[str, list[float]] = {"plain": [], "idempotent": []}
    ratios = []
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as root:
        append_all(batches["plain"][: count // 4], root)  # warm-up: imports, caches
        for rep in range(repeats):
            order = ["plain", "idempotent"] if rep % 2 == 0 else ["idempotent", "plain"]
            took = {mode: append_all(batches[mode], root) / count / 1000 for mode in order}
            for mode, us in took.items():
                per_batch[mode].append(us)
            ratios.append(took["plain"] / took["idempotent"])
    return (sorted(per_batch["plain"])[repeats // 2],
            sorted(per_batch["idempotent"])[repeats // 2], sorted(ratios)[repeats // 2])


# --- instruction counts ---------------------------------------------------------------------

def worker(path: str, appends: int) -> int:
    """Under valgrind: append the first ``appends`` batches of the file at ``path``."""
    with open(path, "rb") as f:
        data = f.read()
    view = memoryview(data)
    batches = [view[pos:pos + header.size] for pos, header in scan_batches(data)]
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as root:
        append_all(batches[:appends], root)
    return 0


def count_instructions(path: str, appends: int) -> int:
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
               "--cachegrind-out-file=/dev/null", sys.executable, __file__,
               "--worker", path, "--appends", str(appends)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(command, capture_output=True, timeout=VALGRIND_TIMEOUT, env=env,
                         check=True, cwd=Path(__file__).parent)
    match = _I_REFS.search(out.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{out.stderr.decode()}")
    return int(match.group(1).replace(b",", b""))


def instructions(records: int, count: int) -> tuple[float, float]:
    """Instructions per batch appended (plain, idempotent)."""
    per_batch = []
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as root:
        for mode in ("plain", "idempotent"):
            path = os.path.join(root, mode)
            with open(path, "wb") as f:
                f.writelines(encode(records, count, mode == "idempotent"))
            # The first batches cost more (the new segment and its indexes): the difference
            # is taken between the two halves' ends, in the steady state.
            few, many = count // 2, count
            per_batch.append((count_instructions(path, many) - count_instructions(path, few))
                             / (many - few))
    return per_batch[0], per_batch[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000, help="batches per timed run")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--instruction-batches", type=int, default=400,
                        help="batches per valgrind run (the longer one)")
    parser.add_argument("--megabytes", type=float, default=64.0,
                        help="at most this much data per timed run")
    parser.add_argument("--instruction-megabytes", type=float, default=40.0,
                        help="at most this much data per valgrind run")
    parser.add_argument("--records", type=int, action="append",
                        help=f"records per batch (repeatable; default {RECORDS_PER_BATCH})")
    parser.add_argument("--no-instructions", action="store_true",
                        help="skip the valgrind instruction counts")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--appends", type=int, help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)
    if args.worker:
        return worker(args.worker, args.appends)

    valgrind = not args.no_instructions and shutil.which("valgrind") is not None
    print(f"idempotence_append: Partition.append_records in process, up to {args.batches:,} "
          f"batches per run, median of {args.repeats}; plain / idempotent (target >= 0.97)")
    for records in args.records or RECORDS_PER_BATCH:
        count = batches_per_run(records, args.batches, args.megabytes)
        plain, idem, ratio = cpu_time(records, count, args.repeats)
        line = (f"  {records:3d} x 1 KiB records ({count} batches): CPU {plain:6.1f} us plain, "
                f"{idem:6.1f} us idempotent per batch, ratio {ratio:.3f}")
        if valgrind:
            counted = batches_per_run(records, args.instruction_batches,
                                      args.instruction_megabytes)
            i_plain, i_idem = instructions(records, counted)
            line += (f"; instructions {i_plain:,.0f} plain, {i_idem:,.0f} idempotent, "
                     f"ratio {i_plain / i_idem:.3f}")
        print(line, flush=True)
    if not valgrind and not args.no_instructions:
        print("  (valgrind not found: no instruction counts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
