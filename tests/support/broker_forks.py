"""Broker processes forked from a process that has already imported the broker.

The suite starts hundreds of brokers; as ``python -m oncelog broker`` each paid for a fresh
interpreter and oncelog's import (about a second of CPU on the test machine, a third of the
workers' time) before doing anything. Here each test process starts one zygote
(support/broker_zygote.py, single-threaded) that imports the broker once; every broker is a
fork of it: a real, separate OS process with its own pid, its stderr in its own log file and
its stdout a pipe to the test, that a test may SIGKILL, SIGSTOP or SIGTERM and whose exit
code it reads, as with ``subprocess.Popen``. ``ForkedBroker`` is the part of Popen the
tests use; the zygote reaps each broker and writes its exit code to a pipe the test reads.

What a fork cannot give, BrokerProcess still gets from a fresh interpreter: a ``preexec``
(it must run before the broker's imports, as a setrlimit does) or an ``env`` of its own
(oncelog reads some variables as it is imported). ``ONCELOG_TEST_EXEC_BROKERS=1`` starts
every broker that way.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

ZYGOTE = Path(__file__).with_name("broker_zygote.py")
START_TIMEOUT = 60.0  # the zygote's own start: one import of the broker, on a busy machine
_STATUS = struct.Struct("=i")


class _Zygote:
    """The zygote of this test process, started on first use."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.proc = subprocess.Popen([sys.executable, str(ZYGOTE), str(theirs.fileno())],
                                         pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        self.sock = ours
        self.lock = threading.Lock()
        ready = self._receive(START_TIMEOUT)
        if ready.get("ready") is not True:
            raise RuntimeError(f"the broker zygote did not start: {ready}")

    def _receive(self, timeout: float) -> dict:
        readable, _, _ = select.select([self.sock], [], [], timeout)
        data = self.sock.recv(1 << 16) if readable else b""
        if not data:
            raise RuntimeError(f"the broker zygote did not answer (exit code {self.proc.poll()})")
        return json.loads(data)

    def fork(self, argv: list[str], env: dict[str, str], log_path: str,
             stdout_w: int, status_w: int) -> int:
        request = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd(),
                              "log": log_path}).encode()
        with self.lock:
            socket.send_fds(self.sock, [request], [stdout_w, status_w])
            answer = self._receive(START_TIMEOUT)
        if "pid" not in answer:
            raise RuntimeError(f"the broker zygote could not fork: {answer}")
        return answer["pid"]


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


def zygote() -> _Zygote:
    global _zygote
    with _zygote_lock:
        if _zygote is None or _zygote.owner != os.getpid() or _zygote.proc.poll() is not None:
            _zygote = _Zygote()
        return _zygote


class ForkedBroker:
    """The part of ``subprocess.Popen`` the tests use, for a broker forked from the zygote."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: str) -> None:
        self.args = argv
        self.returncode: int | None = None
        stdout_r, stdout_w = os.pipe()
        self._status, status_w = os.pipe()
        try:
            self.pid = zygote().fork(argv, env, log_path, stdout_w, status_w)
        except BaseException:
            os.close(stdout_r)
            os.close(self._status)
            raise
        finally:
            os.close(stdout_w)
            os.close(status_w)
        self.stdout = os.fdopen(stdout_r, "rb")

    def _read_status(self) -> None:
        data = os.read(self._status, _STATUS.size)
        os.close(self._status)
        if len(data) != _STATUS.size:
            raise RuntimeError(f"the broker zygote lost broker {self.pid} (its zygote exited)")
        (self.returncode,) = _STATUS.unpack(data)

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._status], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            while self.returncode is None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if select.select([self._status], [], [], left)[0]:
                    self._read_status()
                elif deadline is not None:
                    raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        if self.returncode is None and hasattr(self, "_status"):
            os.close(self._status)
