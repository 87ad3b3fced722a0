"""How many connections the broker keeps, and for how long an idle one: Kafka's
``max.connections``, ``max.connections.per.ip``, ``max.connections.per.ip.overrides`` and
``connections.max.idle.ms``.

    | # | a new connection from address A                     | outcome                     |
    |---|-----------------------------------------------------|-----------------------------|
    | 1 | A's connections already at its limit: the override  | closed at once, logged      |
    |   | for A if max.connections.per.ip.overrides names A,  | (rate-limited)              |
    |   | else max.connections.per.ip                         |                             |
    | 2 | the broker's connections already at max.connections | closed at once, logged      |
    | 3 | otherwise                                           | served, counted until closed|

Then the connection creation rates (KIP-612): every new connection counts, served or not,
against ``listener.name.<listener>.max.connection.creation.rate`` (when set) and, on every
listener but the inter-broker one (Kafka exempts it), ``max.connection.creation.rate``, each
measured as a client quota is (security/quotas.py's Rate over quota.window.num windows of
quota.window.size.seconds). Over either, the connection is served only after the throttle
time (at most one window): Kafka's acceptor waits that long before it accepts the next
connection; here the connection is accepted and muted, nothing read from it handled, until
then. An address over its own ``connection_creation_rate`` (client_quotas.py) is closed
instead, as Kafka does.

Row 2 differs from Kafka, whose acceptor stops accepting (the connection waits in the
listen backlog) until one closes; here it is closed, and the client reconnects with its
backoff. The limits are read from the configuration at each accept, so an AlterConfigs of
them (they are cluster-wide dynamic keys in Kafka) applies to the next connection.

A connection with nothing going on (no request being handled, no answer waiting, not muted
by a quota) whose last read or write is older than ``connections.max.idle.ms`` is closed by
a sweep every tenth of that time (at least every 10 ms, at most every 30 s).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

from ..security.quotas import Rate, throttle_ms
from .config import INT_MAX, parse_connection_overrides

_BROKER = ""  # the broker-wide rate's key among the listeners' rates


class ConnectionLimits:
    def __init__(self, config) -> None:
        self.config = config
        self.per_ip: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.refused = 0
        self._overrides_text: str | None = None
        self._overrides: dict[str, int] = {}
        self._creations: dict[str, Rate] = {}  # by listener name, and _BROKER
        self.delayed = 0  # connections served late for a creation rate
        self.idle_ms: int = config.get("connections.max.idle.ms")
        self.idle_check_ms = min(max(self.idle_ms // 10, 10), 30_000) if self.idle_ms >= 0 \
            else 30_000

    def _limit_for(self, ip: str) -> int:
        text = self.config.get("max.connections.per.ip.overrides")
        if text != self._overrides_text:
            self._overrides, self._overrides_text = parse_connection_overrides(text), text
        return self._overrides.get(ip, self.config.get("max.connections.per.ip"))

    def admit(self, ip: str) -> str | None:
        """Count a new connection from ``ip``; or why it is refused (not counted)."""
        per_ip = self._limit_for(ip)
        if self.per_ip[ip] >= per_ip:
            self.refused += 1
            return f"{ip} already has max.connections.per.ip ({per_ip}) connections"
        total = self.config.get("max.connections")
        if self.total >= total:
            self.refused += 1
            return f"the broker already has max.connections ({total}) connections"
        self.per_ip[ip] += 1
        self.total += 1
        return None

    def creation_delay(self, listener: str, now_ms: int) -> int:
        """A new connection on ``listener`` counted against the creation rates: how long
        (ms) before it is served; 0 at once."""
        config = self.config
        limits = [(listener, config.listener_overrides.get(
            f"listener.name.{listener.lower()}.max.connection.creation.rate"))]
        if listener != config.inter_broker_listener_name:
            limits.append((_BROKER, config.get("max.connection.creation.rate")))
        window_ms = config.get("quota.window.size.seconds") * 1000
        delay = 0
        for key, limit in limits:
            if limit is None or limit >= INT_MAX:
                continue
            rate = self._creations.get(key)
            if rate is None:
                rate = self._creations[key] = Rate(config.get("quota.window.num"), window_ms)
            rate.record(1, now_ms)
            # a limit of 0 takes nothing: each connection waits the longest
            delay = max(delay, throttle_ms(rate, limit, now_ms, window_ms) if limit
                        else window_ms)
        if delay:
            self.delayed += 1
        return delay

    def release(self, ip: str) -> None:
        self.total -= 1
        self.per_ip[ip] -= 1
        if self.per_ip[ip] <= 0:
            del self.per_ip[ip]

    def idle(self, connections: Iterable[Any], now: float) -> list[Any]:
        """The connections to close for connections.max.idle.ms (each has ``idle`` and
        ``last_active``, monotonic seconds)."""
        if self.idle_ms < 0:  # Kafka: -1 never closes
            return []
        cutoff = now - self.idle_ms / 1000
        return [c for c in connections if c.idle and c.last_active < cutoff]
