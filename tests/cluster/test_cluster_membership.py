"""Cluster mode on a real ZooKeeper (cluster/): broker processes register under
/brokers/ids with Kafka's JSON, one is elected controller with a raised /controller_epoch, a
controller killed with SIGKILL or cut off past its session timeout is replaced by the other
broker at a higher epoch, a broker whose session expired registers again, and producer ids
handed out by two brokers never collide (their blocks come from one ZooKeeper node)."""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import time

import pytest
from kazoo.exceptions import NoNodeError
from kio.schema.errors import ErrorCode
from support.audit_helpers import init_producer_id
from support.broker_forks import run_oncelog
from support.waits import wait_for
from support.zookeepers import observer

from oncelog.client.network.connection import connect
from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build

SESSION_MS = 2000  # the server's tick (tests/support/zookeepers.py) allows sessions this short
# A dead broker's session ends SESSION_MS after its last heartbeat; the survivor then needs a
# watch event and one transaction: bounded well inside this.
TAKEOVER_TIMEOUT = SESSION_MS / 1000 + 8
TIMEOUT = 30.0


@pytest.fixture
def cluster(zookeeper, start_broker):
    """start(broker_id) -> a broker of one fresh cluster (its own chroot); ``zk`` watches it."""
    connect_string = zookeeper.chroot("cluster")
    chroot = connect_string[len(zookeeper.connect):]
    zk = observer(zookeeper.connect, chroot)

    def start(broker_id: int, **settings: str):
        return start_broker(**{"broker.id": str(broker_id), "broker.rack": f"rack-{broker_id}",
                               "zookeeper.connect": connect_string,
                               "zookeeper.session.timeout.ms": str(SESSION_MS), **settings})

    start.zk = zk
    start.connect = connect_string
    yield start
    zk.stop()
    zk.close()


def zget(zk, path: str):
    """A read that gives up after a second (kazoo holds a request while it reconnects)."""
    return zk.get_async(path).get(timeout=1.0)


def controller(zk) -> tuple[int, int] | None:
    """(controller broker id, controller epoch) as ZooKeeper holds them; None when there is
    no controller or the two reads straddle an election (a controller and its epoch are
    written by one transaction: the same zxid)."""
    try:
        data, controller_stat = zget(zk, "/controller")
        epoch, epoch_stat = zget(zk, "/controller_epoch")
    except (NoNodeError, zk.handler.timeout_exception):
        return None
    if controller_stat.czxid != epoch_stat.mzxid:
        return None
    value = json.loads(data)
    assert value["version"] == 1 and set(value) == {"version", "brokerid", "timestamp"}
    return value["brokerid"], int(epoch)


def registered(zk, broker_id: int) -> dict | None:
    try:
        data, stat = zget(zk, f"/brokers/ids/{broker_id}")
    except (NoNodeError, zk.handler.timeout_exception):
        return None
    assert stat.ephemeralOwner != 0  # ephemeral: gone with the broker's session
    return json.loads(data)


def metadata(broker):
    """Metadata as librdkafka (a client we did not write) reads it."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    return admin.list_topics(timeout=TIMEOUT)


def cluster_view(broker) -> tuple[dict[int, tuple[str, int, str | None]], int] | None:
    """{id: (host, port, rack)} and the controller id, as Metadata and DescribeCluster both
    answer them (librdkafka's admin client); None while the two answers differ."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    answer = admin.list_topics(timeout=TIMEOUT)
    described = admin.describe_cluster(request_timeout=TIMEOUT).result(TIMEOUT)
    nodes = {n.id: (n.host, n.port, n.rack) for n in described.nodes}
    if {i: (b.host, b.port) for i, b in answer.brokers.items()} != \
            {i: (host, port) for i, (host, port, _) in nodes.items()}:
        return None
    if answer.controller_id != described.controller.id:
        return None
    return nodes, answer.controller_id


def test_registration_controller_failover_and_producer_ids(cluster):
    one, two = cluster(1), cluster(2)
    zk = cluster.zk
    for broker_id, broker in ((1, one), (2, two)):
        value = registered(zk, broker_id)
        assert value == {**value, "version": 5, "host": "127.0.0.1", "port": broker.port,
                         "endpoints": [f"PLAINTEXT://127.0.0.1:{broker.port}"],
                         "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
                         "rack": f"rack-{broker_id}", "jmx_port": -1, "features": {}}
        assert int(value["timestamp"]) > 0
    assert sorted(zk.get_children("/brokers/ids")) == ["1", "2"]
    first, epoch = wait_for(lambda: controller(zk), TIMEOUT, "a controller")
    assert first in (1, 2) and epoch == 1  # the first controller of a new cluster
    expected = {1: ("127.0.0.1", one.port, "rack-1"), 2: ("127.0.0.1", two.port, "rack-2")}
    for broker in (one, two):  # each answers for the whole cluster, as one cluster
        wait_for(lambda b=broker: cluster_view(b) == (expected, first), TIMEOUT,
                 f"{broker.port}: Metadata and DescribeCluster naming both brokers")
    assert len({metadata(b).cluster_id for b in (one, two)}) == 1

    # Producer ids from both brokers: blocks claimed in one ZooKeeper node never overlap.
    pids = []
    for broker in (one, two, one, two):
        with connect(broker.bootstrap, timeout=TIMEOUT) as conn:
            pids.append(init_producer_id(conn))
    assert len(set(pids)) == 4
    block, _ = zk.get("/latest_producer_id_block")
    assert json.loads(block)["version"] == 1

    dead, survivor = (one, two) if first == 1 else (two, one)
    survivor_id = 3 - first
    killed_at = time.monotonic()
    dead.kill()
    _, new_epoch = wait_for(
        lambda: (c := controller(zk)) is not None and c[0] == survivor_id and c,
        TAKEOVER_TIMEOUT, f"broker {survivor_id} taking over as controller")
    took = time.monotonic() - killed_at
    print(f"controller takeover {took:.2f}s after kill -9 (session timeout {SESSION_MS} ms)")
    assert new_epoch == epoch + 1
    assert registered(zk, first) is None  # the dead broker's registration went with it
    del expected[first]
    wait_for(lambda: cluster_view(survivor) == (expected, survivor_id), TIMEOUT,
             "the survivor naming itself alone, and itself as controller")
    with connect(survivor.bootstrap, timeout=TIMEOUT) as conn:
        assert init_producer_id(conn) not in pids


def test_expired_session_registers_again_and_follows(cluster):
    """SIGSTOP past the session timeout: ZooKeeper expires the session (the registration and
    /controller go), the other broker takes over at a higher epoch; after SIGCONT the broker
    registers again on a new session and does not claim the controller back."""
    one = cluster(1)
    zk = cluster.zk
    assert wait_for(lambda: controller(zk), TIMEOUT, "broker 1 controller") == (1, 1)
    two = cluster(2)
    old_owner = zk.exists("/brokers/ids/1").ephemeralOwner
    os.kill(one.proc.pid, signal.SIGSTOP)
    try:
        assert wait_for(lambda: controller(zk) == (2, 2) and controller(zk),
                        TAKEOVER_TIMEOUT, "broker 2 taking over")
        assert registered(zk, 1) is None
    finally:
        os.kill(one.proc.pid, signal.SIGCONT)
    wait_for(lambda: registered(zk, 1), TIMEOUT, "broker 1 registered again")
    assert zk.exists("/brokers/ids/1").ephemeralOwner != old_owner
    assert registered(zk, 1)["port"] == one.port
    assert controller(zk) == (2, 2)
    assert two.alive and one.alive


def _broker_exit(tmp_path, *settings: str) -> subprocess.CompletedProcess:
    args = ["broker", "--set", f"log.dirs={tmp_path}/data",
            "--set", "listeners=PLAINTEXT://127.0.0.1:0"]
    for setting in settings:
        args += ["--set", setting]
    return run_oncelog(*args, timeout=TIMEOUT)


def test_unreachable_zookeeper_exits_with_a_clear_error(tmp_path):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        done = _broker_exit(tmp_path, f"zookeeper.connect=127.0.0.1:{port}",
                            "zookeeper.connection.timeout.ms=500")
    assert done.returncode == 3, done.stderr
    assert f"no ZooKeeper server at 127.0.0.1:{port} answered within 0.5s" in done.stderr
    assert "Traceback" not in done.stderr


def test_broker_id_taken_exits_with_a_clear_error(cluster, tmp_path):
    cluster(7)
    done = _broker_exit(tmp_path, "broker.id=7", f"zookeeper.connect={cluster.connect}",
                        "zookeeper.session.timeout.ms=1000")  # waits this long, then gives up
    assert done.returncode == 3, done.stderr
    assert "broker.id 7 is registered in ZooKeeper by another session" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_internal_topic_count_not_to_be_read_exits_with_a_clear_error(cluster, tmp_path):
    """__consumer_offsets exists in ZooKeeper, but neither its assignment (not Kafka's JSON)
    nor its partitions' znodes (none) tell its partition count: the broker does not guess it
    (its group coordinator would map group ids unlike its peers') and, after reading again for
    zookeeper.connection.timeout.ms, exits saying why. Before, it waited for ever."""
    cluster.zk.create("/brokers/topics/__consumer_offsets", b"\xff{", makepath=True)
    done = _broker_exit(tmp_path, "broker.id=8", f"zookeeper.connect={cluster.connect}",
                        "zookeeper.connection.timeout.ms=1500")
    assert done.returncode == 3, done.stderr
    assert "the partition count of internal topic __consumer_offsets could not be read from " \
           "ZooKeeper within 1.5s" in done.stderr
    assert "Traceback" not in done.stderr


def init_producer_id_error(conn) -> ErrorCode:
    def make(mod, version):
        return build(mod.InitProducerIdRequest, transactional_id=None,
                     transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1,
                     producer_epoch=-1)

    return conn.call(apis.INIT_PRODUCER_ID, make).error_code


def test_zookeeper_restarted_the_broker_comes_back(start_broker):
    """ZooKeeper (a server of this test's own) killed and restarted on its port and data:
    the broker reconnects (to its own session, which the server kept, or to a new one after
    being told it expired), is registered and controller, and claims producer ids again."""
    from support.zookeepers import ZooKeeperServer

    server = ZooKeeperServer().start()
    zk = None
    try:
        connect_string = server.chroot("restart")
        broker = start_broker(**{"broker.id": "1", "zookeeper.connect": connect_string,
                                 "zookeeper.session.timeout.ms": str(SESSION_MS)})
        server.stop()
        # A producer id needs a block from ZooKeeper: while it is away the answer is a
        # retriable error at once, never a broker stuck waiting for ZooKeeper.
        with connect(broker.bootstrap, timeout=TIMEOUT) as conn:
            assert wait_for(lambda: init_producer_id_error(conn) ==
                            ErrorCode.coordinator_load_in_progress, TIMEOUT,
                            "InitProducerId answering COORDINATOR_LOAD_IN_PROGRESS")
        server.restart()
        wait_for(lambda: broker.log_text().count("ZooKeeper session state: CONNECTED") >= 2,
                 TIMEOUT, "the broker connected to the restarted ZooKeeper")
        zk = observer(connect_string)
        view = wait_for(lambda: controller(zk), TAKEOVER_TIMEOUT, "a controller")
        assert view in ((1, 1), (1, 2))  # the same session, or broker 1 again on a new one
        assert registered(zk, 1)["port"] == broker.port
        with connect(broker.bootstrap, timeout=TIMEOUT) as conn:
            assert init_producer_id(conn) >= 0
        broker.stop()
    finally:
        if zk is not None:
            zk.stop()
            zk.close()
        server.close()


def test_a_clean_stop_does_not_say_its_session_expired(cluster):
    """Closing its own ZooKeeper session at a stop is not an expiry: before, every clean
    stop logged a WARNING "session ... expired: re-registering"."""
    broker = cluster(11)
    assert broker.stop() == 0
    text = broker.log_text()
    assert "stopped cleanly" in text and "ZooKeeper session of broker 11 closed" in text
    assert "expired" not in text, text
