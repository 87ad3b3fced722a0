"""ReplicaWatch: what ZooKeeper says this broker's replicas are, for its replica manager.

Reads, and watches, Kafka's znodes (znodes.py): the topics' assignments under
``/brokers/topics``, the state of every partition assigned to this broker, and those topics'
configs under ``/config/topics``; it hands the whole view to the broker (``on_view``, called
on this watch's thread: the broker moves it to its event loop), with whether the broker
vouched for its session (membership.py's standing table) when the read began: a view read
before the broker registered again is no ground to lead (isr.py's B0). The picture is kept
between reads (watched_topics.py) and only what a watch says changed is read again. The view
is read again when a watch fires, when the session comes back, when the broker asks
(``refresh``: an ISR write refused, or its outcome unknown: that partition is read again),
and at least every third of the session timeout; a read
that fails is retried by the next of these, and a broker ZooKeeper does not answer stops
leading within half the session timeout (membership.py's V3), which bounds how long an
acks=all produce can wait on an ISR the leader does not know.
A pass that fails (ZooKeeper away) hands nothing: the broker keeps acting on the last view,
and never takes a partial view for the truth (a topic missing from a failed read is not a
deleted topic). A topic whose assignment, config or partitions list cannot be read through
its own fault (unreadable.py) is handed with the assignment and configs last handed and the
states read (a state that cannot be read: as last read), or as None when none was handed
yet: the broker keeps its replicas of it as they are, and never deletes them for that.

Writes: ``write_isrs``, the leader's ISR changes (many partitions in one transaction:
batches.py), each conditional on the state znode's version as the leader read it (Kafka's
ZooKeeper mode before AlterPartition): leader and leader epoch kept, the controller epoch as
it was. A controller write in between wins for that partition (BadVersion: the leader reads
the new state and the role table decides again; the others of the batch are written); a
sequential ``/isr_change_notification/isr_change_`` znode tells the controller which
partitions changed. A change that lets brokers into the ISR is also conditional on their
registrations (``/brokers/ids/<id>`` there, in the same transaction): KIP-841 lets only a
registered broker join (isr.py's I3), and the leader's list of registered brokers comes
from a watch that can trail the state it read, so a broker that has just lost its session,
and been taken out by the controller, would otherwise be put back by a leader that has not
yet heard of it.

Must not know: logs, partitions' bytes, the broker's loop.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from kazoo.exceptions import (
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.protocol.states import KazooState

from ..metadata.store import MetadataUnavailable
from ..metadata.zookeeper import ZooKeeperStore
from . import znodes as zn
from .batches import outcome, settle
from .wakeups import woken
from .watched_topics import WatchedTopics

log = logging.getLogger(__name__)


class IsrWrite(NamedTuple):
    """One partition's state as its leader writes it: at the version it read, and only
    while every broker it lets into the ISR is registered."""
    topic: str
    partition: int
    state: zn.PartitionState
    version: int
    joining: tuple[int, ...] = ()



@dataclass(frozen=True, slots=True)
class TopicView:
    name: str
    assignment: zn.TopicAssignment
    configs: dict[str, str]
    # partition -> (state, znode version), for the partitions assigned to this broker whose
    # state exists yet
    states: dict[int, tuple[zn.PartitionState, int]]


class ReplicaWatch:
    def __init__(self, store: ZooKeeperStore, broker_id: int,
                 on_view: Callable[[dict[str, TopicView | None], bool], None],
                 vouches: Callable[[], bool] = lambda: True) -> None:
        self.store = store
        self.vouches = vouches
        self.zk = store.client
        self.broker_id = broker_id
        self.on_view = on_view
        self._recheck_s = store.session_timeout_ms / 3000
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        # the assignments, configs and this broker's partitions' states, read again only
        # where a watch says they changed: each view read cost two requests per partition
        self.topics = WatchedTopics(store, self._wake.set, lambda assignment: [
            p for p, replicas in assignment.partitions.items() if broker_id in replicas],
            reader="replica watch")
        self._handed: dict[str, TopicView] = {}  # as last handed, for an unreadable topic
        store.add_session_listener(self._on_session)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="replica-watch", daemon=True)
        self._thread.start()
        self._wake.set()

    def close(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self.store.session_timeout_ms / 1000 + 5)

    def refresh(self) -> None:
        """Read the view again soon (a conditional write lost: the state moved on)."""
        self._wake.set()

    def _run(self) -> None:
        for _ in woken(self._stopped, self._wake, self._recheck_s):
            if self.zk.state != KazooState.CONNECTED:
                continue
            vouched = self.vouches()
            try:
                view = self.read_view()
            except Exception as exc:  # ZooKeeper away mid-pass: the next pass reads again
                log.warning("reading the replica assignments from ZooKeeper failed: %r", exc)
                continue
            try:
                self.on_view(view, vouched)
            except Exception:
                log.exception("handing the replica view to the broker failed")

    def _op(self, call_async, *args, **kwargs):
        return self.store.op(call_async, *args, **kwargs)

    def read_view(self) -> dict[str, TopicView | None]:
        """Every topic with a partition assigned to this broker, watched (None: unreadable,
        never handed: the broker leaves its replicas of it as they are). The picture is
        kept between reads (watched_topics.py): only what changed is read again."""
        view: dict[str, TopicView | None] = {}
        for topic in self.topics.read():
            before = self._handed.get(topic.name)
            if topic.problem is not None and before is None:
                view[topic.name] = None
                continue
            assignment, configs = (topic.assignment, topic.configs) if topic.problem is None \
                else (before.assignment, before.configs)
            ours = [p for p, replicas in assignment.partitions.items()
                    if self.broker_id in replicas]
            if ours:  # a state that cannot be read is as last read: the picture keeps it
                view[topic.name] = TopicView(
                    topic.name, assignment, configs,
                    {p: found for p in ours if (found := topic.states.get(p)) is not None})
        self._handed = {name: tv for name, tv in view.items() if tv is not None}
        return view

    def write_isrs(self, changes: list[IsrWrite], notify: bool = True) -> list[int | None]:
        """Write each change: the leader's ISR changes, each at the version it read and
        with every joining broker registered, in transactions of many (batches.py); each
        one's new version, or None when its znode moved on or a joining broker is not
        registered (or ZooKeeper is away: the next pass decides again). One change
        notification names every partition written (``notify``; a handover's ready, which
        changes no ISR, needs none: the controller watches the state znode itself)."""
        try:
            fates = settle(changes, self._commit_isrs)
        except (MetadataUnavailable, ConnectionLoss, SessionExpiredError) as exc:
            # perhaps written: the leader counts the ISR asked for until it reads the state
            log.warning("ISR changes of %d partitions not written: %r", len(changes), exc)
            for topic, partition, *_ in changes:
                self.topics.mark(topic, partition)
            self.refresh()
            return [None] * len(changes)
        versions = [None if isinstance(f, Exception) else f.version for f in fates]
        for (topic, partition, *_), version in zip(changes, versions, strict=True):
            if version is None:  # its state moved on: read it again
                self.topics.mark(topic, partition)
        if any(v is None for v in versions):
            self.refresh()
        written = [{"topic": t, "partition": p}
                   for (t, p, *_), v in zip(changes, versions, strict=True) if v is not None]
        if not written or not notify:
            return versions
        try:
            self._op(self.zk.create_async, f"{zn.ISR_CHANGE_NOTIFICATION}/isr_change_",
                     json.dumps({"version": 1, "partitions": written}).encode(),
                     sequence=True, makepath=True)
        except (NodeExistsError, MetadataUnavailable, ConnectionLoss,
                SessionExpiredError) as exc:
            # the states are written: a lost notification must not say they were not
            log.debug("ISR change notification not written: %r", exc)
        return versions

    def _commit_isrs(self, changes: list[IsrWrite]) -> list[object]:
        txn = self.zk.transaction()
        spans = []
        for change in changes:
            for broker in change.joining:  # a check of version -1 fails on no node only
                txn.check(zn.broker_path(broker), -1)
            txn.set_data(zn.partition_state_path(change.topic, change.partition),
                         change.state.encode(), version=change.version)
            spans.append(len(change.joining) + 1)
        results = self._op(txn.commit_async)
        answers, at = [], 0
        for ops in spans:  # each change's fate from its own ops (the write's last)
            answers.append(outcome(results[at:at + ops]))
            at += ops
        return answers

    def report_offline(self, partitions: list[tuple[str, int]],
                       all_log_dirs: bool = False) -> None:
        """This broker's replicas on failed log directories, and whether every one of its
        log directories failed (neither: the znode goes), then Kafka's log directory event,
        which wakes the controller (controller.py moves their leaderships and takes them
        out of the ISRs: leader_election.py's D1, L1)."""
        path = f"{zn.OFFLINE_REPLICAS}/{self.broker_id}"
        if not partitions and not all_log_dirs:
            try:
                self._op(self.zk.delete_async, path)
            except NoNodeError:
                return
        else:
            data = zn.encode_offline_replicas(partitions, all_log_dirs)
            try:
                self._op(self.zk.set_async, path, data)
            except NoNodeError:
                self._op(self.zk.create_async, path, data, makepath=True)
        self._op(self.zk.create_async,
                 f"{zn.LOG_DIR_EVENT_NOTIFICATION}/{zn.LOG_DIR_EVENT_PREFIX}",
                 zn.encode_log_dir_event(self.broker_id), sequence=True, makepath=True)

    def _on_session(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._wake.set()
