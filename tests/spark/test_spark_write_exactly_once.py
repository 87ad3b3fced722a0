"""Exactly-once writes from Spark (spark/two_phase.py), proven with real Spark: a task that
fails halfway through its rows, a speculative attempt writing beside a slow one, a driver
killed (-9, its whole process group) between the tasks and its commit, and a stream whose
driver is killed at random points across 20 micro-batches. Each time a read_committed reader
finds every input row exactly once, the last stable offset reaches the end of the log, and
no transaction is left open.

Drivers that a test kills or starts with settings of their own run tests/support/spark_write_job.py
in a subprocess; the other tests, and the runs after a kill that nobody kills, share the
session of tests/support/sparks.py (a driver start is most of a run's time)."""

from __future__ import annotations

import collections
import contextlib
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import spark_write_job
from support.spark_read_helpers import TIMEOUT, create, produce
from support.spark_write_exactly_once_helpers import (
    TWO_PHASE,
    _job,
    _kill,
    _wait_for,
    assert_once,
    committed,
    writer,
)

from oncelog import Admin, Consumer, TopicPartition


def test_a_task_that_fails_halfway_leaves_nothing_of_its_first_attempt(start_broker,
                                                                      _spark_sessions):
    """local[2,3]: the first attempt of the one task raises at row 500 of its 1000 (row 500
    names a partition that does not exist, on the first attempt only, and only once the log
    holds rows 0-399 of its transaction); it aborts the
    transaction, the second attempt writes all 1000. A read_uncommitted reader sees the
    aborted copies, so the abort hid rows that were really in the log."""
    broker = start_broker(**TWO_PHASE)
    spark = _spark_sessions.spark_session("local[2,3]")
    create(broker.bootstrap, "halfway", 2)
    bootstrap = broker.bootstrap
    # Bytes per value: Spark's 64 KiB stream buffers pass rows on while the UDF waits. The
    # rows just before 500 stay in them (the UDF's output buffer, the last Arrow batch begun)
    # until it returns, so it waits for rows 0-399 (in practice 0-449 arrive).
    pad = 2000

    def fail_once(i: int) -> tuple[int, str]:
        from pyspark import TaskContext

        if i == 500 and TaskContext.get().attemptNumber() == 0:
            # Until rows 0-399 are in the log (bounded: the test then fails on what a
            # read_uncommitted reader finds). Defined here, so that Spark's workers get it.
            wanted = {("halfway", p): -1 for p in range(2)}
            deadline = time.monotonic() + TIMEOUT
            with Admin({"bootstrap.servers": bootstrap}) as admin:
                while time.monotonic() < deadline and \
                        sum(admin.list_offsets(wanted).values()) < 400:
                    time.sleep(0.05)
            return 7, str(i).ljust(pad)
        return i % 2, str(i).ljust(pad)

    spark.udf.register("fail_once", fail_once, "struct<partition: int, value: string>")
    # Small batches, so that the sink gets rows 0-449 while the UDF waits at row 500.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        df = spark.range(0, 1000, numPartitions=1).selectExpr("fail_once(id) as row") \
            .selectExpr("row.value", "row.partition")
        writer(df, broker.bootstrap, topic="halfway", **{"kafka.linger.ms": "0"}).save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    records = committed(broker.bootstrap, "halfway", 2)
    values = [b"%d" % i + b" " * (pad - len(b"%d" % i)) for i in range(1000)]
    assert_once(records, values)
    with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition("halfway", p) for p in range(2)])
        stored = collections.Counter(r.value for r in c)
    # Each of rows 0-399 stored twice at least: the aborted first attempt's copy was in the log.
    missing = [int(v) for v in values[:400] if stored[v] < 2]
    assert missing == [], (len(missing), collections.Counter(stored.values()))


def test_bad_options_fail_before_any_task_runs(start_broker, spark):
    plain = start_broker(transaction_two_phase_commit_enable="false")
    df = spark.range(3).selectExpr("cast(id as string) as value")
    with pytest.raises(Exception, match=r"option transaction\.two\.phase\.commit\.enable: the "
                                        r"broker refuses two-phase commit"):
        writer(df, plain.bootstrap, topic="t").save()
    for options, message in [
        ({"guarantee": "at-most-once"}, "option guarantee: 'at-most-once' must be exactly-once "
                                        "or at-least-once"),
        ({"kafka.transactional.id": "mine"}, "option kafka.transactional.id: the oncelog sink "
                                             "sets the transactional settings itself"),
        ({"transaction.timeout.ms": "1000"}, "option transaction.timeout.ms: the oncelog sink "
                                             "sets"),
    ]:
        with pytest.raises(Exception, match=r"format\(\"oncelog\"\)") as failed:
            writer(df, plain.bootstrap, topic="t", **options).save()
        assert message in str(failed.value)
    with pytest.raises(Exception, match=r'write with \.mode\("append"\)'):
        writer(df, plain.bootstrap, topic="t").mode("overwrite").save()
    # at-least-once needs no transactions of the broker
    create(plain.bootstrap, "plain", 1)
    writer(df, plain.bootstrap, topic="plain", guarantee="AT-LEAST-ONCE").save()
    with Consumer({"bootstrap.servers": plain.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition("plain", 0)])
        assert sorted(r.value for r in c) == [b"0", b"1", b"2"]


def _finish(job: subprocess.Popen) -> None:
    try:
        out, _ = job.communicate(timeout=TIMEOUT * 2)
    except subprocess.TimeoutExpired:
        _kill(job)
        raise
    assert job.returncode == 0, out.decode(errors="replace")[-4000:]


@contextlib.contextmanager
def standalone_cluster(work: Path):
    """Spark's standalone master on 127.0.0.1 and two one-core workers on 127.0.0.2 and
    127.0.0.3: Spark never runs a speculative copy on the host of the slow attempt, and
    local mode does not speculate at all. Yields the master's URL."""
    import pyspark
    from support import sparks

    home = Path(pyspark.__file__).parent
    env = {**os.environ, **sparks.JAVA_ENV, "SPARK_HOME": str(home),
           "PYSPARK_PYTHON": sys.executable}
    spark_class = [str(home / "bin" / "spark-class")]
    procs: list[subprocess.Popen] = []

    def launch(name: str, args: list[str], host: str) -> Path:
        log = work / f"{name}.log"
        with open(log, "wb") as out:
            procs.append(subprocess.Popen(spark_class + args, stdout=out, stderr=out,
                                          start_new_session=True,
                                          env={**env, "SPARK_LOCAL_IP": host}))
        return log

    def ready(name: str, log: Path, proc: subprocess.Popen, pattern: str) -> str:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            found = re.search(pattern, log.read_text(errors="replace"))
            if found:
                return found.group(0)
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        raise AssertionError(f"{name} did not start: {log.read_text()[-3000:]}")

    try:
        log = launch("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                "--port", "0", "--webui-port", "0"], "127.0.0.1")
        url = ready("master", log, procs[0], r"spark://127\.0\.0\.1:\d+")
        # Both workers at once: each is a JVM of its own, seconds to start.
        workers = {host: launch(f"worker-{host}", [
            "org.apache.spark.deploy.worker.Worker", "--host", host, "--cores", "1",
            "--memory", "1g", "--webui-port", "0", "--work-dir", str(work / host), url], host)
            for host in ("127.0.0.2", "127.0.0.3")}
        for (host, log), proc in zip(workers.items(), procs[1:], strict=True):
            ready(f"worker-{host}", log, proc, "Successfully registered with master")
        yield url
    finally:
        for proc in procs:
            _kill(proc)


@pytest.mark.timeout(600)  # a cluster of three JVMs and a driver, on a shared machine
def test_a_speculative_attempt_beside_a_slow_one_writes_once(start_broker, tmp_path):
    """spark.speculation: the first attempt of partition 0 stalls, a speculative attempt of
    the partition runs meanwhile on the other worker and wins; the slow attempt is killed
    and whatever it wrote aborted."""
    broker = start_broker(**TWO_PHASE)
    create(broker.bootstrap, "speculated", 2)
    with standalone_cluster(tmp_path) as url:
        _finish(_job("batch", broker.bootstrap, "speculated", "200", "spec", "--slow-task",
                     env={"SPARK_MASTER_URL": url}))
    assert_once(committed(broker.bootstrap, "speculated", 2), [b"%d" % i for i in range(200)])
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        listed = admin.list_transactions(pattern="spec-.*")
        states = sorted(t.state for ts in listed.values() for t in ts)
    # Three task attempts began: two were committed, the slow one never got to write (it
    # was killed in its stall: Empty), or was aborted.
    assert len(states) == 3 and states.count("CompleteCommit") == 2, states


def test_a_driver_killed_before_its_commit_then_run_again(start_broker, spark, tmp_path):
    broker = start_broker(**TWO_PHASE)
    create(broker.bootstrap, "killed", 2)
    held = tmp_path / "held"
    job = _job("batch", broker.bootstrap, "killed", "100", "again", "--hold-commit", str(held))
    assert _wait_for(held, job), job.communicate()[0].decode(errors="replace")[-4000:]
    _kill(job)
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        listed = admin.list_transactions(states=("Ongoing",), pattern="again-.*")
        assert len([t for ts in listed.values() for t in ts]) == 2  # both tasks' prepared
    # Run again by another driver: the shared session's, not killed, so not a process of its own.
    spark_write_job.write_batch(spark, "oncelog", broker.bootstrap, "killed", 100, "again",
                                slow=False)
    assert_once(committed(broker.bootstrap, "killed", 2), [b"%d" % i for i in range(100)])


@pytest.mark.timeout(900)  # up to five drivers, each a JVM, on a shared machine
def test_a_stream_killed_at_random_points_across_20_micro_batches(start_broker, spark,
                                                                  tmp_path):
    seed = int(os.environ.get("ONCELOG_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    broker = start_broker(**TWO_PHASE)
    create(broker.bootstrap, "events", 2)
    create(broker.bootstrap, "copied", 2)
    per_batch, batches = 10, 20
    items = [(-1, b"k%d" % (i % 3), b"k%d-%03d" % (i % 3, i), None, None)
             for i in range(per_batch * batches)]
    produce(broker.bootstrap, "events", items)
    checkpoint = str(tmp_path / "checkpoint")
    kills = 0
    began = time.monotonic()
    for run in range(5):  # bounded: at most 4 kills, then a run to the end
        args = ["stream", broker.bootstrap, "events", "copied", checkpoint, str(per_batch)]
        held = tmp_path / f"held{run}"
        # The first kill always falls between the sink's commit and Spark's checkpoint.
        action = "after-commit" if run == 0 else \
            rng.choice(("after-commit", "after-delay")) if run < 4 else "finish"
        if action == "after-commit":  # between the sink's commit and Spark's checkpoint
            args += ["--hold-after", str(rng.randrange(batches)), str(held)]
        print(f"run {run}: {action} {args[6:]} at {time.monotonic() - began:.0f}s")
        if action == "finish":  # nobody kills it: the shared session's driver runs it
            spark_write_job.copy_stream(spark, "oncelog", *args[1:])
            break
        job = _job(*args)
        if action == "after-commit":
            killed = _wait_for(held, job)
        else:
            deadline = time.monotonic() + rng.uniform(8, 25)
            while time.monotonic() < deadline and job.poll() is None:
                time.sleep(0.1)
            killed = job.poll() is None
        if not killed:  # it finished first: everything was written
            assert job.returncode == 0, job.communicate()[0].decode(errors="replace")[-4000:]
            job.communicate()
            break
        _kill(job)
        kills += 1
    print(f"seed {seed}: {kills} kills")
    records = committed(broker.bootstrap, "copied", 2)
    if len(records) != len(items):
        with Consumer({"bootstrap.servers": broker.bootstrap,
                       "auto.offset.reset": "earliest"}) as c:
            c.assign([TopicPartition("copied", p) for p in range(2)])
            everything = list(c)
        print("read_uncommitted:", len(everything), [(r.partition, r.offset, r.value,
                                                       r.producer_id) for r in everything])
    assert_once(records, [item[2] for item in items])
    by_key: dict[bytes, list[bytes]] = collections.defaultdict(list)
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_key[r.key].append(r.value)
    assert all(values == sorted(values) for values in by_key.values())
