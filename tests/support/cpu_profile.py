"""Where the suite's CPU goes: a pytest plugin, off by default, that records each test's CPU
(user + system) of the test process AND of every process it started (brokers, JVMs, Spark's
Python workers, tools), from its setup to its teardown.

    .venv/bin/python -m pytest tests/spark -q -p no:xdist -p support.cpu_profile \\
        -o cpu_profile_file=/tmp/cpu.tsv

prints the 30 most expensive tests at the end and writes every test's row to the file
(nodeid, wall s, CPU s, of which in the test process itself), then a ``#process`` row per
process it started (command line, own CPU). Under xdist (``make test ARGS="-p
support.cpu_profile -o cpu_profile_file=/tmp/cpu.tsv"``) each worker writes its own file,
``/tmp/cpu.tsv.gw0``, ``.gw1``, ..., and nothing is printed. Session fixtures are charged to
the first test that uses them. Wall time says little on a shared machine; the summed CPU
against the summed wall time says how much of the run the cores sat idle (what more xdist
workers than cores fill, see the Makefile).

The CPU of a process tree: this process's own (``RUSAGE_SELF``), its reaped children's
(``RUSAGE_CHILDREN``), and each live descendant's own plus its reaped children's
(``/proc/<pid>/stat`` utime, stime, cutime, cstime). A descendant that its parent never reaps
(orphaned: a job killed with its process group, the JVM outliving it) is reaped by init, and its
CPU reaches no rusage of ours: a thread samples the tree every 0.2 s and keeps the last value of
each process; one that vanishes with its parent gone too is counted at that value (what it used
after its last sample is lost, at most 0.2 s of it).
"""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

import pytest

_TICK = os.sysconf("SC_CLK_TCK")
_PERIOD = 0.2


def _stat(pid: str) -> tuple[int, int, float, float] | None:
    """(ppid, starttime, own CPU, reaped children's CPU) of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return int(fields[1]), int(fields[19]), (utime + stime) / _TICK, (cutime + cstime) / _TICK


def _command(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [os.path.basename(a.decode(errors="replace")) for a in args if a][:4]
    return " ".join(w[:60] for w in words)


class TreeCpu:
    """The CPU of this process and everything it started, dead or alive, as a running total."""

    def __init__(self) -> None:
        self.me = os.getpid()
        self.lock = threading.Lock()
        self.seen: dict[int, tuple[int, int, float, float]] = {}  # pid -> last _stat
        self.lost = 0.0  # CPU of vanished orphans (no rusage of ours got it)
        self.last = 0.0
        # (pid, starttime) -> [command line, last own CPU]: what each kind of process costs
        self.kinds: dict[tuple[int, int], list] = {}

    def sample(self) -> float:
        """The running total; the last one while this process is out of descriptors (a test
        of running out of them lowers RLIMIT_NOFILE)."""
        try:
            self.last = self._sample()
        except OSError:
            pass
        return self.last

    def _sample(self) -> float:
        with self.lock:
            now = {}
            for pid in os.listdir("/proc"):
                if pid.isdigit() and int(pid) != self.me:
                    found = _stat(pid)
                    if found is not None:
                        now[int(pid)] = found
            tree = {self.me}
            children: dict[int, list[int]] = {}
            for pid, (ppid, *_rest) in now.items():
                children.setdefault(ppid, []).append(pid)
            todo = [self.me]
            while todo:
                for child in children.get(todo.pop(), ()):
                    tree.add(child)
                    todo.append(child)
            alive = {pid: now[pid] for pid in tree - {self.me}}
            for pid, (_ppid, start, _own, _reaped) in self.seen.items():
                later = now.get(pid)
                if later is not None and later[1] == start:
                    alive[pid] = later  # tracked even when reparented out of the tree
            for pid, (ppid, _start, own, reaped) in self.seen.items():
                if pid not in alive and ppid != self.me and ppid not in alive:
                    # Gone, and not reaped by us nor by a process we follow (whose reaped
                    # children's CPU we count): orphaned, reaped by init.
                    self.lost += own + reaped
            for pid, (_ppid, start, own, _reaped) in alive.items():
                kind = self.kinds.setdefault((pid, start), [_command(pid), 0.0])
                kind[1] = own
            self.seen = alive
            mine = resource.getrusage(resource.RUSAGE_SELF)
            reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
            return (mine.ru_utime + mine.ru_stime + reaped.ru_utime + reaped.ru_stime
                    + self.lost + sum(own + cut for _, _, own, cut in alive.values()))


def _own() -> float:
    mine = resource.getrusage(resource.RUSAGE_SELF)
    return mine.ru_utime + mine.ru_stime


class CpuProfile:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self.tree = TreeCpu()
        self.rows: list[tuple[str, float, float, float]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True, name="cpu_profile")
        self.thread.start()

    def _watch(self) -> None:
        while not self.stopping.wait(_PERIOD):
            self.tree.sample()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        wall, cpu, own = time.monotonic(), self.tree.sample(), _own()
        yield
        self.rows.append((item.nodeid, time.monotonic() - wall, self.tree.sample() - cpu,
                          _own() - own))

    def pytest_sessionfinish(self, session):
        # Under xdist each worker holds its own tests' rows and the controller none: each
        # writes its own file (the worker's id appended), and a worker prints no summary.
        self.stopping.set()
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        if self.path and (self.rows or not worker):
            path = f"{self.path}.{worker}" if worker else self.path
            with open(path, "w") as out:
                for nodeid, wall, cpu, own in self.rows:
                    out.write(f"{nodeid}\t{wall:.2f}\t{cpu:.2f}\t{own:.2f}\n")
                for command, own in self.tree.kinds.values():
                    out.write(f"#process\t{command}\t{own:.2f}\n")

    def pytest_terminal_summary(self, terminalreporter):
        self.stopping.set()
        rows = sorted(self.rows, key=lambda row: -row[2])
        write = terminalreporter.write_line
        write(f"CPU of the tests and their processes: {sum(r[2] for r in rows):.1f} s in "
              f"{len(rows)} tests ({sum(r[3] for r in rows):.1f} s in this process); "
              f"the 30 most:")
        for nodeid, wall, cpu, own in rows[:30]:
            write(f"{cpu:8.1f} s CPU {wall:7.1f} s wall {own:7.1f} s here  {nodeid}")
        kinds: dict[str, list] = {}
        for command, own in self.tree.kinds.values():
            kind = kinds.setdefault(command, [0, 0.0])
            kind[0] += 1
            kind[1] += own
        write("Own CPU of the processes started, by command line (as last sampled):")
        for command, (count, own) in sorted(kinds.items(), key=lambda k: -k[1][1])[:25]:
            write(f"{own:8.1f} s CPU {count:5d} processes  {command}")


def pytest_addoption(parser):
    parser.addini("cpu_profile_file", "where support.cpu_profile writes its rows")


def pytest_configure(config):
    config.pluginmanager.register(CpuProfile(config.getini("cpu_profile_file") or None),
                                  "cpu_profile")
