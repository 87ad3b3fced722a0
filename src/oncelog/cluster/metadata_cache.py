"""MetadataCache: every broker's picture of the cluster's topics, fed by ZooKeeper watches.

What it holds, as ``image`` (an immutable ClusterImage replaced whole on each change, so the
event loop reads it without a lock and never waits on ZooKeeper): each topic's id, replica
assignment (with an ongoing reassignment's adding and removing replicas), each partition's
state znode (leader, leader_epoch, ISR) and the topic's config overrides.

How it stays current: a one-shot watch on ``/brokers/topics`` (the topic list), on each
``/brokers/topics/<t>`` (its assignment), on each partition's state znode (an ``exists``
watch while it is not written yet) and on ``/config/changes`` (Kafka's change notifications:
each new ``config_change_<seq>`` names the topic whose ``/config/topics/<t>`` to read
again). A watch only marks what changed; the cache's own thread reads it (kazoo's watch
thread must not block) and re-arms the watch with that read, so no change is missed between
two reads. After a new ZooKeeper session everything is read again. A topic's assignment,
config or partition state that cannot be read through its own fault (unreadable.py: a
NoAuth, bytes that are not Kafka's JSON) stays as last read (a topic never read stays out
of the picture), is read again at each refresh and logged once per change; the other
topics' changes are published as ever. ZooKeeper being away fails the whole refresh.

Listeners (``add_listener``) are told the names of the topics whose picture changed, on the
cache's thread: the broker applies config changes, a replica manager may follow
assignments and states through the same picture.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ..metadata.store import MetadataUnavailable
from . import znodes as zn
from .unreadable import Unreadable, Unreadables, decoded, unreadable
from .wakeups import woken
from .watched_topics import read_states

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartitionImage:
    topic: str
    index: int
    replicas: tuple[int, ...]
    state: zn.PartitionState | None = None
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def leader(self) -> int:
        return zn.NO_LEADER if self.state is None else self.state.leader

    @property
    def leader_epoch(self) -> int:
        return -1 if self.state is None else self.state.leader_epoch

    @property
    def isr(self) -> tuple[int, ...]:
        return () if self.state is None else self.state.isr


@dataclass(frozen=True, slots=True)
class TopicImage:
    name: str
    topic_id: uuid.UUID
    partitions: tuple[PartitionImage, ...]
    configs: dict[str, str] = field(default_factory=dict)


class ClusterImage:
    """The topics by name and by id (the read interface Metadata uses of a TopicManager)."""

    __slots__ = ("_by_id", "topics")

    def __init__(self, topics: dict[str, TopicImage] | None = None) -> None:
        self.topics = topics or {}
        self._by_id = {t.topic_id: t for t in self.topics.values()}

    def get(self, name: str) -> TopicImage | None:
        return self.topics.get(name)

    def by_id(self, topic_id: uuid.UUID | None) -> TopicImage | None:
        return self._by_id.get(topic_id) if topic_id is not None else None


def topic_id_of(assignment: zn.TopicAssignment) -> uuid.UUID:
    """Kafka's topic id (a decoded assignment's is whole: znodes.TopicAssignment.decode)."""
    return zn.decode_topic_id(assignment.topic_id)


def encode_topic_id(topic_id: uuid.UUID) -> str:
    import base64

    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()


class MetadataCache:
    def __init__(self, store, recheck_s: float | None = None) -> None:
        self.store = store
        self.zk = store.client
        self.image = ClusterImage()
        self._assignments: dict[str, zn.TopicAssignment] = {}
        self._states: dict[tuple[str, int], zn.PartitionState] = {}
        self._configs: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()
        self._dirty_list = True
        self._dirty_topics: set[str] = set()
        self._dirty_states: set[tuple[str, int]] = set()
        self._dirty_configs: set[str] = set()
        self._changes_seen = ""  # the last config_change_<seq> read
        self._changes_listed = False
        self._dirty_changes = True
        self._wake = threading.Event()
        self._changed = threading.Condition()
        self._stopped = threading.Event()
        self._listeners: list[Callable[[set[str]], None]] = []
        self._recheck_s = recheck_s or store.session_timeout_ms / 3000
        self._thread: threading.Thread | None = None
        # what cannot be read through its own fault: (topic, "assignment"), (topic,
        # "config"), (topic, partition) for a state
        self._unreadable = Unreadables("metadata cache", log)
        store.add_session_listener(self._on_session)

    # --- what the broker reads -----------------------------------------------------------

    def add_listener(self, listener: Callable[[set[str]], None]) -> None:
        self._listeners.append(listener)

    def wait_for(self, condition: Callable[[ClusterImage], bool], timeout: float) -> bool:
        """Blocks (not on the event loop) until ``condition(image)`` or the timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: condition(self.image), timeout)

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self.refresh()  # a first picture before any client asks
        except MetadataUnavailable as exc:
            log.warning("first metadata read from ZooKeeper failed: %s", exc)
        self._thread = threading.Thread(target=self._run, name="metadata-cache", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        for _ in woken(self._stopped, self._wake, self._recheck_s):
            if not self.zk.connected:
                continue
            try:
                self.refresh()
            except Exception as exc:  # a lost connection mid-read: read again on the next
                log.warning("metadata cache refresh cut short: %r", exc)
                self._wake.set()
                self._stopped.wait(0.1)

    def _on_session(self, state: str) -> None:
        if state in ("CONNECTED", "LOST"):
            with self._lock:  # watches may have been lost with the session: read all again
                self._dirty_list = True
                self._dirty_topics.update(self._assignments)
                self._dirty_states.update(self._states)
                self._dirty_configs.update(self._assignments)
                self._dirty_changes = True
            self._wake.set()

    # --- watches mark, the thread reads ------------------------------------------------

    def _mark(self, kind: str, key=None) -> Callable:
        def watch(_event) -> None:
            with self._lock:
                if kind == "list":
                    self._dirty_list = True
                elif kind == "topic":
                    self._dirty_topics.add(key)
                elif kind == "state":
                    self._dirty_states.add(key)
                elif kind == "changes":
                    self._dirty_changes = True
            self._wake.set()
        return watch

    def _op(self, call_async, *args, **kwargs):
        return self.store.op(call_async, *args, **kwargs)

    def refresh(self) -> None:
        """Read what was marked; publish a new image when anything changed."""
        with self._lock:
            dirty_list, self._dirty_list = self._dirty_list, False
            topics, self._dirty_topics = self._dirty_topics, set()
            states, self._dirty_states = self._dirty_states, set()
            configs, self._dirty_configs = self._dirty_configs, set()
            dirty_changes, self._dirty_changes = self._dirty_changes, False
        try:
            changed = self._read(dirty_list, topics, states, configs, dirty_changes)
        except Exception:
            with self._lock:  # read them again next time
                self._dirty_list |= dirty_list
                self._dirty_topics |= topics
                self._dirty_states |= states
                self._dirty_configs |= configs
                self._dirty_changes |= dirty_changes
            raise
        if changed:
            self._publish(changed)
        with self._lock:
            self._unreadable.again(self._again)

    def _again(self, key: tuple) -> None:
        name, what = key
        if what == "assignment":
            self._dirty_topics.add(name)
        elif what == "config":
            self._dirty_configs.add(name)
        else:
            self._dirty_states.add(key)

    def _read(self, dirty_list: bool, topics: set[str], states: set[tuple[str, int]],
              configs: set[str], dirty_changes: bool) -> set[str]:
        from kazoo.exceptions import NoNodeError

        changed: set[str] = set()
        if dirty_list:
            self._op(self.zk.ensure_path_async, zn.BROKER_TOPICS)
            names = set(self._op(self.zk.get_children_async, zn.BROKER_TOPICS,
                                 watch=self._mark("list")))
            for gone in set(self._assignments) - names:
                self._forget(gone)
                changed.add(gone)
            new = names - set(self._assignments)
            topics |= new
            configs |= new
        if dirty_changes:
            configs |= self._read_changes()
        for name in topics:
            try:
                data, _ = self._op(self.zk.get_async, zn.topic_path(name),
                                   watch=self._mark("topic", name))
                assignment = decoded(zn.TopicAssignment.decode, data)
            except NoNodeError:
                self._unreadable.read((name, "assignment"))
                if name in self._assignments:
                    self._forget(name)
                    changed.add(name)
                continue
            except Exception as exc:
                if (bad := unreadable(exc)) is None:
                    raise
                self._unreadable.failed((name, "assignment"), bad)  # as last read meanwhile
                continue
            self._unreadable.read((name, "assignment"))
            before = self._assignments.get(name)
            if before is None:  # first taken in (listed while unreadable, perhaps): its
                configs.add(name)  # config was skipped then
            self._assignments[name] = assignment
            known = set(before.partitions) if before is not None else set()
            states |= {(name, p) for p in assignment.partitions if p not in known}
            for p in known - set(assignment.partitions):
                self._states.pop((name, p), None)
            changed.add(name)
        # Pipelined: a round trip per hundred states marked, not one each (the controller's
        # one reading: only an absence is read as absence, anything else raises).
        keys = [key for key in states if key[0] in self._assignments]
        missing = []
        for key, got in read_states(self.store, keys,
                                    watch_of=lambda k: self._mark("state", k)).items():
            if isinstance(got, Unreadable):
                self._unreadable.failed(key, got)  # as last read meanwhile
                continue
            self._unreadable.read(key)
            if got is None:
                self._states.pop(key, None)
                missing.append(key)
                continue
            self._states[key] = got[0]
            changed.add(key[0])
        for key in missing:  # told when the controller writes it
            if self._op(self.zk.exists_async, zn.partition_state_path(*key),
                        watch=self._mark("state", key)) is not None:
                with self._lock:
                    self._dirty_states.add(key)
                self._wake.set()
        for name in configs:
            if name not in self._assignments:
                continue
            try:
                data, _ = self._op(self.zk.get_async, f"{zn.CONFIG_TOPICS}/{name}")
                self._configs[name] = decoded(zn.decode_topic_config, data)
            except NoNodeError:
                self._configs[name] = {}
            except Exception as exc:
                if (bad := unreadable(exc)) is None:
                    raise
                self._unreadable.failed((name, "config"), bad)  # as last read meanwhile
                continue
            self._unreadable.read((name, "config"))
            changed.add(name)
        return changed

    def _read_changes(self) -> set[str]:
        """Topics named by the change notifications newer than the last one read."""
        from kazoo.exceptions import NoNodeError

        self._op(self.zk.ensure_path_async, zn.CONFIG_CHANGES)
        children = sorted(self._op(self.zk.get_children_async, zn.CONFIG_CHANGES,
                                   watch=self._mark("changes")))
        named = set()
        first, self._changes_listed = not self._changes_listed, True
        for child in children:
            if first or child <= self._changes_seen:  # first: every config is read anyway
                continue
            try:
                data, _ = self._op(self.zk.get_async, f"{zn.CONFIG_CHANGES}/{child}")
                entity = decoded(zn.decode_config_change, data)
            except NoNodeError:
                continue
            except Exception as exc:
                if (bad := unreadable(exc)) is None:
                    raise
                # which topic it names is unknown: every config is read again; said once,
                # as the notifications read are never read again
                log.warning("config change notification %s cannot be read (%s): every "
                            "topic's config is read again", child, bad)
                named |= set(self._assignments)
                continue
            if entity.startswith("topics/"):
                named.add(entity[len("topics/"):])
        if children:
            self._changes_seen = max(self._changes_seen, children[-1])
        return named

    def _forget(self, name: str) -> None:
        assignment = self._assignments.pop(name, None)
        self._configs.pop(name, None)
        self._unreadable.forget(name)
        if assignment is not None:
            for p in assignment.partitions:
                self._states.pop((name, p), None)

    def _publish(self, changed: set[str]) -> None:
        topics = dict(self.image.topics)
        for name in changed:
            assignment = self._assignments.get(name)
            if assignment is None:
                topics.pop(name, None)
                continue
            partitions = tuple(
                PartitionImage(name, p, replicas, self._states.get((name, p)),
                               assignment.adding_replicas.get(p, ()),
                               assignment.removing_replicas.get(p, ()))
                for p, replicas in sorted(assignment.partitions.items()))
            topics[name] = TopicImage(name, topic_id_of(assignment), partitions,
                                      dict(self._configs.get(name, {})))
        with self._changed:
            self.image = ClusterImage(topics)
            self._changed.notify_all()
        for listener in self._listeners:
            try:
                listener(set(changed))
            except Exception:
                log.exception("metadata cache listener failed")


