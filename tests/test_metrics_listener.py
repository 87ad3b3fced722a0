"""/metrics on its own listener (issue 28 #9): the Kafka port answers Kafka only, the
metrics listener (metrics.listener) serves Prometheus text rendered off the event loop, and
per-partition metrics keep at most metrics.partition.series.max series."""

from __future__ import annotations

import socket
import urllib.request

from brokers import create_topic
from confluent_kafka import Producer

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
