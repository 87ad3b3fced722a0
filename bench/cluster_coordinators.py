"""Coordinators on a three-broker cluster (issue 24): transactions per second and OffsetCommit
round trips on three brokers against one broker, and how long a coordinator's failover takes.

    .venv/bin/python bench/cluster_coordinators.py [--repeats 3] [--seconds 4]
        [--failovers 3] [--session-ms 6000] [--parts txn,commit,failover] [--json PATH]
    make bench ARGS="--only cluster_coordinators"

Set-ups, both up for the whole run: a standalone broker (no ZooKeeper), and a cluster of
three brokers on one ZooKeeper (Debian's, as the tests run it) whose internal topics have
replication factor 3, min.insync.replicas 2 for ``__transaction_state`` (Kafka's defaults):
every coordinator write waits for the ISR. The runs on the two set-ups take turns within
every repetition, in alternating order; printed: medians, and the median of the paired
ratios cluster / single. The CPU other processes used during each run is reported.

* txn: one confluent-kafka transactional producer, each transaction one 100-byte record to
  each of 3 partitions (led by the three brokers on the cluster) and a commit, for
  ``--seconds``: committed transactions per second.
* commit: one confluent-kafka consumer commits an offset synchronously (OffsetCommit to the
  group's coordinator and its answer) in a loop for ``--seconds``: round trips per second.
* failover (cluster only): a group's coordinator's broker is SIGKILLed; measured: from the
  kill to the first synchronous commit that succeeds again (a fresh client asks whichever
  broker it likes; the new coordinator is named once ZooKeeper expires the dead broker's
  session and the controller elects a new leader of the group's ``__consumer_offsets``
  partition, which then loads it). Goal: under ``zookeeper.session.timeout.ms`` + 1 s. The
  killed broker is started again (and back in every ISR) before the next repetition.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid

from _support import (
    REPO,
    LoadMeter,
    OncelogBroker,
    add_json_argument,
    add_parts_argument,
    add_quiet_arguments,
    machine,
    median,
    wait_if_asked,
    write_json,
)

sys.path.insert(0, str(REPO / "tests"))
from support.zookeepers import ZooKeeperServer

PARTS = ("txn", "commit", "failover")
PARTITIONS = 3
VALUE = b"v" * 100
TIMEOUT = 60.0


class Cluster:
    """Three brokers on ``connect`` (a chroot of its own), each restartable on its port."""

    def __init__(self, connect: str, session_ms: int) -> None:
        self.settings = {"zookeeper.connect": connect,
                         "zookeeper.session.timeout.ms": str(session_ms),
                         "default.replication.factor": "3",
                         "offsets.topic.num.partitions": "6",
                         "transaction.state.log.num.partitions": "6",
                         "group.initial.rebalance.delay.ms": "0"}
        self.brokers = {i: OncelogBroker({**self.settings, "broker.id": str(i)})
                        for i in (1, 2, 3)}
        for broker in self.brokers.values():
            broker.__enter__()

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values() if b.proc is not None)

    def kill(self, broker_id: int) -> None:
        broker = self.brokers[broker_id]
        broker.proc.kill()
        broker.proc.wait(TIMEOUT)
        broker.proc = None

    def restart(self, broker_id: int) -> None:
        """Start a killed broker again on its port, with its data."""
        broker = self.brokers[broker_id]
        broker.settings["listeners"] = f"PLAINTEXT://127.0.0.1:{broker.port}"
        broker.__enter__()

    def close(self) -> None:
        for broker in self.brokers.values():
            try:
                broker.__exit__(None, None, None)
            except RuntimeError as exc:
                print(f"warning: {exc}", file=sys.stderr)


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise RuntimeError(f"not within {timeout}s: {what}")


def create_topic(bootstrap: str, topic: str, replicas: list[list[int]] | None) -> None:
    from oncelog.client.admin.admin import Admin

    with Admin({"bootstrap.servers": bootstrap}) as admin:
        if replicas is None:
            admin.create_topic(topic, PARTITIONS, 1)
        else:
            admin.create_topic(topic, -1, -1, assignments=dict(enumerate(replicas)))
    wait_for(lambda: _leaders_known(bootstrap, topic), TIMEOUT, f"the leaders of {topic}")


def _leaders_known(bootstrap: str, topic: str) -> bool:
    from oncelog.client.admin.admin import Admin

    with Admin({"bootstrap.servers": bootstrap}) as admin:
        found = admin.metadata([topic], missing_ok=True).topics.get(topic)
    return found is not None and len(found.partitions) == PARTITIONS \
        and all(p.leader >= 0 for p in found.partitions)


def transactions(bootstrap: str, topic: str, seconds: float) -> float:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                         "transactional.id": f"bench-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(TIMEOUT)

    def one() -> None:
        producer.begin_transaction()
        for p in range(PARTITIONS):
            producer.produce(topic, value=VALUE, partition=p)
        producer.commit_transaction(TIMEOUT)

    one()  # the coordinator found, every partition's leader connected
    count, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        one()
        count += 1
    return count / (time.monotonic() - start)


def commits(bootstrap: str, topic: str, seconds: float) -> float:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "enable.auto.commit": False,
                         "group.id": f"bench-{uuid.uuid4().hex[:8]}"})
    try:
        offsets = [TopicPartition(topic, 0, 1)]
        consumer.commit(offsets=offsets, asynchronous=False)
        count, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            offsets[0].offset += 1
            consumer.commit(offsets=offsets, asynchronous=False)
            count += 1
        return count / (time.monotonic() - start)
    finally:
        consumer.close()


def _coordinator(bootstrap: str, group: str) -> int:
    from oncelog.client.network import calls
    from oncelog.client.network.connection import BrokerConnection
    from oncelog.protocol.api_versions import FIND_COORDINATOR

    host, port = bootstrap.split(",")[0].split(":")

    def named():
        conn = BrokerConnection(host, int(port), timeout=TIMEOUT)
        try:
            found = calls.find_coordinator_result(conn.call(
                FIND_COORDINATOR, calls.find_coordinator_request(group)))
        finally:
            conn.close()
        return found.node_id if found.error == 0 else None
    return wait_for(named, TIMEOUT, f"the coordinator of {group}")


def failover(cluster: Cluster, topic: str) -> float:
    """Seconds from the SIGKILL of a group's coordinator's broker to the next commit taken."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    group = f"failover-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "enable.auto.commit": False,
                         "group.id": group})
    offsets = [TopicPartition(topic, 0, 1)]
    consumer.commit(offsets=offsets, asynchronous=False)
    victim = _coordinator(cluster.bootstrap, group)
    killed = time.monotonic()
    cluster.kill(victim)
    took = None
    try:
        while time.monotonic() - killed < TIMEOUT:
            offsets[0].offset += 1
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException:
                time.sleep(0.01)
                continue
            took = time.monotonic() - killed
            break
    finally:
        consumer.close()
    cluster.restart(victim)
    wait_for(lambda: _coordinator(cluster.bootstrap, group) >= 0, TIMEOUT, "back")
    time.sleep(2)  # back in the ISRs (its fetchers caught up)
    if took is None:
        raise RuntimeError("no commit taken after the kill")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--session-ms", type=int, default=6000)
    add_parts_argument(parser, PARTS)
    add_json_argument(parser)
    add_quiet_arguments(parser)  # --max-other-load: reported here, nothing left out
    args = parser.parse_args()
    wait_if_asked(args)
    parts = set(args.parts.split(","))
    print(machine())
    zookeeper = ZooKeeperServer().start()
    single = OncelogBroker().__enter__()
    cluster = Cluster(zookeeper.chroot("bench"), args.session_ms)
    results: dict = {"machine": machine(), "session_ms": args.session_ms}
    try:
        create_topic(single.bootstrap, "bench", None)
        create_topic(cluster.bootstrap, "bench", [[1, 2, 3], [2, 3, 1], [3, 1, 2]])
        setups = {"single": single.bootstrap, "cluster": cluster.bootstrap}
        for part, run in (("txn", transactions), ("commit", commits)):
            if part not in parts:
                continue
            got: dict[str, list[float]] = {"single": [], "cluster": []}
            ratios, loads = [], []
            for r in range(args.repeats):
                meter = LoadMeter()
                order = ("single", "cluster") if r % 2 == 0 else ("cluster", "single")
                for name in order:
                    got[name].append(run(setups[name], "bench", args.seconds))
                ratios.append(got["cluster"][-1] / got["single"][-1])
                loads.append(meter.others_share())
            unit = "transactions/s" if part == "txn" else "OffsetCommit round trips/s"
            print(f"{part}: single broker {median(got['single']):.1f} {unit}, three brokers "
                  f"{median(got['cluster']):.1f}; cluster/single (paired median) "
                  f"{median(ratios):.2f}; other processes used "
                  f"{', '.join(f'{x:.0%}' for x in loads)} of the CPUs", flush=True)
            results[part] = {"single": got["single"], "cluster": got["cluster"],
                             "ratios": ratios, "other_load": loads}
        if "failover" in parts:
            times = []
            for _ in range(args.failovers):
                times.append(failover(cluster, "bench"))
                print(f"failover: {times[-1]:.2f}s", flush=True)
            goal = args.session_ms / 1000 + 1
            print(f"failover: median {median(times):.2f}s, max {max(times):.2f}s "
                  f"(goal: under {goal:.1f}s, zookeeper.session.timeout.ms + 1 s)")
            results["failover"] = {"seconds": times, "goal_s": goal}
    finally:
        cluster.close()
        single.__exit__(None, None, None)
        zookeeper.close()
    write_json(results, args.json)
    print(json.dumps(results) if not args.json else "", end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
