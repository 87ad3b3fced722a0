"""examples/copy_job.py killed with kill -9 twenty times: the copy equals the source."""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.idempotent_clients_helpers import produce_outcomes

from oncelog import Admin, Consumer, Producer

JOB = Path(__file__).resolve().parents[2] / "examples" / "copy_job.py"
PARTITIONS = 3
PER_PARTITION = 20000  # enough that twenty runs, however fast, do not reach the end
CHECKPOINT_EVERY = 300
KILLS = 20
SEED = 20261123
LINE_TIMEOUT = 60.0


def fill_source(bootstrap: str) -> None:
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic("source", PARTITIONS)
        admin.create_topic("copy", PARTITIONS)
    rng = random.Random(SEED)
    with Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4"}) as p:
        for i in range(PER_PARTITION * PARTITIONS):
            p.produce("source", b"%d:" % i + b"x" * rng.randrange(0, 100),
                      key=b"k%d" % i if i % 4 else None, partition=i % PARTITIONS,
                      headers=[("i", b"%d" % i)], timestamp=1_700_000_000_000 + i)


def read(bootstrap: str, topic: str) -> list:
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([(topic, p) for p in range(PARTITIONS)])
        return list(c)


def start_job(bootstrap: str, state: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(JOB), "--bootstrap-server", bootstrap, "--source", "source",
         "--dest", "copy", "--state", str(state), "--checkpoint-every", str(CHECKPOINT_EVERY),
         "--exit-at-end"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def read_line(proc: subprocess.Popen) -> bytes:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], LINE_TIMEOUT)
    assert ready, f"the copy job printed nothing for {LINE_TIMEOUT}s"
    return proc.stdout.readline()


def test_copy_job_killed_twenty_times_copies_exactly_once(broker, tmp_path):
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    fill_source(broker.bootstrap)
    state = tmp_path / "state.json"
    killed_mid_copy = 0
    for _ in range(KILLS):
        proc = start_job(broker.bootstrap, state)
        try:
            line = b""
            for _ in range(rng.randint(1, 2)):  # let it get past one or two checkpoints
                line = read_line(proc)
                if not line.startswith(b"checkpoint"):
                    break
            if line.startswith(b"checkpoint"):
                time.sleep(rng.uniform(0, 0.03))  # then anywhere: mid-batch, mid-flush
                killed_mid_copy += proc.poll() is None
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(LINE_TIMEOUT)
    progress = sum(json.loads(state.read_text())["positions"].values())
    print(f"after {KILLS} kills: {progress} of {PARTITIONS * PER_PARTITION} records copied")
    assert killed_mid_copy == KILLS
    proc = start_job(broker.bootstrap, state)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    assert out.splitlines()[-1] == b"done %d" % (PARTITIONS * PER_PARTITION)

    source, copy = read(broker.bootstrap, "source"), read(broker.bootstrap, "copy")
    for p in range(PARTITIONS):
        want = [(r.key, r.value, r.headers, r.timestamp) for r in source if r.partition == p]
        got = [(r.key, r.value, r.headers, r.timestamp) for r in copy if r.partition == p]
        assert len(got) == len(want) == PER_PARTITION
        assert got == want
    # One identity all along: no retry ever needed a new epoch, nothing was resent blind.
    assert len({(r.producer_id, r.producer_epoch) for r in copy}) == 1
    # Each restart re-sent what it had sent since its checkpoint: the broker said so.
    outcomes = produce_outcomes(broker, "copy")
    print(f"broker outcomes for the copy: {outcomes}")
    assert outcomes.get("duplicate", 0) + outcomes.get("duplicate_sequence_number", 0) > 0
    assert set(outcomes) <= {"appended", "duplicate", "duplicate_sequence_number",
                             "out_of_order_sequence_number"}, outcomes
    # The records carry 2023 timestamps: segments roll by their records' time (KAFKA-4099),
    # so each partition of both topics holds one segment, not one per batch.
    for topic in ("source", "copy"):
        for p in range(PARTITIONS):
            names = os.listdir(broker.data_dir / f"{topic}-{p}")
            assert sum(name.endswith(".log") for name in names) == 1, sorted(names)
            assert sum(name.endswith(".snapshot") for name in names) <= 1, sorted(names)
