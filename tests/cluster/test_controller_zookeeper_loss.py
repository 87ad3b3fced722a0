"""ZooKeeper requests in flight when the connection drops (kazoo fails them with
ConnectionLoss), found by test_txn_workload.py:

- seed 4: the controller's broker cut off from ZooKeeper mid-pass logged "controller pass
  failed" with a traceback, where every other pass says "cut short by ZooKeeper": the
  controller's read is MetadataUnavailable, as one ZooKeeper does not answer in time is;
- seed 7: a leader's ISR write (or its change notification after it) raised ConnectionLoss
  out of ReplicaWatch.write_isrs: it answers None (not written, or not known to be; the
  leader counts the ISR asked for until it reads the state, test_leader_high_watermark)."""

from __future__ import annotations

import threading

from support.sigstop import sigstop
from support.waits import wait_for
from support.zookeepers import ZooKeeperServer

from oncelog.cluster import znodes as zn
from oncelog.cluster.controller import Controller
from oncelog.cluster.membership import ClusterMember
from oncelog.cluster.replica_watch import IsrWrite, ReplicaWatch
from oncelog.metadata.store import MetadataUnavailable
from oncelog.metadata.zookeeper import ZooKeeperStore

SESSION_MS = 10_000  # kazoo does not give up on a silent server before the test kills it


def dropped_under(call) -> list:
    """``call(store)`` on a ZooKeeper of its own, stopped before and killed once the
    request is sent: what it returned or raised."""
    server = ZooKeeperServer().start()  # of its own: it is stopped and killed
    store = ZooKeeperStore(server.chroot("connection-loss"), SESSION_MS)
    try:
        prepared = call(store)
        # What it sends goes unanswered: the server's every thread is stopped, not only
        # signalled (a server still answering the request sent was this test's flake).
        sigstop(server.proc.pid, group=True)
        outcome: list = []

        def run() -> None:
            try:
                outcome.append(prepared())
            except BaseException as exc:
                outcome.append(exc)

        caller = threading.Thread(target=run)
        caller.start()
        # kazoo's requests sent and not answered yet: what it fails when the connection drops
        wait_for(lambda: len(store.client._pending) > 0, 5, "the request sent, unanswered")
        server.stop()  # SIGKILL: the connection drops under the request
        caller.join(SESSION_MS / 1000 + 5)
        assert not caller.is_alive()
        return outcome
    finally:
        store.close()
        server.close()


def test_a_controller_read_in_flight_when_the_connection_drops_is_metadata_unavailable():
    def read(store):
        controller = Controller(ClusterMember(store, 1, None), lambda: False)
        assert controller.read_topics(["absent"]) == []
        return lambda: controller.read_topics(["absent"])

    outcome = dropped_under(read)
    assert len(outcome) == 1 and isinstance(outcome[0], MetadataUnavailable), outcome


def test_an_isr_write_in_flight_when_the_connection_drops_answers_none():
    def write(store):
        watch = ReplicaWatch(store, 1, lambda view: None)
        path = zn.partition_state_path("t", 0)
        store.client.create(path, zn.PartitionState(1, 0, (1, 2), 0).encode(), makepath=True)
        wanted = zn.PartitionState(1, 0, (1, 2, 3), 0)
        return lambda: watch.write_isrs([IsrWrite("t", 0, wanted, 0)])

    assert dropped_under(write) == [[None]]
