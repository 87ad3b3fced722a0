"""Controller: what the elected controller does, on its own thread, while it is controller.

Every broker runs one; it acts only while its ClusterMember is the controller. A pass reads
what ZooKeeper holds (the live brokers under ``/brokers/ids``, the brokers shutting down
under ``/oncelog/controlled_shutdown``, every topic's assignment, config and partition
states, the deletions asked under ``/admin/delete_topics``), takes every decision with
``leader_election.decide`` and writes each topic's decisions in one ZooKeeper transaction
through ``ClusterMember.controller_transaction``: each state znode at the version read (a
leader's ISR change in between fails the transaction; the next pass reads it again) and
/controller_epoch at the version its election left (a deposed controller's writes never
land: ControllerMoved, and it stops acting).

A broker whose log directory failed writes the replicas it lost under
``/oncelog/offline_replicas/<id>`` and announces it with Kafka's
``/log_dir_event_notification/log_dir_event_<seq>``: a pass reads every broker's offline
replicas (those replicas are not eligible: leader_election.py's D1, L1) and deletes the
notifications it has read, as Kafka's controller does once it has handled them.

A deletion removes the topic's state, partition and assignment znodes, its config and the
deletion request, in one such transaction; each broker's replica manager drops its local
replicas when the assignment goes (Kafka's controller waits for the replicas to answer
StopReplica first; here the brokers follow the znodes). A topic whose assignment's bytes
were read but are not whole (corrupt, id-less, without partitions) is deleted from a fresh
listing of its partitions (unwhole_topics.py); one that cannot be read at all (a NoAuth)
waits, said once. An assignment lacking only its topic_id is named first (T1).

A broker shutting down (its ``/oncelog/controlled_shutdown/<id>``) is told, in that znode,
once a pass has landed every decision (``_tell_moved``): it leads nothing another eligible
ISR member could lead, and stops without reading the states written.

A broker that bounced (killed and started again, or its session expired and it registered
again) between two passes may have come back with less than it had: a wiped disk, a power
loss. As Kafka's controller treats its bounced brokers (a newer broker epoch: failure, then
startup), a pass counts a broker whose registration is newer than the one this controller
last saw (the ephemeral znode's czxid) as dead until a pass has landed every decision: L1
and F1/F3 take it out of the ISR and move its leaderships, and its leader adds it back once
it has caught up. Otherwise it would stay in the ISR with an empty log, electable.

Passes are woken by watches (``/brokers/ids``, ``/brokers/topics``, ``/admin/
delete_topics``, the controlled-shutdown requests, every topic's assignment and config and
every state znode, through watched_topics.py: a reassignment completes when its ISR
grows, the log directory events), by a new controllership, by an ElectLeaders request, and
at least every third of the session timeout. The topics and states are kept between passes
(watched_topics.py) and read again only where a watch says they changed, pipelined, so
a pass costs a few requests plus one per state that changed and one transaction per 200
partitions written (a request each was 7-10 s a pass over 1,000 partitions in a loaded
broker: docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kazoo.exceptions import ConnectionLoss, NoNodeError, SessionExpiredError
from kio.schema.errors import ErrorCode

from ..metadata.store import MetadataUnavailable
from . import unwhole_topics
from . import znodes as zn
from .batches import gather, outcome, settle
from .leader_election import (
    HANDOVER_TIMEOUT_S,
    Ask,
    Decision,
    Facts,
    HandoverClock,
    election_answer,
    election_decision,
    name_topic,
    pass_decision,
    rebalance,
)
from .membership import SILENCE_FRACTION, ClusterMember, ControllerMoved
from .topic_admin import reassignment_target
from .unreadable import unreadable
from .wakeups import woken
from .watched_topics import TopicRead, WatchedTopics, read_states, read_topics

log = logging.getLogger(__name__)

# The whole picture is read again this often whatever the watches say: a safety net against
# a change no watch or mark caught (a bug), costing one full read (about 1,000 requests,
# 0.8 s of CPU at 1,000 partitions: docs/benchmarks.md) every 5 minutes, 0.3% of a core.
_FULL_READ_S = 300.0
_RETRY_PAUSE_S = 0.05  # after a transaction lost to a concurrent write: read again soon
_FENCED_MARGIN_S = 1.0  # H3 after a cut-off leader fenced itself: handover_bound_s
# Config change notifications kept (Kafka purges them after 15 minutes): a broker that
# missed more than these (its session expired) reads every topic's config again anyway.
CONFIG_CHANGES_KEPT = 100


def handover_bound_s(session_timeout_ms: int) -> float:
    """H3's bound (leader_election.py): HANDOVER_TIMEOUT_S, or longer with a long session.
    A leader cut off from ZooKeeper reads no ask and goes on answering acks=1 on the append
    until it fences itself, SILENCE_FRACTION of its session timeout after ZooKeeper last
    heard from it (membership.py's V3): H3 moves its leadership only after that."""
    return max(HANDOVER_TIMEOUT_S,
               session_timeout_ms * SILENCE_FRACTION / 1000 + _FENCED_MARGIN_S)


__all__ = ["Controller", "TopicRead"]


class Controller:
    def __init__(self, member: ClusterMember, unclean_default: Callable[[], bool],
                 rebalance: Callable[[], tuple[bool, float, int]] | None = None) -> None:
        """``rebalance``: (auto.leader.rebalance.enable, leader.imbalance.check.interval
        .seconds, leader.imbalance.per.broker.percentage), read at each check."""
        self.member = member
        self.rebalance_configs = rebalance
        self._next_rebalance: float | None = None  # monotonic; None: not acting yet
        self.zk = member.zk
        self.store = member.store
        self.unclean_default = unclean_default
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._recheck_s = self.store.session_timeout_ms / 3000
        self._acting_epoch = -1
        self._next_full_read = 0.0
        self.passes = 0
        # broker id -> czxid of the registration last seen; those counted dead since they
        # bounced, until a pass lands every decision (the pass thread and ElectLeaders read)
        self._registrations: dict[int, int] = {}
        self._bounced: set[int] = set()
        # the same, owed per partition a pass skipped (leader_election.py's X1, *live*):
        # (topic, partition; None: every partition of a topic never read) -> brokers
        self._owed: dict[tuple[str, int | None], frozenset[int]] = {}
        self._registrations_lock = threading.Lock()
        self._handover_lock = threading.Lock()  # the passes' thread and ElectLeaders'
        self._handovers = HandoverClock()
        self.handover_bound_s = handover_bound_s(self.store.session_timeout_ms)
        self._told: set[int] = set()  # brokers shutting down told their moves landed
        # name -> the topic id this broker's metadata cache last read of it, for T1 when the
        # pass has read none: a controller elected after an old tool rewrote a known topic
        # without its id, before the last controller named it
        self.known_topic_id: Callable[[str], str | None] = lambda name: None
        self._waits: set[str] = set()  # deletions said to wait for what cannot be read
        # what the passes read, kept between them and read again where watches say it
        # changed (watched_topics.py)
        self.context = WatchedTopics(self.store, self.wake)

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self.member.on_elected = self.wake
        self._thread = threading.Thread(target=self._run, name="controller", daemon=True)
        self._thread.start()
        self._watch_controller()

    def close(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    def wake(self, _event=None) -> None:
        self._wake.set()

    def _handover_due(self) -> float | None:
        """When the first outstanding ask reaches H3's bound: a pass then, not at the next
        recheck (a third of the session timeout later) or watch."""
        with self._handover_lock:
            return self._handovers.next_due(time.monotonic(), self.handover_bound_s)

    def _watch_controller(self) -> None:
        try:
            self.store.op(self.zk.exists_async, zn.CONTROLLER, watch=self.wake)
        except Exception as exc:  # the pass re-arms it
            log.debug("watch on /controller not set: %r", exc)

    def _run(self) -> None:
        for _ in woken(self._stopped, self._wake, self._recheck_s, self._handover_due):
            view = self.member.controller
            if not self.member.is_controller or not self.zk.connected:
                self._acting_epoch = -1
                self._watch_controller()
                continue
            if view.epoch != self._acting_epoch:
                log.info("broker %d acts as controller (epoch %d)", self.member.broker_id,
                         view.epoch)
                self._acting_epoch = view.epoch
                self._next_rebalance = None
                with self._registrations_lock:  # a new controllership starts from what is
                    self._registrations.clear()
                    self._bounced.clear()
                    self._owed.clear()
                self.context.reset()
                self._told.clear()
                with self._handover_lock:  # H3 counts from this controllership's first look
                    self._handovers = HandoverClock()
                self._next_full_read = time.monotonic() + _FULL_READ_S
            elif time.monotonic() >= self._next_full_read:
                self.context.reset()
                self._next_full_read = time.monotonic() + _FULL_READ_S
            try:
                if self.pass_once():
                    self._wake.set()
            except ControllerMoved as exc:
                log.warning("controller writes refused: %s", exc)
                self.member._wake.set()  # read who the controller is now
            except (MetadataUnavailable, ConnectionError, ConnectionLoss,
                    SessionExpiredError) as exc:
                log.warning("controller pass cut short by ZooKeeper: %r", exc)
            except Exception:
                log.exception("controller pass failed; retrying from a fresh read")
                self.context.reset()  # the same picture might fail the same way forever
                self._stopped.wait(_RETRY_PAUSE_S)
                self._wake.set()

    # --- one pass ------------------------------------------------------------------------

    def _op(self, call_async, *args, **kwargs):
        return self.store.op(call_async, *args, **kwargs)

    def _gather(self, calls):
        """One round trip for all of them (batches.gather)."""
        return gather(self.store, calls)

    def live_brokers(self) -> frozenset[int]:
        """The registered brokers, less those that bounced since this controller last saw
        them (counted dead until a pass lands every decision)."""
        return self._live_and_absent()[0]

    def _live_and_absent(self) -> tuple[frozenset[int], dict[int, int]]:
        """``live_brokers``, and the brokers known registered before and not now, with the
        registration (czxid) each was last seen with. An absent broker's registration is
        kept until a pass that counted it dead lands every decision (``_forget``): only
        then is it out of every ISR, and its return no bounce. A reader that merely saw it
        gone (an ElectLeaders round, a pass whose write lost a race) acted on nothing, and
        forgetting there made a quick bounce look like a first registration: the broker
        stayed in every ISR and kept leading, whatever log it came back with."""
        ids = self._op(self.zk.get_children_async, zn.BROKER_IDS, watch=self.wake)
        stats = self._gather([lambda b=b: self.zk.exists_async(f"{zn.BROKER_IDS}/{b}")
                              for b in ids])
        found = {int(b): stat.czxid for b, stat in zip(ids, stats, strict=True)
                 if stat is not None and not isinstance(stat, Exception)}  # gone meanwhile
        with self._registrations_lock:
            for broker, czxid in found.items():
                if czxid > self._registrations.get(broker, czxid):
                    log.info("broker %d registered again (it bounced): out of every ISR "
                             "until it has caught up", broker)
                    self._bounced.add(broker)
                self._registrations[broker] = czxid
            absent = {b: czxid for b, czxid in self._registrations.items() if b not in found}
            return frozenset(found) - self._bounced, absent

    def _forget(self, absent: dict[int, int]) -> None:
        """A pass counted these brokers dead and landed every decision: each is out of
        every ISR, so a later registration of it is a first one (unless it came back
        meanwhile and another reader saw it: then the czxid moved on, and it stays)."""
        with self._registrations_lock:
            for broker, czxid in absent.items():
                if self._registrations.get(broker) == czxid:
                    del self._registrations[broker]

    def shutting_down(self) -> frozenset[int]:
        return frozenset(int(b) for b in self._op(
            self.zk.get_children_async, zn.CONTROLLED_SHUTDOWN, watch=self.wake))

    def offline_replicas(self) -> tuple[dict[tuple[str, int], frozenset[int]], list[str]]:
        """(partition -> the brokers whose replica of it is on a failed log directory, the
        log directory events seen before reading them)."""
        from kazoo.exceptions import NoNodeError

        events, brokers = self._gather([
            lambda: self.zk.get_children_async(zn.LOG_DIR_EVENT_NOTIFICATION, watch=self.wake),
            lambda: self.zk.get_children_async(zn.OFFLINE_REPLICAS, watch=self.wake)])
        for got in (events, brokers):
            if isinstance(got, Exception) and not isinstance(got, NoNodeError):
                raise got
        if isinstance(events, Exception):  # absent: none yet, watched until it is made
            self._op(self.zk.exists_async, zn.LOG_DIR_EVENT_NOTIFICATION, watch=self.wake)
            events = []
        brokers = [] if isinstance(brokers, Exception) else brokers
        found: dict[tuple[str, int], set[int]] = {}
        for broker, got in zip(brokers, self._gather(
                [lambda b=b: self.zk.get_async(f"{zn.OFFLINE_REPLICAS}/{b}")
                 for b in brokers]), strict=True):
            if isinstance(got, Exception):
                continue  # deleted since listed: its broker restarted
            for key in zn.decode_offline_replicas(got[0]):
                found.setdefault(key, set()).add(int(broker))
        return {k: frozenset(v) for k, v in found.items()}, events

    def read_topics(self, names: list[str] | None = None) -> list[TopicRead]:
        """The named topics (None: every one) read afresh, unwatched, as the picture reads
        them (watched_topics.read_topics: only absence is read as absence)."""
        if names is None:
            names = sorted(self._op(self.zk.get_children_async, zn.BROKER_TOPICS,
                                    watch=self.wake))
        read, _, _ = read_topics(self.store, names)
        topics = [read[n] for n in names if n in read]
        keys = [(t.name, p) for t in topics for p in sorted(t.assignment.partitions)
                if p in t.partition_nodes]
        by_name = {t.name: t for t in topics}
        for (name, p), got in read_states(self.store, keys).items():
            if isinstance(got, Exception):  # unreadable.py: that partition alone
                by_name[name].bad_states[p] = str(got)
            elif got is not None:
                by_name[name].states[p] = got
        return topics

    def pass_once(self) -> bool:
        """One pass over every topic; True when something was written or lost to a
        concurrent write (another pass should follow at once)."""
        self.passes += 1
        self._watch_controller()
        live, absent = self._live_and_absent()
        with self._registrations_lock:  # those this pass counts dead (an ElectLeaders on
            counted_dead = set(self._bounced)  # another thread may find more meanwhile)
        shutting = self.shutting_down() & live
        deleting = set(self._op(self.zk.get_children_async, zn.DELETE_TOPICS, watch=self.wake))
        offline, events = self.offline_replicas()
        again = False
        topics = self.context.read()  # after the requests above: caught up with them
        chosen: list[tuple[TopicRead, dict[int, Decision]]] = []
        skipped: list[tuple[str, int | None]] = []  # X1: owed every broker counted dead
        decided: list[tuple[str, int | None]] = []
        for topic in topics:
            if topic.name in deleting:
                if topic.problem is None:
                    self._delete(topic)
                    again = True
                    continue
                if topic.read_version is None:
                    self._say_waits(topic)
                elif (deleted := self._delete_unwhole(topic)) is not None:
                    again = True  # landed: look again; lost a race: read again
                    if deleted:
                        continue
                # not deleted: skipped as any unreadable topic (X1, what bounced is owed)
            unnamed = topic.unnamed is not None and topic.name not in deleting
            named = name_topic(unnamed, topic.name in deleting,
                               self._known_id(topic) if unnamed else None)
            if named is not None:
                self._name(topic, named)
                again = True
            if topic.never_read:
                skipped.append((topic.name, None))
            decisions = {}
            for p in sorted(topic.assignment.partitions):
                facts = self.facts(topic, p, live, shutting, offline)
                _, decision = self._decide(topic.name, p, facts, Ask.PASS)
                (skipped if decision.row == "X1" else decided).append((topic.name, p))
                if decision.state is not None:
                    decisions[p] = decision
                # a reassignment completes when its ISR grows (the leader's write): the
                # context's watch on every state znode wakes the pass
            if decisions:
                chosen.append((topic, decisions))
                again = True  # landed: look again; lost a race: read again
        try:
            landed = self.write(chosen)
        except BaseException:  # an answer lost: the write may have landed all the same
            for topic, decisions in chosen:
                self.context.mark(topic.name)
                for p in decisions:
                    self.context.mark(topic.name, p)
            raise
        self._settle_owed(topics, counted_dead, skipped, decided, landed)
        if all(landed.values()):
            self._forget(absent)
        with self._handover_lock:
            self._handovers.keep_only({t.name for t in topics})
        if all(landed.values()):
            self._tell_moved(shutting)
        for name in deleting - {t.name for t in topics}:  # nothing left but the request
            self.member.controller_transaction(
                lambda txn, n=name: txn.delete(zn.delete_topic_path(n)))
        self._waits &= deleting
        self._purge_config_changes()
        self._purge_isr_change_notifications()
        if not again and self._rebalance_due():
            again = self.rebalance(topics, live, shutting, offline)
        if events and not again:  # handled: every decision they called for is written
            self._gather([lambda e=e: self.zk.delete_async(
                f"{zn.LOG_DIR_EVENT_NOTIFICATION}/{e}") for e in events])
        return again

    def _settle_owed(self, topics: list[TopicRead], counted_dead: set[int],
                     skipped: list[tuple[str, int | None]],
                     decided: list[tuple[str, int | None]],
                     landed: dict[tuple[str, int], bool]) -> None:
        """leader_election.py's *live*: once every decision of the pass landed, the brokers
        it counted dead since they bounced are out of every ISR it decided on, and are
        owed only to the partitions it skipped (X1), until a decision on each lands."""
        names = {t.name for t in topics}
        with self._registrations_lock:
            if not self._owed and not (skipped and counted_dead):  # the usual pass
                if all(landed.values()):
                    self._bounced -= counted_dead
                return
            for key in decided + skipped:  # a topic read at last: its partitions owe
                whole = self._owed.get((key[0], None))
                if whole and key[1] is not None:
                    self._owed[key] = self._owed.get(key, frozenset()) | whole
            for name in {t for t, p in decided + skipped if p is not None}:
                self._owed.pop((name, None), None)
            for key in decided:
                if landed.get(key, True):  # nothing to write, or written
                    self._owed.pop(key, None)
            if not all(landed.values()):
                return
            for key in skipped:
                if counted_dead:
                    self._owed[key] = self._owed.get(key, frozenset()) | counted_dead
            self._bounced -= counted_dead  # out of every ISR now (or the last of one)
            for key in [k for k in self._owed if k[0] not in names]:
                del self._owed[key]  # deleted

    def _owed_at(self, name: str, p: int) -> frozenset[int]:
        with self._registrations_lock:
            return self._owed.get((name, p), frozenset()) | \
                self._owed.get((name, None), frozenset())

    def _tell_moved(self, shutting: frozenset[int]) -> None:
        """Every decision of this pass landed: each broker shutting down leads nothing
        another eligible ISR member could (F1 moved it, S1 keeps it) among the partitions
        it could read (one skipped as unreadable, X1, is left as it is), which its
        controlled-shutdown znode now says; once per request (a new znode is a new one).
        Written as the decisions were, only while this controller's epoch holds: a deposed
        one's word could stop a broker whose moves nobody made."""
        self._told &= shutting
        todo = sorted(shutting - self._told)
        if not todo:
            return

        def commit(brokers: list[int]) -> list[object]:
            return self.member.controller_transaction(lambda txn: [txn.set_data(
                f"{zn.CONTROLLED_SHUTDOWN}/{b}", zn.CONTROLLED_SHUTDOWN_MOVED)
                for b in brokers], partial=True)

        for broker, answer in zip(todo, settle(todo, commit), strict=True):
            if isinstance(answer, Exception):  # gone: it stopped, or its session ended
                log.debug("controlled shutdown of broker %d not told: %r", broker, answer)
            else:
                self._told.add(broker)

    def _rebalance_due(self) -> bool:
        if self.rebalance_configs is None:
            return False
        enabled, interval_s, _ = self.rebalance_configs()
        now = time.monotonic()
        if self._next_rebalance is None:  # a new controller looks one interval later
            self._next_rebalance = now + interval_s
        if not enabled or now < self._next_rebalance:
            return False
        self._next_rebalance = now + interval_s
        return True

    def rebalance(self, topics: list[TopicRead], live: frozenset[int],
                  shutting: frozenset[int],
                  offline: dict[tuple[str, int], frozenset[int]]) -> bool:
        """Kafka's auto leader rebalance (leader_election.py's RB rows): a preferred
        election for each partition of a broker leading too few of those it is preferred
        for; True when something was written."""
        assert self.rebalance_configs is not None
        enabled, _, percentage = self.rebalance_configs()
        keys = [(t, p) for t in topics for p in sorted(t.assignment.partitions)
                if t.states.get(p) is not None and t.assignment.partitions[p]
                and t.problem is None and p not in t.bad_states  # unreadable: left alone
                and reassignment_target(t.assignment, p) is None]  # as Kafka: not those
        asked = rebalance([(t.assignment.partitions[p][0], t.states[p][0].leader)
                           for t, p in keys], enabled, percentage)
        decisions: dict[str, tuple[TopicRead, dict[int, Decision]]] = {}
        for i in asked:
            topic, p = keys[i]
            facts = self.facts(topic, p, live, shutting, offline)
            _, decision = self._decide(topic.name, p, facts, Ask.PREFERRED)
            if decision.state is not None:  # P2 (or its handover); P3 (not live, not in sync) waits
                decisions.setdefault(topic.name, (topic, {}))[1][p] = decision
        self.write(list(decisions.values()))
        return bool(decisions)

    def _purge_config_changes(self) -> None:
        changes = sorted(self._op(self.zk.get_children_async, zn.CONFIG_CHANGES))
        self._gather([lambda c=c: self.zk.delete_async(f"{zn.CONFIG_CHANGES}/{c}")
                      for c in changes[:-CONFIG_CHANGES_KEPT]])

    def _purge_isr_change_notifications(self) -> None:
        """Every ``isr_change_<seq>`` the leaders wrote (znodes.py): nothing here needs
        them, and left they would pile up in ZooKeeper for as long as the cluster runs."""
        try:
            notes = self._op(self.zk.get_children_async, zn.ISR_CHANGE_NOTIFICATION)
        except NoNodeError:  # no ISR has changed yet
            return
        self._gather([lambda n=n: self.zk.delete_async(f"{zn.ISR_CHANGE_NOTIFICATION}/{n}")
                      for n in notes])

    def facts(self, topic: TopicRead, p: int, live: frozenset[int],
              shutting: frozenset[int],
              offline: dict[tuple[str, int], frozenset[int]] | None = None) -> Facts:
        found = topic.states.get(p)
        unclean = topic.configs.get("unclean.leader.election.enable")
        return Facts(replicas=topic.assignment.partitions.get(p, ()),
                     state=None if found is None else found[0], live=live,
                     shutting_down=shutting,
                     unclean=self.unclean_default() if unclean is None
                     else unclean.strip().lower() == "true",
                     target=reassignment_target(topic.assignment, p),
                     offline=(offline or {}).get((topic.name, p), frozenset()),
                     bounced=self._owed_at(topic.name, p),
                     unreadable=topic.problem or topic.bad_states.get(p))

    def write(self, chosen: list[tuple[TopicRead, dict[int, Decision]]]
              ) -> dict[tuple[str, int], bool]:
        """Every topic's decisions in transactions of at most ``batches.BATCH_ITEMS``
        partitions (batches.py), each op conditional as one topic's transaction was: each
        topic's assignment znode at its version, each state znode at its version, and the
        controller epoch. Whether each partition's decision landed (False: its znode, or
        its topic's, changed since it was read; the next pass reads it again)."""
        landed: dict[tuple[str, int], bool] = {}
        items = []
        for topic, decisions in chosen:
            if any(d.replicas is not None for d in decisions.values()):
                # A1 rewrites the assignment: the topic's decisions go in one transaction
                ok = self._write(topic, decisions)
                landed.update({(topic.name, p): ok for p in decisions})
                if not ok:
                    self.context.mark(topic.name)
                    for p in decisions:
                        self.context.mark(topic.name, p)
            else:
                items += [(topic, p, decisions[p]) for p in sorted(decisions)]
        fates = settle(items, self._commit_states)
        lost = set()
        for (topic, p, decision), fate in zip(items, fates, strict=True):
            landed[(topic.name, p)] = not isinstance(fate, Exception)
            if isinstance(fate, Exception):
                lost.add(topic.name)
                self.context.mark(topic.name)  # its assignment, or this state, moved on
                self.context.mark(topic.name, p)
                continue
            state = decision.state
            log.info("partition %s-%d: %s leader %d epoch %d isr %s", topic.name, p,
                     decision.row, state.leader, state.leader_epoch, list(state.isr))
        if lost:
            log.info("controller writes for %d partitions of %s lost to concurrent changes; "
                     "reading again", sum(not ok for ok in landed.values()), sorted(lost))
            self._stopped.wait(_RETRY_PAUSE_S)
        return landed

    def _commit_states(self, items: list[tuple[TopicRead, int, Decision]]) -> list[object]:
        """One transaction for ``items`` (grouped by topic): each one's outcome."""
        spans: list[tuple[range, range]] = []  # per item: its topic's ops, its own ops

        def build(txn) -> None:
            n = 0
            topic_ops: dict[str, range] = {}
            for topic, p, decision in items:
                if topic.name not in topic_ops:
                    first = n
                    txn.check(zn.topic_path(topic.name), topic.version)
                    n += 1
                    if not topic.has_partitions_node and any(
                            t is topic and t.states.get(q) is None for t, q, _ in items):
                        txn.create(zn.partitions_path(topic.name),
                                   zn.encode_partitions_node(topic.assignment.topic_id))
                        n += 1
                    topic_ops[topic.name] = range(first, n)
                first = n
                path = zn.partition_state_path(topic.name, p)
                found = topic.states.get(p)
                if found is None:
                    if p not in topic.partition_nodes:
                        txn.create(f"{zn.partitions_path(topic.name)}/{p}", b"")
                        n += 1
                    txn.create(path, decision.state.encode())
                else:
                    txn.set_data(path, decision.state.encode(), version=found[1])
                n += 1
                spans.append((topic_ops[topic.name], range(first, n)))

        results = self.member.controller_transaction(build, partial=True)
        answers = [outcome([results[i] for i in (*shared, *own)]) for shared, own in spans]
        for (topic, p, _), answer in zip(items, answers, strict=True):
            if not isinstance(answer, Exception):  # later transactions build on it
                topic.has_partitions_node = True
                topic.partition_nodes.add(p)
        return answers

    def _write(self, topic: TopicRead, decisions: dict[int, Decision]) -> bool:
        """One transaction for the topic's decisions; False when it lost a race (a znode
        changed since it was read)."""
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

        assignment = topic.assignment
        completed = {p: d.replicas for p, d in decisions.items() if d.replicas is not None}

        def build(txn) -> None:
            if completed:
                partitions = {**assignment.partitions, **completed}
                adding = {p: r for p, r in assignment.adding_replicas.items()
                          if p not in completed}
                removing = {p: r for p, r in assignment.removing_replicas.items()
                            if p not in completed}
                txn.set_data(zn.topic_path(topic.name), zn.TopicAssignment(
                    assignment.topic_id, partitions, adding, removing).encode(),
                    version=topic.version)
            else:
                txn.check(zn.topic_path(topic.name), topic.version)
            if not topic.has_partitions_node and any(
                    topic.states.get(p) is None for p in decisions):
                txn.create(zn.partitions_path(topic.name),
                           zn.encode_partitions_node(assignment.topic_id))
            for p, decision in sorted(decisions.items()):
                path = zn.partition_state_path(topic.name, p)
                found = topic.states.get(p)
                if found is None:
                    if p not in topic.partition_nodes:
                        txn.create(f"{zn.partitions_path(topic.name)}/{p}", b"")
                    txn.create(path, decision.state.encode())
                else:
                    txn.set_data(path, decision.state.encode(), version=found[1])

        try:
            self.member.controller_transaction(build)
        except (BadVersionError, NodeExistsError, NoNodeError) as exc:
            log.info("controller writes for topic %s lost to a concurrent change (%r); "
                     "reading again", topic.name, exc)
            self._stopped.wait(_RETRY_PAUSE_S)
            return False
        for p, decision in sorted(decisions.items()):
            state = decision.state
            log.info("partition %s-%d: %s leader %d epoch %d isr %s%s", topic.name, p,
                     decision.row, state.leader, state.leader_epoch, list(state.isr),
                     f" replicas {list(decision.replicas)}" if decision.replicas else "")
        return True

    def _delete(self, topic: TopicRead) -> None:
        from kazoo.exceptions import BadVersionError, NoNodeError, NotEmptyError

        def build(txn) -> None:
            for p in sorted(topic.partition_nodes):
                if p in topic.states or p in topic.bad_states:
                    txn.delete(zn.partition_state_path(topic.name, p))
                txn.delete(f"{zn.partitions_path(topic.name)}/{p}")
            if topic.has_partitions_node:
                txn.delete(zn.partitions_path(topic.name))
            txn.delete(zn.topic_path(topic.name), version=topic.version)
            txn.delete(zn.delete_topic_path(topic.name))

        try:
            self.member.controller_transaction(build)
        except (BadVersionError, NoNodeError, NotEmptyError) as exc:
            # NotEmpty: a partition znode the picture does not hold (made meanwhile)
            log.info("deleting topic %s lost to a concurrent change (%r); reading again",
                     topic.name, exc)
            self.context.mark(topic.name)
            self._stopped.wait(_RETRY_PAUSE_S)
            return
        self._deleted(topic)

    def _deleted(self, topic: TopicRead) -> None:
        from kazoo.exceptions import NoNodeError

        # Its config goes after it: a topic re-created meanwhile writes its own.
        try:
            self._op(self.zk.delete_async, zn.topic_config_path(topic.name))
        except NoNodeError:
            pass
        self.context.forget(topic.name)
        self._waits.discard(topic.name)
        log.info("deleted topic %s", topic.name)

    def _delete_unwhole(self, topic: TopicRead) -> bool | None:
        """A deletion asked for a topic whose assignment's bytes were read but are not
        whole (unwhole_topics.py): True when it landed, False when it lost a race (read
        again), None when its partitions cannot be listed (it waits)."""
        try:
            unwhole_topics.delete(self.member, self.store, topic)
        except unwhole_topics.LOST as exc:
            log.info("deleting topic %s lost to a concurrent change (%r); reading again",
                     topic.name, exc)
            self.context.mark(topic.name)
            self._stopped.wait(_RETRY_PAUSE_S)
            return False
        except Exception as exc:
            if (bad := unreadable(exc)) is None:
                raise
            self._say_waits(topic, str(bad))
            return None
        self._deleted(topic)
        return True

    def _say_waits(self, topic: TopicRead, why: str | None = None) -> None:
        """Once per deletion: it waits for what cannot be read (a NoAuth)."""
        if topic.name not in self._waits:
            self._waits.add(topic.name)
            log.warning("deleting topic %s waits: %s", topic.name, why or topic.problem)

    def _known_id(self, topic: TopicRead) -> str | None:
        """T1's id of an unnamed topic: the one recorded with its partitions, else the one
        last read of it (kept as last read), else the one this broker's metadata cache
        last read."""
        return (unwhole_topics.recorded_topic_id(self.store, topic.name)
                or topic.assignment.topic_id or self.known_topic_id(topic.name))

    def _name(self, topic: TopicRead, topic_id: str) -> None:
        """T1: the topic id written; the topic is read again at the next pass."""
        try:
            unwhole_topics.write_topic_id(self.member, topic, topic_id)
        except unwhole_topics.LOST as exc:
            log.info("naming topic %s lost to a concurrent change (%r); reading again",
                     topic.name, exc)
            self._stopped.wait(_RETRY_PAUSE_S)
        else:
            log.info("topic %s: T1 its assignment had no topic_id (pre-2.8 tooling): "
                     "named %s", topic.name, topic_id)
        self.context.mark(topic.name)

    # --- ElectLeaders --------------------------------------------------------------------

    def _decide(self, name: str, p: int, facts: Facts, ask: Ask
                ) -> tuple[str | None, Decision]:
        """One partition's decision, a pass's or an election's, through the H rows (the H
        row taken, said in the log when it is worth saying, and the decision)."""
        with self._handover_lock:
            waited = self._handovers.waited((name, p), facts.state, time.monotonic())
        epoch = self.member.controller.epoch
        row, decision = pass_decision(facts, waited, epoch, self.handover_bound_s) \
            if ask is Ask.PASS else \
            election_decision(facts, ask, waited, epoch, self.handover_bound_s)
        self._say_handover(name, p, row, facts)
        return row, decision

    def _say_handover(self, name: str, p: int, row: str | None, facts: Facts) -> None:
        state = facts.state
        if row == "H4":
            log.info("partition %s-%d: H4 asks broker %d to hand its leadership over",
                     name, p, state.leader)
        elif row == "H2":
            log.info("partition %s-%d: H2 broker %d handed its leadership over", name, p,
                     state.leader)
        elif row == "H3":
            log.warning("partition %s-%d: H3 broker %d did not say its ISR holds what it "
                        "acknowledged within %.0fs; moving its leadership all the same",
                        name, p, state.leader, self.handover_bound_s)

    def elect(self, wanted: list[tuple[str, int]] | None, ask: Ask,
              handing_over: bool = False
              ) -> tuple[dict[tuple[str, int], tuple[ErrorCode, str | None]],
                         list[tuple[str, int]]]:
        """One round of ElectLeaders on the controller (``wanted`` None: every partition
        whose preferred replica does not lead): each partition's answer (rows E1-E4), and
        the partitions still waiting for their leader's handover, which the caller asks
        about again (``handing_over``) until they are answered or its time is up."""
        live = self.live_brokers()
        shutting = self.shutting_down() & live
        offline, _ = self.offline_replicas()
        names = None if wanted is None else sorted({t for t, _ in wanted})
        topics = {t.name: t for t in self.read_topics(names)}
        if wanted is None:
            wanted = [(t.name, p) for t in topics.values() for p in t.assignment.partitions]
        answers: dict[tuple[str, int], tuple[ErrorCode, str | None]] = {}
        chosen: dict[str, tuple[TopicRead, dict[int, Decision]]] = {}
        waiting: list[tuple[str, int]] = []
        for name, p in wanted:
            topic = topics.get(name)
            if topic is None or (p not in topic.assignment.partitions
                                 and not topic.never_read):  # never read: X1 below
                answers[(name, p)] = (ErrorCode.unknown_topic_or_partition,
                                      "The partition does not exist.")
                continue
            facts = self.facts(topic, p, live, shutting, offline)
            handover, decision = self._decide(name, p, facts, ask)
            if handover in ("H4", "H5"):
                waiting.append((name, p))
                if decision.state is not None:  # the ask (H4), or an ISR shrink meanwhile
                    chosen.setdefault(name, (topic, {}))[1][p] = decision
                continue
            if handing_over and decision.row == "P1":
                answers[(name, p)] = election_answer(True, True)  # E3: elected by a pass
                continue
            if decision.state is None:
                answers[(name, p)] = (decision.error, _ELECTION_MESSAGES.get(
                    decision.error) if decision.row != "X1" else
                    f"its znodes in ZooKeeper cannot be read: {facts.unreadable}")
                continue
            chosen.setdefault(name, (topic, {}))[1][p] = decision
        for key, ok in self.write(list(chosen.values())).items():
            if key in waiting:
                continue  # E4: its handover asked or awaited; looked at again
            answer = election_answer(ok, handing_over)
            if answer is None:
                waiting.append(key)  # E4: a pass wrote first, perhaps this very election
            else:
                answers[key] = answer
        return answers, waiting


_ELECTION_MESSAGES = {
    ErrorCode.election_not_needed: "Leader election not needed for topic partition.",
    ErrorCode.preferred_leader_not_available:
        "The preferred leader is not live or not in the ISR.",
    ErrorCode.eligible_leaders_not_available: "No live replica can become leader.",
    ErrorCode.unknown_topic_or_partition: "The partition does not exist.",
}
