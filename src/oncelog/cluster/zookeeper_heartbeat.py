"""ZooKeeperHeartbeat: a cheap request to ZooKeeper every tenth of the session timeout, so
the broker knows when ZooKeeper last heard from it (membership.py's standing table, V3).

kazoo's own pings are not enough: kazoo declares a connection lost only after a ping goes
unanswered for about two thirds of the session timeout, and tells nobody when the last
answer came. The heartbeat is an ``exists`` of the root, sent without waiting for it: its
answer records its send time (``ZooKeeperStore.heard``): the server heard from the session
no earlier than then, so it cannot expire it before a session timeout after that. One is
outstanding at most (a request kazoo holds on a dead connection is answered or failed when
it reconnects or the session ends; a new one goes after a session timeout anyway), so a
long outage queues nothing.

Must not know: partitions, the broker's loop.
"""

from __future__ import annotations

import logging
import threading
import time

from ..metadata.zookeeper import ZooKeeperStore

log = logging.getLogger(__name__)

# Sent every this fraction of the session timeout: a broker that ZooKeeper answers stays
# within V1/V2 (silent at most half the session timeout) with four heartbeats to spare.
HEARTBEAT_FRACTION = 0.1


class ZooKeeperHeartbeat:
    def __init__(self, store: ZooKeeperStore) -> None:
        self.store = store
        self._outstanding_since: float | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="zookeeper-heartbeat",
                                            daemon=True)
            self._thread.start()

    @property
    def interval_s(self) -> float:
        """Follows the negotiated session timeout, which a new session may change."""
        return self.store.session_timeout_ms * HEARTBEAT_FRACTION / 1000

    def close(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):  # close() ends the wait at once
            self.beat()

    def beat(self) -> None:
        now = time.monotonic()
        since = self._outstanding_since
        if since is not None and now - since < self.store.session_timeout_ms / 1000:
            return
        if not self.store.client.connected:
            return  # kazoo would hold it until reconnected; the next beat after that goes
        self._outstanding_since = now
        try:
            answer = self.store.client.exists_async("/")
        except Exception as exc:  # closing, or the connection going as we send
            self._outstanding_since = None
            log.debug("ZooKeeper heartbeat not sent: %r", exc)
            return
        answer.rawlink(lambda result: self._answered(result, now))

    def _answered(self, result, sent: float) -> None:
        """On kazoo's thread."""
        if self._outstanding_since == sent:
            self._outstanding_since = None
        if result.successful():
            self.store.heard(sent)
