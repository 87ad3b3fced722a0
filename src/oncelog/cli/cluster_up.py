"""``oncelog cluster up`` (a ZooKeeper and N brokers on loopback, for trying cluster mode),
``oncelog cluster status`` (brokers, controller, under-replicated and offline partitions) and
``oncelog cluster elect-leaders`` (preferred or unclean leader election).

``up`` runs Debian's ZooKeeper from its jar (``/usr/share/java/zookeeper.jar``, whose
manifest names its dependencies, as the tests run it) with its data under
``<data-dir>/zookeeper``, then ``oncelog broker`` N times with ``broker.id`` 1..N on
consecutive ports from ``--base-port``, each with its log directory ``<data-dir>/broker-<id>``
and its log file beside it, all under the ZooKeeper chroot ``/oncelog``. It prints the
bootstrap list and waits; Ctrl-C (or SIGTERM) stops the brokers with SIGTERM (each hands its
leaderships over first), then ZooKeeper.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..broker.announce import wait_for_ports

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
CHROOT = "/oncelog"


def _ruok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"ruok")
            return s.recv(4) == b"imok"
    except OSError:
        return False


def _start_zookeeper(data: Path, port: int) -> subprocess.Popen:
    if not ZOOKEEPER_JAR.exists():
        raise SystemExit(f"oncelog cluster up: {ZOOKEEPER_JAR} is missing: install Debian's "
                         f"zookeeper package (make system-deps)")
    java = shutil.which("java")
    if java is None:
        raise SystemExit("oncelog cluster up: no java on PATH (make system-deps)")
    (data / "data").mkdir(parents=True, exist_ok=True)
    cfg = data / "zoo.cfg"
    # ZooKeeper expires a session at the first tick past its timeout: a short tick keeps a
    # dead broker's failover within the timeout + 0.1 s. The default maxSessionTimeout is
    # 20 ticks: raised, or zookeeper.session.timeout.ms would be cut to 2 s behind our back.
    cfg.write_text(f"tickTime=100\nmaxSessionTimeout=60000\ndataDir={data / 'data'}\n"
                   f"clientPort={port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
                   "4lw.commands.whitelist=ruok,srvr\n")
    with open(data / "zookeeper.log", "ab") as log:
        proc = subprocess.Popen(
            [java, "-Xmx128m", "-Dzookeeper.admin.enableServer=false", "-cp",
             str(ZOOKEEPER_JAR), "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _ruok(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"oncelog cluster up: ZooKeeper did not start on port {port}; "
                             f"see {data / 'zookeeper.log'}")
        time.sleep(0.1)
    return proc


def _start_broker(broker_id: int, port: int, data: Path, connect: str,
                  extra: list[str]) -> subprocess.Popen:
    args = [sys.executable, "-m", "oncelog", "broker",
            "--set", f"broker.id={broker_id}",
            "--set", f"listeners=PLAINTEXT://127.0.0.1:{port}",
            "--set", f"log.dirs={data / f'broker-{broker_id}'}",
            "--set", f"zookeeper.connect={connect}"]
    for setting in extra:
        args += ["--set", setting]
    with open(data / f"broker-{broker_id}.log", "ab") as log:
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _stop(procs: list[tuple[str, subprocess.Popen]]) -> None:
    for _, proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for name, proc in procs:
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"{name} did not stop within {STOP_TIMEOUT_S:.0f}s: killed", file=sys.stderr)
            proc.kill()
            proc.wait()


def _cluster_up(args: argparse.Namespace) -> int:
    data = Path(args.data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    zookeeper = _start_zookeeper(data / "zookeeper", args.zookeeper_port)
    connect = f"127.0.0.1:{args.zookeeper_port}{CHROOT}"
    brokers: list[tuple[str, subprocess.Popen]] = []
    stopping = []
    # Ctrl-C is KeyboardInterrupt even when SIGINT came ignored: a process started in the
    # background of a shell script inherits it so, and Python leaves it so (a bench's
    # SIGINT went unheard for minutes).
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: stopping.append(True)),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    try:
        for i in range(1, args.brokers + 1):  # all at once: each takes seconds to import
            brokers.append((f"broker {i}", _start_broker(
                i, args.base_port + i - 1, data, connect, args.set or [])))
        for i, (name, proc) in enumerate(brokers, 1):
            if wait_for_ports(proc, START_TIMEOUT_S) is None:
                raise SystemExit(f"oncelog cluster up: {name} did not start; see "
                                 f"{data / f'broker-{i}.log'}")
        bootstrap = ",".join(f"127.0.0.1:{args.base_port + i}" for i in range(args.brokers))
        print(f"ZooKeeper at {connect} (data in {data})")
        print(f"bootstrap servers: {bootstrap}", flush=True)
        print("Ctrl-C stops them all", flush=True)
        while not stopping:
            for name, proc in brokers:
                if proc.poll() is not None:
                    print(f"{name} exited with status {proc.returncode}", file=sys.stderr)
                    brokers.remove((name, proc))
            if not brokers:
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print("stopping the brokers, then ZooKeeper", flush=True)
        _stop(brokers)
        _stop([("ZooKeeper", zookeeper)])
    return 0


def _cluster_status(args: argparse.Namespace) -> int:
    from ..client.admin.admin import Admin

    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        cluster = admin.describe_cluster()
        metadata = admin.metadata()
    live = {b.node_id for b in cluster.brokers}
    print(f"Cluster ID: {cluster.cluster_id}")
    print(f"Controller: {cluster.controller_id}")
    for b in cluster.brokers:
        print(f"Broker: {b.node_id}\tEndpoint: {b.host}:{b.port}\tRack: {b.rack or '-'}")
    under, offline = [], []
    for name, topic in sorted(metadata.topics.items()):
        for p in topic.partitions:
            if p.leader < 0:
                offline.append((name, p))
            elif len(p.isr) < len(p.replicas) or any(b not in live for b in p.isr):
                under.append((name, p))
    print(f"Under-replicated partitions: {len(under)}")
    for name, p in under:
        print(f"\t{name}-{p.index}\tLeader: {p.leader}\tReplicas: "
              f"{','.join(map(str, p.replicas))}\tIsr: {','.join(map(str, p.isr))}")
    print(f"Offline partitions: {len(offline)}")
    for name, p in offline:
        print(f"\t{name}-{p.index}\tReplicas: {','.join(map(str, p.replicas))}\tIsr: "
              f"{','.join(map(str, p.isr))}")
    return 1 if offline else 0


def _elect_leaders(args: argparse.Namespace) -> int:
    """As kafka-leader-election.sh: each partition elected, or why not."""
    from kio.schema.errors import ErrorCode

    from ..client.admin.admin import Admin

    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        wanted = None
        if args.topic is not None:
            if args.partition is not None:
                wanted = [(args.topic, args.partition)]
            else:
                info = admin.metadata([args.topic]).topics[args.topic]
                wanted = [(args.topic, p.index) for p in info.partitions]
        results = admin.elect_leaders(wanted, 1 if args.election_type == "unclean" else 0)
    failed = 0
    for (topic, partition), error in sorted(results.items()):
        if error is None:
            print(f"Successfully completed leader election ({args.election_type.upper()}) "
                  f"for partition {topic}-{partition}")
        elif error.error == ErrorCode.election_not_needed:
            print(f"Valid replica already elected for partition {topic}-{partition}")
        else:
            failed += 1
            print(f"Error completing leader election for partition {topic}-{partition}: "
                  f"{error}", file=sys.stderr)
    return 1 if failed else 0


def add_cluster_up_commands(csub, with_bootstrap, guarded) -> None:
    up = csub.add_parser(
        "up", help="start ZooKeeper and N brokers on loopback (Ctrl-C stops them)",
        description="A cluster to try: Debian's ZooKeeper and N oncelog brokers on "
                    "127.0.0.1, data under --data-dir.")
    up.add_argument("--brokers", type=int, default=3, help="how many brokers (default 3)")
    up.add_argument("--data-dir", default="./data/cluster",
                    help="where ZooKeeper and the brokers keep their data and logs")
    up.add_argument("--base-port", type=int, default=9092,
                    help="broker i listens on base-port + i - 1 (default 9092)")
    up.add_argument("--zookeeper-port", type=int, default=2181)
    up.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="a broker setting for every broker; may be repeated")
    up.set_defaults(func=_cluster_up)
    status = with_bootstrap(csub.add_parser(
        "status", help="brokers, controller, under-replicated and offline partitions"))
    status.set_defaults(func=guarded(_cluster_status))
    elect = with_bootstrap(csub.add_parser(
        "elect-leaders", help="preferred or unclean leader election (kafka-leader-election.sh)",
        description="Asks the controller to elect each partition's preferred replica (or, "
                    "unclean, any live replica of a partition without a leader)."))
    elect.add_argument("--election-type", choices=("preferred", "unclean"),
                       default="preferred")
    elect.add_argument("--topic", help="only this topic (default: every partition)")
    elect.add_argument("--partition", type=int, help="only this partition of --topic")
    elect.set_defaults(func=guarded(_elect_leaders))
