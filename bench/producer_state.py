"""Producer state at scale: memory per producer, and restart time with and without a snapshot.

    .venv/bin/python bench/producer_state.py [--producers 100000] [--restart-producers 1000000]

Memory: 100,000 producers with 5 cached batches each on one partition, measured with
tracemalloc (every byte Python allocated for the state). Target: <= 180 bytes a producer,
Kafka's (issue 26; it was <= 256 before). What bounds it: docs/benchmarks.md, "Memory and
import time (issue 26)".

CPU: validate + apply of a live producer's next batch (rule 7, the produce path's common
case), one producer and ``--producers`` taking turns, in process CPU microseconds a batch
and the same in instructions counted by valgrind (repeatable on a loaded machine); the whole
append of a batch is bench/idempotence_append.py's.

Restart: a partition whose log holds one idempotent batch from each of N producers is opened
(a) with the snapshot its clean shutdown wrote, (b) with no snapshot, rebuilt from the log.
Printed as seconds and as the ratio rebuild / snapshot, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc

import crc32c

from oncelog.broker.partition import Partition
from oncelog.log.log import LogConfig
from oncelog.producer_state.manager import ProducerStateManager, StateLimits
from oncelog.producer_state.rules import Append, BatchIdentity
from oncelog.protocol.record_batch import split_batches
from oncelog.protocol.records import encode_batch

NOW = int(time.time() * 1000)


def memory_per_producer(producers: int) -> float:
    limits = StateLimits(max_producers=producers)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    state = ProducerStateManager(limits)
    offset = 0
    for pid in range(10**6, 10**6 + producers):
        for i in range(5):
            batch = BatchIdentity(pid, 0, i * 10, i * 10 + 9)
            offset += 10
            state.apply(Append(batch, reset=i == 0), offset - 1, NOW, NOW)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(state) == producers
    return (after - before) / producers


def _filled(producers: int) -> tuple[ProducerStateManager, int]:
    """``producers`` producers with 5 cached batches each; the next offset."""
    state = ProducerStateManager(StateLimits(max_producers=producers))
    offset = 0
    for pid in range(10**6, 10**6 + producers):
        for i in range(5):
            offset += 10
            state.apply(Append(BatchIdentity(pid, 0, i * 10, i * 10 + 9), reset=i == 0),
                        offset - 1, NOW, NOW)
    return state, offset


def _validate_apply(state: ProducerStateManager, offset: int, work: list) -> None:
    issued = EveryIdIssued().is_issued
    for batch in work:
        decision = state.validate(batch, issued)
        offset += 10
        state.apply(decision, offset - 1, NOW, NOW)
    assert isinstance(decision, Append)


def _work(producers: int, rounds: int) -> list:
    return [BatchIdentity(pid, 0, r * 10, r * 10 + 9)
            for r in range(5, 5 + rounds) for pid in range(10**6, 10**6 + producers)]


def validate_apply_cpu(producers: int, batches: int = 300_000) -> float:
    """CPU microseconds for validate + apply of one batch (rule 7, a live producer's next
    batch: the produce path's common case), ``producers`` of them taking turns, each with 5
    cached batches already; ``batches`` in all, timed by process CPU time."""
    state, offset = _filled(producers)
    work = _work(producers, max(1, batches // producers))
    start = time.process_time()
    _validate_apply(state, offset, work)
    return (time.process_time() - start) / len(work) * 1e6


_I_REFS = re.compile(rb"I\s+refs:\s+([\d,]+)")


def validate_apply_instructions(producers: int) -> float:
    """Instructions (valgrind's cachegrind, repeatable whatever the machine's load) for
    validate + apply of one batch: two runs doing R and 3R rounds over ``producers`` (R *
    ``producers`` about 10,000 batches), the difference divided by the batches it makes."""
    base = max(1, 10_000 // producers)
    counts = []
    for rounds in (base, 3 * base):
        command = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
                   "--cachegrind-out-file=/dev/null", sys.executable, __file__,
                   "--worker", str(producers), str(rounds)]
        out = subprocess.run(command, capture_output=True, timeout=1800, check=True,
                             env={**os.environ, "PYTHONHASHSEED": "0"})
        match = _I_REFS.search(out.stderr)
        assert match is not None, out.stderr.decode()
        counts.append(int(match.group(1).replace(b",", b"")))
    return (counts[1] - counts[0]) / (2 * base * producers)


def build_log(directory: str, producers: int) -> None:
    """One single-record idempotent batch per producer, written straight into the log."""
    template = bytearray(encode_batch([(None, b"v", (), NOW)], producer_id=0, producer_epoch=0,
                                      base_sequence=0))
    size = len(template)
    partition = open_partition(directory, producers)
    # Opened for writing: the ``log`` of a partition never written is the read-only absent
    # log (a read creates nothing).
    plog, state = partition._writable()
    chunk = 10_000
    for start in range(0, producers, chunk):
        count = min(chunk, producers - start)
        buf = bytearray(template * count)
        for i in range(count):
            pos = i * size
            struct.pack_into(">q", buf, pos, plog.log_end_offset + i)
            struct.pack_into(">q", buf, pos + 43, 10**6 + start + i)
            crc = crc32c.crc32c(memoryview(buf)[pos + 21:pos + size])
            struct.pack_into(">I", buf, pos + 17, crc)
        headers = split_batches(buf, 1 << 30)
        plog.append([buf], headers)
        for header in headers:
            state.replay(
                BatchIdentity(header.producer_id, 0, 0, 0), header.last_offset, NOW, NOW)
    partition.close()


def open_partition(directory: str, producers: int) -> Partition:
    return Partition("bench", 0, directory, LogConfig(segment_bytes=1 << 30), 1 << 20,
                     StateLimits(max_producers=producers), EveryIdIssued())


class EveryIdIssued:
    def is_issued(self, producer_id: int) -> bool:
        return True

    def highest_claimed(self) -> int:
        return (1 << 63) - 1


def time_open(directory: str, producers: int) -> float:
    start = time.perf_counter()
    partition = open_partition(directory, producers)
    assert len(partition.state) == producers, len(partition.state)
    elapsed = time.perf_counter() - start
    partition.close()
    return elapsed


def restart_times(producers: int) -> tuple[float, float]:
    root = tempfile.mkdtemp(prefix="oncelog-bench-")
    try:
        directory = os.path.join(root, "bench-0")
        build_log(directory, producers)
        with_snapshot = time_open(directory, producers)
        # Only the snapshots go: the log stays cleanly closed, so (b) measures the rebuild of
        # producer state, not the validation of the log that follows a crash.
        for name in os.listdir(directory):
            if name.endswith(".snapshot"):
                os.unlink(os.path.join(directory, name))
        without = time_open(directory, producers)
        return with_snapshot, without
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producers", type=int, default=100_000)
    parser.add_argument("--restart-producers", type=int, default=1_000_000)
    parser.add_argument("--instruction-producers", type=int, default=10_000,
                        help="producers taking turns for the instruction count (0: none)")
    parser.add_argument("--worker", nargs=2, type=int, help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)  # run_all.py may pass other modules' options
    if args.worker:  # under valgrind: producers, rounds
        state, offset = _filled(args.worker[0])
        _validate_apply(state, offset, _work(*args.worker))
        return 0

    per = memory_per_producer(args.producers)
    verdict = "met" if per <= 180 else "MISS"
    print(f"producer state memory: {per:.0f} bytes per producer with 5 cached batches "
          f"({args.producers:,} producers on one partition; target <= 180, Kafka's: {verdict})")
    for count in (1, args.producers):
        print(f"validate + apply of a producer's next batch, {count:,} producers taking "
              f"turns: {validate_apply_cpu(count):.2f} us of CPU a batch")
    if args.instruction_producers:
        print(f"validate + apply of a producer's next batch, {args.instruction_producers:,} "
              "producers taking turns: "
              f"{validate_apply_instructions(args.instruction_producers):,.0f} instructions a "
              "batch (valgrind)")
    snap, rebuild = restart_times(args.restart_producers)
    print(f"partition open with {args.restart_producers:,} producers: {snap:.2f} s from the "
          f"snapshot, {rebuild:.2f} s rebuilt from the log; rebuild / snapshot = "
          f"{rebuild / snap:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
