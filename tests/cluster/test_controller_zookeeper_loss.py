"""The controller's reads cut short by a lost ZooKeeper connection (found by
test_txn_workload.py, seed 4: the controller's broker cut off from ZooKeeper mid-pass logged
"controller pass failed" with kazoo's ConnectionLoss and a traceback, where every other pass
says "cut short by ZooKeeper"): a read in flight when the connection drops is
MetadataUnavailable, as one ZooKeeper does not answer in time already is."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from support.waits import wait_for
from support.zookeepers import ZooKeeperServer

from oncelog.cluster.controller import Controller
from oncelog.cluster.membership import ClusterMember
from oncelog.metadata.store import MetadataUnavailable
from oncelog.metadata.zookeeper import ZooKeeperStore

pytestmark = pytest.mark.xdist_group("zookeeper")

SESSION_MS = 10_000  # kazoo does not give up on a silent server before the test kills it


def test_a_read_in_flight_when_the_connection_drops_is_metadata_unavailable():
    server = ZooKeeperServer().start()  # of its own: it is stopped and killed
    store = ZooKeeperStore(server.chroot("controller-loss"), SESSION_MS)
    try:
        controller = Controller(ClusterMember(store, 1, None), lambda: False)
        assert controller.read_topics(["absent"]) == []
        os.killpg(server.proc.pid, signal.SIGSTOP)  # the reads below go unanswered
        raised: list[BaseException] = []

        def read() -> None:
            try:
                controller.read_topics(["absent"])
            except BaseException as exc:
                raised.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        # kazoo's requests sent and not answered yet: what it fails when the connection drops
        wait_for(lambda: len(store.client._pending) > 0, 5, "the read sent, unanswered")
        server.stop()  # SIGKILL: the connection drops under the read
        reader.join(SESSION_MS / 1000 + 5)
        assert not reader.is_alive()
        assert len(raised) == 1 and isinstance(raised[0], MetadataUnavailable), raised
    finally:
        store.close()
        server.close()
