"""Spark's exactly-once sink (spark/two_phase.py) on a three-broker cluster (issue 24): a batch
write and a stream, each through the SIGKILL of the broker leading an output partition and
then of the broker hosting the transaction coordinator, while the tasks' transactions are
open with rows in the log (tests/support/paused_sink.py holds them there). The killed broker
comes back; the write goes on (each micro-batch decided once, under its batch id), and a
read_committed reader finds every input row exactly once, nothing left open. Without Spark
(the sink's own calls, cheaper): KIP-939 prepared transactions committed by the coordinator
elected after the kill of theirs, at each step of the driver's commit.

The cluster's internal topics have one partition each, so that one broker is the
coordinator of every transactional id (the tasks' and the driver's): killing it moves all
of them; the decisions' group coordinator is the leader of the one ``__consumer_offsets``
partition. The jobs run in the shared Spark session: a killed broker needs no killed
driver."""

from __future__ import annotations

import collections
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.paused_sink import paused_source
from support.txn_cluster import TxnCluster, end_offsets, read_committed
from support.waits import wait_for

from oncelog import Admin, Producer
from oncelog.spark import two_phase
from oncelog.spark.options import write_options

TIMEOUT = 60.0
HOLD = 120.0  # a paused task's bound: the test releases it long before
ROWS = 120  # per run
ARROW_BATCH = "10"  # rows per Arrow batch: a task pauses after its first
STATE = "__transaction_state"
OFFSETS = "__consumer_offsets"


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    running = TxnCluster(zookeeper, tmp_path_factory.mktemp("sparkcluster"), "sparkcluster",
                         **{"transaction.two.phase.commit.enable": "true",
                            "transaction.state.log.num.partitions": "1",
                            "offsets.topic.num.partitions": "1"})
    yield running
    running.close()


@pytest.fixture
def small_batches(spark):
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", ARROW_BATCH)
    yield spark
    spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def _coordinator(cluster: TxnCluster) -> int:
    """The broker of every transactional id's coordinator (one partition of the state log;
    FindCoordinator creates it)."""
    with Admin({"bootstrap.servers": cluster.bootstrap()}) as admin:
        found = admin.find_transaction_coordinator("spark-on-cluster").node_id
    assert found == cluster.state(STATE, 0)["leader"]
    return found


class Pauses:
    """The test's side of paused_source: which tasks are holding, and their release."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir()
        self.ended = threading.Event()  # set when the job returns or raises

    def source(self, *holds: str):
        return paused_source(self.folder, frozenset(holds), HOLD)

    def wait_held(self, hold: str, tasks: int, cluster: TxnCluster, topic: str,
                  rows: int) -> None:
        """Until ``tasks`` tasks pause at ``hold`` and the log of ``topic`` has ``rows``
        rows (the transactions are open with rows in the log)."""
        # (bounded by a task's own hold: a Spark job's start is slow on a busy machine)
        def held() -> bool:
            assert not self.ended.is_set(), f"the job ended before {hold}"
            return len(list(self.folder.glob(f"entered-{hold}-*"))) >= tasks

        wait_for(held, HOLD, f"{tasks} tasks holding at {hold}")
        wait_for(lambda: sum(end_offsets(cluster.bootstrap(), topic, 2, False)) >= rows,
                 TIMEOUT, f"{rows} rows of open transactions in {topic}")

    def release(self, hold: str) -> None:
        (self.folder / f"release-{hold}").touch()

    def kill_in_turn(self, cluster: TxnCluster, topic: str, tasks: int,
                     kills: list[tuple[str, int, int, tuple[str, int]]]) -> None:
        """In a thread beside the job: at each (hold, rows in the log, broker, partition it
        leads), SIGKILL the broker once the tasks pause (until the partition has another
        leader), release them, and start the broker again before the next (the last one
        stays dead: the test brings it back after the job). A failed wait releases
        everything: no task is left holding."""
        try:
            for n, (hold, rows, victim, moved) in enumerate(kills):
                self.wait_held(hold, tasks, cluster, topic, rows)
                cluster.kill(victim, *moved)
                self.release(hold)
                if n + 1 < len(kills):
                    cluster.bring_back(victim, [topic, STATE])
        finally:
            for hold, *_ in kills:
                self.release(hold)


def _once(cluster: TxnCluster, topic: str, expected: list[bytes]) -> None:
    bootstrap = cluster.bootstrap()

    def ended() -> bool:  # the markers of a commit decided may still be on their way
        with Admin({"bootstrap.servers": bootstrap}) as admin:
            listed = admin.list_transactions(
                states=("Ongoing", "PrepareCommit", "PrepareAbort"))
        return not [t for ts in listed.values() for t in ts]

    wait_for(ended, TIMEOUT, "every transaction ended", interval=0.2)
    assert end_offsets(bootstrap, topic, 2, True) == end_offsets(bootstrap, topic, 2, False)
    found = collections.Counter(v for vs in read_committed(bootstrap, topic, 2).values()
                                for v in vs)
    assert sorted(found) == sorted(expected)
    assert [v for v, n in found.items() if n > 1] == []


def test_a_batch_write_is_exactly_once_through_the_kills_of_its_leader_and_coordinator(
        cluster, small_batches, tmp_path):
    """Each task pauses after its first Arrow batch (the output's leader is killed) and
    after its second (the coordinator's broker is killed)."""
    spark = small_batches
    coordinator = _coordinator(cluster)
    leader, other = [b for b in (1, 2, 3) if b != coordinator]
    topic = "spark-batch"
    # partition 0 led by a broker that is not the coordinator, partition 1 by the coordinator
    cluster.create(topic, [[leader, other, coordinator], [coordinator, leader, other]])
    pauses = Pauses(tmp_path / "holds")
    spark.dataSource.register(pauses.source("batch.0", "batch.1"))
    batch = int(ARROW_BATCH)
    with ThreadPoolExecutor(1) as killer:
        kills = killer.submit(pauses.kill_in_turn, cluster, topic, 2, [
            ("batch.0", 2 * batch, leader, (topic, 0)),
            ("batch.1", 4 * batch, coordinator, (STATE, 0))])
        # (in this thread: Spark finds the registered source through the session active in
        # the thread that saves)
        try:
            spark.range(0, ROWS, numPartitions=2) \
                .selectExpr("cast(id as string) as value", "cast(id % 2 as int) as partition") \
                .write.format("oncelog_paused").mode("append") \
                .option("bootstrap.servers", cluster.bootstrap()).option("topic", topic) \
                .option("transactionalIdPrefix", "spark-batch").save()
        finally:
            pauses.ended.set()
        kills.result(TIMEOUT)
    cluster.bring_back(coordinator, [topic, STATE])
    _once(cluster, topic, [str(i).encode() for i in range(ROWS)])


def test_a_stream_is_exactly_once_through_the_kills_of_its_leader_and_coordinator(
        cluster, small_batches, tmp_path):
    """Two micro-batches: the output's leader is killed in the first, the coordinator's
    broker in the second, each while its task pauses after its first Arrow batch."""
    spark = small_batches
    coordinator = _coordinator(cluster)
    leader, other = [b for b in (1, 2, 3) if b != coordinator]
    source, topic = "spark-stream-in", "spark-stream-out"
    cluster.create(source, [[other, leader, coordinator]])  # led by a broker never killed
    cluster.create(topic, [[leader, other, coordinator], [coordinator, leader, other]])
    expected = [str(i).encode() for i in range(ROWS)]
    with Producer({"bootstrap.servers": cluster.bootstrap()}) as producer:
        for value in expected:
            producer.produce(source, value, None, 0)
        producer.flush(TIMEOUT)
    pauses = Pauses(tmp_path / "holds")
    spark.dataSource.register(pauses.source("0.0", "1.0"))
    per_batch = ROWS // 2
    batch = int(ARROW_BATCH)
    query = (spark.readStream.format("oncelog").option("bootstrap.servers", cluster.bootstrap())
             .option("subscribe", source).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(per_batch)).load()
             .selectExpr("value", "cast(cast(cast(value as string) as int) % 2 as int) "
                         "as partition")
             .writeStream.format("oncelog_paused")
             .option("bootstrap.servers", cluster.bootstrap()).option("topic", topic)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    try:
        with ThreadPoolExecutor(1) as killer:
            kills = killer.submit(pauses.kill_in_turn, cluster, topic, 1, [
                ("0.0", batch, leader, (topic, 0)),
                ("1.0", per_batch + batch, coordinator, (STATE, 0))])
            try:
                finished = query.awaitTermination(HOLD)
            finally:
                pauses.ended.set()
            kills.result(TIMEOUT)
        assert finished, "the stream did not finish"
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    cluster.bring_back(coordinator, [topic, STATE])
    _once(cluster, topic, expected)


@pytest.mark.parametrize("step", ["prepared", "decided", "group"])
def test_prepared_transactions_are_committed_by_the_coordinator_elected_after_a_kill(
        cluster, step):
    """KIP-939 across a coordinator move, without Spark (the sink's own calls): two tasks
    prepare, the broker of their coordinator (and of the driver's) is SIGKILLed, and the
    driver's commit (commit_run: open P, decide, end each prepared transaction at the epoch
    it was prepared with) goes to the coordinator elected in its place, which loaded the
    prepared transactions from the replicated ``__transaction_state``; or the kill comes
    between the decision and the commits (``decided``: the driver's admin knew the dead
    coordinator); or it is the group coordinator's (``group``: the decisions' group, read
    before the kill and after). The bootstrap list still names the dead broker."""
    coordinator = _coordinator(cluster)
    leader, other = [b for b in (1, 2, 3) if b != coordinator]
    topic = prefix = f"prepared-move-{step}"
    cluster.create(topic, [[leader, other, coordinator], [other, leader, coordinator]])
    with Admin({"bootstrap.servers": cluster.bootstrap()}) as admin:  # (creates the topic)
        group_coordinator = admin.find_group_coordinator(prefix).node_id
    victim = group_coordinator if step == "group" else coordinator
    # the broker to be killed first in the bootstrap list: the admin's first connection
    options = write_options({"bootstrap.servers": cluster.bootstrap(
        victim, *(b for b in (1, 2, 3) if b != victim)), "topic": topic,
        "transactionalIdPrefix": prefix})
    two_phase.recover(options)
    run = two_phase.new_run()
    winners, expected = {}, []
    for p in (0, 1):
        rows = [f"{p}-{i}".encode() for i in range(ROWS // 2)]
        expected += rows

        def produce(producer, rows=rows, p=p) -> int:
            for value in rows:
                producer.produce(topic, value, None, p)
            return len(rows)

        task = two_phase.task_transactional_id(prefix, run, p, p)
        winners[task] = two_phase.run_task(options, prefix, run, task, produce)
    if step == "prepared":
        cluster.kill(coordinator, STATE, 0)
        two_phase.commit_run(options, run, winners, {topic})
    else:  # commit_run's steps, the kill within them
        decision = two_phase.Decision(run, two_phase.NO_BATCH, frozenset(winners))
        with two_phase.Driver(options, decides=True) as driver:
            if step == "group":  # as commit_micro_batch: the decisions, then recover
                assert driver.decisions() == []
                cluster.kill(group_coordinator, OFFSETS, 0)
                assert driver.recover(keep=frozenset(winners)) == ([], [])
            driver.check_prepared(run, winners)
            driver.decide(decision, topic)
            if step == "decided":
                cluster.kill(coordinator, STATE, 0)
            driver.finish(frozenset(winners), winners)
            driver.abort_open(run, keep=frozenset(winners))
            assert driver.decisions() == [decision]
    cluster.bring_back(victim, [topic, STATE, OFFSETS])
    _once(cluster, topic, expected)
