"""ClusterMember: this broker's registration and its part in the controller election.

Registration, decided by ``registration_step`` (the znode ``/brokers/ids/<broker.id>`` as
found, against this broker's ZooKeeper session):

| row | /brokers/ids/<id>                        | action                                   |
|-----|------------------------------------------|------------------------------------------|
| R1  | absent                                   | CREATE it, ephemeral, with our JSON      |
| R2  | present, owned by our session            | REGISTERED: nothing to do                |
| R3  | present, owned by another session        | WAIT for it to vanish (a killed earlier  |
|     |                                          | run of this broker: its session expires  |
|     |                                          | within the session timeout); still there |
|     |                                          | after that at start: broker.id is taken, |
|     |                                          | ClusterStartError                        |

Controller election, decided by ``election_step`` (``/controller`` as found):

| row | /controller                              | action                                   |
|-----|------------------------------------------|------------------------------------------|
| E1  | absent                                   | CLAIM: in one ZooKeeper transaction,     |
|     |                                          | create /controller (ephemeral) and set   |
|     |                                          | /controller_epoch to E+1 at the version  |
|     |                                          | it was read at E; success: controller    |
|     |                                          | with epoch E+1; either op failing:       |
|     |                                          | another broker won, read again           |
| E2  | names us, owned by our session           | CONTROLLER (the epoch our claim wrote)   |
| E3  | owned by another session (another broker,| FOLLOW: note who and the epoch, watch    |
|     | or an earlier session of ours)           | /controller and claim when it is deleted |

Standing, decided by ``standing_step``: whether this broker may vouch for what it last read
from ZooKeeper, above all that it leads a partition (cluster/isr.py's B0 and B7 act on it; so
does Metadata, broker/cluster_mode.py):

| row | session                                  | standing                                 |
|-----|------------------------------------------|------------------------------------------|
| V1  | connected, /brokers/ids/<id> created or  | VOUCH                                    |
|     | found ours by the current session (R1/R2)|                                          |
|     | and ZooKeeper answered a request sent at |                                          |
|     | most half zookeeper.session.timeout.ms   |                                          |
|     | ago                                      |                                          |
| V2  | as V1, disconnected (kazoo noticed)      | VOUCH: the session lives at least until  |
|     |                                          | a session timeout after that request,    |
|     |                                          | and no other leader is elected before    |
| V3  | registered, but no request sent within   | FENCED: ZooKeeper may expire the session |
|     | the last half session timeout answered,  | at a full session timeout after it last  |
|     | connected as kazoo believes or not       | heard from us, and the controller then   |
|     |                                          | moves its leaderships; we stop first     |
| V4  | expired ("LOST"), or a session not       | FENCED until R1 registers it (and the    |
|     | registered yet                           | replica manager reads the states again)  |

V3 counts from the send time of the latest request ZooKeeper answered (a heartbeat every
tenth of the session timeout, cluster/zookeeper_heartbeat.py, and every other request), not
from the moment kazoo notices a lost connection: that comes only after a ping has gone
unanswered for about two thirds of the session timeout, and fencing a session timeout after
it would leave an old leader answering acks=1 produce and fetches long after the controller
elected a new one (as a ZooKeeper-mode Kafka broker does). The server cannot expire the
session before it has been silent for its session timeout, which starts no earlier than that
send time, so half of it leaves the other half for a request that passed the check to
finish, and for the fence to reach every partition on the event loop. (kazoo does not say
which timeout the server negotiated: a zookeeper.session.timeout.ms above the server's
maxSessionTimeout is cut to it there, and the half counted here may then be too long.)
The price: a broker cannot tell ZooKeeper away from being cut off from it, so while ZooKeeper
itself is down (restarted) for more than half the session timeout every broker fences, and
leads again once its heartbeat is answered (B7), where V2 used to let them go on for the
whole timeout; no session expires while the server is down, but none of them can know that.

Kafka in ZooKeeper mode keeps acting on its last picture in V3 and V4: a producer that still
reaches the broker stalls on its partitions until the partition heals. Here a fenced broker
refuses Produce and Fetch for them (NOT_LEADER_OR_FOLLOWER) and answers Metadata by closing
the connection (broker/apis/api_meta.py): librdkafka asks Metadata only of the brokers it is
connected to, and would ask an answer naming no leader (LEADER_NOT_AVAILABLE) again of the
same broker until it heals; with the connection gone it connects to another broker (one
it never connected to first) and learns the new leader there.

The epoch write in E1 is conditional on the version read, so two brokers that both saw
/controller absent cannot both raise the epoch: exactly one transaction commits, and every
controller's epoch is higher than any before it. That is the fence for a deposed controller's
later writes: ``controller_transaction`` checks /controller_epoch at the version its own claim
left in the same ZooKeeper transaction as the writes.

The work runs on one thread, woken by a watch on /controller, by a new session (after "LOST"
the ephemeral znodes are gone: R1 and E1 again), and at least every third of the session
timeout; every ZooKeeper call in it is bounded by kazoo's session timeout. The same passes
keep the list of registered brokers (a watch on /brokers/ids) for Metadata.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import TransactionRequest
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.protocol.states import KazooState

from ..metadata.store import MetadataUnavailable
from ..metadata.zookeeper import ZooKeeperStore, ZooKeeperUnreachable
from . import ClusterStartError
from . import znodes as zn
from .wakeups import woken
from .zookeeper_heartbeat import ZooKeeperHeartbeat

log = logging.getLogger(__name__)

NO_CONTROLLER = -1


class ControllerMoved(Exception):
    """A write as controller refused: this broker is not the controller, or another broker
    has been elected since (the controller epoch moved on): Kafka's ControllerMovedException.
    """


class Registration(enum.Enum):
    CREATE = "R1"
    REGISTERED = "R2"
    WAIT = "R3"


class Election(enum.Enum):
    CLAIM = "E1"
    CONTROLLER = "E2"
    FOLLOW = "E3"


def registration_step(owner_session: int | None, our_session: int) -> Registration:
    """``owner_session``: the ephemeral owner of /brokers/ids/<id>, None when absent."""
    if owner_session is None:
        return Registration.CREATE
    if owner_session == our_session:
        return Registration.REGISTERED
    return Registration.WAIT


def election_step(controller: int | None, owner_session: int | None, our_id: int,
                  our_session: int) -> Election:
    """``controller``: the broker /controller names, None when absent."""
    if controller is None:
        return Election.CLAIM
    if controller == our_id and owner_session == our_session:
        return Election.CONTROLLER
    return Election.FOLLOW


class Standing(enum.Enum):
    VOUCH = "V1/V2"
    FENCED = "V3/V4"


# V3: the share of the session timeout this broker may go unanswered and still vouch
SILENCE_FRACTION = 0.5


def standing_step(registered_session: int | None, our_session: int | None,
                  silent_ms: int, session_timeout_ms: int) -> Standing:
    """``registered_session``: the session that last registered us (R1/R2), None after
    "LOST"; ``our_session``: the client's session (None while disconnected: kazoo names
    none then); ``silent_ms``: how long ago the latest request ZooKeeper answered was sent."""
    if registered_session is None or our_session not in (None, registered_session):
        return Standing.FENCED  # V4
    if silent_ms > session_timeout_ms * SILENCE_FRACTION:
        return Standing.FENCED  # V3
    return Standing.VOUCH  # V1, V2


@dataclass(frozen=True, slots=True)
class ControllerView:
    controller_id: int
    epoch: int


class ClusterMember:
    def __init__(self, store: ZooKeeperStore, broker_id: int, rack: str | None) -> None:
        self.store = store
        self.zk = store.client
        self.broker_id = broker_id
        self.rack = rack
        self.registration: zn.BrokerRegistration | None = None
        self._view = ControllerView(NO_CONTROLLER, zn.INITIAL_CONTROLLER_EPOCH)
        self._brokers: tuple[zn.BrokerRegistration, ...] = ()
        # The brokers seen in controlled shutdown (/oncelog/controlled_shutdown/<id>, made
        # before their leaderships move, gone with their session) at the last read, and
        # those that left /brokers/ids from there: stopped cleanly (departed_brokers.py).
        self._stopping: frozenset[int] = frozenset()
        self._left_cleanly: frozenset[int] = frozenset()
        self._epoch_version = -1  # of /controller_epoch, as our winning claim left it
        self._registered_session: int | None = None  # the session R1/R2 last found ours
        self.heartbeat = ZooKeeperHeartbeat(store)  # V3 counts from its answers
        # Told (on this member's thread) when a session registered us (R1): the replica
        # manager reads the partition states again, and may vouch for them (B7).
        self.on_registered: Callable[[], None] | None = None
        # Told (on this member's thread) when the registered brokers changed: Metadata's
        # departed brokers are decided on the leaders of that moment (departed_brokers.py).
        self.on_brokers_changed: Callable[[], None] | None = None
        self._recheck_s = store.session_timeout_ms / 3000
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        # Told (on this member's thread) when this broker has just won the controller
        # election: the controller (controller.py) starts its first pass at once.
        self.on_elected: Callable[[], None] | None = None
        store.add_session_listener(self._on_session)

    @classmethod
    def connect(cls, connect: str, session_timeout_ms: int, connection_timeout_ms: int | None,
                broker_id: int, rack: str | None) -> ClusterMember:
        try:
            store = ZooKeeperStore(connect, session_timeout_ms, connection_timeout_ms)
        except ZooKeeperUnreachable as exc:
            raise ClusterStartError(str(exc)) from None
        return cls(store, broker_id, rack)

    # --- what the broker reads ---------------------------------------------------------

    @property
    def controller(self) -> ControllerView:
        return self._view

    @property
    def is_controller(self) -> bool:
        return self._view.controller_id == self.broker_id

    def standing(self) -> Standing:
        """The standing table's row now (no ZooKeeper round trip: safe on the event loop)."""
        return standing_step(self._registered_session, self._session() or None,
                             int((time.monotonic() - self.store.heard_at) * 1000),
                             self.store.session_timeout_ms)

    def vouch_left_s(self) -> float:
        """How long this broker still vouches if ZooKeeper answers nothing more (0: it does
        not vouch now): when the replica manager must look again."""
        if self.standing() is not Standing.VOUCH:
            return 0.0
        limit_s = self.store.session_timeout_ms * SILENCE_FRACTION / 1000
        return max(0.0, self.store.heard_at + limit_s - time.monotonic())

    @property
    def vouches(self) -> bool:
        return self.standing() is Standing.VOUCH

    @property
    def brokers(self) -> tuple[zn.BrokerRegistration, ...]:
        """The registered brokers by id, as this member last read them (kept current by a
        watch on /brokers/ids: no ZooKeeper round trip here, safe on the event loop)."""
        return self._brokers

    @property
    def left_cleanly(self) -> frozenset[int]:
        """The brokers that left /brokers/ids after this member saw them in controlled
        shutdown, until they register again."""
        return self._left_cleanly

    def _read_brokers(self) -> None:
        brokers = []
        try:  # read first: a broker already gone is seen stopping by this read or none
            stopping = frozenset(int(b) for b in self._op(
                self.zk.get_children_async, zn.CONTROLLED_SHUTDOWN, watch=self._on_change))
        except NoNodeError:  # not made yet (the first broker of a cluster makes it)
            self._op(self.zk.exists_async, zn.CONTROLLED_SHUTDOWN, watch=self._on_change)
            stopping = frozenset()
        ids = self._op(self.zk.get_children_async, zn.BROKER_IDS, watch=self._on_change)
        for name in ids:
            try:
                data, _ = self._op(self.zk.get_async, f"{zn.BROKER_IDS}/{name}")
            except NoNodeError:
                continue  # gone between the listing and the read: the watch tells us
            brokers.append(zn.BrokerRegistration.decode(int(name), data))
        before = {b.broker_id for b in self._brokers}
        present = {b.broker_id for b in brokers}
        # Seen stopping at this read or the last (a stop's znode is made before its moves,
        # which the broker waits for: a pass in between is all but certain).
        self._left_cleanly = frozenset(
            (self._left_cleanly | ((before - present) & (self._stopping | stopping)))
            - present)
        self._stopping = stopping
        self._brokers = tuple(sorted(brokers, key=lambda b: b.broker_id))
        if before != present and self.on_brokers_changed is not None:
            self.on_brokers_changed()

    def cluster_id(self, proposed: str) -> str:
        """The cluster's id, Kafka's /cluster/id ``{"version":"1","id":...}``: the first
        broker's proposal wins, every other broker adopts it."""
        try:
            self._op(self.zk.create_async, zn.CLUSTER_ID, zn.encode_cluster_id(proposed),
                     makepath=True)
        except NodeExistsError:
            pass
        data, _ = self._op(self.zk.get_async, zn.CLUSTER_ID)
        return zn.decode_cluster_id(data)

    # --- lifecycle ---------------------------------------------------------------------

    def start(self, host: str, port: int, background: bool = True,
              endpoints: tuple[tuple[str, str, int, str], ...] = ()) -> None:
        """Register (waiting up to the session timeout for an earlier run's registration to
        expire, R3), then elect; later passes on this member's thread (``background``, or
        the caller's ``pass_once``)."""
        self.heartbeat.start()
        try:
            self._join(host, port, endpoints)
        except MetadataUnavailable as exc:
            raise ClusterStartError(str(exc)) from None
        if not background:
            return
        self._thread = threading.Thread(target=self._run, name="cluster-member", daemon=True)
        self._thread.start()
        self._wake.set()

    def _join(self, host: str, port: int,
              endpoints: tuple[tuple[str, str, int, str], ...] = ()) -> None:
        self.registration = zn.BrokerRegistration(self.broker_id, host, port, self.rack,
                                                  endpoints)
        self._op(self.zk.ensure_path_async, zn.BROKER_IDS)
        deadline = time.monotonic() + self.store.session_timeout_ms / 1000 + 1
        while not self._register():
            if time.monotonic() >= deadline:
                raise ClusterStartError(
                    f"broker.id {self.broker_id} is registered in ZooKeeper by another "
                    f"session ({zn.broker_path(self.broker_id)}): another broker has this id")
            self._wait_gone(zn.broker_path(self.broker_id), deadline)
        self.pass_once()  # a first answer for Metadata before any client asks

    def close(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self.store.session_timeout_ms / 1000 + 5)
        self.heartbeat.close()
        self.store.close()  # our ephemeral znodes go now, not a session timeout later

    # --- the work ----------------------------------------------------------------------

    def pass_once(self) -> None:
        """One pass of both tables, then the registered brokers read again."""
        if self._register():
            self._elect()
        self._read_brokers()

    def _op(self, call_async, *args, **kwargs):
        return self.store.op(call_async, *args, **kwargs)

    def _session(self) -> int:
        return self.zk.client_id[0] if self.zk.client_id else 0

    def _owner(self, path: str, watch=None) -> tuple[bytes | None, int | None]:
        stat = self._op(self.zk.exists_async, path, watch=watch)
        if stat is None:
            return None, None
        try:
            data, stat = self._op(self.zk.get_async, path)
        except NoNodeError:
            return None, None
        return data, stat.ephemeralOwner

    def _register(self) -> bool:
        """One pass of the registration table; True once registered by this session."""
        assert self.registration is not None
        path = zn.broker_path(self.broker_id)
        _, owner = self._owner(path)
        step = registration_step(owner, self._session())
        if step is Registration.CREATE:
            try:
                self._op(self.zk.create_async, path, self.registration.encode(), ephemeral=True)
            except NodeExistsError:
                return False  # created by another session since we looked: R3 next pass
            log.info("registered as broker %d at %s:%d in ZooKeeper", self.broker_id,
                     self.registration.host, self.registration.port)
            self._registered_session = self._session()
            if self.on_registered is not None:
                self.on_registered()
            return True
        if step is Registration.REGISTERED:
            self._registered_session = self._session()
            return True
        return False

    def _wait_gone(self, path: str, deadline: float) -> None:
        gone = threading.Event()
        if self._op(self.zk.exists_async, path, watch=lambda _event: gone.set()) is None:
            return
        gone.wait(max(0.0, deadline - time.monotonic()))

    def _elect(self) -> None:
        """One pass of the election table."""
        data, owner = self._owner(zn.CONTROLLER, watch=self._on_change)
        controller = None if data is None else zn.decode_controller(data)
        step = election_step(controller, owner, self.broker_id, self._session())
        if step is Election.CLAIM:
            self._claim()
        elif step is Election.FOLLOW:
            assert controller is not None
            epoch = self._epoch()[0]
            if controller == self.broker_id:
                # An earlier session of ours: no controller this process can act for, until
                # that session expires and /controller goes (then E1).
                controller = NO_CONTROLLER
            if self._view != ControllerView(controller, epoch):
                log.info("broker %d is the controller (epoch %d)", controller, epoch)
            self._view = ControllerView(controller, epoch)

    def _epoch(self) -> tuple[int, int]:
        """(epoch, znode version), creating /controller_epoch at the initial epoch."""
        try:
            data, stat = self._op(self.zk.get_async, zn.CONTROLLER_EPOCH)
        except NoNodeError:
            try:
                self._op(self.zk.create_async, zn.CONTROLLER_EPOCH,
                         zn.encode_epoch(zn.INITIAL_CONTROLLER_EPOCH))
            except NodeExistsError:
                pass
            data, stat = self._op(self.zk.get_async, zn.CONTROLLER_EPOCH)
        return zn.decode_epoch(data), stat.version

    def _claim(self) -> None:
        epoch, version = self._epoch()
        txn = self.zk.transaction()
        txn.create(zn.CONTROLLER, zn.encode_controller(self.broker_id), ephemeral=True)
        txn.set_data(zn.CONTROLLER_EPOCH, zn.encode_epoch(epoch + 1), version=version)
        results = self._op(txn.commit_async)
        if any(isinstance(r, Exception) for r in results):
            log.debug("controller claim at epoch %d lost: %s", epoch + 1, results)
            self._wake.set()  # read the winner on the next pass
            return
        self._epoch_version = version + 1
        self._view = ControllerView(self.broker_id, epoch + 1)
        log.info("broker %d is now the controller (epoch %d)", self.broker_id, epoch + 1)
        if self.on_elected is not None:
            self.on_elected()

    def controller_transaction(self, build: Callable[[TransactionRequest], None],
                               partial: bool = False) -> list:
        """The controller's writes, all or none, and only while the epoch it won is still
        the cluster's: ``build`` adds the operations to a ZooKeeper transaction that also
        checks /controller_epoch at the version our claim left it. A deposed controller
        that does not know it yet (paused past its session timeout) is refused by ZooKeeper
        itself: ControllerMoved. Returns the operations' results (``partial``: a failed
        transaction's too, each op's exception, instead of raising the one that failed)."""
        if not self.is_controller:
            raise ControllerMoved(f"broker {self.broker_id} is not the controller "
                                  f"(broker {self._view.controller_id} is)")
        txn = self.zk.transaction()
        txn.check(zn.CONTROLLER_EPOCH, self._epoch_version)
        build(txn)
        results = self._op(txn.commit_async)
        if isinstance(results[0], (BadVersionError, NoNodeError)):
            raise ControllerMoved(f"broker {self.broker_id}'s controller epoch "
                                  f"{self._view.epoch} is over")
        for result in results[1:]:
            if isinstance(result, Exception) and not isinstance(result, RolledBackError) \
                    and not partial:
                raise result
        return results[1:]

    def _run(self) -> None:
        for _ in woken(self._stopped, self._wake, self._recheck_s):
            if self.zk.state != KazooState.CONNECTED:
                continue
            try:
                self.pass_once()
            except (ConnectionLoss, SessionExpiredError, MetadataUnavailable) as exc:
                # The session listener wakes us once connected again.
                log.warning("cluster membership pass cut short by ZooKeeper: %r", exc)
            except Exception:
                # A lost connection mid-pass (kazoo raises), or an unexpected answer: the
                # next pass starts again from what ZooKeeper holds.
                log.exception("cluster membership pass failed; retrying")

    def _on_change(self, _event) -> None:
        """A watch fired (/controller or /brokers/ids changed): a pass reads them again."""
        self._wake.set()

    def _on_session(self, state: str) -> None:
        if state == KazooState.LOST:
            # The session's ephemeral znodes are gone: we are neither registered nor the
            # controller until the next pass redoes R1 and E1 on the new session.
            if self._stopped.is_set():  # closed by close(): a stop, not an expiry
                log.info("ZooKeeper session of broker %d closed", self.broker_id)
            else:
                log.warning("ZooKeeper session of broker %d expired: re-registering",
                            self.broker_id)
            self._view = ControllerView(NO_CONTROLLER, self._view.epoch)
            self._registered_session = None  # V4 until R1
        elif state == KazooState.CONNECTED:
            self._wake.set()
