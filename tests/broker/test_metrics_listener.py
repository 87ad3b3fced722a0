"""/metrics on its own listener (issue 28 #9): the Kafka port answers Kafka only, the
metrics listener (metrics.listener) serves Prometheus text rendered off the event loop, and
per-partition metrics keep at most metrics.partition.series.max series."""

from __future__ import annotations

import socket
import urllib.request

from confluent_kafka import Producer
from support.brokers import create_topic

TIMEOUT = 30.0


def _scrape(broker) -> str:
    with urllib.request.urlopen(broker.metrics_url, timeout=TIMEOUT) as answer:
        return answer.read().decode()


def test_the_kafka_port_answers_no_http(broker):
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(1000) == b""  # a 1.2 GB frame size: closed, nothing answered
    assert "oncelog_connections" in _scrape(broker)


def test_no_metrics_listener_unless_set(start_broker):
    broker = start_broker(metrics_listener="")
    assert broker.metrics_port is None
    assert "metrics served" not in broker.log_text()


def test_per_partition_series_are_capped(start_broker):
    limit = 20
    broker = start_broker(metrics_partition_series_max=str(limit))
    partitions = limit + 12
    create_topic(broker.bootstrap, "many", partitions)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50,
                         "enable.idempotence": True})
    for p in range(partitions):
        producer.produce("many", value=b"v", partition=p)
    assert producer.flush(TIMEOUT) == 0
    text = _scrape(broker)
    produced = [line for line in text.splitlines()
                if line.startswith("oncelog_produce_batches_total{")]
    held = [line for line in text.splitlines() if line.startswith("oncelog_producers{")]
    assert len(produced) == limit and len(held) == limit
    assert 'oncelog_partition_series_omitted{metric="produce_batches"} 12' in text
    assert 'oncelog_partition_series_omitted{metric="producers"} 12' in text


def test_scrapes_render_in_a_worker_thread_one_at_a_time(tmp_path, monkeypatch):
    """In process, on a real broker: the text is rendered off the event loop's thread, and
    scrapes that arrive while one renders share it (four scrapers cost one rendering)."""
    import asyncio
    import threading
    import time

    from oncelog.broker import metrics
    from oncelog.broker.config import BrokerConfig
    from oncelog.broker.server import Broker

    calls: list[str] = []
    real_render = metrics.render

    def render(broker) -> str:
        calls.append(threading.current_thread().name)
        time.sleep(0.5)  # long enough for the other scrapes to arrive meanwhile
        return real_render(broker)

    monkeypatch.setattr(metrics, "render", render)

    async def scrape(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), TIMEOUT)
        writer.close()
        return answer

    async def main() -> list[bytes]:
        broker = Broker(BrokerConfig({"log.dirs": str(tmp_path), "metrics.listener":
                                      "127.0.0.1:0", "listeners": "PLAINTEXT://127.0.0.1:0"}))
        await broker.start()
        try:
            port = broker.metrics_address[1]
            return await asyncio.gather(*(scrape(port) for _ in range(4)))
        finally:
            await broker.stop()

    answers = asyncio.run(main())
    assert all(a.startswith(b"HTTP/1.1 200 OK") and b"oncelog_connections" in a
               for a in answers)
    assert len(calls) == 1 and calls[0] != threading.main_thread().name, calls


def test_a_scrape_open_when_the_broker_stops_ends_without_a_traceback(start_broker):
    """A scraper connected and silent when the broker stops: the loop's end cancels its
    handler, and Python 3.11's StreamReaderProtocol then asked the cancelled task for its
    exception, which raised into asyncio's handler ("Exception in callback", a traceback in
    the broker's log at every such stop; seen in a CI run)."""
    broker = start_broker()
    with socket.create_connection(("127.0.0.1", broker.metrics_port), timeout=10) as sock:
        sock.sendall(b"GET /metr")  # the head not whole: its handler waits in readuntil
        assert broker.stop() == 0
    assert "Traceback" not in broker.log_text(), broker.log_text()
