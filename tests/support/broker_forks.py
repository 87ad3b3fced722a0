"""Broker processes forked from a process that has already imported the broker.

The suite starts hundreds of brokers; as ``python -m oncelog broker`` each paid for a fresh
interpreter and oncelog's import (about a second of CPU on the test machine, a third of the
workers' time) before doing anything. Here each test process starts one zygote
(support/broker_zygote.py, single-threaded) that imports the broker once; every broker is a
fork of it: a real, separate OS process with its own pid, its stderr in its own log file and
its stdout a pipe to the test, that a test may SIGKILL, SIGSTOP or SIGTERM and whose exit
code it reads, as with ``subprocess.Popen``. ``ForkedProcess`` is the part of Popen the
tests use; run_oncelog is ``subprocess.run`` for the command-line tools, forked the same
way. The zygote reaps each process and writes its exit code to a pipe the test reads.

What a fork cannot give, BrokerProcess still gets from a fresh interpreter: a ``preexec``
(it must run before the broker's imports, as a setrlimit does) or an ``env`` of its own
(oncelog reads some variables as it is imported). ``ONCELOG_TEST_EXEC_BROKERS=1`` starts
every broker that way.
"""

from __future__ import annotations

import io
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

    def fork(self, argv: list[str], env: dict[str, str], status_w: int,
             stdio: tuple[int, int, int]) -> int:
        request = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
        with self.lock:
            socket.send_fds(self.sock, [request], [status_w, *stdio])
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


class ForkedProcess:
    """The part of ``subprocess.Popen`` the tests use, for an ``oncelog`` process forked from
    the zygote: ``python -m oncelog ARGV`` with ``env``, the test's working directory and the
    given stdin, stdout and stderr (file descriptors, still the caller's to close)."""

    def __init__(self, argv: list[str], env: dict[str, str],
                 stdio: tuple[int, int, int]) -> None:
        self.args = argv
        self.returncode: int | None = None
        self.stdout: io.BufferedReader | None = None
        self._status, status_w = os.pipe()
        try:
            self.pid = zygote().fork(argv, env, status_w, stdio)
        except BaseException:
            os.close(self._status)
            raise
        finally:
            os.close(status_w)

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


def forked_broker(argv: list[str], env: dict[str, str], log_path: str) -> ForkedProcess:
    """A broker as BrokerProcess starts it: stdout a pipe it announces its ports on (the
    process's ``stdout``), stderr appended to its log."""
    stdout_r, stdout_w = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        proc = ForkedProcess(argv, env, (null, stdout_w, log))
    except BaseException:
        os.close(stdout_r)
        raise
    finally:
        for fd in (null, stdout_w, log):
            os.close(fd)
    proc.stdout = os.fdopen(stdout_r, "rb")
    return proc


def run_oncelog(*args: str, input: str | None = None, timeout: float = 60.0,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-m", "oncelog", *args], input=input,
    capture_output=True, text=True, timeout=timeout)``, the process forked from the zygote:
    a command-line tool costs a fork, not an interpreter and oncelog's import."""
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    ours = [stdin_w, out_r, err_r]  # still open on this side
    try:
        try:
            proc = ForkedProcess(list(args), {**os.environ, **(env or {})},
                                 (stdin_r, out_w, err_w))
        finally:
            for fd in (stdin_r, out_w, err_w):
                os.close(fd)
        pending = (input or "").encode()
        chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
        deadline = time.monotonic() + timeout
        while out_r in ours or err_r in ours:
            if stdin_w in ours and not pending:
                os.close(stdin_w)
                ours.remove(stdin_w)
            left = deadline - time.monotonic()
            readable, writable, _ = select.select(
                [fd for fd in ours if fd != stdin_w], [fd for fd in ours if fd == stdin_w], [],
                max(0.0, left))
            if not readable and not writable and left <= 0:
                proc.kill()
                proc.wait()
                raise subprocess.TimeoutExpired(["oncelog", *args], timeout)
            if writable:
                try:
                    pending = pending[os.write(stdin_w, pending[:65536]):]
                except BrokenPipeError:
                    pending = b""
            for fd in readable:
                data = os.read(fd, 65536)
                chunks[fd].append(data)
                if not data:
                    os.close(fd)
                    ours.remove(fd)
        code = proc.wait(max(0.0, deadline - time.monotonic()))
    finally:
        for fd in ours:
            os.close(fd)
    return subprocess.CompletedProcess(
        ["oncelog", *args], code, b"".join(chunks[out_r]).decode(errors="replace"),
        b"".join(chunks[err_r]).decode(errors="replace"))
