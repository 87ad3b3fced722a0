"""The controller's pass over many partitions (issue 23), in process against a real ZooKeeper.

A ZooKeeper (Debian's, as ``oncelog cluster up`` starts it) and three brokers registered in
it (``ClusterMember``s in this process, each on a ZooKeeper session of its own; broker 1 is
the controller); a topic of P partitions (default 1,000) with replication factor 3, every
partition led by its first replica with a full ISR. Measured, each ``--repeats`` times:

* ``steady``: a pass with nothing to decide (what every watch and every third of the
  session timeout costs): wall seconds, CPU seconds of this process, ZooKeeper requests;
* ``shutdown pass``: broker 3 asks for a controlled shutdown; the pass that moves its
  leaderships away and takes it out of every ISR (P/3 elections, 2P/3 shrinks), and the
  requests it took, then the pass after it (which finds nothing more to do); then the
  states are put back for the next repetition.

Part ``shutdown`` (``--parts``): three real brokers (``LocalCluster``, as
bench/replication.py), a topic of P partitions x 3 replicas with a record in each; broker 3
is stopped with SIGTERM (a controlled shutdown): the seconds to its exit, with the steps from
its own log (leaderships moved, stopped cleanly).

Requests are counted at the kazoo client (a multi is one request). ``--profile FILE``
writes a cProfile of the timed passes.

    .venv/bin/python bench/cluster_control.py [--partitions P] [--repeats R] [--profile F]
                                              [--parts pass,shutdown]
    make bench ARGS="--only cluster_control"
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _support import LoadMeter, add_parts_argument, machine

from oncelog.cli.cluster_up import _start_zookeeper, _stop
from oncelog.cli.scenario_cluster import LocalCluster, _free_port
from oncelog.cluster import znodes as zn
from oncelog.cluster.controller import Controller
from oncelog.cluster.membership import ClusterMember
from oncelog.cluster.topic_admin import TopicAdmin
from oncelog.metadata.zookeeper import ZooKeeperStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.zookeepers import count_requests  # tests/: the kazoo request counter

TOPIC = "bench-control"
PARTS = ("pass", "shutdown")
SESSION_MS = 6000


def _states(store: ZooKeeperStore, partitions: int) -> None:
    """Every partition led by its first replica, ISR full (one transaction per 200)."""
    zk = store.client
    for start in range(0, partitions, 200):
        txn = zk.transaction()
        for p in range(start, min(start + 200, partitions)):
            replicas = _replicas(p)
            txn.set_data(zn.partition_state_path(TOPIC, p),
                         zn.PartitionState(replicas[0], 0, replicas, 1).encode())
        txn.commit()


def _replicas(p: int) -> tuple[int, ...]:
    first = p % 3
    return tuple(1 + (first + i) % 3 for i in range(3))


def _topic(store: ZooKeeperStore, partitions: int) -> None:
    zk = store.client
    zk.create(zn.topic_path(TOPIC), zn.TopicAssignment(
        "AAAAAAAAAAAAAAAAAAAAAA", {p: _replicas(p) for p in range(partitions)}, {},
        {}).encode(), makepath=True)
    zk.ensure_path(zn.partitions_path(TOPIC))
    for start in range(0, partitions, 200):
        txn = zk.transaction()
        for p in range(start, min(start + 200, partitions)):
            txn.create(f"{zn.partitions_path(TOPIC)}/{p}", b"")
            replicas = _replicas(p)
            txn.create(zn.partition_state_path(TOPIC, p),
                       zn.PartitionState(replicas[0], 0, replicas, 1).encode())
        txn.commit()


def _timed(controller: Controller, sent: list[int], profile: cProfile.Profile | None
           ) -> tuple[float, float, int, bool]:
    before = sent[0]
    cpu, wall = time.process_time(), time.perf_counter()
    if profile is not None:
        profile.enable()
    again = controller.pass_once()
    if profile is not None:
        profile.disable()
    return (time.perf_counter() - wall, time.process_time() - cpu, sent[0] - before, again)


def passes(partitions: int, repeats: int, profile: cProfile.Profile | None) -> None:
    data = Path(tempfile.mkdtemp(prefix="oncelog-control-"))
    port = _free_port()
    zookeeper = _start_zookeeper(data / "zookeeper", port)
    members: list[ClusterMember] = []
    try:
        connect = f"127.0.0.1:{port}/bench"
        for broker in (1, 2, 3):
            member = ClusterMember(ZooKeeperStore(connect, SESSION_MS, 30_000), broker, None)
            member.start("127.0.0.1", 9000 + broker, background=False)
            members.append(member)
        assert members[0].is_controller
        admin = members[1].store
        TopicAdmin(admin).ensure_paths()
        _topic(admin, partitions)
        controller = Controller(members[0], lambda: False)
        sent = count_requests(members[0].store.client)
        controller.pass_once()  # the first pass reads the registrations
        steady: list[tuple[float, float, int, bool]] = []
        moved: list[tuple[float, float, int, bool]] = []
        after: list[tuple[float, float, int, bool]] = []
        for _ in range(repeats):
            steady.append(_timed(controller, sent, profile))
            admin.client.create(f"{zn.CONTROLLED_SHUTDOWN}/3", b"", ephemeral=True,
                                makepath=True)
            moved.append(_timed(controller, sent, profile))
            after.append(_timed(controller, sent, profile))
            admin.client.delete(f"{zn.CONTROLLED_SHUTDOWN}/3")
            _states(admin, partitions)
            while controller.pass_once():  # untimed: takes the states put back
                pass
        for name, runs in (("steady pass (nothing to decide)", steady),
                           ("controlled shutdown pass of broker 3 (decides and writes)", moved),
                           ("the pass after it (nothing to decide)", after)):
            walls = [w for w, _, _, _ in runs]
            cpus = [c for _, c, _, _ in runs]
            requests = [n for _, _, n, _ in runs]
            print(f"{name}, {partitions:,} partitions: median {statistics.median(walls):.3f} "
                  f"s wall, {statistics.median(cpus):.3f} s CPU, ZooKeeper requests "
                  f"{sorted(set(requests))} (runs: {', '.join(f'{w:.3f}' for w in walls)} s)",
                  flush=True)
    finally:
        for member in members:
            member.close()
        _stop([("zookeeper", zookeeper)])
        shutil.rmtree(data, ignore_errors=True)


def _logged(cluster: LocalCluster, broker: int, pattern: str, after: float) -> float | None:
    """When (time.time()) ``broker`` first logged a line matching ``pattern`` after
    ``after``."""
    for line in cluster.log_text(broker).splitlines():
        if re.search(pattern, line):
            try:
                at = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            if at >= after:
                return at
    return None


def _cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (threads that ended included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def shutdown(partitions: int, data_dir: str | None, profile: str | None) -> None:
    from confluent_kafka import Producer

    from oncelog.client.admin.admin import Admin

    with LocalCluster(data_dir, 3) as cluster:
        bootstrap = ",".join(cluster.bootstrap(b) for b in cluster.ids)
        with Admin({"bootstrap.servers": bootstrap, "request.timeout.ms": "120000"}) as admin:
            admin.create_topic(TOPIC, partitions, 3)
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                try:
                    ps = admin.metadata([TOPIC]).topics[TOPIC].partitions
                except Exception:
                    ps = ()
                if len(ps) == partitions and all(p.leader >= 0 and len(p.isr) == 3
                                                 for p in ps):
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError("the topic was not led with full ISRs within 180 s")
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for p in range(partitions):
            producer.produce(TOPIC, b"x" * 100, partition=p)
            producer.poll(0)
        assert producer.flush(120) == 0
        broker = 3
        pid = cluster.procs[broker].pid
        spy = None
        if profile:  # py-spy (pip install py-spy) samples the broker until it exits
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record",
                                    "-p", str(pid), "-o", profile, "-r", "50", "--threads"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(2)
        cpu_before = _cpu_seconds(pid)
        at = time.time()
        cluster.procs[broker].send_signal(signal.SIGTERM)
        cpu_at_exit = cpu_before
        while cluster.procs[broker].poll() is None and time.time() - at < 60:
            try:
                cpu_at_exit = _cpu_seconds(pid)
            except (OSError, IndexError):
                break
            time.sleep(0.05)
        if cluster.procs[broker].poll() is None:
            cluster.procs[broker].kill()
            print("shutdown: broker 3 did not stop within 60 s: killed", flush=True)
        took = time.time() - at
        moved = _logged(cluster, broker, r"controlled shutdown: broker \d+ leads no", at)
        stopped = _logged(cluster, broker, r"stopped cleanly", at)
        steps = ", ".join(f"{what} +{(when - at):.1f} s" for what, when in
                          (("leaderships moved", moved), ("stopped cleanly", stopped))
                          if when is not None)
        print(f"shutdown: SIGTERM to exit of broker {broker} holding {partitions:,} replicas "
              f"(led {partitions // 3:,}): {took:.1f} s ({steps}; its CPU meanwhile "
              f"{cpu_at_exit - cpu_before:.1f} s)", flush=True)
        if spy is not None:
            spy.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", help="write a cProfile of the timed passes here, and "
                        "a py-spy flame graph of the stopping broker to PROFILE.svg")
    parser.add_argument("--data-dir", help="shutdown: the cluster's data and logs, kept")
    add_parts_argument(parser, PARTS)
    args = parser.parse_args()
    parts = args.parts.split(",")
    print(machine(), flush=True)
    profile = cProfile.Profile() if args.profile else None
    meter = LoadMeter()
    if "pass" in parts:
        passes(args.partitions, args.repeats, profile)
        if profile is not None:
            profile.dump_stats(args.profile)
    if "shutdown" in parts:
        shutdown(args.partitions, args.data_dir,
                 args.profile and f"{args.profile}.svg")
    print(f"other processes used {meter.others_share():.0%} of the CPUs meanwhile",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
