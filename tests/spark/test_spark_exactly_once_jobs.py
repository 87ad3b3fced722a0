"""Exactly-once writes from Spark when jobs and queries meet (spark/two_phase.py): two jobs on
one topic or on topics whose names overlap, two jobs given one transactionalIdPrefix, two
queries writing one topic, a commit that fails after its decision was written, and a driver
killed after its tasks prepared that nobody runs again. Real Spark (the shared local[2]
session, jobs run side by side from threads; a killed driver runs tests/support/spark_write_job.py),
a real broker with two-phase commit on."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from support.broker_forks import run_oncelog
from support.held_sink import held_source
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

from oncelog import Admin
from oncelog.spark import two_phase
from oncelog.spark.source import OncelogDataSource


def _flaky_source():
    """``format("oncelog_flaky")``: the sink whose commit() meets a coordinator that fails
    every EndTxn call after ending half of the transactions asked (rounded down: alone, a
    transaction is never ended), as one transient failure after another would; abort() meets
    the broker as it is."""

    class Flaky(OncelogDataSource):
        @classmethod
        def name(cls) -> str:
            return "oncelog_flaky"

        def writer(self, schema, overwrite):
            writer = super().writer(schema, overwrite)
            real = writer.commit

            def commit(messages) -> None:
                from kio.schema.errors import ErrorCode

                from oncelog.client.admin.admin import Admin as RealAdmin
                from oncelog.client.network.connection import KafkaError

                end = RealAdmin.end_transactions

                def failing(self, ends, commit):
                    if not commit:
                        return end(self, ends, commit)
                    half = dict(sorted(ends.items())[:len(ends) // 2])
                    if half:
                        end(self, half, commit)
                    raise KafkaError(ErrorCode.coordinator_not_available, "injected")

                RealAdmin.end_transactions = failing
                try:
                    real(messages)
                finally:
                    RealAdmin.end_transactions = end

            writer.commit = commit
            return writer

    return Flaky


def _rows(spark, first: int, count: int):
    return spark.range(first, first + count, numPartitions=2).selectExpr(
        "cast(id as string) as value")


def _values(first: int, count: int) -> list[bytes]:
    return [b"%d" % i for i in range(first, first + count)]


def _save_while_held(spark, tmp_path: Path, bootstrap: str, first: int, count: int,
                     meanwhile, **options: str) -> BaseException | None:
    """A save() of rows first.. whose commit waits, once its tasks prepared, while
    ``meanwhile()`` runs on a thread of its own (Spark runs jobs of one session side by
    side; the held save() stays on this thread, where its data source was registered).
    Returns what the held save() raised."""
    entered, release = tmp_path / "held.entered", tmp_path / "held.release"
    spark.dataSource.register(held_source(entered, release, TIMEOUT))
    failures: list[BaseException] = []

    def run() -> None:
        try:
            # Spark looks Python data sources up in the thread's active session.
            spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)
            deadline = time.monotonic() + TIMEOUT
            while not entered.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert entered.exists(), "the held job's tasks did not finish"
            meanwhile()
        except BaseException as exc:
            failures.append(exc)
        finally:
            release.touch()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    error = None
    try:
        writer(_rows(spark, first, count), bootstrap, **options).format("oncelog_held").save()
    except Exception as exc:
        error = exc
    thread.join(TIMEOUT * 2)
    assert not thread.is_alive()
    if failures:
        raise failures[0]
    return error


def test_jobs_on_one_topic_or_overlapping_topics_leave_each_other_alone(
        start_broker, spark, tmp_path):
    """Job A (topic orders-eu) has prepared; jobs on topic orders and on orders-eu run and
    end meanwhile. Their default prefixes were oncelog-spark-orders and -orders-eu, matched
    as a start of name: their recovery aborted A's transactions, and A's commit, finding
    nothing open, reported success with none of its 1000 rows."""
    broker = start_broker(**TWO_PHASE)
    for topic in ("orders", "orders-eu", "stream"):
        create(broker.bootstrap, topic, 2)

    def others() -> None:
        writer(_rows(spark, 5000, 10), broker.bootstrap, topic="orders").save()
        writer(_rows(spark, 6000, 10), broker.bootstrap, topic="orders-eu").save()

    assert _save_while_held(spark, tmp_path, broker.bootstrap, 0, 1000, others,
                            topic="orders-eu") is None
    assert_once(committed(broker.bootstrap, "orders-eu", 2),
                _values(0, 1000) + _values(6000, 10))
    assert_once(committed(broker.bootstrap, "orders", 2), _values(5000, 10))


def test_a_job_whose_transactions_another_job_aborted_fails(start_broker, spark, tmp_path):
    """Two jobs given one transactionalIdPrefix (which the prefix's rule forbids): the
    second's recovery aborts the first's prepared transactions. The first's commit cannot
    prove its winners committed: its save() fails, naming the prefix, and left nothing."""
    broker = start_broker(**TWO_PHASE)
    create(broker.bootstrap, "shared", 2)

    def second() -> None:
        writer(_rows(spark, 5000, 10), broker.bootstrap, topic="shared",
               transactionalIdPrefix="one-name").save()

    error = _save_while_held(spark, tmp_path, broker.bootstrap, 0, 1000, second,
                             topic="shared", transactionalIdPrefix="one-name")
    assert error is not None and "one-name" in str(error) and "aborted" in str(error), error
    assert_once(committed(broker.bootstrap, "shared", 2), _values(5000, 10))


def test_a_commit_that_fails_after_its_decision_rolls_forward_in_abort(start_broker, spark):
    """The winners' EndTxn fails after one of the two was committed, again and again: the
    commit fails, Spark calls abort(), which must finish the decided run, not abort the
    winner left (500 of 1000 rows committed for good, 500 aborted for good)."""
    broker = start_broker(**TWO_PHASE)
    create(broker.bootstrap, "flaky", 2)
    spark.dataSource.register(_flaky_source())
    with pytest.raises(Exception, match="decided") as failed:
        writer(_rows(spark, 0, 1000), broker.bootstrap, topic="flaky") \
            .format("oncelog_flaky").save()
    print(str(failed.value)[-2000:])
    assert_once(committed(broker.bootstrap, "flaky", 2), _values(0, 1000))


def _stream(spark, bootstrap: str, source: str, topic: str, **options: str):
    query = spark.readStream.format("oncelog").option("bootstrap.servers", bootstrap) \
        .option("subscribe", source).option("startingOffsets", "earliest") \
        .option("maxOffsetsPerTrigger", "10").load().selectExpr("key", "value") \
        .writeStream.format("oncelog").option("bootstrap.servers", bootstrap) \
        .option("topic", topic)
    for key, value in options.items():
        query = query.option(key, value)
    query = query.trigger(availableNow=True).start()
    try:
        assert query.awaitTermination(TIMEOUT)
    except StreamingQueryException:
        pass  # the caller looks at query.exception()
    finally:
        query.stop()
    return query


def test_two_queries_writing_one_topic_each_write_every_micro_batch(start_broker, spark,
                                                                   tmp_path):
    """Checkpoints from spark.sql.streaming.checkpointLocation (no option): both queries'
    default prefix was oncelog-spark-stream-<topic>, and the second's micro-batches 0-4 were
    taken for done by the first's decisions (50 of 100 rows, no error). Given one
    transactionalIdPrefix, the second query fails, naming it, and writes nothing."""
    broker = start_broker(**TWO_PHASE)
    for topic in ("in1", "in2"):
        create(broker.bootstrap, topic, 1)
        produce(broker.bootstrap, topic, [(0, None, b"%s-%02d" % (topic.encode(), i), None,
                                           None) for i in range(50)])
    for topic in ("out", "named"):
        create(broker.bootstrap, topic, 2)
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path / "checkpoints"))
    try:
        for source in ("in1", "in2"):
            assert _stream(spark, broker.bootstrap, source, "out").exception() is None
        first = _stream(spark, broker.bootstrap, "in1", "named",
                        transactionalIdPrefix="query-name")
        assert first.exception() is None
        second = _stream(spark, broker.bootstrap, "in2", "named",
                         transactionalIdPrefix="query-name")
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")
    expected = [b"in%d-%02d" % (n, i) for n in (1, 2) for i in range(50)]
    assert_once(committed(broker.bootstrap, "out", 2), expected)
    error = second.exception()
    assert error is not None and "query-name" in str(error) and \
        str(first.id) in str(error), error
    assert_once(committed(broker.bootstrap, "named", 2), expected[:50])


def _oncelog(*args: str) -> subprocess.CompletedProcess:
    return run_oncelog(*args, timeout=TIMEOUT)


@pytest.mark.timeout(600)
def test_a_driver_killed_after_its_tasks_prepared_is_found_and_recovered(start_broker,
                                                                        tmp_path):
    """Nobody runs the job again: its prepared transactions (no timeout, KIP-939) hold every
    read_committed reader of the topic back. The broker logs them once they are older than
    transaction.max.timeout.ms, find-prepared lists them with their Spark prefix, and
    ``oncelog spark recover --prefix P`` ends them by the prefix's decisions (none: aborted)."""
    broker = start_broker(**TWO_PHASE, transaction_max_timeout_ms="1000",
                          transaction_abort_timed_out_transaction_cleanup_interval_ms="200")
    create(broker.bootstrap, "dead", 2)
    held = tmp_path / "held"
    job = _job("batch", broker.bootstrap, "dead", "100", "-", "--hold-commit", str(held))
    assert _wait_for(held, job), job.communicate()[0].decode(errors="replace")[-4000:]
    _kill(job)
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        open_ids = sorted(t.transactional_id for ts in admin.list_transactions(
            states=("Ongoing",)).values() for t in ts)
    assert len(open_ids) == 2, open_ids
    prefix = open_ids[0].rsplit("-", 3)[0]
    assert prefix.startswith("oncelog-spark-dead-"), prefix
    deadline = time.monotonic() + 30
    while not all(t in broker.log_text() for t in open_ids) and time.monotonic() < deadline:
        time.sleep(0.2)
    lines = [line for line in broker.log_text().splitlines() if "prepared" in line
             and open_ids[0] in line]
    assert lines and "oncelog spark recover" in lines[0], broker.log_text()[-3000:]

    found = _oncelog("transactions", "find-prepared", "--bootstrap-server", broker.bootstrap,
                     "--duration-filter", "0")
    assert found.returncode == 0, found.stderr
    assert all(t in found.stdout for t in open_ids) and prefix in found.stdout, found.stdout

    recovered = _oncelog("spark", "recover", "--bootstrap-server", broker.bootstrap,
                         "--prefix", prefix)
    assert recovered.returncode == 0, recovered.stderr
    assert "aborted 2" in recovered.stdout, recovered.stdout
    assert committed(broker.bootstrap, "dead", 2) == []
    again = _oncelog("transactions", "find-prepared", "--bootstrap-server", broker.bootstrap,
                     "--duration-filter", "0")
    assert open_ids[0] not in again.stdout, again.stdout


def test_a_query_keeps_its_prefix_however_its_checkpoint_is_spelled(start_broker, spark,
                                                                    tmp_path):
    """Suspected and proven: the default prefix hashed the checkpoint path as written, so
    ``dir``, ``dir/`` and ``file:dir`` were three prefixes for one query, and a batch the
    sink committed before a crash was written again after a restart spelled otherwise. The
    prefix is now the query's id, which the checkpoint keeps."""
    broker = start_broker(**TWO_PHASE)
    create(broker.bootstrap, "in", 1)
    create(broker.bootstrap, "copy", 2)
    checkpoint = tmp_path / "checkpoint"
    ids = set()
    for run, spelling in enumerate((str(checkpoint), f"{checkpoint}/", f"file:{checkpoint}")):
        produce(broker.bootstrap, "in", [(0, None, b"%d-%02d" % (run, i), None, None)
                                         for i in range(20)])
        query = _stream(spark, broker.bootstrap, "in", "copy", checkpointLocation=spelling)
        assert query.exception() is None
        ids.add(str(query.id))
    assert len(ids) == 1
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        listed = admin.list_transactions(pattern="oncelog-spark-stream-.*")
    # The tasks' ids (P-run-partition-attempt), not the driver's (P).
    prefixes = {t.transactional_id.rsplit("-", 3)[0] for ts in listed.values() for t in ts
                if re.fullmatch(r".+-[0-9a-f]{8}-[0-9]+-[0-9]+", t.transactional_id)}
    assert len(prefixes) == 1, prefixes
    assert prefixes == {two_phase.stream_prefix(ids.pop())}
    assert_once(committed(broker.bootstrap, "copy", 2),
                [b"%d-%02d" % (run, i) for run in range(3) for i in range(20)])
