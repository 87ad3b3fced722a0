"""cluster/isr.py's tables held against models (hypothesis).

- A leader and two followers (broker/replication.ReplicaState, the real one): appends,
  follower fetches, time passing, ISR checks, acks=all waits. Kafka's safety properties hold
  after every step: the leader is in the ISR, the high watermark never goes back nor past
  the leader's log end, every ISR member has everything below it, a follower caught up
  within replica.lag.time.max.ms stays in the ISR and one behind longer leaves it, and an
  acks=all produce is acknowledged exactly when the high watermark passed it with
  min.insync.replicas in the ISR, an acks=1 one in controlled shutdown or with a handover
  asked (row K6) exactly when the high watermark passed it, whatever the ISR's size; a
  follower whose registration is gone (its ZooKeeper session lost) never joins the ISR,
  however caught up it fetches (KIP-841).
- Truncation: a follower whose log diverged from its leader's after a common prefix (it led
  an epoch the leader never saw all of) truncates, over OffsetForLeaderEpoch rounds
  (isr.truncation_point with the real LeaderEpochCache on both sides), to exactly that
  prefix.
- The role table, row by row.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from kio.schema.errors import ErrorCode

from oncelog.broker.replication import ReplicaState, ReplicationError
from oncelog.cluster import isr
from oncelog.log.leader_epoch import LeaderEpochCache
from oncelog.log.memory_disk import MemoryDisk

LAG_MS = 1000
LEADER, F1, F2 = 1, 2, 3


class LeaderModel(RuleBasedStateMachine):
    @initialize(min_insync=st.integers(1, 3))
    def start(self, min_insync):
        self.loop = asyncio.new_event_loop()
        self.now = 0
        self.leo = {LEADER: 0, F1: 0, F2: 0}
        self.caught_up: dict[int, int] = {F1: 0, F2: 0}  # Kafka's lastCaughtUpTime
        self.previous: dict[int, tuple[int, int]] = {}  # leader end and time at last fetch
        self.state = ReplicaState(LEADER, LEADER, 0, (LEADER, F1, F2), (LEADER, F1, F2), 0,
                                  min_insync=min_insync)
        self.state.followers = {b: isr.FollowerView(-1, 0) for b in (F1, F2)}
        self.last_hw = 0
        self.waiting: list[tuple[int, asyncio.Future]] = []
        self.registered = {LEADER, F1, F2}  # /brokers/ids as the leader last read it

    def teardown(self):
        for _, _, fut in self.waiting:
            fut.cancel()
        self.loop.close()

    def _settle(self):
        self.loop.run_until_complete(asyncio.sleep(0))

    @rule(count=st.integers(1, 5),
          acks=st.sampled_from(["1", "all", "1 leaving", "1 handing over"]))
    def append(self, count, acks):
        if acks == "all" and isr.acks_all_before(len(self.state.isr), self.state.min_insync):
            return  # K1: refused before the append
        self.leo[LEADER] += count
        self.state.advance_high_watermark(self.leo[LEADER])
        if acks == "1 leaving":
            assert isr.acks_one_waits(True, False)  # K6: it waits for the ISR, K5 no longer
        if acks == "1 handing over":
            assert isr.acks_one_waits(False, True)  # K6 for a handover asked (H4)
        if acks in ("all", "1 leaving", "1 handing over"):
            minimum = None if acks == "all" else 1

            async def wait(needed=self.leo[LEADER]):
                return self.state.wait_for(needed, 3600, minimum)

            fut = self.loop.run_until_complete(wait())
            if fut is None:  # K2 at once
                assert self.state.high_watermark >= self.leo[LEADER]
                assert len(self.state.isr) >= (minimum or self.state.min_insync)
            else:
                if self.state.high_watermark < self.leo[LEADER]:
                    assert not fut.done()  # K4: not acknowledged before the ISR has it
                self.waiting.append((self.leo[LEADER], minimum, fut))
        else:
            assert not isr.acks_one_waits(False, False)  # K5: answered on the append

    @rule(follower=st.sampled_from([F1, F2]))
    def session_lost_or_registered_again(self, follower):
        self.registered ^= {follower}

    @rule(follower=st.sampled_from([F1, F2]), data=st.data())
    def fetch(self, follower, data):
        # a fetch at the follower's log end, which then takes some of what the leader has
        offset = self.leo[follower]
        self.state.follower_fetched(follower, offset, self.leo[LEADER], self.now)
        if offset >= self.leo[LEADER]:
            self.caught_up[follower] = self.now
        elif follower in self.previous and offset >= self.previous[follower][0]:
            self.caught_up[follower] = max(self.caught_up[follower], self.previous[follower][1])
        self.previous[follower] = (self.leo[LEADER], self.now)
        self.state.advance_high_watermark(self.leo[LEADER])
        s = self.state
        if follower not in s.isr:  # I3 / I4, asked on its fetch (the periodic check: I4)
            wanted = s.isr_changes(self.now, LAG_MS, fetching=follower,
                                   registered=self.registered)
            joined = wanted is not None and follower in wanted
            assert joined == (offset >= s.high_watermark and follower in self.registered)
            if joined:
                self._written(wanted)
        self.leo[follower] = data.draw(st.integers(offset, self.leo[LEADER]))

    @rule(ms=st.integers(1, 800))
    def time_passes(self, ms):
        self.now += ms

    @rule()
    def check_isr(self):
        wanted = self.state.isr_changes(self.now, LAG_MS, registered=self.registered)
        s = self.state
        for broker in (F1, F2):
            after = broker in (s.isr if wanted is None else wanted)
            if broker in s.isr:  # I1 / I2
                assert after == (self.now - self.caught_up[broker] <= LAG_MS)
            else:  # I4: only its own fetch brings it back (I3, in fetch)
                assert not after
        if wanted is not None:
            self._written(wanted)

    def _written(self, wanted):
        self.state.isr = wanted  # the conditional write went through
        self.state.advance_high_watermark(self.leo[LEADER])
        self.state.resolve_waiters()
        self._settle()

    @invariant()
    def safe(self):
        if not hasattr(self, "state"):
            return
        s = self.state
        assert LEADER in s.isr
        assert self.last_hw <= s.high_watermark <= self.leo[LEADER]
        self.last_hw = s.high_watermark
        for broker in s.isr:
            if broker != LEADER:
                # what the leader knows the member has (its last fetch offset) covers the HW
                assert s.followers[broker].log_end_offset >= s.high_watermark or \
                    s.high_watermark == 0

    @invariant()
    def acks(self):
        if not hasattr(self, "state"):
            return
        self._settle()
        s = self.state
        for needed, minimum, fut in self.waiting:
            if not fut.done():
                assert s.high_watermark < needed
            elif fut.exception() is None:
                assert s.high_watermark >= needed
            else:
                error = fut.exception()
                assert isinstance(error, ReplicationError)
                assert error.error_code == ErrorCode.not_enough_replicas_after_append
                assert minimum is None and len(s.isr) < s.min_insync
        self.waiting = [(n, m, f) for n, m, f in self.waiting if not f.done()]


LeaderModel.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                         deadline=None)
TestLeaderModel = LeaderModel.TestCase


@st.composite
def diverged_logs(draw):
    """(common prefix, the follower's epochs after it, the leader's after it, the leader's
    epoch): each log an epoch per offset, epochs never falling. After the prefix each epoch
    is one side's (its leader wrote it, the other never saw it): at most one side goes on
    with the prefix's last epoch, and the leader's epoch is above all."""
    prefix = sorted(draw(st.lists(st.integers(0, 3), max_size=10)))
    low = prefix[-1] if prefix else 0
    epochs = sorted(draw(st.lists(st.integers(low + 1, low + 8), unique=True, max_size=6)))
    sides = draw(st.lists(st.booleans(), min_size=len(epochs), max_size=len(epochs)))
    goes_on = draw(st.sampled_from(["none", "follower", "leader"]))
    tails: dict[bool, list[int]] = {True: [], False: []}
    if goes_on != "none":
        tails[goes_on == "follower"] += [low] * draw(st.integers(1, 3))
    for epoch, side in zip(epochs, sides, strict=True):
        tails[side] += [epoch] * draw(st.integers(1, 3))
    leader_epoch = max([low, *epochs]) + draw(st.integers(1, 2))
    return prefix, tails[True], tails[False], leader_epoch


def cache_of(disk: MemoryDisk, directory: str, epochs: list[int]) -> LeaderEpochCache:
    disk.makedirs(directory)
    cache = LeaderEpochCache(directory, disk)
    for offset, epoch in enumerate(epochs):
        cache.assign(epoch, offset)
    return cache


@settings(max_examples=150, deadline=None)
@given(diverged_logs(), st.integers(0, 12))
def test_a_follower_truncates_to_exactly_the_common_prefix(logs, hw):
    prefix, follower_tail, leader_tail, leader_epoch = logs
    disk = MemoryDisk()
    leader_log = prefix + leader_tail
    leader = cache_of(disk, "/leader", leader_log)
    leader.assign(leader_epoch, len(leader_log))  # as it became leader
    follower_log = prefix + follower_tail
    follower = cache_of(disk, "/follower", follower_log)
    high_watermark = min(hw, len(prefix))  # committed: everyone has it
    for _ in range(20):  # each round cuts the follower back: bounded by its epochs
        asked = follower.latest_epoch
        answer = leader.end_offset_for(asked, len(leader_log))
        ours = follower.end_offset_for(answer[0], len(follower_log)) \
            if answer[0] >= 0 else (isr.NO_EPOCH, -1)
        point, done = isr.truncation_point(*answer, ours, len(follower_log),
                                           high_watermark)
        follower_log = follower_log[:point]
        follower.truncate_from_end(point)
        if done:
            break
    else:
        raise AssertionError("truncation did not finish")
    # exactly the common prefix: all it had that the leader has not, nothing more
    assert follower_log == prefix


@given(st.one_of(st.none(), st.integers(0, 5)), st.booleans(), st.integers(-1, 3),
       st.integers(0, 6), st.booleans(), st.booleans())
def test_role_table(our_epoch, leading, leader, epoch, vouched, older):
    role = isr.role_step(our_epoch, leading, leader, epoch, 1, vouched, older)
    if our_epoch is not None and epoch < our_epoch:
        assert role is isr.Role.IGNORE  # B1
    elif not vouched and ((leading and epoch == our_epoch) or
                          (leader == 1 and epoch != our_epoch)):
        assert role is isr.Role.FENCE  # B0
    elif our_epoch is not None and epoch == our_epoch and leading and older:
        assert role is isr.Role.IGNORE  # B8
    elif our_epoch is not None and epoch == our_epoch and not leading and leader == 1 \
            and vouched:
        assert role is isr.Role.BECOME_LEADER  # B7
    elif our_epoch is not None and epoch == our_epoch:
        assert role is (isr.Role.ADOPT_ISR if leading else isr.Role.IGNORE)  # B2, B3
    elif leader == 1:
        assert role is isr.Role.BECOME_LEADER  # B4
    elif leader == -1:
        assert role is isr.Role.NO_LEADER  # B6
    else:
        assert role is isr.Role.BECOME_FOLLOWER  # B5


def test_leader_epochs_in_requests():
    assert isr.epoch_problem(-1, 4) is None
    assert isr.epoch_problem(4, 4) is None
    assert isr.epoch_problem(3, 4) == ErrorCode.fenced_leader_epoch
    assert isr.epoch_problem(5, 4) == ErrorCode.unknown_leader_epoch


def test_a_follower_that_stopped_fetching_stays_out_of_the_isr():
    """I1 then I4: a follower caught up when it died leaves the ISR after the lag; its last
    fetch is at the high watermark still, yet only a fetch of its own brings it back (I3):
    the periodic check never re-adds a dead or stopping broker the controller shrank."""
    state = ReplicaState(LEADER, LEADER, 0, (LEADER, F1), (LEADER, F1), 0)
    state.followers = {F1: isr.FollowerView(-1, 0)}
    state.follower_fetched(F1, 0, 0, 0)  # caught up: the log is empty
    assert state.isr_changes(LAG_MS + 1, LAG_MS) == (LEADER,)  # I1
    state.isr = (LEADER,)
    assert state.isr_changes(LAG_MS + 2, LAG_MS) is None  # I4: not on the periodic check
    state.follower_fetched(F1, 0, 0, LAG_MS + 3)
    assert state.isr_changes(LAG_MS + 3, LAG_MS, fetching=F1) == (LEADER, F1)  # I3


def test_an_unregistered_follower_is_not_put_back_into_the_isr():
    """KIP-841 (row I3's "registered"): a follower cut off from ZooKeeper only keeps fetching
    and is caught up, yet while it is not in /brokers/ids its leader does not put it back
    (the controller took it out); registered again, its next fetch does."""
    state = ReplicaState(LEADER, LEADER, 0, (LEADER,), (LEADER, F1), 0)
    state.followers = {F1: isr.FollowerView(-1, 0)}
    state.follower_fetched(F1, 0, 0, 10)
    assert state.isr_changes(10, LAG_MS, fetching=F1, registered={LEADER}) is None
    assert isr.isr_change(False, isr.FollowerView(0, 10), 10, LAG_MS, 0, 0, True,
                          registered=False) is isr.IsrChange.KEEP
    assert state.isr_changes(11, LAG_MS, fetching=F1, registered={LEADER, F1}) == (LEADER, F1)


@pytest.mark.parametrize(("finished", "error", "lacks"), [
    (True, None, False),  # L1: the high watermark reached it
    (True, ErrorCode.not_leader_or_follower, False),  # L2: the leadership moved first
    (True, ErrorCode.unknown_topic_or_partition, False),  # L2: deleted meanwhile
    (True, ErrorCode.request_timed_out, True),  # L3: its own timer
    (False, None, True),  # L3: still waiting at the bound
])
def test_leave_rows(finished, error, lacks):
    assert isr.leave_lacks(finished, error) is lacks


@pytest.mark.parametrize("leading", [False, True])
@pytest.mark.parametrize("asked", [False, True])
@pytest.mark.parametrize("ready", [False, True])
@pytest.mark.parametrize("running", [False, True])
def test_handover_start_table(leading, asked, ready, running):
    """H7: a leader reading an ask it has not answered, with no wait running for this very
    ask, starts one; H9 otherwise."""
    assert isr.handover_starts(leading, asked, ready, running) == \
        (leading and asked and not ready and not running)


@pytest.mark.parametrize("same_role", [False, True])
@pytest.mark.parametrize("same_ask", [False, True])
@pytest.mark.parametrize("lacking", [False, True])
@pytest.mark.parametrize("pending", [False, True])
def test_handover_after_wait_table(same_role, same_ask, lacking, pending):
    """H10-H13, in the order the rows are tried: ready is written only for the role and
    the very ask the wait began with, caught up, with no ISR write of its own in flight."""
    step = isr.handover_after_wait(same_role, same_ask, lacking, pending)
    if not (same_role and same_ask):
        assert step is isr.HandoverStep.NOTHING  # H11
    elif lacking:
        assert step is isr.HandoverStep.LACKING  # H12
    elif pending:
        assert step is isr.HandoverStep.READ_AGAIN  # H13
    else:
        assert step is isr.HandoverStep.WRITE_READY  # H10
