"""Every replication decision of a partition, as tables: pure functions, no I/O, no clock.

The broker (broker/replica_manager.py, broker/replica_fetcher.py) feeds them what it knows
and does what they answer; tests/cluster/test_isr_model.py holds them against a model.

Role, decided by ``role_step`` when a partition state is read from ZooKeeper
(``/brokers/topics/<t>/partitions/<p>/state``), against the leader epoch this replica acts on
(None before any state), and whether this broker vouches for its ZooKeeper session
(cluster/membership.py's standing table: V1/V2 vouch; V3/V4, the session expired or
ZooKeeper silent for half the session timeout, do not; the replica manager applies its last view
again when that happens, and a view read before it registered again vouches for nothing):

| row | state read                                         | action                         |
|-----|----------------------------------------------------|--------------------------------|
| B1  | leader_epoch below ours                            | IGNORE: a stale state          |
| B0  | not vouched; our leader_epoch while we lead it, or | FENCE: lead nothing at that    |
|     | a newer one naming us                              | epoch (as B6), until B7        |
| B7  | vouched; same leader_epoch naming us, we do not    | BECOME_LEADER at it again (only|
|     | lead (B0 fenced us)                                | we were ever its leader)       |
| B2  | same leader_epoch, we lead it                      | ADOPT_ISR: keep leading, take  |
|     |                                                    | the ISR written (our own write |
|     |                                                    | or the controller's, with its  |
|     |                                                    | controller epoch, which our    |
|     |                                                    | next ISR write keeps) and the  |
|     |                                                    | assignment's replicas (a       |
|     |                                                    | reassignment adds and removes  |
|     |                                                    | them at the same epoch: I3     |
|     |                                                    | grows the ISR over them)       |
| B8  | same leader_epoch, we lead it, the znode at a      | IGNORE: a view read before our |
|     | version below the one we last read or wrote        | own ISR write landed; its ISR  |
|     |                                                    | is not ZooKeeper's (adopted,   |
|     |                                                    | the high watermark would count |
|     |                                                    | without a follower let in)     |
| B3  | same leader_epoch, we follow or have no leader     | IGNORE: nothing changes        |
| B4  | newer epoch (or none yet), leader is us            | BECOME_LEADER at that epoch    |
| B5  | newer epoch, leader another broker                 | BECOME_FOLLOWER of it (in      |
|     |                                                    | controlled shutdown: without   |
|     |                                                    | fetching, it leaves the ISR)   |
| B6  | newer epoch, leader -1 (no ISR member alive)       | NO_LEADER: fetch from nobody,  |
|     |                                                    | refuse produce and fetch       |

ISR, decided by ``isr_change`` on the leader for each follower (Kafka's Partition
maybeShrinkIsr / maybeExpandIsr in ZooKeeper mode):

| row | follower                                             | action                       |
|-----|------------------------------------------------------|------------------------------|
| I1  | in the ISR, not caught up for replica.lag.time.max.ms| SHRINK: out of the ISR       |
| I2  | in the ISR, caught up within it                      | KEEP                         |
| I3  | out of the ISR, assigned, registered (/brokers/ids), | EXPAND: into the ISR         |
|     | fetching now, its log end at or past the high        |                              |
|     | watermark and past the start of our epoch            |                              |
| I4  | out of the ISR otherwise (the periodic check: what   | KEEP                         |
|     | it last fetched may be a dead or stopping broker's;  |                              |
|     | not registered: KIP-841, below)                      |                              |

KIP-841: only a registered broker joins an ISR. One that lost its ZooKeeper session (cut off
from ZooKeeper, or paused past the session timeout) but still fetches would otherwise flap:
the controller takes it out of every ISR, its leaders put it back on its next fetch.
"Registered" is the leader's list, from a watch that can trail the state it read; the write
that lets a broker in is also conditional on its registration in ZooKeeper
(replica_watch.py), so a leader that has not yet heard of an expiry cannot undo the
controller's removal.

"Caught up" is Kafka's lastCaughtUpTime (``caught_up_at``): a fetch that asks for the
leader's log end offset catches the follower up at its time; one that asks for the log end
the leader had at the follower's previous fetch, at that previous fetch's time.
The leader itself never leaves the ISR.

High watermark, ``high_watermark``: the least log end offset over the ISR (the leader's
included); it only moves forward (a new ISR member is at or past it, I3), and never past the
leader's log end.

acks=all, ``acks_all_step`` (Kafka's checkEnoughReplicasReachOffset):

| row | when                                              | answer                          |
|-----|---------------------------------------------------|---------------------------------|
| K1  | before the append, ISR smaller than min.insync    | NOT_ENOUGH_REPLICAS, not stored |
| K2  | high watermark reached the batch's end, ISR at or | DONE: acknowledged              |
|     | above min.insync.replicas                         |                                 |
| K3  | high watermark reached it, ISR below min.insync   | NOT_ENOUGH_REPLICAS_AFTER_APPEND|
| K4  | high watermark not there yet                      | WAIT                            |

acks=1, ``acks_one_waits`` (acks=0 is never answered, so nothing is acknowledged):

| row | when                                              | answer                          |
|-----|---------------------------------------------------|---------------------------------|
| K5  | neither below                                     | on the append (Kafka's acks=1)  |
| K6  | its controlled shutdown began: its leaderships    | K2/K4 with min.insync.replicas  |
|     | are about to move; or the partition's state asks  | 1: once the high watermark      |
|     | a handover of its leadership (leader_election.py's| passed the batch, or            |
|     | H4: a preferred election or a reassignment will   | NOT_LEADER_OR_FOLLOWER when the |
|     | move it)                                          | leadership moved first          |

A handover asked of this leader (``handover_starts``; the state znode's ``oncelog_handover``):

| row | the state read                                    | the leader                      |
|-----|---------------------------------------------------|---------------------------------|
| H7  | asks it, not ready, no wait of it running here    | K6 for the partition from now;  |
|     |                                                   | waits as L1-L3 for its ISR to   |
|     |                                                   | hold its log end of now, then   |
|     |                                                   | writes the state ready (at the  |
|     |                                                   | version read: a write in between|
|     |                                                   | reads it again, H7 again)       |
| H8  | the wait ended lacking (L3)                       | writes nothing: the controller  |
|     |                                                   | moves it at its own bound (H3)  |
| H9  | asks nothing (H6 took it back), or already ready, | nothing more; without an ask,   |
|     | or a wait running for this very ask (an ask that  | acks=1 on the append again (K5) |
|     | appears again after H6 is a new one)              |                                 |

Its wait over (``handover_after_wait``):

| row | the leader, the ask                               | the leader                      |
|-----|---------------------------------------------------|---------------------------------|
| H10 | same role, same ask, ISR caught up, no ISR write  | writes the state ready (no ISR  |
|     | of its own in flight                              | change notification)            |
| H11 | moved, fenced, deleted, or the ask taken back or  | nothing (a new ask has its own  |
|     | already ready                                     | wait)                           |
| H12 | lacking (H8)                                      | nothing, logged                 |
| H13 | its own ISR write in flight (same znode version)  | reads the state again: H7 anew  |

A controlled shutdown's wait before it asks the controller to move the leaderships
(broker/replica_manager.py's leave, ``leave_lacks`` for each partition led there; its
fetchers keep following meanwhile), waiting for the high watermark at the log end offset the
leader had when the shutdown began, at most 10 s (``LEAVE_TIMEOUT_S``):

| row | the wait ended                                    | counts as                       |
|-----|---------------------------------------------------|---------------------------------|
| L1  | the high watermark reached it                     | replicated                      |
| L2  | the leadership moved away first (any error but a  | replicated: the new leader is   |
|     | timeout: NOT_LEADER_OR_FOLLOWER, the partition    | the controller's pick from the  |
|     | deleted, its log directory offline)               | ISR, or no leader is left here  |
| L3  | not within the 10 s (its own timer, or still      | lacking: logged, and the        |
|     | waiting at the bound)                             | leaderships are moved anyway    |

A whole cluster stopped at once (``oncelog cluster up``'s Ctrl-C, SIGTERM to every broker):
no leader waits out the 10 s on a follower that is leaving too. A leaving follower keeps
fetching while its own L wait runs (so the other leaving leaders' high watermarks move);
once that wait is over it stops fetching and asks for its controlled shutdown, and the
controller's pass takes it out of every ISR whose leader is still eligible
(leader_election.py's L1; a leader itself past its wait is no longer eligible and keeps its
ISR, S1), so the high watermark of a leader still waiting is the least log end of those
still fetching. Kafka's ZooKeeper-mode controller does the same on a ControlledShutdown
request (the broker's follower replicas go offline and out of their ISRs, never emptying
one) but, as it never waits for the ISR first, a broker whose leaderships no ISR member can
take (all of them stopping) is refused and retries controlled.shutdown.max.retries (3)
times, controlled.shutdown.retry.backoff.ms (5 s) apart, before it stops anyway.
(tests/cluster/test_cluster_control_plane.py's whole-cluster test: no broker logs an L3
wait-out after a SIGTERM to all three, every acknowledged record there after a restart.)

K6 is stricter than Kafka, whose old leader acknowledges acks=1 until it hears of the move
and then truncates what the new leader lacks: the controller elects the new leader from the
ISR, and every ISR member holds what is below the high watermark, so nothing the stopping
leader acknowledged is lost by its own shutdown. (What it acknowledged before the shutdown
began is replicated before it asks the controller to move, unless the ISR has not caught up
within 10 s (L3, logged): broker/replica_manager.py's leave.) A leadership moved off
a live leader by a preferred election (leader_election.py's P2, the RB rows) or a
reassignment (A1) is handed over the same way (H7-H9 here, H1-H6 there): before, the old
leader acknowledged acks=1 until it read the new state, then truncated what the new leader
lacked (bench/preferred_election_acks1.py: 135 to 12,949 of ~45,000-75,000 records
acknowledged at full speed were lost in three runs), as Kafka's does.

Truncation of a replica that becomes follower, ``truncation_point`` (Kafka's follower with
OffsetForLeaderEpoch): it asks the leader for the end of its own latest epoch and gets
(leader's epoch L, end offset); it looks L up in its own leader epoch cache (the same
``end_offset_for``), getting (its epoch F, its end offset):

| row | answers                                        | truncate to                 | done?   |
|-----|------------------------------------------------|-----------------------------|---------|
| T1  | the leader's end offset is -1 (it knows no     | our high watermark          | yes     |
|     | epoch at or below ours)                        |                             |         |
| T2  | F == L: we have that epoch                     | min(both ends, our log end) | yes     |
| T3  | F < L: we have an older epoch only             | min(our end of F, log end)  | no: ask |
|     |                                                |                             | again   |
| T4  | we have no epoch at or below L                 | min(its end, our log end)   | yes     |

Leader epochs a request names (KIP-320), ``epoch_problem``: -1 checks nothing; below the
partition's FENCED_LEADER_EPOCH; above it UNKNOWN_LEADER_EPOCH (we have not heard of it yet).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

NO_LEADER = -1
NO_EPOCH = -1


class Role(enum.Enum):
    IGNORE = "B1/B3"
    ADOPT_ISR = "B2"
    BECOME_LEADER = "B4"
    BECOME_FOLLOWER = "B5"
    NO_LEADER = "B6"
    FENCE = "B0"


def role_step(our_epoch: int | None, leading: bool, state_leader: int, state_epoch: int,
              our_id: int, vouched: bool = True, older: bool = False) -> Role:
    """``our_epoch``: the leader epoch this replica acts on (None: none yet); ``leading``:
    whether it leads at that epoch; ``vouched``: the standing table's VOUCH; ``older``: the
    state znode's version is below the one this replica last read or wrote."""
    if our_epoch is not None and state_epoch < our_epoch:
        return Role.IGNORE
    if our_epoch is not None and state_epoch == our_epoch:
        if leading:
            if not vouched:
                return Role.FENCE
            return Role.IGNORE if older else Role.ADOPT_ISR
        return Role.BECOME_LEADER if vouched and state_leader == our_id else Role.IGNORE
    if state_leader == our_id:
        return Role.BECOME_LEADER if vouched else Role.FENCE
    if state_leader == NO_LEADER:
        return Role.NO_LEADER
    return Role.BECOME_FOLLOWER


@dataclass(frozen=True, slots=True)
class FollowerView:
    """What the leader knows of one follower since it became leader."""

    log_end_offset: int  # -1: it has not fetched from this leader yet
    last_caught_up_ms: int  # when it was last caught up (Kafka's lastCaughtUpTime)


class IsrChange(enum.Enum):
    KEEP = "I2/I4"
    SHRINK = "I1"
    EXPAND = "I3"


def isr_change(in_isr: bool, follower: FollowerView, now_ms: int, lag_max_ms: int,
               high_watermark: int, epoch_start_offset: int, fetching: bool,
               registered: bool = True) -> IsrChange:
    """``fetching``: asked on this follower's fetch (Kafka expands only then), not by the
    periodic check; ``registered``: the follower is in /brokers/ids as the leader last read
    it (KIP-841)."""
    if in_isr:
        if now_ms - follower.last_caught_up_ms > lag_max_ms:
            return IsrChange.SHRINK
        return IsrChange.KEEP
    if fetching and registered and follower.log_end_offset >= 0 and \
            follower.log_end_offset >= high_watermark and \
            follower.log_end_offset >= epoch_start_offset:
        return IsrChange.EXPAND
    return IsrChange.KEEP


def caught_up_at(fetch_offset: int, leader_end: int, leader_end_at_last_fetch: int,
                 now_ms: int, last_fetch_ms: int, last_caught_up_ms: int) -> int:
    """The follower's lastCaughtUpTime after a fetch at ``fetch_offset`` (Kafka's rule): the
    leader's log end now reached is this fetch's time; the log end of its previous fetch
    reached is that fetch's time."""
    if fetch_offset >= leader_end:
        return max(last_caught_up_ms, now_ms)
    if fetch_offset >= leader_end_at_last_fetch:
        return max(last_caught_up_ms, last_fetch_ms)
    return last_caught_up_ms


def high_watermark(current: int, leader_end: int, isr_ends: list[int]) -> int:
    """The ISR's least log end offset (the leader's among them), never backwards; a member
    that has not fetched yet (-1) holds it where it is."""
    if any(end < 0 for end in isr_ends):
        return min(current, leader_end)
    return max(current, min([leader_end, *isr_ends])) if current <= leader_end \
        else leader_end


class Acks(enum.Enum):
    DONE = "K2"
    NOT_ENOUGH_REPLICAS = "K1"
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = "K3"
    WAIT = "K4"


def acks_all_before(isr_size: int, min_insync: int) -> Acks | None:
    """K1 (None: go on and append)."""
    return Acks.NOT_ENOUGH_REPLICAS if isr_size < min_insync else None


def acks_all_step(high_watermark_now: int, needed: int, isr_size: int, min_insync: int) -> Acks:
    """K2-K4 for a batch whose last offset is ``needed`` - 1."""
    if high_watermark_now < needed:
        return Acks.WAIT
    return Acks.DONE if isr_size >= min_insync else Acks.NOT_ENOUGH_REPLICAS_AFTER_APPEND


def acks_one_waits(leaving: bool, handover_asked: bool) -> bool:
    """K5/K6: whether an acks=1 answer waits for the ISR (with min.insync.replicas 1)."""
    return leaving or handover_asked


def handover_starts(leading: bool, asked: bool, ready: bool, running: bool) -> bool:
    """H7/H9: whether a state just read starts this leader's handover wait (``running``:
    one runs for this very ask)."""
    return leading and asked and not ready and not running


class HandoverStep(enum.Enum):
    WRITE_READY = "H10"
    NOTHING = "H11"
    LACKING = "H12"
    READ_AGAIN = "H13"


def handover_after_wait(same_role: bool, same_ask: bool, lacking: bool,
                        isr_write_pending: bool) -> HandoverStep:
    """H10-H13: what a leader does once its handover wait is over. ``same_role``: it
    still leads the partition in the role it waited in (not moved, fenced, deleted);
    ``same_ask``: the ask it waited for is still there, not ready, never taken back
    meanwhile (an ask taken back, H6, and asked again is another ask: acks=1 was answered
    on the append in between)."""
    if not same_role or not same_ask:
        return HandoverStep.NOTHING  # H11
    if lacking:
        return HandoverStep.LACKING  # H12 (H8): the controller's H3 moves it
    if isr_write_pending:
        return HandoverStep.READ_AGAIN  # H13: two writes at one version: one would lose
    return HandoverStep.WRITE_READY  # H10


def leave_lacks(finished: bool, error: ErrorCode | None) -> bool:
    """L1-L3: whether a partition's controlled-shutdown wait ended lacking. ``finished``:
    it ended within the bound; ``error``: how (None: the high watermark reached it)."""
    if not finished:
        return True  # L3
    return error == ErrorCode.request_timed_out  # L3 by its own timer, else L1 / L2


def truncation_point(leader_epoch: int, leader_end: int, ours: tuple[int, int], log_end: int,
                     our_high_watermark: int) -> tuple[int, bool]:
    """(offset to truncate to, whether truncation is complete). ``ours``: (epoch, end) our
    own cache answers for ``leader_epoch`` (-1, -1: nothing at or below it)."""
    our_epoch, our_end = ours
    if leader_end < 0:
        return min(our_high_watermark, log_end), True  # T1
    if our_epoch == NO_EPOCH or our_end < 0:
        return min(leader_end, log_end), True  # T4
    if our_epoch == leader_epoch:
        return min(leader_end, our_end, log_end), True  # T2
    return min(our_end, log_end), False  # T3


def epoch_problem(asked: int, current: int) -> ErrorCode | None:
    if asked == NO_EPOCH or asked == current:
        return None
    return ErrorCode.fenced_leader_epoch if asked < current \
        else ErrorCode.unknown_leader_epoch
