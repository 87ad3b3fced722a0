"""The zygote of support/broker_forks.py: imports the broker and the command-line tools once,
then forks an ``oncelog`` process (a broker, or a command) for each request of its test
process. Run as ``python broker_zygote.py FD`` (FD: its end of a
SOCK_SEQPACKET socket pair with the test process).

Each request is JSON (argv, env, working directory) with four file descriptors: a pipe for
the exit code, then the process's stdin, stdout and stderr. The zygote answers the process's
pid, reaps it when it exits and writes its exit code (negative: the signal that ended it) to
that pipe, as ``Popen.wait`` would give it. A forked process leaves the zygote's loop and runs as
``python -m oncelog`` does, ending as that interpreter would (its atexit handlers, its threads
joined). The zygote ends when its test process closes its end.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys

# What ``oncelog broker`` imports, as it starts and once it serves (found with
# ``python -X importtime -m oncelog broker``): a fork imports none of it again.
PRELOAD = [
    "oncelog.cli.main", "oncelog.cli.chaos", "oncelog.cli.configs", "oncelog.cli.spark",
    "oncelog.cli.tools", "oncelog.broker.announce", "oncelog.broker.log_limits",
    "oncelog.broker.server", "oncelog.broker.log_cleaner", "oncelog.cluster",
    "concurrent.futures.thread", "encodings.idna", "uvloop",
]

_STATUS = struct.Struct("=i")


def serve(control: socket.socket) -> dict | None:
    """Fork until the test process goes; returns a request in a forked process only."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    exits: dict[int, int] = {}  # pid -> the write end of its exit-code pipe
    control.send(json.dumps({"ready": True}).encode())
    while True:
        readable, _, _ = select.select([control, wake_r], [], [])
        if wake_r in readable:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
        _reap(exits)
        if control not in readable:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
        except ConnectionError:
            message, fds = b"", []
        if not message:
            return None  # the test process went
        request = json.loads(message)
        status_w, stdio = fds[0], fds[1:]
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"error": repr(exc)}).encode())
            continue
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (wake_r, wake_w, status_w, *exits.values()):
                os.close(fd)
            control.close()
            for target, fd in enumerate(stdio):  # stdin, stdout, stderr
                os.dup2(fd, target)
                os.close(fd)
            return request
        for fd in stdio:
            os.close(fd)
        exits[pid] = status_w
        control.send(json.dumps({"pid": pid}).encode())


def _reap(exits: dict[int, int]) -> None:
    while exits:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status_w = exits.pop(pid, None)
        if status_w is not None:
            os.write(status_w, _STATUS.pack(os.waitstatus_to_exitcode(status)))
            os.close(status_w)


def run(request: dict) -> None:
    """What ``python -m oncelog`` runs."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(line_buffering=True, write_through=True)
        sys.stderr.reconfigure(line_buffering=True, write_through=True)
    import oncelog
    from oncelog.cli.main import main

    sys.argv = [os.path.join(os.path.dirname(oncelog.__file__), "__main__.py"), *request["argv"]]
    sys.exit(main(request["argv"]))


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as for ``python -m``: tests/support/ would shadow modules
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # uvloop is optional
            if name != "uvloop":
                raise
    # What the imports made is never garbage in a fork: frozen, a fork's collections (its exit's
    # above all, 0.45 s of a command's 0.55 s) leave it alone instead of copying every page.
    gc.freeze()
    control = socket.socket(fileno=int(sys.argv[1]))
    job = serve(control)
    if job is not None:
        run(job)
