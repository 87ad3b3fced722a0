"""The event loop at a segment roll: how long the append that rolls a 1 GiB segment holds the
loop, in process (issue 26; docs/benchmarks.md, "The event loop at a segment roll").

    .venv/bin/python bench/segment_roll.py [--gib N] [--repeats R] [--data-dir D]
        [--src DIR] [--json PATH]

Batches of 1 MiB (1,000 records of 1 KiB, one fixed incompressible payload) are appended to
a Partition in a running event loop, as produce requests reach it, with segment.bytes at its
default of 1 GiB and no fsync per append (the default flush policy): each append is timed,
and between two appends the loop runs whatever is ready (a seal ending in a worker thread is
answered there). Each run writes ``--gib`` GiB, so it rolls ``--gib`` - 1 or ``--gib``
times, and reports the appends that rolled, the slowest of the others, the appends over 2 ms
per GiB appended (and the event loop's time in them, the roll's included), and the median
append.

Each run is a child interpreter of this tree, or of the ``--src`` tree (another checkout's
root or ``src/``, its compiled extensions copied in), importing ``oncelog`` from it; with
``--src`` the two alternate, this tree first in even repetitions. Before each run the files
of the last are deleted and the page cache is written back (``sync``), outside the timing;
the load average is printed with each run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _support import REPO, add_json_argument, filesystem_of, median, tree_env, write_json

SEED = 20261129
PAYLOAD = random.Random(SEED).randbytes(1024)
RECORDS = 1000  # 1 KiB each: a batch of about 1 MiB
SLOW_S = 0.002
RUN_TIMEOUT = 600.0


class _EveryIdIssued:
    def is_issued(self, producer_id: int) -> bool:
        return True

    def highest_claimed(self) -> int:
        return 0


async def _appends(directory: str, gib: int) -> dict:
    """In the child: the timed appends, and which of them rolled."""
    from oncelog.broker.partition import Partition
    from oncelog.log.log import LogConfig
    from oncelog.producer_state.manager import StateLimits
    from oncelog.protocol.records import encode_batch

    now = int(time.time() * 1000)
    batch = encode_batch([(None, PAYLOAD, (), now) for _ in range(RECORDS)])
    partition = Partition("roll", 0, directory, LogConfig(segment_bytes=1 << 30), 1 << 24,
                          StateLimits(), _EveryIdIssued())
    plog = partition.log  # opened (created) outside the timing
    count = gib * (1 << 30) // len(batch)
    took: list[float] = []
    rolled: list[int] = []
    gc.collect()
    gc.freeze()
    for i in range(count):
        segments = len(plog.segments)
        start = time.perf_counter()
        partition.append_records(batch)
        took.append(time.perf_counter() - start)
        if len(plog.segments) != segments:
            rolled.append(i)
        await asyncio.sleep(0)
    partition.close()  # waits for the seals under way
    return {"took": took, "rolled": rolled, "batch": len(batch)}


def child(directory: str, gib: int) -> None:
    result = asyncio.run(_appends(directory, gib))
    print(json.dumps(result))


def run_tree(src: Path, root: str, gib: int) -> dict:
    directory = tempfile.mkdtemp(prefix="roll-", dir=root)
    try:
        os.sync()  # the last run's dirty pages written back, outside the timing
        load = os.getloadavg()[0]
        out = subprocess.run([sys.executable, __file__, "--child", directory, "--gib", str(gib)],
                             env=tree_env(src), capture_output=True, text=True,
                             timeout=RUN_TIMEOUT)
        if out.returncode != 0:
            raise RuntimeError(f"the run under {src} failed:\n{out.stderr}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    took, rolled = result["took"], result["rolled"]
    others = [t for i, t in enumerate(took) if i not in rolled]
    written_gib = len(took) * result["batch"] / (1 << 30)
    return {"tree": str(src), "load_1min": load, "roll_ms": [took[i] * 1e3 for i in rolled],
            "other_max_ms": max(others) * 1e3,
            "over_2ms_per_gib": sum(t > SLOW_S for t in took) / written_gib,
            "over_2ms_ms_per_gib": sum(t for t in took if t > SLOW_S) * 1e3 / written_gib,
            "median_ms": median(took) * 1e3, "appends": len(took)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=int, default=3, help="GiB appended per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", default=None,
                        help="where each run's partition directory is made (system temp dir)")
    parser.add_argument("--src", type=Path, default=None,
                        help="another tree (its root or src/) run beside this one")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_json_argument(parser)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.gib)
        return
    trees = [REPO / "src"]
    if args.src is not None:
        trees.append(args.src / "src" if (args.src / "src" / "oncelog").is_dir()
                     else args.src)
    root = tempfile.mkdtemp(prefix="oncelog-roll-", dir=args.data_dir)
    print(f"{args.gib} GiB of 1 MiB batches per run, 1 GiB segments, in {root} "
          f"({filesystem_of(root)})")
    runs = []
    try:
        for rep in range(args.repeats):
            for src in (trees if rep % 2 == 0 else trees[::-1]):
                r = run_tree(src, root, args.gib)
                runs.append(r)
                rolls = " ".join(f"{ms:.1f}" for ms in r["roll_ms"])
                print(f"{r['tree']:<40} load {r['load_1min']:4.2f}  roll appends (ms) "
                      f"{rolls:<24} slowest other {r['other_max_ms']:6.1f} ms  "
                      f"over 2 ms per GiB {r['over_2ms_per_gib']:4.1f} "
                      f"({r['over_2ms_ms_per_gib']:5.0f} ms)  "
                      f"median {r['median_ms']:.2f} ms", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\nmedians over the runs:")
    for src in trees:
        mine = [r for r in runs if r["tree"] == str(src)]
        rolls = [ms for r in mine for ms in r["roll_ms"]]
        print(f"{src!s:<40} roll append {median(rolls):7.1f} ms "
              f"({min(rolls):.1f}-{max(rolls):.1f}), slowest other "
              f"{median([r['other_max_ms'] for r in mine]):.1f} ms, over 2 ms per GiB "
              f"{median([r['over_2ms_per_gib'] for r in mine]):.1f} "
              f"({median([r['over_2ms_ms_per_gib'] for r in mine]):.0f} ms)")
    write_json({"runs": runs}, args.json)


if __name__ == "__main__":
    main()
