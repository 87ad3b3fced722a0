"""acks=1 records acknowledged and then lost across a preferred-leader election (issue 23):
three brokers on the test harness's ZooKeeper, one partition x 3 replicas led by a
non-preferred replica, librdkafka producing acks=1 as fast as it can; a preferred election
moves the leadership while records come in. Before the handover (leader_election.py's H
rows), the old leader was not told before the controller wrote the new leader, kept
acknowledging until its replica watch read the new state, then truncated to the new leader:
those acknowledgements were lost. Prints how many acknowledged records are not at their
offset afterwards, and how long the ElectLeaders call took (the handover's price).

    .venv/bin/python bench/preferred_election_acks1.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.brokers import acknowledged_lost
from support.three_brokers import ThreeBrokers
from support.waits import wait_for
from support.zookeepers import ZooKeeperServer


def main() -> None:
    from confluent_kafka import ElectionType, KafkaError, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    zookeeper = ZooKeeperServer().start()
    cluster = None
    try:
        cluster = ThreeBrokers(zookeeper, Path(tempfile.mkdtemp(prefix="pref-acks1-")),
                               "pref", {"default.replication.factor": "3"})
        bootstrap = ",".join(b.bootstrap for b in cluster.brokers.values())
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("p", 1, 3)])["p"].result(30)

        def state() -> dict:
            return json.loads(cluster.zk.get("/brokers/topics/p/partitions/0/state")[0])

        wait_for(lambda: len(state()["isr"]) == 3, 30, "an ISR of three")
        preferred = state()["leader"]
        cluster.brokers[preferred].stop()  # its leadership moves; back, it only follows
        cluster.brokers[preferred].start()
        wait_for(lambda: len(state()["isr"]) == 3 and state()["leader"] != preferred, 60,
                 "the preferred replica back in the ISR, not leading")
        acked: dict[bytes, int] = {}
        producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 1,
                             "enable.idempotence": False, "message.timeout.ms": 10000})
        done = threading.Event()

        def produce() -> None:
            i = 0
            while not done.is_set():
                try:
                    producer.produce("p", b"%d" % i, partition=0, on_delivery=lambda e, m:
                                     e or acked.__setitem__(m.value(), m.offset()))
                except BufferError:
                    producer.poll(0.01)
                i += 1
                producer.poll(0)

        writer = threading.Thread(target=produce, daemon=True)
        writer.start()
        wait_for(lambda: len(acked) > 20000, 60, "20,000 acknowledged")
        # An admin made now: the broker just restarted may have been the controller, and
        # librdkafka sends ElectLeaders to the controller it last knew, without asking
        # again on NOT_CONTROLLER (what this run failed on once).
        def elect() -> bool:
            fresh = AdminClient({"bootstrap.servers": bootstrap})
            try:
                fresh.elect_leaders(ElectionType.PREFERRED,
                                    [TopicPartition("p", 0)]).result(30)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.NOT_CONTROLLER:
                    raise
                return False
            return True

        began = time.monotonic()
        wait_for(elect, 30, "a preferred election by the controller")
        took = time.monotonic() - began
        before = len(acked)
        wait_for(lambda: len(acked) > before + 20000, 60, "20,000 more acknowledged")
        done.set()
        writer.join(30)
        producer.flush(10)
        lost = acknowledged_lost(bootstrap, "p", acked)
        print(f"leader now {state()['leader']} (preferred {preferred}); {len(acked)} "
              f"acknowledged with acks=1, {len(lost)} not at their offset afterwards"
              + (f" (offsets {lost[0]}..{lost[-1]})" if lost else "")
              + f"; ElectLeaders answered in {took * 1000:,.0f} ms")
    finally:
        if cluster is not None:
            cluster.close()
        zookeeper.close()


if __name__ == "__main__":
    main()
