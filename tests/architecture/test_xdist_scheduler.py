"""The suite's own xdist scheduler (tests/conftest.py, SparkOnFewScheduling), driven without
xdist's processes: fake workers that behave as xdist's do (a worker reports a test only once
it holds the next one or is shut down), a worker crashing at a random point and replaced
under a new number. Every test must run, none may be left unsent, nothing may hang, and the
Spark tests go to the first two workers while either is alive. Seeds fixed."""

from __future__ import annotations

import random
from types import SimpleNamespace

import conftest
import pytest


class _Config:
    def __init__(self, workers: int) -> None:
        self.options = {"dist": "loadgroup", "numprocesses": workers, "maxschedchunk": None,
                        "loadscopereorder": False, "tx": [f"{workers}*popen"]}
        self.option = SimpleNamespace(loadscopereorder=False, numprocesses=workers)

    def getoption(self, name):
        return self.options.get(name)

    getvalue = getoption


class _Worker:
    def __init__(self, number: int) -> None:
        self.gateway = SimpleNamespace(id=f"gw{number}")
        self.shutting_down = False
        self.queue: list[int] = []

    def send_runtest_some(self, indexes) -> None:
        self.queue += indexes

    def shutdown(self) -> None:
        self.shutting_down = True


def _run(seed: int, workers: int, crash: bool) -> None:
    rng = random.Random(seed)
    tests = [f"tests/spark/test_s.py::t{i}" for i in range(8)] + \
        [f"tests/x/test_x.py::t[a@b-{i}]" for i in range(24)]
    sched = conftest.pytest_xdist_make_scheduler(_Config(workers), None)
    nodes = [_Worker(i) for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, tests)
    sched.schedule()
    ran: list[tuple[str, str]] = []
    crash_at = rng.randrange(len(tests)) if crash else -1
    number = workers
    for _ in range(10_000):
        live = sched.nodes
        if not live:
            break
        movable = [n for n in live if len(n.queue) >= 2 or n.shutting_down]
        assert movable, f"hung: {[(n.gateway.id, n.queue) for n in live]}"
        node = rng.choice(movable)
        if not node.queue:
            sched.remove_node(node)  # shut down and empty: it exits
        elif len(ran) == crash_at and not node.shutting_down:
            crash_at = -1
            sched.remove_node(node)  # crashed: xdist queues its work again
            number += 1
            replacement = _Worker(number)
            sched.add_node(replacement)
            sched.add_node_collection(replacement, tests)
            sched.schedule()
        else:
            index = node.queue.pop(0)
            ran.append((node.gateway.id, tests[index]))
            sched.mark_test_complete(node, index)
    else:
        raise AssertionError("did not end")
    assert {t for _, t in ran} == set(tests)
    if not crash:
        assert len(ran) == len(tests)
        spark_on = {w for w, t in ran if "/spark/" in t}
        assert spark_on <= {"gw0", "gw1"}, spark_on


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("crash", [False, True])
def test_every_test_runs_and_nothing_hangs(workers, crash):
    for seed in range(150):
        _run(seed, workers, crash)
