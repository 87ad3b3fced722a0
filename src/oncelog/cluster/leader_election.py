"""Every decision the controller takes about one partition's leader, ISR and replicas.

``decide`` is given what ZooKeeper holds of one partition (its assignment, its state znode,
an ongoing reassignment's target), which brokers are live and which are shutting down, and
what is asked (a controller pass, a preferred or an unclean election); it answers with one
Decision: the row taken, the state (and replica list) to write, or an ElectLeaders error.
It writes nothing: the controller (controller.py) writes the answer in one conditional
ZooKeeper transaction fenced by its epoch, and reads again when that fails.

Words: *live*: registered, and not a broker counted dead for this partition since it
bounced (``Facts.bounced``: it registered again within the session timeout, perhaps with a
wiped disk; the controller counts it dead for every partition until a pass lands every
decision, and for a partition that pass skipped (X1) until a decision on that partition
lands: else, read again at epoch E, a state naming it leader or ISR member would find it
live and leave it there, and it would lead an empty log); *eligible*: live, not shutting
down, and its replica of this partition not on a log
directory its broker reported failed (``/oncelog/offline_replicas/<id>``, announced by
Kafka's ``/log_dir_event_notification``: rows D1, F3, L1); *first ... in assignment order*: the
assignment's replica order (its first replica is the preferred leader). The leader's replica
manager adds a replica that caught up back to the ISR (never the controller).

A controller pass (``Ask.PASS``), rows in the order they are tried:

| row | partition as found                                 | decision                              |
|-----|----------------------------------------------------|---------------------------------------|
| X1  | a znode of it (its topic's assignment, config or   | nothing: no decision on what cannot   |
|     | partitions list, its state) cannot be read through | be read (kept as last read, read again|
|     | its own fault (unreadable.py: NoAuth, not JSON)    | at the next pass); ElectLeaders       |
|     |                                                    | answers UNKNOWN_SERVER_ERROR for it   |
| N1  | no state znode, an eligible replica                | CREATE: leader = first eligible       |
|     |                                                    | replica, ISR = eligible replicas,     |
|     |                                                    | leader_epoch 0                        |
| N2  | no state znode, no eligible replica                | WAIT: written once one is             |
| F1  | leader -1, dead or shutting down; an eligible      | ELECT it: first eligible ISR member,  |
|     | ISR member                                         | ISR = eligible ISR members, epoch + 1 |
| D1  | the leader's replica on a failed log directory, an | as F1 (Kafka: the replica goes        |
|     | eligible ISR member                                | offline, another in-sync one leads)   |
| F2  | as F1 but no eligible ISR member, unclean election | ELECT the first eligible replica      |
|     | enabled, an eligible replica                       | (unclean), ISR = [it], epoch + 1      |
| F3  | leader dead, shutting down or its replica on a     | leader -1 (OFFLINE); ISR = its live   |
|     | failed log directory, nothing eligible to lead (a  | members, or as it was when none is    |
|     | shutting-down leader that is still alive: S1       | (so the last in-sync replicas stay    |
|     | instead)                                           | electable when they return), epoch + 1|
| S1  | leader alive but shutting down, no other eligible  | KEEP it (controlled shutdown cannot   |
|     | ISR member                                         | move it; it goes offline when it dies)|
| F4  | leader -1, nothing eligible                        | KEEP (offline until an ISR member     |
|     |                                                    | returns, F1, or unclean is enabled)   |
| A1  | leader eligible; a reassignment's target replicas  | COMPLETE: replicas = target, ISR =    |
|     | all eligible and in the ISR                        | ISR within target; the leader stays   |
|     |                                                    | if in target, else first ISR member   |
|     |                                                    | of target leads, epoch + 1            |
| L1  | leader eligible, an ISR member not eligible        | SHRINK: ISR = eligible members, leader|
|     |                                                    | and leader_epoch kept                 |
| L2  | leader eligible, every ISR member eligible         | KEEP                                  |

Before its partitions, a pass takes one decision per topic (``name_topic``):

| row | topic as found                                     | decision                              |
|-----|----------------------------------------------------|---------------------------------------|
| T1  | its assignment whole but for a missing topic_id    | NAME it, at the version read: the id  |
|     | (pre-2.8 tooling: kafka-topics.sh --zookeeper,     | it had when an old tool rewrote it (a |
|     | AdminZkClient write version 1 without one), not    | new id would make every replica set   |
|     | being deleted                                      | its log aside): the one recorded in   |
|     |                                                    | its ``partitions`` znode, else the    |
|     |                                                    | one last read of it, else the one the |
|     |                                                    | controller's broker's metadata cache  |
|     |                                                    | last read; else a new random one      |
|     |                                                    | (Kafka's setTopicIds); its partitions |
|     |                                                    | are X1 until it lands                 |
| T2  | otherwise                                          | nothing                               |

ElectLeaders (``Ask.PREFERRED``, ``Ask.UNCLEAN``), only for partitions with a state:

| row | asked, partition as found                          | decision                              |
|-----|----------------------------------------------------|---------------------------------------|
| P1  | preferred, the preferred replica leads             | ELECTION_NOT_NEEDED                   |
| P2  | preferred, it is eligible and in the ISR           | ELECT it, ISR kept, epoch + 1         |
| P3  | preferred, otherwise                               | PREFERRED_LEADER_NOT_AVAILABLE        |
| U1  | unclean, the leader is eligible                    | ELECTION_NOT_NEEDED                   |
| U2  | unclean, an eligible ISR member                    | as F1                                 |
| U3  | unclean, an eligible replica                       | as F2, whatever the topic's config    |
| U4  | unclean, none                                      | ELIGIBLE_LEADERS_NOT_AVAILABLE        |

Auto leader rebalance (``rebalance``, Kafka's auto.leader.rebalance.enable): every
leader.imbalance.check.interval.seconds the controller looks, for each broker, at the
partitions whose preferred replica (the assignment's first) it is (those being reassigned
left out, as Kafka does):

| row | the broker's partitions                            | decision                              |
|-----|----------------------------------------------------|---------------------------------------|
| RB1 | auto.leader.rebalance.enable false                 | nothing                               |
| RB2 | the share it does not lead is above                | a preferred election (P1-P3) for each |
|     | leader.imbalance.per.broker.percentage             | it does not lead                      |
| RB3 | at or below it                                     | nothing                               |

A decision that moves the leadership off a live leader (P2 from ElectLeaders or the auto
rebalance, A1 completing a reassignment) first asks that leader to hand it over
(``hand_over``; not Kafka's, whose old leader acknowledges acks=1 until it reads the move,
then truncates what the new leader lacks): the state is written with the handover asked,
and the leader answers acks=1 only once its ISR has the batch, waits until its ISR holds
everything it acknowledged before, and writes the state ``ready`` (isr.py's H7-H9). The
ask rides on the state znode: the leader's and the controller's ISR writes (L1, A1 keeping
the leader) keep it.

| row | the decision, the partition's state                | written                               |
|-----|----------------------------------------------------|---------------------------------------|
| H1  | keeps the leader, or the leader is not eligible    | the decision (a dead, stopping or     |
|     | (dead, shutting down: K6 already, offline)         | offline leader has nothing to hand)   |
| H2  | moves a live leader that said ready (to any ask:   | the decision: the ask goes with it    |
|     | ready is about what it acknowledged, not the move) |                                       |
| H3  | ... asked, not ready, the bound since the          | the decision (logged: the ISR may lack|
|     | controller first saw the ask (HANDOVER_TIMEOUT_S,  | acks=1 records, as L3)                |
|     | longer with a long session: controller.py)         |                                       |
| H4  | ... not asked                                      | the state with the handover asked;    |
|     |                                                    | the move waits                        |
| H5  | ... asked, not ready, within the bound             | nothing: the leader's write wakes it  |
|     |                                                    | (H4, H5: the ISR without its members  |
|     |                                                    | that are not eligible, as L1)         |
| H6  | a state asked for a move that no longer applies    | the state without the ask             |

ElectLeaders' answer for a partition a preferred election moves (``election_answer``; a
request goes on asking about those waiting for a handover, at most its timeout and H3's
bound and a margin: broker/cluster_mode.py):

| row | the partition                                      | answer                                |
|-----|----------------------------------------------------|---------------------------------------|
| E1  | its decision written                               | NONE                                  |
| E2  | its write lost to a concurrent change, no handover | ELIGIBLE_LEADERS_NOT_AVAILABLE (try   |
|     | asked by this request                              | again)                                |
| E3  | a handover this request asked, the preferred       | NONE (elected by a pass, H2 or H3)    |
|     | replica leads now                                  |                                       |
| E4  | a handover asked or awaited (H4, H5), or its write | asked about again; REQUEST_TIMED_OUT  |
|     | lost while one is (a pass moving it first)         | when the request's time is up         |

Every leader change raises leader_epoch by one and nothing lowers it; the leader is always
a member of the ISR it is written with, or -1; an out-of-sync replica leads only by F2/U3.
"""

from __future__ import annotations

import base64
import enum
import uuid
from dataclasses import dataclass, replace

from kio.schema.errors import ErrorCode

from .znodes import HANDOVER_PREFERRED, HANDOVER_REASSIGNMENT, NO_LEADER, PartitionState

# How long a controller waits for a live leader to say its ISR holds what it acknowledged
# before it moves the leadership all the same (H3), as a controlled shutdown waits (isr.py's
# L3).
HANDOVER_TIMEOUT_S = 10.0


class Ask(enum.Enum):
    PASS = "pass"
    PREFERRED = "preferred"
    UNCLEAN = "unclean"


@dataclass(frozen=True, slots=True)
class Facts:
    """One partition as the controller found it."""

    replicas: tuple[int, ...]
    state: PartitionState | None
    live: frozenset[int]
    shutting_down: frozenset[int] = frozenset()
    unclean: bool = False  # unclean.leader.election.enable of its topic
    target: tuple[int, ...] | None = None  # an ongoing reassignment's target replicas
    offline: frozenset[int] = frozenset()  # brokers whose replica is on a failed log dir
    bounced: frozenset[int] = frozenset()  # counted dead here since they bounced (*live*)
    unreadable: str | None = None  # why a znode of it cannot be read (X1)


@dataclass(frozen=True, slots=True)
class Decision:
    row: str
    state: PartitionState | None = None  # to write; None: nothing
    replicas: tuple[int, ...] | None = None  # a new replica list to write (A1)
    error: ErrorCode = ErrorCode.none


def _live(facts: Facts, broker: int) -> bool:
    return broker in facts.live and broker not in facts.bounced


def _eligible(facts: Facts, broker: int) -> bool:
    return _live(facts, broker) and broker not in facts.shutting_down and \
        broker not in facts.offline


def decide(facts: Facts, ask: Ask, controller_epoch: int) -> Decision:
    if facts.unreadable is not None:
        return Decision("X1", error=ErrorCode.none if ask is Ask.PASS
                        else ErrorCode.unknown_server_error)
    state = facts.state
    eligible = [b for b in facts.replicas if _eligible(facts, b)]
    if state is None:
        if ask is not Ask.PASS:
            return Decision("-", error=ErrorCode.unknown_topic_or_partition)
        if not eligible:
            return Decision("N2")
        return Decision("N1", PartitionState(eligible[0], 0, tuple(eligible), controller_epoch))
    isr_eligible = [b for b in facts.replicas if b in state.isr and _eligible(facts, b)]
    # ISR members the assignment no longer names (a finished reassignment) stay last.
    isr_eligible += [b for b in state.isr if b not in facts.replicas and _eligible(facts, b)]
    leader_ok = state.leader != NO_LEADER and _eligible(facts, state.leader)

    def elect(row: str, leader: int, isr: list[int] | tuple[int, ...]) -> Decision:
        return Decision(row, PartitionState(leader, state.leader_epoch + 1, tuple(isr),
                                            controller_epoch))

    if ask is Ask.PREFERRED:
        preferred = facts.replicas[0] if facts.replicas else NO_LEADER
        if state.leader == preferred:
            return Decision("P1", error=ErrorCode.election_not_needed)
        if preferred in isr_eligible:
            return elect("P2", preferred, state.isr)
        return Decision("P3", error=ErrorCode.preferred_leader_not_available)
    if ask is Ask.UNCLEAN:
        if leader_ok:
            return Decision("U1", error=ErrorCode.election_not_needed)
        if isr_eligible:
            return elect("U2", isr_eligible[0], isr_eligible)
        if eligible:
            return elect("U3", eligible[0], eligible[:1])
        return Decision("U4", error=ErrorCode.eligible_leaders_not_available)

    if not leader_ok:
        if isr_eligible:
            return elect("D1" if state.leader in facts.offline else "F1", isr_eligible[0],
                         isr_eligible)
        if facts.unclean and eligible:
            return elect("F2", eligible[0], eligible[:1])
        if state.leader == NO_LEADER:
            return Decision("F4")
        if _live(facts, state.leader) and state.leader not in facts.offline:
            return Decision("S1")  # shutting down, nobody to hand over to
        live_isr = [b for b in state.isr if _live(facts, b)]
        return elect("F3", NO_LEADER, live_isr or state.isr)
    target = facts.target
    if target and all(b in isr_eligible for b in target):
        isr = tuple(b for b in target if b in state.isr)
        if state.leader in target:  # a handover asked of it stays asked (H rows)
            new = replace(state, isr=isr, controller_epoch=controller_epoch)
        else:
            new = PartitionState(isr[0], state.leader_epoch + 1, isr, controller_epoch)
        return Decision("A1", new, replicas=tuple(target))
    if len(isr_eligible) < len(state.isr):
        return Decision("L1", replace(state, isr=tuple(b for b in state.isr
                                                      if _eligible(facts, b)),
                                      controller_epoch=controller_epoch))
    return Decision("L2")


def hand_over(facts: Facts, decision: Decision, asked_for: str, waited_s: float | None,
              controller_epoch: int, bound_s: float = HANDOVER_TIMEOUT_S
              ) -> tuple[str, Decision]:
    """H1-H5: the row, and what to write, for ``decision`` (``asked_for``: what decided
    it, znodes.HANDOVER_PREFERRED or HANDOVER_REASSIGNMENT). ``waited_s``: how long this
    controller has seen the handover asked (None: not seen yet). Whatever an outstanding
    ask was asked for, it serves this move: ready says the leader's ISR holds what it
    acknowledged, whoever moves it (two askers never overwrite each other's ask)."""
    state, new = facts.state, decision.state
    if state is None or new is None or new.leader == state.leader or \
            state.leader == NO_LEADER or not _eligible(facts, state.leader):
        return "H1", decision
    # While the move waits (H4, H5), the ISR still loses its members that are not eligible
    # (L1): a pass that counted a bounced broker dead must land its removal (controller.py).
    isr = tuple(b for b in state.isr if _eligible(facts, b))
    if not state.handover_for:
        return "H4", Decision("H4", replace(state, isr=isr, handover_for=asked_for,
                                            handover_ready=False,
                                            controller_epoch=controller_epoch))
    if state.handover_ready:
        return "H2", decision
    if waited_s is not None and waited_s >= bound_s:
        return "H3", decision
    return "H5", Decision("H5", None if isr == state.isr else replace(
        state, isr=isr, controller_epoch=controller_epoch))


def pass_decision(facts: Facts, waited_s: float | None, controller_epoch: int,
                  bound_s: float = HANDOVER_TIMEOUT_S) -> tuple[str | None, Decision]:
    """A controller pass on one partition: ``decide`` (Ask.PASS) through the H rows (the
    H row taken, or None), and a handover asked for a preferred election (ElectLeaders,
    the auto rebalance) carried on once no pass row decides anything."""
    decision = decide(facts, Ask.PASS, controller_epoch)
    state = facts.state
    if decision.row == "X1" or state is None:
        return None, decision
    if decision.state is not None:  # only A1 moves a live leader among the pass's rows
        return hand_over(facts, decision, HANDOVER_REASSIGNMENT, waited_s, controller_epoch,
                         bound_s)
    if not state.handover_for:
        return None, decision
    if state.handover_for == HANDOVER_PREFERRED:
        preferred = decide(facts, Ask.PREFERRED, controller_epoch)
        if preferred.state is not None:
            return hand_over(facts, preferred, HANDOVER_PREFERRED, waited_s, controller_epoch,
                             bound_s)
    return "H6", handover_dropped(state, controller_epoch)


def election_decision(facts: Facts, ask: Ask, waited_s: float | None,
                      controller_epoch: int, bound_s: float = HANDOVER_TIMEOUT_S
                      ) -> tuple[str | None, Decision]:
    """ElectLeaders (and the auto rebalance) on one partition: ``decide``, a preferred
    election through the H rows (an unclean one moves no eligible leader: U1)."""
    decision = decide(facts, ask, controller_epoch)
    if ask is not Ask.PREFERRED or decision.state is None:
        return None, decision
    return hand_over(facts, decision, HANDOVER_PREFERRED, waited_s, controller_epoch,
                     bound_s)


def election_answer(landed: bool, handing_over: bool
                    ) -> tuple[ErrorCode, str | None] | None:
    """E1-E4: ElectLeaders' answer for a partition whose decision was written (``landed``:
    it was, else a concurrent write won), or, ``handing_over``, one whose handover this
    request asked and the preferred replica now leads (``landed`` True); None: look again."""
    if landed:
        return ErrorCode.none, None  # E1, E3
    if handing_over:
        return None  # E4: a pass moving the same leadership wrote first
    return (ErrorCode.eligible_leaders_not_available,  # E2
            "the partition changed meanwhile; try again")


class HandoverClock:
    """When this controller first saw each partition's handover asked (and not yet ready):
    H3's bound counts from there (a controller elected meanwhile starts counting anew)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], tuple[tuple[int, str], float]] = {}

    def waited(self, key: tuple[str, int], state: PartitionState | None,
               now: float) -> float | None:
        if state is None or not state.handover_for or state.handover_ready:
            self._seen.pop(key, None)
            return None
        mark = (state.leader_epoch, state.handover_for)
        seen = self._seen.get(key)
        if seen is None or seen[0] != mark:
            self._seen[key] = (mark, now)
            return 0.0
        return now - seen[1]

    def keep_only(self, topics: set[str]) -> None:
        for key in [k for k in self._seen if k[0] not in topics]:
            del self._seen[key]

    def next_due(self, now: float, bound_s: float) -> float | None:
        """Seconds until the next ask seen reaches ``bound_s`` (H3), None when none will:
        the controller looks again then, not at its next recheck. One past it already was
        decided H3 by the pass that saw it so; should that write not land, the watches and
        rechecks carry it, not a pass at once again and again."""
        due = [at + bound_s - now for _, at in self._seen.values() if at + bound_s > now]
        return min(due) if due else None


def handover_dropped(state: PartitionState, controller_epoch: int) -> Decision:
    """H6: a handover asked for a move that no longer applies (the preferred replica leads
    or cannot, the reassignment is gone or its target is not in sync): the ask is taken
    back, and its leader answers acks=1 on the append again."""
    return Decision("H6", state.without_handover(controller_epoch))


def name_topic(unnamed: bool, deleting: bool, known: str | None = None) -> str | None:
    """T1-T2: the topic id (Kafka's encoding) to write for a topic whose assignment lacks
    only its id (``unnamed``): ``known``, the id it had (recorded with its partitions, else
    last read by the controller or by its broker's metadata cache), else a new one; else
    None."""
    if not unnamed or deleting:
        return None  # T2
    return known or base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()  # T1


def rebalance(preferred_leaders: list[tuple[int, int]], enabled: bool,
              percentage: int) -> list[int]:
    """``preferred_leaders``: (preferred replica, leader) of each partition with a state;
    the indexes of those a preferred election is asked for (RB1-RB3)."""
    if not enabled:
        return []  # RB1
    total: dict[int, int] = {}
    elsewhere: dict[int, list[int]] = {}
    for i, (preferred, leader) in enumerate(preferred_leaders):
        total[preferred] = total.get(preferred, 0) + 1
        if leader != preferred:
            elsewhere.setdefault(preferred, []).append(i)
    return sorted(i for broker, indexes in elsewhere.items()
                  if len(indexes) * 100 > percentage * total[broker] for i in indexes)  # RB2
