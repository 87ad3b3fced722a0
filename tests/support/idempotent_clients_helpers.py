"""What tests besides tests/e2e/test_idempotent_clients.py use of it."""
from __future__ import annotations

import re
import urllib.request

from support.brokers import BrokerProcess

TIMEOUT = 20.0  # seconds: the bound on a single wait (a request, a poll, a broker start)


def produce_outcomes(broker: BrokerProcess, topic: str) -> dict[str, int]:
    """The broker's produce outcome counters for ``topic`` (since it last started)."""
    with urllib.request.urlopen(broker.metrics_url, timeout=TIMEOUT) as r:
        text = r.read().decode()
    outcomes: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r'oncelog_produce_batches_total\{topic="([^"]*)",partition="\d+",'
                         r'outcome="([^"]*)"\} (\d+)$', line)
        if match and match.group(1) == topic:
            outcomes[match.group(2)] = outcomes.get(match.group(2), 0) + int(match.group(3))
    return outcomes
