"""WatchedTopics: a picture of every topic and partition state in ZooKeeper, kept between
reads and read again only where watches say it changed: the controller's (controller.py,
Kafka's ControllerContext) and each broker's replica watch's (replica_watch.py, the states
of the partitions assigned to the broker only).

A controller pass used to read every topic's assignment, config and partitions and every partition's
state znode: one ZooKeeper request per partition, each a hand-off to kazoo's connection
thread, so a pass over 1,000 partitions cost a second of CPU on a quiet machine and 7-10 s
in a loaded broker whose event loop holds the GIL (docs/benchmarks.md). As Kafka's
controller keeps its WatchedTopics, the picture is kept here and only what changed is
read again: every read sets a watch (the topic list's children, each topic's assignment,
config and partitions' children, each state znode; an ``exists`` watch while a config, the
partitions znode or a state is absent) and a watch
only marks what it names; ``read`` reads the marked znodes (pipelined) and answers the whole
picture. A steady pass then costs a few requests, whatever the partition count; a pass
after N state changes reads N states.

Why the picture is never older than a fresh read would be, where a decision depends on it:

- ZooKeeper sends a session a watch's event before the answer to any request of that
  session processed after the change; kazoo runs the watch callbacks on its callback thread,
  so ``read`` makes one request, then puts a marker on that thread's queue behind the
  callbacks and waits for it (``_caught_up``): every change ZooKeeper applied before that
  request was answered is marked by then.
- Every write made from the picture (the controller's decisions, a leader's ISR change) is
  conditional on the version read, so a stale entry can only lose a write (BadVersion),
  never overwrite a newer state; its writer ``mark``s it and the next read takes it again.
- ``reset`` (a new controllership) and a new or resumed ZooKeeper session (watches may be
  lost with it) read everything again (what cannot be read then is kept as last read, as
  below: a reconnection must not turn a partition led here into one with no state).

A topic or state znode that cannot be read through its own fault (unreadable.py: a NoAuth,
bytes that are not Kafka's JSON) fails only itself: the picture keeps what it last read of
it, marks it (``TopicRead.problem``, ``TopicRead.bad_states``; a topic never read has an
empty assignment and version -1), reads it again at every ``read`` (an ACL change fires no
watch) and says so once per change (``unreadable.Unreadables``). The readers take no decision on
what is marked. ZooKeeper being away still fails the whole read.

One thread calls ``read`` and ``forget``; ``reset``, ``mark`` and the watch and session
callbacks (kazoo's threads among them) only mark, under a lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import Callback, KazooState

from ..metadata.store import MetadataUnavailable
from . import znodes as zn
from .batches import gather
from .unreadable import Unreadable, Unreadables, answer, decoded

log = logging.getLogger(__name__)

_STATE_SUFFIX = "/state"


@dataclass(slots=True)
class TopicRead:
    name: str
    assignment: zn.TopicAssignment
    version: int
    configs: dict[str, str]
    states: dict[int, tuple[zn.PartitionState, int] | None]  # (state, znode version)
    partition_nodes: set[int]  # partitions/<p> znodes that exist
    has_partitions_node: bool
    # why its assignment, config or partitions list cannot be read (unreadable.py): the
    # rest is as last read (nothing, version -1, when never read); no decision on it
    problem: str | None = None
    bad_states: dict[int, str] = field(default_factory=dict)  # partition -> why, as above
    # the assignment znode's version at the last read that got its bytes, whole or not
    # (None: a NoAuth), which a deletion names (controller.py)
    read_version: int | None = None
    # an assignment whole but for its topic_id (pre-2.8 tooling): the controller names it
    # (leader_election.py T1); unreadable until then
    unnamed: zn.TopicAssignment | None = None

    @property
    def never_read(self) -> bool:
        return self.version < 0


def _unread(name: str, why: str) -> TopicRead:
    """A topic whose assignment could not be read: nothing known of it but that."""
    return TopicRead(name, zn.TopicAssignment("", {}, {}, {}), -1, {}, {}, set(), False, why)


class WatchedTopics:
    def __init__(self, store, wake: Callable[[], None],
                 states_of: Callable[[zn.TopicAssignment], Iterable[int]] | None = None,
                 reader: str = "controller") -> None:
        """``wake``: called after a watch marked something; ``states_of``: the partitions of
        a topic whose states are read and watched (None: every one); ``reader``: who reads,
        in what the log says of unreadable znodes."""
        self.store = store
        self.zk = store.client
        self._wake = wake
        self._states_of = states_of
        self._topics: dict[str, TopicRead] = {}
        self._lock = threading.Lock()
        self._everything = True  # read it all: no picture yet, or it may have missed changes
        self._list = True
        self._dirty_topics: set[str] = set()
        self._dirty_states: set[tuple[str, int]] = set()
        self._unreadable = Unreadables(reader, log)
        store.add_session_listener(self._on_session)

    # --- marks (any thread) ----------------------------------------------------------------

    def reset(self) -> None:
        """Read everything at the next ``read`` (a new controllership)."""
        with self._lock:
            self._everything = True

    def mark(self, topic: str, partition: int | None = None) -> None:
        """Read this topic (its assignment, config and partitions), or this partition's
        state, again at the next ``read``: a write to it was lost."""
        with self._lock:
            if partition is None:
                self._dirty_topics.add(topic)
            else:
                self._dirty_states.add((topic, partition))

    def _on_session(self, state: str) -> None:
        if state in (KazooState.CONNECTED, KazooState.LOST):
            self.reset()
            self._wake()

    def _list_changed(self, _event) -> None:
        with self._lock:
            self._list = True
        self._wake()

    def _topic_changed(self, event) -> None:
        # /brokers/topics/<t> or /config/topics/<t>: either way the topic is read again
        if event.path is None:  # the session's end, told to every watch
            self.reset()
        else:
            self.mark(event.path.rsplit("/", 1)[1])
        self._wake()

    def _partitions_changed(self, event) -> None:
        # /brokers/topics/<t>/partitions: a partition znode made or deleted
        parts = (event.path or "").split("/")
        if event.path is None or len(parts) < 2:  # the session's end, told to every watch
            self.reset()
        else:
            self.mark(parts[-2])
        self._wake()

    def _state_changed(self, event) -> None:
        # /brokers/topics/<t>/partitions/<p>/state
        parts = (event.path or "")[:-len(_STATE_SUFFIX)].split("/")
        try:
            self.mark(parts[-3], int(parts[-1]))
        except (IndexError, ValueError):  # the session's end, told to every watch
            self.reset()
        self._wake()

    # --- the picture (the pass thread) -----------------------------------------------------

    def forget(self, topic: str) -> None:
        self._topics.pop(topic, None)

    def read(self) -> list[TopicRead]:
        """Every topic as ZooKeeper holds it, reading only what changed since the last
        read."""
        self.store.op(self.zk.exists_async, zn.BROKER_TOPICS)
        self._caught_up()
        with self._lock:
            everything, self._everything = self._everything, False
            listed, self._list = self._list or everything, False
            topics, self._dirty_topics = self._dirty_topics, set()
            states, self._dirty_states = self._dirty_states, set()
        try:
            self._read(everything, listed, topics, states)
        except BaseException:
            with self._lock:  # read them again next time
                self._everything |= everything
                self._list |= listed
                self._dirty_topics |= topics
                self._dirty_states |= states
            raise
        topics = [self._topics[name] for name in sorted(self._topics)]
        self._unreadable.why = {topic.name: topic.problem for topic in topics
                                if topic.problem is not None}
        self._unreadable.why.update(((topic.name, p), why) for topic in topics
                                    for p, why in topic.bad_states.items())
        with self._lock:  # read again next time, unwatched as they may be (a NoAuth)
            self._unreadable.again(lambda key: (self._dirty_states if isinstance(key, tuple)
                                                else self._dirty_topics).add(key))
        return topics

    def _caught_up(self) -> None:
        """Every watch callback kazoo had queued has run."""
        done = threading.Event()
        self.zk.handler.dispatch_callback(Callback("controller", done.set, ()))
        if not done.wait(self.store.session_timeout_ms / 1000):
            raise MetadataUnavailable("kazoo's callbacks did not run in time")

    def _read(self, everything: bool, listed: bool, topics: set[str],
              states: set[tuple[str, int]]) -> None:
        if everything:  # every topic and state read again; what cannot be, kept as it was
            topics = topics | set(self._topics)
        if listed:
            try:
                names = set(self.store.op(self.zk.get_children_async, zn.BROKER_TOPICS,
                                          watch=self._list_changed))
            except NoNodeError:  # no topic was ever made
                self.store.op(self.zk.ensure_path_async, zn.BROKER_TOPICS)
                names = set(self.store.op(self.zk.get_children_async, zn.BROKER_TOPICS,
                                          watch=self._list_changed))
            for gone in set(self._topics) - names:
                del self._topics[gone]
            topics = (topics | (names - set(self._topics))) & names
        read = self._read_topics(sorted(topics))
        for name in topics:
            if name not in read:
                self._topics.pop(name, None)  # gone meanwhile: the list's watch fires too
        for name, topic in read.items():
            old = self._topics.get(name)
            if topic.problem is not None and old is not None and not old.never_read:
                old.problem = topic.problem  # what was last read of it stays
                old.read_version, old.unnamed = topic.read_version, topic.unnamed
                if everything:
                    states |= {(name, p) for p in self._wanted(old.assignment)}
                continue
            self._topics[name] = topic
            if old is not None:
                topic.bad_states.update((p, why) for p, why in old.bad_states.items()
                                        if p in topic.assignment.partitions)
            # a new topic, or a new partition: every state of it is read; the others stay
            # (read again too after a reset, kept where they cannot be read)
            for p in self._wanted(topic.assignment):
                if old is not None and p in old.states:
                    topic.states[p] = old.states[p]
                if old is None or p not in old.states or everything:
                    states.add((name, p))
        wanted = {name: self._wanted(self._topics[name].assignment)
                  for name in {t for t, _ in states} if name in self._topics}
        self._read_states(sorted(k for k in states if k[1] in wanted.get(k[0], ())))

    def _wanted(self, assignment: zn.TopicAssignment) -> set[int]:
        if self._states_of is None:
            return set(assignment.partitions)
        return set(self._states_of(assignment))

    def _read_topics(self, names: list[str]) -> dict[str, TopicRead]:
        out, no_config, no_partitions = read_topics(
            self.store, names, self._topic_changed, self._partitions_changed)
        # told when a config is written for the first time, and when its partitions znode
        # is made (so that its children get their watch)
        self._watch_creation(no_config, zn.topic_config_path, self._topic_changed)
        self._watch_creation(no_partitions, zn.partitions_path, self._partitions_changed)
        return out

    def _watch_creation(self, names: list[str], path_of: Callable[[str], str],
                        watch: Callable) -> None:
        """An existence watch on ``path_of(name)`` for each of ``names`` (absent when read);
        one made meanwhile marks its topic to be read again at once."""
        for name, stat in zip(names, gather(self.store, [
                lambda n=n: self.zk.exists_async(path_of(n), watch=watch)
                for n in names]), strict=True):
            if isinstance(stat, Exception):
                raise stat
            if stat is not None:
                self.mark(name)  # written since: read it next time
                self._wake()

    def _read_states(self, keys: list[tuple[str, int]]) -> None:
        missing = []
        for (t, p), got in read_states(self.store, keys, self._state_changed).items():
            topic = self._topics[t]
            if isinstance(got, Unreadable):  # what was last read of it stays
                topic.bad_states[p] = str(got)
                continue
            topic.bad_states.pop(p, None)
            if got is None:
                topic.states.pop(p, None)
                missing.append((t, p))
            else:
                topic.states[p] = got
        # told when the state is created (by this controller, or one before it)
        for key, stat in zip(missing, gather(self.store, [
                lambda t=t, p=p: self.zk.exists_async(zn.partition_state_path(t, p),
                                                      watch=self._state_changed)
                for t, p in missing]), strict=True):
            if isinstance(stat, Exception):
                raise stat
            if stat is not None:
                self.mark(*key)
                self._wake()


# --- the one reading of topics and states (the picture's, and the controller's unwatched
# one for ElectLeaders and its tests) ----------------------------------------------------
#
# Only an absent znode (NoNodeError) is read as absence; a znode unreadable through its own
# fault (unreadable.py) marks its topic or partition alone; any other failure (a lost
# connection, a timeout) raises, and the pass or request that read is tried again. Read as
# absence, a config read that failed would hand the controller a topic without its overrides
# (unclean.leader.election.enable among them), and a partitions list that failed one without
# its partition znodes, which the controller would then try to create: a decision on a
# picture ZooKeeper never held.


def read_topics(store, names: list[str], topic_watch=None, partitions_watch=None
                ) -> tuple[dict[str, TopicRead], list[str], list[str]]:
    """Each named topic's assignment, config and partition znodes, pipelined (``batches.
    gather``), with watches when given (``topic_watch`` on the assignment and config,
    ``partitions_watch`` on the partitions' children); a topic whose assignment is absent
    is left out, one whose assignment, config or partitions list is unreadable has its
    ``problem`` (and an empty assignment when that is the assignment). Also the topics read
    without a config znode, and without a partitions znode (a watch for their creation is
    the caller's). States are not read."""
    zk = store.client
    answers = gather(store, [
        lambda n=n: zk.get_async(zn.topic_path(n), watch=topic_watch) for n in names]
        + [lambda n=n: zk.get_async(zn.topic_config_path(n), watch=topic_watch)
           for n in names]
        + [lambda n=n: zk.get_children_async(zn.partitions_path(n), watch=partitions_watch)
           for n in names])
    k = len(names)
    out: dict[str, TopicRead] = {}
    no_config: list[str] = []
    no_partitions: list[str] = []
    for i, name in enumerate(names):
        got = answers[i]
        if isinstance(got, NoNodeError):
            continue
        try:
            data, stat = answer(got)
        except Unreadable as exc:
            out[name] = _unread(name, f"its assignment: {exc}")
            continue
        try:
            assignment = decoded(zn.TopicAssignment.decode, data)
        except Unreadable as exc:
            out[name] = unread = _unread(name, f"its assignment: {exc}")
            unread.read_version = stat.version
            try:
                unread.unnamed = decoded(
                    lambda d: zn.TopicAssignment.decode(d, unnamed=True), data)
            except Unreadable:
                pass
            continue
        problem = None
        config = answers[k + i]
        configs: dict[str, str] = {}
        if isinstance(config, NoNodeError):
            no_config.append(name)
        else:
            try:
                configs = decoded(zn.decode_topic_config, answer(config)[0])
            except Unreadable as exc:
                problem = f"its config: {exc}"
        children = answers[2 * k + i]
        nodes: set[int] = set()
        if isinstance(children, NoNodeError):
            no_partitions.append(name)
        else:
            try:
                nodes = decoded(lambda c: {int(x) for x in c}, answer(children))
            except Unreadable as exc:
                problem = problem or f"its partitions: {exc}"
        out[name] = TopicRead(name, assignment, stat.version, configs, {}, nodes,
                              not isinstance(children, Exception), problem,
                              read_version=stat.version)
    return out, no_config, no_partitions


def read_states(store, keys: list[tuple[str, int]], watch=None, watch_of=None
                ) -> dict[tuple[str, int], tuple[zn.PartitionState, int] | Unreadable | None]:
    """Each (topic, partition)'s state znode and its version, pipelined, watched when
    ``watch`` is given (or ``watch_of(key)``, a watch per key); None where it is absent, an
    Unreadable where it cannot be read through its own fault (unreadable.py)."""
    zk = store.client
    answers = gather(store, [lambda k=k: zk.get_async(
        zn.partition_state_path(*k), watch=watch if watch_of is None else watch_of(k))
        for k in keys])
    out: dict[tuple[str, int], tuple[zn.PartitionState, int] | None] = {}
    for key, got in zip(keys, answers, strict=True):
        if isinstance(got, NoNodeError):
            out[key] = None
            continue
        try:
            data, stat = answer(got)
            out[key] = (decoded(zn.PartitionState.decode, data), stat.version)
        except Unreadable as exc:
            out[key] = exc
    return out
