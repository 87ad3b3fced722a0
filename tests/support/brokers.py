"""Real oncelog brokers as processes of their own on ephemeral loopback ports, for the tests.

Each is forked from a zygote that has imported the broker (support/broker_forks.py): a start
costs a fork, not an interpreter and oncelog's import. A broker with a ``preexec`` or an
``env`` of its own, or every broker under ``ONCELOG_TEST_EXEC_BROKERS=1``, is
``python -m oncelog broker`` as before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from oncelog.broker.announce import wait_for_announcement
from support.broker_forks import ForkedProcess, forked_broker

START_TIMEOUT = 30.0
# Every broker from a fresh interpreter (support/broker_forks.py says when one is anyway).
EXEC_BROKERS = os.environ.get("ONCELOG_TEST_EXEC_BROKERS") == "1"
STOP_TIMEOUT = 30.0


class BrokerProcess:
    """One broker process; ``restart`` keeps its data directory and its port."""

    def __init__(self, data_dir: Path, settings: dict[str, str] | None = None,
                 env: dict[str, str] | None = None, preexec=None) -> None:
        self.data_dir = Path(data_dir)
        self.settings = dict(settings or {})
        self.env = dict(env or {})
        self.preexec = preexec  # run in the child before the broker (e.g. a setrlimit)
        self.port = 0  # the PLAINTEXT listener's, else the first listener's
        self.ports: dict[str, int] = {}  # every listener's port, by name (SASL_SSL, ...)
        self.metrics_port: int | None = None  # metrics.listener's, 127.0.0.1:0 unless set
        self.proc: subprocess.Popen | ForkedProcess | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def bootstrap_for(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self) -> BrokerProcess:
        args = [sys.executable, "-m", "oncelog", "broker",
                "--set", f"listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "--set", f"log.dirs={self.data_dir}", "--set", "metrics.listener=127.0.0.1:0"]
        for key, value in self.settings.items():
            args += ["--set", f"{key}={value}"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        if self.preexec is None and not self.env and not EXEC_BROKERS:
            self.proc = forked_broker(args[3:], env, str(self.log_path))
        else:
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, env=env,
                                         preexec_fn=self.preexec)
            log.close()
        found = wait_for_announcement(self.proc, START_TIMEOUT)
        if found is not None:
            first, self.metrics_port, self.ports = found
            self.port = self.ports.get("PLAINTEXT", first)
            if "listeners" in self.settings:  # a restart keeps every listener's port
                self.settings["listeners"] = ",".join(
                    f"{name}://127.0.0.1:{port}" for name, port in self.ports.items())
            return self
        self.kill()
        raise RuntimeError(f"broker did not start; its log:\n{self.log_text()}")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> int:
        """SIGTERM and wait: the clean shutdown path."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)
            raise RuntimeError("broker did not stop within the timeout") from None
        self.proc = None
        return code

    def kill(self) -> None:
        """SIGKILL: the crash path."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait(STOP_TIMEOUT)
        self.proc = None

    def restart(self, clean: bool = True) -> BrokerProcess:
        if clean:
            self.stop()
        else:
            self.kill()
        return self.start()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def loop_cpu(pid: int) -> float:
    """Seconds of CPU a broker's event loop (its main thread) has run, to the nanosecond:
    what a request cost it, whatever else the shared machine runs meanwhile (wall-time
    ratios swing with the other xdist workers' load)."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    """Create a topic with confluent-kafka's admin client (a client we did not write)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive its futures
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(START_TIMEOUT)


def batches_on_disk(broker: BrokerProcess, topic: str, partition: int) -> list:
    """Every batch header of a partition, read straight from its segment files."""
    from oncelog.protocol.record_batch import scan_batches

    directory = Path(broker.data_dir) / f"{topic}-{partition}"
    headers = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".log"):
            headers += [h for _, h in scan_batches((directory / name).read_bytes())]
    return headers


def append_on_disk(broker: BrokerProcess, topic: str, partition: int,
                   batches: list[bytes]) -> int:
    """Append batches no client may produce (control batches, compacted batches) to a
    partition's log the way the broker appends, through the log classes, with the broker
    stopped; it is started again on the same port. Each batch's base offset is set to where
    it lands. Returns the log end offset after them."""
    import struct

    from oncelog.log.log import Log, LogConfig
    from oncelog.protocol.record_batch import read_header

    broker.stop()
    log = Log(str(Path(broker.data_dir) / f"{topic}-{partition}"), LogConfig())
    try:
        for batch in batches:
            placed = bytearray(batch)
            struct.pack_into(">q", placed, 0, log.log_end_offset)
            log.append([bytes(placed)], [read_header(placed)])
        end = log.log_end_offset
    finally:
        log.close()
    broker.start()
    return end


def produce_batches(bootstrap: str, topic: str, first: int, batches: int) -> None:
    """``batches`` batches of 10 records of 100 bytes each (values first, first + 1, ...),
    through the wire one batch a request: each batch about 1.1 KB."""
    from oncelog.client.network import calls
    from oncelog.client.network.connection import connect
    from oncelog.protocol.records import encode_batch

    now = int(time.time() * 1000)
    with connect(bootstrap, timeout=START_TIMEOUT) as conn:
        for b in range(batches):
            values = [b"%-100d" % (first + 10 * b + i) for i in range(10)]
            calls.produce(conn, topic, 0, encode_batch([(None, v, (), now) for v in values]))


def wait_for_log_start(bootstrap: str, topic: str, past: int) -> int:
    """The log start offset of partition 0 once retention has moved it past ``past``."""
    from oncelog import Consumer, TopicPartition

    with Consumer({"bootstrap.servers": bootstrap}) as c:
        c.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + START_TIMEOUT
        while (low := c.watermarks(TopicPartition(topic, 0))[0]) <= past:
            assert time.monotonic() < deadline, "retention deleted nothing"
            time.sleep(0.05)
    return low


def read_to_end(bootstrap: str, topic: str, partitions: int = 1,
                timeout: float = 60.0) -> dict[int, list[tuple[int, bytes]]]:
    """(offset, value) of every record of each partition, read with confluent-kafka (a
    client we did not write) until it reports the end of every partition."""
    import time

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    found: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(at_end) < partitions and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            found[msg.partition()].append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    assert len(at_end) == partitions, f"did not reach the end of {topic} within {timeout}s"
    return found


def acknowledged_lost(bootstrap: str, topic: str, acked: dict[bytes, int],
                      timeout: float = 60.0) -> list[int]:
    """The offsets of partition 0 at which a record acknowledged there (``acked``: value ->
    offset, values unique) is not found, read once the high watermark has passed every one
    of them (an acks=1 answer comes before the followers have the record)."""
    from confluent_kafka import Consumer, TopicPartition

    from support.waits import wait_for

    last = max(acked.values(), default=-1)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        wait_for(lambda: consumer.get_watermark_offsets(TopicPartition(topic, 0),
                                                        timeout=timeout)[1] > last,
                 timeout, "the high watermark past every acknowledged record")
    finally:
        consumer.close()
    stored = dict(read_to_end(bootstrap, topic, 1, timeout)[0])
    return sorted(o for v, o in acked.items() if stored.get(o) != v)
