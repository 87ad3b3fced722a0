"""How long `oncelog cluster up --brokers 3` takes to stop on Ctrl-C (SIGINT), with records
coming in and a consumer group, ZooKeeper's stop included: what a user of `make cluster`
waits. Prints one line per run.

    .venv/bin/python bench/cluster_stop.py --acks all --repeats 2
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.cluster_up import free_ports, read_until


def one_run(acks: str) -> float:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    data = tempfile.mkdtemp(prefix="cluster-stop-")
    zk_port, *ports = free_ports(4)
    up = subprocess.Popen(
        [sys.executable, "-m", "oncelog", "cluster", "up", "--brokers", "3", "--data-dir",
         data, "--base-port", str(ports[0]), "--zookeeper-port", str(zk_port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    done = threading.Event()
    try:
        read_until(up, "Ctrl-C stops them all", 60)
        bootstrap = ",".join(f"127.0.0.1:{p}" for p in ports)
        admin = AdminClient({"bootstrap.servers": bootstrap})  # kept while its future runs
        admin.create_topics([NewTopic("s", 6, 3)])["s"].result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 1,
                             "message.timeout.ms": 5000})

        def produce() -> None:
            i = 0
            while not done.is_set():
                try:
                    producer.produce("s", b"%d" % i, partition=i % 6)
                except BufferError:
                    producer.poll(0.01)
                i += 1
                producer.poll(0)

        threading.Thread(target=produce, daemon=True).start()
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g",
                             "auto.offset.reset": "earliest"})
        consumer.subscribe(["s"])
        read, deadline = 0, time.monotonic() + 60
        while read < 2000 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            read += msg is not None and msg.error() is None
        began = time.monotonic()
        up.send_signal(signal.SIGINT)
        up.wait(120)
        return time.monotonic() - began
    finally:
        done.set()
        if up.poll() is None:  # a failed run: its brokers and ZooKeeper are not in its group
            up.send_signal(signal.SIGINT)
            try:
                up.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--acks", default="all", choices=("0", "1", "all"))
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.repeats):
        print(f"acks={args.acks}: cluster up stopped {one_run(args.acks):.2f}s after Ctrl-C",
              flush=True)


if __name__ == "__main__":
    main()
