"""What tests besides tests/spark/test_spark_write_exactly_once.py use of it."""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from oncelog import Admin, Consumer, TopicPartition
from support.spark_read_helpers import TIMEOUT

TWO_PHASE = {"transaction_two_phase_commit_enable": "true"}


JOB = Path(__file__).with_name("spark_write_job.py")


def committed(bootstrap: str, topic: str, partitions: int) -> list:
    """What a read_committed reader gets, after checking that nothing holds the last stable
    offset back (so that this is all it will ever get)."""
    wanted = {(topic, p): -1 for p in range(partitions)}
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        assert admin.list_offsets(wanted, read_committed=True) == admin.list_offsets(wanted)
        listed = admin.list_transactions(states=("Ongoing", "PrepareCommit", "PrepareAbort"))
        assert [t for ts in listed.values() for t in ts] == []
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                   "isolation.level": "read_committed"}) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        return list(c)


def assert_once(records, expected: list[bytes]) -> None:
    copies = collections.Counter(r.value for r in records)
    assert sorted(copies) == sorted(expected)
    assert [v for v, n in copies.items() if n > 1] == []


def writer(df, bootstrap: str, **options):
    write = df.write.format("oncelog").mode("append").option("bootstrap.servers", bootstrap)
    for key, value in options.items():
        write = write.option(key, value)
    return write


def _job(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """tests/support/spark_write_job.py in a process group of its own (killpg takes Spark's JVM
    too)."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(
        [str(JOB.parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(JOB), *args], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


def _kill(job: subprocess.Popen) -> None:
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.communicate(timeout=60)


def _wait_for(path: Path, job: subprocess.Popen, timeout: float = TIMEOUT * 2) -> bool:
    """Until ``path`` exists (True) or the job ends (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        if job.poll() is not None:
            return False
        time.sleep(0.1)
    _kill(job)
    raise AssertionError(f"{path.name} did not appear in time")
