"""ZooKeeperStore: the MetadataStore interface on a real ZooKeeper, for cluster mode.

A store path ``a/b`` is the znode ``/a/b`` under the chroot of ``zookeeper.connect``
(``host:port[,host:port...][/chroot]``, Kafka's syntax); values are JSON, as Kafka keeps its
znodes; a znode's version is the store's version (both start at 0 when created), so the
conditional writes the single broker makes on its local file store (the producer-id block
claim of ``latest_producer_id_block`` first) are ZooKeeper's own versioned ``setData`` and
``create`` here. ``children`` lists direct children only (ZooKeeper's meaning; the store's
callers keep one level under a prefix, where both stores agree).

The ZooKeeper session is owned here: connecting is bounded by
``zookeeper.connection.timeout.ms`` (``ZooKeeperUnreachable`` after it, never a hang), the
session timeout asked for is ``zookeeper.session.timeout.ms``, and kazoo reconnects after a
lost session by itself. The server clamps the timeout to its ``minSessionTimeout`` ..
``maxSessionTimeout``; ``session_timeout_ms`` is what it negotiated, which everything timed by
the session follows (a fence timed by a longer one than ZooKeeper enforces comes after the
session is gone); what must be redone on a new session (ephemeral znodes) is the cluster
package's business, told through ``add_session_listener``.

kazoo is imported on first use: a broker without ``zookeeper.connect`` (``make run``) does
not need it installed (it is the ``cluster`` extra).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .store import NO_VERSION, BadVersion, MetadataUnavailable

if TYPE_CHECKING:
    from kazoo.client import KazooClient

log = logging.getLogger(__name__)

# One host:port, a comma-separated list of them, then an optional chroot of path segments.
_CONNECT = re.compile(r"(?P<hosts>[^,/:\s]+:\d{1,5}(?:,[^,/:\s]+:\d{1,5})*)"
                      r"(?P<chroot>(?:/[^/\s]+)*)/?")


_RECONNECT_MAX_DELAY_S = 1.0


_NEGOTIATED = re.compile(r"negotiated session timeout: (\d+)")


class _SessionLog(logging.LoggerAdapter):
    """kazoo's logger, given to it so that the store learns the negotiated session timeout:
    kazoo keeps it in no attribute and only logs it (at its BLATHER level) when a session is
    created or resumed."""

    def __init__(self, negotiated: Callable[[int], None]) -> None:
        super().__init__(logging.getLogger("kazoo.client"), {})
        self._negotiated = negotiated

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(msg, str) and msg.startswith("Session created"):
            try:
                found = _NEGOTIATED.search(msg % args)
            except (TypeError, ValueError):
                found = None
            if found:
                self._negotiated(int(found.group(1)))
        super().log(level, msg, *args, **kwargs)


class ZooKeeperUnreachable(Exception):
    """No ZooKeeper server answered within zookeeper.connection.timeout.ms."""


def parse_connect(text: str) -> tuple[str, str]:
    """``zookeeper.connect`` -> (``host:port,...``, chroot or ""); ValueError when malformed."""
    m = _CONNECT.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"expected host:port[,host:port...][/chroot], got {text!r}")
    for hostport in m.group("hosts").split(","):
        port = int(hostport.rsplit(":", 1)[1])
        if not 0 < port < 65536:
            raise ValueError(f"port {port} of {hostport!r} is outside 1..65535")
    return m.group("hosts"), m.group("chroot")


def _znode(path: str) -> str:
    return "/" + path.strip("/")


class ZooKeeperStore:
    def __init__(self, connect: str, session_timeout_ms: int,
                 connection_timeout_ms: int | None = None) -> None:
        from kazoo.client import KazooClient
        from kazoo.handlers.threading import KazooTimeoutError
        from kazoo.retry import KazooRetry

        hosts, chroot = parse_connect(connect)
        self.connect = connect
        self.requested_session_timeout_ms = session_timeout_ms
        self.session_timeout_ms = session_timeout_ms  # until the server negotiates
        timeout_s = (connection_timeout_ms or session_timeout_ms) / 1000
        # Without the chroot first: Kafka creates a missing chroot, and kazoo cannot create
        # the node it is rooted at.
        # Reconnecting never gives up, and backs off to at most a second (kazoo's default
        # grows to an hour: a broker would stay out of its cluster long after ZooKeeper is
        # back).
        self.client: KazooClient = KazooClient(
            hosts=hosts, timeout=session_timeout_ms / 1000, logger=_SessionLog(self._negotiated),
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2,
                                        max_delay=_RECONNECT_MAX_DELAY_S))
        self._listeners: list[Callable[[str], None]] = []
        self.client.add_listener(self._on_state)
        # Monotonic send time of the latest request ZooKeeper answered (``heard``): the
        # server cannot expire the session before a full session timeout after it.
        self.heard_at = time.monotonic()
        try:
            self.client.start(timeout=timeout_s)
        except KazooTimeoutError:
            self._close_client()
            raise ZooKeeperUnreachable(
                f"no ZooKeeper server at {hosts} answered within {timeout_s:g}s "
                f"(zookeeper.connect={connect})") from None
        if chroot:
            self.client.ensure_path(chroot)
            self.client.chroot = chroot
        log.info("connected to ZooKeeper at %s (session 0x%x, timeout %d ms)", connect,
                 self.client.client_id[0], self.session_timeout_ms)

    # --- the MetadataStore interface ---------------------------------------------------

    def get(self, path: str) -> tuple[Any, int]:
        from kazoo.exceptions import NoNodeError

        try:
            data, stat = self.op(self.client.get_async, _znode(path))
        except NoNodeError:
            return None, NO_VERSION
        return (json.loads(data) if data else None), stat.version

    def compare_and_set(self, path: str, value: Any, expected_version: int) -> int:
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

        data = json.dumps(value, separators=(",", ":")).encode()
        node = _znode(path)
        if expected_version == NO_VERSION:
            try:
                self.op(self.client.create_async, node, data, makepath=True)
            except NodeExistsError:
                raise BadVersion(f"{path}: exists, expected it not to") from None
            return 0
        try:
            stat = self.op(self.client.set_async, node, data, version=expected_version)
        except (BadVersionError, NoNodeError):
            raise BadVersion(f"{path}: not at version {expected_version}") from None
        return stat.version

    def delete(self, path: str, expected_version: int | None = None) -> None:
        from kazoo.exceptions import BadVersionError, NoNodeError

        try:
            self.op(self.client.delete_async, _znode(path),
                    version=-1 if expected_version is None else expected_version)
        except NoNodeError:
            if expected_version not in (None, NO_VERSION):
                raise BadVersion(f"{path}: gone, expected version {expected_version}") from None
        except BadVersionError:
            raise BadVersion(f"{path}: not at version {expected_version}") from None

    def children(self, prefix: str) -> list[str]:
        from kazoo.exceptions import NoNodeError

        try:
            return sorted(self.op(self.client.get_children_async, _znode(prefix)))
        except NoNodeError:
            return []

    def create_sequential(self, prefix: str, value: Any) -> str:
        """A new persistent sequential znode ``<prefix><10 digits>`` (Kafka's change
        notifications, ``/config/changes/config_change_``); returns its path."""
        data = json.dumps(value, separators=(",", ":")).encode()
        return self.op(self.client.create_async, _znode(prefix), data, sequence=True,
                       makepath=True)

    def op(self, call_async: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One ZooKeeper operation (a kazoo ``*_async`` method), answered within the session
        timeout or MetadataUnavailable: kazoo itself would hold a request made while it is
        disconnected until it reconnects, however long ZooKeeper is away."""
        if not self.connected:
            raise MetadataUnavailable(f"not connected to ZooKeeper at {self.connect}")
        sent = time.monotonic()
        try:
            result = call_async(*args, **kwargs).get(timeout=self.session_timeout_ms / 1000)
            self.heard(sent)
            return result
        except self.client.handler.timeout_exception:
            raise MetadataUnavailable(f"ZooKeeper at {self.connect} did not answer within "
                                      f"{self.session_timeout_ms} ms") from None

    # --- the session -------------------------------------------------------------------

    def _negotiated(self, timeout_ms: int) -> None:
        """On kazoo's thread, at each session created or resumed."""
        if timeout_ms <= 0 or timeout_ms == self.session_timeout_ms:
            return
        self.session_timeout_ms = timeout_ms
        if timeout_ms != self.requested_session_timeout_ms:
            log.warning("ZooKeeper at %s negotiated a session timeout of %d ms, not the %d ms "
                        "of zookeeper.session.timeout.ms (its minSessionTimeout and "
                        "maxSessionTimeout bound it): the broker's fence and heartbeats follow "
                        "%d ms", self.connect, timeout_ms, self.requested_session_timeout_ms,
                        timeout_ms)

    @property
    def connected(self) -> bool:
        """Whether the session has a connection to a server now (kazoo reconnects by itself;
        a request meanwhile is refused, ``op``)."""
        return bool(self.client.connected)

    def heard(self, sent: float) -> None:
        """A request sent at ``sent`` (time.monotonic) was answered: ZooKeeper heard from
        this session no earlier than then."""
        if sent > self.heard_at:
            self.heard_at = sent

    def add_session_listener(self, listener: Callable[[str], None]) -> None:
        """``listener(state)`` on each change: "LOST" (the session expired: its ephemeral
        znodes are gone), "SUSPENDED" (disconnected, the session may live on), "CONNECTED".
        Called on kazoo's thread: it must not block."""
        self._listeners.append(listener)

    def _on_state(self, state: str) -> None:
        log.info("ZooKeeper session state: %s", state)
        for listener in self._listeners:
            try:
                listener(str(state))
            except Exception:
                log.exception("ZooKeeper session listener failed")

    def _close_client(self) -> None:
        try:
            self.client.stop()
        finally:
            self.client.close()

    def close(self) -> None:
        """Ends the session: its ephemeral znodes go at once, not after the timeout."""
        self._close_client()
