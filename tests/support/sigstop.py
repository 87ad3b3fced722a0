"""SIGSTOP that has taken effect before the test goes on.

``kill`` returns once the signal is queued; each thread of the process stops only when it
next runs, so on a loaded machine a ZooKeeper server or broker can go on answering for a
while after ``kill(SIGSTOP)`` returned (up to 24 ms measured on the shared 2-core machine,
and a request sent in that window was answered 2 times in 100): a test that means "what is
sent now goes unanswered" waits here until every thread of the process is stopped.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from .waits import wait_for

STOP_TIMEOUT = 5.0


def _every_thread_stopped(pid: int) -> bool:
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            continue
        # the state is the field after the command name, which may itself hold ") "
        if text[text.rindex(")") + 2] not in "TtZX":
            return False
    return True


def sigstop(pid: int, group: bool = False) -> None:
    """SIGSTOP to ``pid`` (its process group when ``group``), returning once every thread
    of ``pid`` is stopped."""
    (os.killpg if group else os.kill)(pid, signal.SIGSTOP)
    wait_for(lambda: _every_thread_stopped(pid), STOP_TIMEOUT,
             f"every thread of process {pid} stopped", interval=0.001)
