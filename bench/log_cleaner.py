"""The log cleaner's throughput against reading the same bytes, and the longest time it holds
the event loop.

    .venv/bin/python bench/log_cleaner.py [--megabytes 64] [--keys 10000] [--codec none]

A compacted log of about ``--megabytes`` MB (records of 200-byte values over ``--keys`` keys,
batches of 50 records, segments of 8 MiB) is written to a temporary directory, then, side by
side in one run:

* read: every batch read back through Log.read from the first offset to the last, its records
  decoded (what a consumer reading the log from the start does, broker and client together);
* clean: one clean of all of it (offset map, rewrite, fsync, swap), driven step by step as
  the broker drives it, timing each step: the longest is how long the cleaner holds the event
  loop at most (the fsync, offloaded to a thread by the broker, is excluded and shown apart).

Printed: MB/s of each and the ratio clean / read. Results in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time

from _support import add_quiet_arguments, wait_if_asked

from oncelog.log import cleaning
from oncelog.log.compaction import CompactionConfig
from oncelog.log.log import Log, LogConfig
from oncelog.protocol.record_batch import assign_offsets, split_batches
from oncelog.protocol.records import CODECS, decode_batch, encode_batch

NOW = int(time.time() * 1000)
RECORDS_PER_BATCH = 50


def build(directory: str, megabytes: int, keys: int, codec: int) -> Log:
    config = LogConfig(segment_bytes=8 << 20,
                       compaction=CompactionConfig(min_cleanable_dirty_ratio=0.0))
    log = Log(directory, config)
    rng = random.Random(1)
    value = bytes(rng.randrange(256) for _ in range(200))
    while log.size < megabytes << 20:
        batch = encode_batch([(b"key-%d" % rng.randrange(keys), value, (), NOW)
                              for _ in range(RECORDS_PER_BATCH)], codec)
        headers = split_batches(batch, 1 << 30)
        if log.should_roll(headers, NOW):
            log.roll()
        headers, parts = assign_offsets(batch, headers, log.log_end_offset, 0)
        log.append(parts, headers)
    log.roll()
    log.close()
    return Log(directory, config)


def read_all(log: Log) -> tuple[int, int]:
    """Bytes and records read from the start to the end, every record decoded."""
    offset = total = count = 0
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20).records
        if not data:
            break
        total += len(data)
        pos = 0
        while pos < len(data):
            header, records = decode_batch(data, pos)
            count += len(records)
            pos += header.size
            offset = header.last_offset + 1
    return total, count


def clean_all(log: Log) -> tuple[cleaning.CleanResult, float, float, float]:
    """One clean; returns it, the longest step on the event loop (wall clock, and CPU time of
    this thread, which other processes on a busy machine do not inflate), and the fsyncs."""
    steps = cleaning.clean(log, {}, NOW, 128 << 20)
    longest = longest_cpu = fsyncs = 0.0
    reply = None
    while True:
        started, started_cpu = time.perf_counter(), time.thread_time()
        try:
            step = steps.send(reply)
        except StopIteration as done:
            step, result = None, done.value
        else:
            result = None
        longest = max(longest, time.perf_counter() - started)
        longest_cpu = max(longest_cpu, time.thread_time() - started_cpu)
        if result is not None:
            return result, longest, longest_cpu, fsyncs
        reply = None
        if step is not None:
            started = time.perf_counter()
            reply = step.call()
            fsyncs += time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--codec", choices=sorted(CODECS), default="none")
    add_quiet_arguments(parser, repeats=False)
    args = parser.parse_args()
    wait_if_asked(args)
    directory = tempfile.mkdtemp(prefix="oncelog-cleaner-bench-")
    try:
        log = build(os.path.join(directory, "t-0"), args.megabytes, args.keys,
                    CODECS[args.codec])
        size = sum(s.size for s in log.segments)
        started = time.perf_counter()
        read_bytes, records = read_all(log)
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        result, longest, longest_cpu, fsync_s = clean_all(log)
        clean_s = time.perf_counter() - started
        mb = size / 1e6
        print(f"log cleaner, {mb:.0f} MB ({records} records over {args.keys} keys, codec "
              f"{args.codec}), {len(log.segments)} segments after the clean")
        print(f"  read and decode:  {read_s:6.2f} s  {read_bytes / 1e6 / read_s:7.1f} MB/s")
        print(f"  clean:            {clean_s:6.2f} s  {mb / clean_s:7.1f} MB/s "
              f"(fsync {fsync_s:.2f} s, off the event loop)")
        print(f"  ratio clean / read (throughput): {read_s / clean_s:.2f}")
        print(f"  longest step on the event loop: {longest_cpu * 1000:.1f} ms of CPU "
              f"({longest * 1000:.1f} ms wall clock)")
        print(f"  {result.records_removed} records removed, "
              f"{result.bytes_written / 1e6:.1f} MB written")
        log.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
