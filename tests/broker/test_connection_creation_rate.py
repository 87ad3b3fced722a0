"""max.connection.creation.rate and listener.name.<l>.max.connection.creation.rate (KIP-612)
on a real broker with two listeners: PLAINTEXT (the inter-broker listener, which the
broker-wide rate leaves alone, as Kafka does) limited by its own listener rate, and EXTERNAL
limited by the broker-wide rate. A connection over a rate is served late (Kafka's acceptor
waits before accepting it), never refused; oncelog_connections_delayed_total counts them.

Rates are measured over quota.window.num=2 windows of a second, the first second counting as
one whole window: at 1 a second a first connection is in at once and a second within the
next second is held for what is left of it (served, late).
"""

from __future__ import annotations

import concurrent.futures
import urllib.request

import pytest

from oncelog.client.network.connection import connect

TIMEOUT = 20.0


@pytest.fixture
def rated(start_broker):
    return start_broker(**{
        "listeners": "PLAINTEXT://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT",
        "quota.window.num": "2", "quota.window.size.seconds": "1",
        "max.connection.creation.rate": "1",
        "listener.name.plaintext.max.connection.creation.rate": "1"})


def _delayed(broker) -> float:
    with urllib.request.urlopen(broker.metrics_url, timeout=TIMEOUT) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("oncelog_connections_delayed_total "):
                return float(line.split()[1])
    raise AssertionError("oncelog_connections_delayed_total not in /metrics")


def _open(bootstrap: str) -> None:
    """A new connection, closed once its first answer (ApiVersions) came."""
    connect(bootstrap, "rated", TIMEOUT).close()


def test_connections_over_a_creation_rate_are_served_late(rated):
    plaintext, external = rated.bootstrap_for("PLAINTEXT"), rated.bootstrap_for("EXTERNAL")
    _open(plaintext)
    # PLAINTEXT's connection is not the broker-wide rate's: EXTERNAL still has its one
    _open(external)
    assert _delayed(rated) == 0
    # side by side: EXTERNAL's second is over the broker-wide rate, PLAINTEXT's over its own
    # listener's; both are served
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(_open, (external, plaintext)))
    assert _delayed(rated) == 2
    assert "over listener EXTERNAL's connection creation rate" in rated.log_text()
