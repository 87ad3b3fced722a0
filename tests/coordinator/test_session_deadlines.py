"""The classic members' session deadlines on one loop timer (session_deadlines.py): the
loop's contract (in deadline order, each once, never after cancel()), and what one timer
for many deadlines adds to it (a turn's batch, an expiry that raises, uvloop's clock)."""

from __future__ import annotations

import asyncio

import uvloop

from oncelog.coordinator.group import session_deadlines
from oncelog.coordinator.group.session_deadlines import SessionDeadlines


def test_session_deadlines_run_in_order_once_and_never_when_cancelled():
    async def scenario():
        loop = asyncio.get_running_loop()
        ran: list[str] = []
        done = asyncio.Event()

        def expired(group, member):
            ran.append(member)
            if member == "boom":
                raise RuntimeError("an expiry that fails")  # logged; the others still run
            if member == "last":
                done.set()

        deadlines = SessionDeadlines(expired)
        now = loop.time()
        handles = {name: deadlines.call_at(now + delay, "g", name) for name, delay in
                   [("c", 0.003), ("a", 0.001), ("boom", 0.002), ("gone", 0.0025),
                    ("last", 0.005)]}
        # many cancelled ones are dropped from the heap, not kept until their time
        for i in range(200):
            deadlines.call_at(now + 60 + i, "g", f"later-{i}").cancel()
        handles["gone"].cancel()
        handles["gone"].cancel()  # twice changes nothing
        await asyncio.wait_for(done.wait(), 5)
        handles["a"].cancel()  # after it ran: changes nothing
        assert ran == ["a", "boom", "c", "last"]
        assert len(deadlines) == 0 and len(deadlines._heap) <= 100
        deadlines.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_deadline_cancelled_by_an_earlier_expiry_of_the_same_turn_never_runs():
    async def scenario():
        ran: list[str] = []
        done = asyncio.Event()
        handles = {}

        def expired(group, member):
            ran.append(member)
            if member == "first":
                handles["second"].cancel()  # e.g. its member removed by a rebalance
            if member == "last":
                done.set()

        deadlines = SessionDeadlines(expired)
        when = asyncio.get_running_loop().time() + 0.001  # all three due in one turn
        for name in ("first", "second", "last"):
            handles[name] = deadlines.call_at(when, "g", name)
        await asyncio.wait_for(done.wait(), 5)
        assert "second" not in ran and ran[0] == "first"
        deadlines.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))


class Escapes(BaseException):
    """Past run_due's isolation of each expiry (which catches Exception); asyncio's loop
    reports it and goes on."""


def test_an_expiry_that_raises_past_its_isolation_leaves_the_rest_to_run():
    async def scenario():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: None)  # Escapes, expected
        ran: list[str] = []
        done = asyncio.Event()

        def expired(group, member):
            ran.append(member)
            if member == "escapes":
                raise Escapes
            if member == "later":
                done.set()

        deadlines = SessionDeadlines(expired)
        now = loop.time()
        deadlines.call_at(now + 0.001, "g", "escapes")
        deadlines.call_at(now + 0.001, "g", "same turn")
        deadlines.call_at(now + 0.003, "g", "later")
        await asyncio.wait_for(done.wait(), 2)
        assert ran == ["escapes", "same turn", "later"]
        deadlines.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_under_uvloop_a_deadline_takes_one_turn_not_many():
    """uvloop's clock and timers count whole milliseconds: a deadline between two found
    the timer fired early, again and again until the clock passed it (1,380 turns for 20
    deadlines)."""
    turns = 0

    class Counted(SessionDeadlines):
        def _run(self) -> None:
            nonlocal turns
            turns += 1
            super()._run()

    async def scenario():
        loop = asyncio.get_running_loop()
        ran: list[int] = []
        done = asyncio.Event()

        def expired(group, member):
            ran.append(member)
            if len(ran) == 20:
                done.set()

        deadlines = Counted(expired)
        now = loop.time()
        for i in range(20):
            deadlines.call_at(now + 0.0023 + i * 0.0011, "g", i)  # between milliseconds
        await asyncio.wait_for(done.wait(), 5)
        assert ran == list(range(20))
        deadlines.close()

    uvloop.run(asyncio.wait_for(scenario(), 10))
    assert turns <= 20


def test_with_a_clock_the_caller_runs_what_is_due():
    ran: list[str] = []
    deadlines = SessionDeadlines(lambda group, member: ran.append(member), clock=lambda: 0.0)
    deadlines.call_at(2.0, "g", "b")
    deadlines.call_at(1.0, "g", "a")
    deadlines.run_due(0.5)
    assert ran == []
    deadlines.run_due(1.0)
    assert ran == ["a"]
    deadlines.run_due(5.0)
    assert ran == ["a", "b"] and len(deadlines) == 0


def test_many_deadlines_due_at_once_run_over_several_turns():
    async def scenario():
        loop = asyncio.get_running_loop()
        ran: list[int] = []
        turns: list[int] = []
        done = asyncio.Event()

        def expired(group, member):
            ran.append(member)
            if len(ran) == count:
                done.set()

        async def count_turns():
            while not done.is_set():
                turns.append(len(ran))
                await asyncio.sleep(0)

        count = 3 * session_deadlines.RUN_AT_ONCE + 1
        deadlines = SessionDeadlines(expired)
        when = loop.time() + 0.001
        for member in range(count):
            deadlines.call_at(when, "g", member)
        watcher = asyncio.ensure_future(count_turns())
        await asyncio.wait_for(done.wait(), 5)
        await watcher
        assert sorted(ran) == list(range(count))
        # the other task ran between the batches
        assert {session_deadlines.RUN_AT_ONCE, 2 * session_deadlines.RUN_AT_ONCE} <= set(turns)

    asyncio.run(asyncio.wait_for(scenario(), 10))
