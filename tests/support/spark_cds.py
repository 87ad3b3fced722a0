"""A class-data-sharing archive (JDK CDS, a dynamic archive) of the classes a Spark driver
loads, mapped by every Spark JVM the tests start: JAVA_TOOL_OPTIONS of tests/support/sparks.py
names it (java_options), and every Spark JVM of the tests runs with that environment (the
shared sessions, the drivers that tests kill, the speculation test's standalone cluster, the
Spark Connect server).

A driver start is mostly the JVM loading and verifying some ten thousand classes from 280
jars: measured on the suite's 2 cores, a session plus its first job took 11.5 s of JVM CPU,
5.5 s with the archive, and a driver that a test kills before its commit 24.6 s of CPU in
all (JVM and Python workers), 17.8 s with it; each test that kills a driver waits for its
start.

``make test`` makes it before pytest starts (``spark_cds.py make``), once per virtualenv,
pyspark and Java: it lives under ``sys.prefix``, so a fresh clone makes its own and ``make
clean`` deletes it, and its name is a hash of pyspark's version and the java binary (its
path and time), so another Spark or Java makes another. The run is a short driver doing the
kinds of work the tests do (tests/support/spark_cds_workload.py), bounded by MAKE_TIMEOUT. A
run that fails prints why and the suite goes on without the archive: the JVM checks an
archive against its class path and jars (size and time) and ignores one that does not match,
so a stale or missing archive costs time, never a failure; its messages are turned off
because the JVMs' stdout is read (Spark's launcher prints its command there).

    spark_cds.py make     (makes the archive unless it is there; exit 1 with the reason)
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

MAKE_TIMEOUT = 300.0  # seconds; a run that takes longer is killed (with its JVM)
_QUIET = "-Xlog:cds*=off -Xlog:class+path=off"  # its warnings would go to the JVMs' stdout


def java_options() -> str:
    """The JVM options that map the archive (with a leading space), or "" while there is
    none."""
    archive = archive_path()
    if archive is None or not archive.exists():
        return ""
    return f" -XX:SharedArchiveFile={archive} {_QUIET}"


def archive_path() -> Path | None:
    """Where the archive of this virtualenv, pyspark and java is, or None without pyspark."""
    try:
        spark = metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return None
    java = os.path.realpath(shutil.which("java") or "java")
    when = os.stat(java).st_mtime_ns if os.path.exists(java) else 0
    key = hashlib.sha256(f"{spark} {java} {when}".encode()).hexdigest()[:16]
    return Path(sys.prefix) / "spark-cds" / f"driver-{key}.jsa"


def make() -> str:
    """Make the archive unless it is there; returns what happened, raises RuntimeError with
    the reason when no archive was made."""
    archive = archive_path()
    if archive is None:
        raise RuntimeError("pyspark is not installed")
    if archive.exists():
        return f"{archive} is there"
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive.parent / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second `make test` at once waits for the first
        if archive.exists():
            return f"{archive} was made meanwhile"
        partial = archive.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        log = archive.with_suffix(".log")
        started = time.monotonic()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
        with open(log, "wb") as out:
            # A session of its own: on a timeout its process group goes, the JVM with it
            # (killed, the JVM writes no archive).
            run = subprocess.Popen([sys.executable, __file__, "record", str(partial)],
                                   env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
            try:
                code = run.wait(MAKE_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
                partial.unlink(missing_ok=True)
                raise RuntimeError(f"no archive within {MAKE_TIMEOUT:.0f} s; see {log}") \
                    from None
        if code != 0 or not partial.exists():
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"the driver run ended with {code} and wrote no archive; "
                               f"see {log}:\n{_tail(log)}")
        partial.rename(archive)
        return f"made {archive} in {time.monotonic() - started:.0f} s"


def _tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _record(partial: str) -> None:
    """A driver of the tests' shared session (tests/support/sparks.py) that writes
    ``partial`` when its JVM exits, running the kinds of work the tests run; then the JVM is
    ended and waited for (the archive is written at its exit)."""
    from pyspark import SparkContext

    from support import sparks

    # Only the driver's JVM records (Spark's launcher JVM before it would write the same file).
    os.environ["PYSPARK_SUBMIT_ARGS"] = \
        f"--driver-java-options '-XX:ArchiveClassesAtExit={partial} {_QUIET}' pyspark-shell"
    spark = sparks.spark_session()
    gateway = SparkContext._gateway
    from support.spark_cds_workload import run

    try:
        run(spark)
        sparks.stop()
    finally:  # whatever happened, the JVM ends (writing the archive) before this run does
        gateway.shutdown()
        gateway.proc.stdin.close()  # Spark's gateway server exits when its stdin ends
        gateway.proc.wait(timeout=MAKE_TIMEOUT)


if __name__ == "__main__":
    if sys.argv[1:2] == ["make"] and len(sys.argv) == 2:
        try:
            print(f"spark-cds: {make()}", flush=True)
        except (RuntimeError, OSError) as exc:
            raise SystemExit(f"spark-cds: no archive, the Spark tests' JVMs start without "
                             f"it: {exc}") from None
    elif sys.argv[1:2] == ["record"] and len(sys.argv) == 3:
        _record(sys.argv[2])
    else:
        raise SystemExit(__doc__)
