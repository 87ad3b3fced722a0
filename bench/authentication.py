"""The cost of authentication (issue 25): produce and consume throughput over SASL_SSL
(SCRAM-SHA-512) against PLAINTEXT on one broker, side by side, and authentication handshakes
per second.

    .venv/bin/python bench/authentication.py [--messages 200000] [--repeats 5] [--seconds 5]
                                             [--baseline COMMIT]

One broker with a PLAINTEXT and a SASL_SSL listener (certificates made here with the
``cryptography`` package, one SCRAM user added with ``oncelog users add --data-dir``). The same
confluent-kafka producer as bench/produce_consume.py (1 KiB incompressible values, acks=all,
librdkafka's default batching) writes ``--messages`` records through each listener in turn,
the order alternating between repetitions; a consumer then reads them back through the same
listener. Printed: the median throughput of each, and the median of the paired ratios
SASL_SSL / PLAINTEXT (the issue's goal: >= 0.7 at 1 KiB records, default batching), and the
broker's CPU time per record (user + system, from /proc): on a machine other work loads, the
throughputs swing with it, the broker's CPU per record much less.

With ``--baseline COMMIT``, the same runs against a broker of that commit's ``src/`` too
(built in a temporary directory), the two brokers side by side and the order alternating, so
that a change is measured against what it changed under the same load. Printed per broker
beside the broker's CPU per record: its event loop thread's (the rest is other threads:
fsync rounds, validation off the loop).

Handshakes: for ``--seconds``, four threads each open connections to the SASL_SSL listener
with oncelog's client (TCP, TLS 1.3, ApiVersions, SaslHandshake, SCRAM-SHA-512 with 4096
iterations, two SaslAuthenticate) and close them; printed: completed handshakes per second.
The client's PBKDF2 runs on the same two cores as the broker's side.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from _support import REPO, OncelogBroker, produce_all
from produce_consume import PAYLOAD
from validation_cost import baseline_tree

sys.path.insert(0, str(REPO / "tests"))
from support.certs import CertificateAuthority

from oncelog.cli.main import main as oncelog_main
from oncelog.client.network.connection import BrokerConnection
from oncelog.client.network.security import ClientSecurity

USER, PASSWORD = "bench", "bench-secret"
TIMEOUT = 120.0


def produce(conf: dict, topic: str, n: int) -> float:
    from confluent_kafka import Producer

    producer = Producer({**conf, "acks": "all"})
    producer.produce(topic, PAYLOAD, partition=0)  # connects, creates the topic: not timed
    producer.flush(TIMEOUT)
    start = time.perf_counter()
    produce_all(producer, topic, PAYLOAD, n, time.monotonic() + TIMEOUT)
    if producer.flush(TIMEOUT):
        raise RuntimeError("undelivered messages")
    return n / (time.perf_counter() - start)


def consume(conf: dict, topic: str, n: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**conf, "group.id": "bench", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 1)])
    got = 0
    start = time.perf_counter()
    deadline = time.monotonic() + TIMEOUT
    while got < n and time.monotonic() < deadline:
        got += sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
    seconds = time.perf_counter() - start
    consumer.close()
    if got < n:
        raise RuntimeError(f"read {got} of {n}")
    return n / seconds


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU time of process ``pid`` so far (Linux), or of its ``thread``."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    with open(path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def handshakes(port: int, security: ClientSecurity, seconds: float, threads: int = 4) -> float:
    done = [0] * threads
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        while time.monotonic() < stop:
            BrokerConnection("127.0.0.1", port, timeout=30, security=security).close()
            done[i] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(done) / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--baseline", help="a commit to measure side by side")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-auth-") as tmp, \
            contextlib.ExitStack() as stack:
        ca = CertificateAuthority(Path(tmp) / "ca")
        server = ca.issue("broker", "localhost", server=True)
        settings = {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
                    "sasl.enabled.mechanisms": "SCRAM-SHA-512",
                    "ssl.keystore.location": str(server.both)}
        trees = {"this tree": None}
        if args.baseline:
            base = Path(tmp) / "baseline"
            base.mkdir()
            trees = {args.baseline: baseline_tree(args.baseline, base), **trees}
        brokers = {name: stack.enter_context(OncelogBroker(settings, src=src))
                   for name, src in trees.items()}
        confs = {}
        for name, broker in brokers.items():
            # the user goes straight into the running broker's store (locked per change)
            assert oncelog_main(["users", "add", USER, "--password", PASSWORD,
                                 "--mechanism", "SCRAM-SHA-512",
                                 "--data-dir", str(broker.data_dir)]) == 0
            ports = broker.ports
            confs[name] = {
                "PLAINTEXT": {"bootstrap.servers": f"127.0.0.1:{ports['PLAINTEXT']}"},
                "SASL_SSL": {"bootstrap.servers": f"127.0.0.1:{ports['SASL_SSL']}",
                             "security.protocol": "SASL_SSL",
                             "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USER,
                             "sasl.password": PASSWORD, "ssl.ca.location": str(ca.pem)}}
        # [tree][what][listener] -> (msgs/s, broker CPU us/record, its loop thread's) per run
        runs: dict = {name: {what: {"PLAINTEXT": [], "SASL_SSL": []}
                             for what in ("produce", "consume")} for name in brokers}
        for repeat in range(args.repeats):
            names = list(brokers) if repeat % 2 == 0 else list(brokers)[::-1]
            for name in names:
                broker = brokers[name]
                order = ["PLAINTEXT", "SASL_SSL"]
                for listener in order if repeat % 2 == 0 else order[::-1]:
                    topic = f"bench-{listener.lower()}-{repeat}"
                    for what, run in (("produce", produce), ("consume", consume)):
                        before = cpu_seconds(broker.pid), cpu_seconds(broker.pid, broker.pid)
                        rate = run(confs[name][listener], topic, args.messages)
                        after = cpu_seconds(broker.pid), cpu_seconds(broker.pid, broker.pid)
                        runs[name][what][listener].append(
                            (rate, *((a - b) / args.messages * 1e6
                                     for a, b in zip(after, before, strict=True))))
        for name, by_what in runs.items():
            print(f"{name}:")
            for what, by in by_what.items():
                ratios = [s[0] / p[0] for s, p in zip(by["SASL_SSL"], by["PLAINTEXT"],
                                                      strict=True)]
                med = {listener: [statistics.median(r[i] for r in by[listener])
                                  for i in range(3)] for listener in by}
                print(f"  {what}: PLAINTEXT {med['PLAINTEXT'][0]:,.0f} msgs/s, "
                      f"SASL_SSL {med['SASL_SSL'][0]:,.0f} msgs/s, "
                      f"ratio {statistics.median(ratios):.2f} "
                      f"(pairs: {', '.join(f'{r:.2f}' for r in ratios)}); broker CPU per "
                      f"record (its event loop's): PLAINTEXT {med['PLAINTEXT'][1]:.1f} us "
                      f"({med['PLAINTEXT'][2]:.1f}), SASL_SSL {med['SASL_SSL'][1]:.1f} us "
                      f"({med['SASL_SSL'][2]:.1f})")
        for name, broker in brokers.items():
            security = ClientSecurity.from_config({**confs[name]["SASL_SSL"],
                                                   "bootstrap.servers": ""})
            rate = handshakes(broker.ports["SASL_SSL"], security, args.seconds)
            print(f"{name}: handshakes (TLS + SCRAM-SHA-512, 4 client threads): {rate:,.0f}/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
