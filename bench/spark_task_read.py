"""One Spark task's read in one process, without Spark: CPU and page faults per read.

    .venv/bin/python bench/spark_task_read.py [--rows 100000] [--reads 15] [--profile]

One oncelog broker on 127.0.0.1 with a fresh temporary log.dirs, the topic of
bench/spark_source.py (1 KiB values, 2 partitions); ``spark.columns.read_range`` reads
partition 0 (half the rows) into Arrow batches as a Spark task does, again and again in one
process as a Python worker runs task after task. Printed: the medians per read of wall time,
user and system CPU seconds and minor page faults (getrusage), and with ``--profile`` a
cProfile by CPU time. To measure another version's source, put its ``src`` first on
PYTHONPATH (the broker runs this checkout's).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import sys
import time

from _support import OncelogBroker, median
from spark_source import load_topic

from oncelog.spark.columns import read_range
from oncelog.spark.offsets import OffsetRange


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--reads", type=int, default=15)
    parser.add_argument("--profile", action="store_true")
    args, _ = parser.parse_known_args(argv)
    with OncelogBroker() as broker:
        load_topic(broker.bootstrap, "bench", args.rows, 2)
        rng = OffsetRange("bench", 0, 0, args.rows // 2)

        def read() -> None:
            rows = sum(b.num_rows for b in read_range(broker.bootstrap, rng, False, True,
                                                      30_000))
            assert rows == rng.end, rows

        read()
        read()  # warm: the worker's allocator and kept buffers as after its first tasks
        wall, user, system, faults = [], [], [], []
        for _ in range(args.reads):
            before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            read()
            after = resource.getrusage(resource.RUSAGE_SELF)
            wall.append(time.perf_counter() - started)
            user.append(after.ru_utime - before.ru_utime)
            system.append(after.ru_stime - before.ru_stime)
            faults.append(after.ru_minflt - before.ru_minflt)
        print(f"spark_task_read: {rng.end:,} records of 1 KiB, median of {args.reads} reads: "
              f"wall {median(wall) * 1000:.1f} ms, CPU user {median(user) * 1000:.1f} ms + "
              f"system {median(system) * 1000:.1f} ms, minor page faults {median(faults):,.0f}")
        if args.profile:
            profile = cProfile.Profile(time.process_time)
            profile.runcall(lambda: [read() for _ in range(args.reads)])
            pstats.Stats(profile).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
