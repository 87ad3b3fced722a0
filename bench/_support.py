"""Shared helpers for the benchmarks: an oncelog broker subprocess and librdkafka's mock cluster.

Everything listens on 127.0.0.1 only, and every wait has a deadline.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from oncelog.broker.announce import wait_for_announcement

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
# "Mock cluster enabled: ... replaced with HOST:PORT" (a notice, logged without any debug
# context) or, with debug=mock, "Mock cluster NAME bootstrap.servers=HOST:PORT".
_MOCK_BOOTSTRAP = re.compile(r"Mock cluster .*(?:replaced with |bootstrap\.servers=)(\S+)")


class OncelogBroker:
    """``python -m oncelog broker`` on an ephemeral loopback port, with its own data dir."""

    def __init__(self, settings: dict[str, str] | None = None, src: Path | None = None,
                 base_dir: Path | None = None, start_timeout: float = START_TIMEOUT) -> None:
        self.settings = dict(settings or {})
        self.start_timeout = start_timeout  # longer on a machine too loaded to start in 30 s
        self.src = Path(src or REPO / "src").resolve()
        self._tmp = tempfile.TemporaryDirectory(prefix="oncelog-bench-", dir=base_dir)
        self.data_dir = Path(self._tmp.name) / "data"
        self.log_path = Path(self._tmp.name) / "broker.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.ports: dict[str, int] = {}  # every listener's, by name
        self.metrics_port: int | None = None  # with metrics.listener set

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __enter__(self) -> OncelogBroker:
        args = [sys.executable, "-m", "oncelog", "broker",
                "--set", "listeners=PLAINTEXT://127.0.0.1:0",
                "--set", f"log.dirs={self.data_dir}"]
        for key, value in self.settings.items():
            args += ["--set", f"{key}={value}"]
        env = self.env()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, env=env,
                                         cwd=self._tmp.name)
        found = wait_for_announcement(self.proc, self.start_timeout)
        if found is not None:
            self.port, self.metrics_port, self.ports = found
            return self
        self._kill()
        raise RuntimeError(f"oncelog broker did not start; its log:\n{self.log_text()}")

    def env(self) -> dict[str, str]:
        """The broker's environment: ``self.src`` first on the path."""
        return tree_env(self.src)

    def package_dir(self) -> str:
        """Where the broker's ``oncelog`` package is imported from."""
        out = subprocess.run([sys.executable, "-c", "import oncelog; print(oncelog.__file__)"],
                             env=self.env(), capture_output=True, text=True, timeout=60,
                             check=True)
        return str(Path(out.stdout.strip()).parent)

    def __exit__(self, *exc_info) -> None:
        try:
            self.stop()
        finally:
            self._tmp.cleanup()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._kill()
            raise RuntimeError("oncelog broker did not stop within the timeout") from None
        self.proc = None
        if code != 0 or "Traceback" in self.log_text():
            print(f"warning: oncelog broker exited with {code}; its log:\n{self.log_text()}",
                  file=sys.stderr)

    def _kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)
            self.proc = None


def source_tree(path: Path | None) -> Path:
    """The directory that holds package ``oncelog`` for ``path``, a checkout's root or its
    ``src/`` (``--src`` takes either); this repo's ``src/`` for None."""
    if path is None:
        return REPO / "src"
    return path / "src" if (path / "src" / "oncelog").is_dir() else path


def tree_env(src: Path) -> dict[str, str]:
    """An environment importing ``oncelog`` from ``src`` first (ahead of the editable
    install's .pth entry), so that a snapshot of another version can be measured."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    src_dir = str(Path(src).resolve())
    env["PYTHONPATH"] = (src_dir + os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                         else src_dir)
    return env


def python_in_tree(src: Path, code: str, *args: str, timeout: float) -> str:
    """Run ``code`` in a fresh interpreter that imports ``oncelog`` from ``src`` (a client
    of another version, beside its broker); its stdout. ``args`` are its ``sys.argv[1:]``."""
    out = subprocess.run([sys.executable, "-c", code, *args], env=tree_env(src),
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"the child under {src} failed ({out.returncode}):\n{out.stderr}")
    return out.stdout


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class MockCluster:
    """librdkafka's in-process mock cluster (one broker), kept alive by a holder client.

    The mock announces its address in the holder's log ("Mock cluster enabled: ... replaced
    with 127.0.0.1:PORT", a notice). ``debug=mock`` is deliberately not set: it logs every
    request the mock serves, which would slow the mock down and flatter oncelog.
    """

    def __init__(self) -> None:
        self._capture = _Capture()
        self._logger = logging.getLogger(f"oncelog.bench.mock.{id(self)}")
        self._logger.addHandler(self._capture)
        self._logger.setLevel(logging.DEBUG)
        self._logger.propagate = False
        self._holder = None
        self.bootstrap = ""

    def __enter__(self) -> MockCluster:
        from confluent_kafka import Producer

        self._holder = Producer({"test.mock.num.brokers": 1, "logger": self._logger})
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and not self.bootstrap:
            self._holder.poll(0.05)
            for message in self._capture.messages:
                match = _MOCK_BOOTSTRAP.search(message)
                if match:
                    self.bootstrap = match.group(1)
                    break
        if not self.bootstrap:
            # Fall back to the metadata the mock serves about itself.
            brokers = self._holder.list_topics(timeout=10).brokers
            broker = brokers[min(brokers)]
            self.bootstrap = f"{broker.host}:{broker.port}"
        host = self.bootstrap.rsplit(":", 1)[0]
        if host != "127.0.0.1":
            raise RuntimeError(f"mock cluster is not on loopback: {self.bootstrap}")
        return self

    def __exit__(self, *exc_info) -> None:
        if self._holder is not None:
            self._holder.flush(5)
            self._holder = None
        self._logger.removeHandler(self._capture)


def filesystem_of(path: str | Path) -> str:
    """'ext4 on /dev/vda' for the mount holding ``path`` (from /proc/mounts)."""
    path = os.path.realpath(path)
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                device, mount, fstype = line.split()[:3]
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) > len(best[0]):
                    best = (mount, fstype, device)
    except OSError:
        return "?"
    return f"{best[1]} on {best[2]}"


class LoadMeter:
    """How much CPU other processes took while we measured: the machine-wide user + system
    time from /proc/stat minus what this process, its reaped children and ``extra`` (a probe
    of a live broker's CPU seconds) used.

    The benchmark shares the CPUs with whatever else runs; on a 2-CPU machine a test suite
    running alongside halves the numbers, so this is measured for every run.
    """

    def __init__(self, extra: Callable[[], float] | None = None) -> None:
        self._extra = extra
        self._start = self._sample()

    @staticmethod
    def _busy_seconds() -> float:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:4]]  # user nice system
        return sum(fields) / os.sysconf("SC_CLK_TCK")

    def _sample(self) -> tuple[float, float, float]:
        t = os.times()
        ours = t.user + t.system + t.children_user + t.children_system
        if self._extra is not None:
            try:
                ours += self._extra()
            except OSError:  # the process is gone (and reaped: counted above)
                pass
        return time.monotonic(), self._busy_seconds(), ours

    def others_share(self) -> float:
        """CPU used by other processes, as a share of all CPUs, since the start."""
        wall0, busy0, ours0 = self._start
        wall1, busy1, ours1 = self._sample()
        cpus = os.cpu_count() or 1
        return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (max(wall1 - wall0, 1e-3) * cpus)


def other_load(seconds: float = 2.0) -> float:
    """Share of all CPUs that other processes use right now (measured over ``seconds``)."""
    meter = LoadMeter()
    time.sleep(seconds)
    return meter.others_share()


def wait_for_quiet(limit: float, timeout: float) -> float:
    """Wait up to ``timeout`` seconds until other processes use less than ``limit`` of the
    CPUs; returns the last measured share."""
    deadline = time.monotonic() + timeout
    while True:
        load = other_load(2.0)
        if load < limit or time.monotonic() >= deadline:
            return load
        print(f"waiting for a quiet machine: other processes use {load:.0%} of the CPUs",
              file=sys.stderr, flush=True)
        time.sleep(min(8.0, max(0.0, deadline - time.monotonic())))


def cpu_seconds_probe(pid: int) -> Callable[[], float]:
    """CPU seconds process ``pid`` has run so far, to the nanosecond: the sum of its threads'
    on-CPU time from /proc/PID/task/*/schedstat (/proc/PID/stat counts in 10 ms ticks, too
    coarse for a run of a second or two). A thread that has exited no longer counts."""
    tasks = f"/proc/{pid}/task"

    def probe() -> float:
        total = 0
        for tid in os.listdir(tasks):
            try:
                with open(f"{tasks}/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:  # the thread ended meanwhile
                pass
        return total / 1e9

    return probe


def median(values: list[float]) -> float:
    return statistics.median(values)


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(fraction * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def machine() -> str:
    import confluent_kafka

    def first(value) -> str:  # version() is a str in some releases, a tuple in others
        return value if isinstance(value, str) else value[0]

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), "")
    except OSError:
        pass
    return (f"{cpu or platform.machine()}, nproc={os.cpu_count()}, {platform.system()} "
            f"{platform.release()}; Python {platform.python_version()}; "
            f"confluent-kafka {first(confluent_kafka.version())}, "
            f"librdkafka {first(confluent_kafka.libversion())}")


# --- the options and the end every benchmark shares ------------------------------------------

def add_parts_argument(parser, parts: tuple[str, ...] | list[str]) -> None:
    """``--parts a,b``: which parts of the benchmark to run (default: all)."""
    parser.add_argument("--parts", default=",".join(parts),
                        help=f"comma-separated, of {', '.join(parts)}")


def add_json_argument(parser, help: str = "write the results as JSON") -> None:
    parser.add_argument("--json", metavar="PATH", help=help)


def write_json(results: dict, path: str | None) -> None:
    """What ``--json PATH`` asked for: the results, indented, at PATH (nothing without it)."""
    if path:
        Path(path).write_text(json.dumps(results, indent=2))


QUIET = 0.05  # --wait-quiet waits until other processes use less than this share of the CPUs


def add_quiet_arguments(parser, repeats: bool = True) -> None:
    """``--wait-quiet S``, which every module takes (make bench passes its ARGS to all): first
    wait up to S seconds until other processes use under QUIET of the CPUs; and for a module
    that repeats its runs, ``--max-other-load F``."""
    if repeats:
        parser.add_argument("--max-other-load", type=float, default=0.10, metavar="F",
                            help="repetitions in which other processes used more than F of "
                                 "the CPUs are left out of the medians (when at least 3 "
                                 "remain; default %(default)s)")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                        help=f"first wait up to S seconds until other processes use under "
                             f"{QUIET * 100:.0f}%% of the CPUs")


def wait_if_asked(args) -> float | None:
    """--wait-quiet's wait, when asked: the share of the CPUs others used at its end."""
    return wait_for_quiet(QUIET, args.wait_quiet) if args.wait_quiet > 0 else None


def produce_all(producer, topic: str, payload: bytes, n: int, deadline: float,
                partition: int = 0) -> None:
    """``n`` records into ``partition`` through a confluent-kafka producer, waiting on a full
    queue for deliveries, never past ``deadline`` (time.monotonic())."""
    for i in range(n):
        while True:
            try:
                producer.produce(topic, payload, partition=partition)
                break
            except BufferError:
                producer.poll(0.001)
                if time.monotonic() > deadline:
                    raise RuntimeError("the producer queue stayed full") from None
        if i % 10_000 == 0:
            producer.poll(0)
