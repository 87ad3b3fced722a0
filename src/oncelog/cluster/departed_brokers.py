"""The brokers a Metadata answer names: the registered ones, and for a short grace those that
just left /brokers/ids. Pure: registrations, leaders and times in, the list out.

Why a grace: librdkafka (2.x) decommissions a broker the moment a Metadata answer no longer
names it, and that broker's thread, tearing down, hands every partition it still holds back
to "no leader", among them those the same answer has just moved to their new leader. A
failover's answer does both at once (the dead leader's registration went when its session
expired, and the controller moved its leaderships then), so librdkafka's producer put the
moved partitions back to no leader and waited for its next metadata query, a second later
(``retry.backoff.max.ms``): measured with ``debug=metadata,broker`` in
bench/replication.py's failover, 4.5 s from a ``kill -9`` to the first acknowledgement with a
3 s session, where the new leader was known at 3.1 s. Kafka's answer drops the broker at once
too, and librdkafka meets the same race there. Named for a grace after the answer that moves
its partitions, the dead broker is decommissioned by a later answer, when it holds nothing.

| row | broker                                                   | named           |
|-----|----------------------------------------------------------|-----------------|
| D1  | registered                                               | yes, as now     |
| D2  | left; a partition's state still names it leader (no      | yes, as it was  |
|     | election yet, or none possible)                          | registered      |
| D3  | left, leads nothing, and it is less than GRACE_S since   | yes, as it was  |
|     | this broker saw it leave, or saw it lead last            | registered      |
| D4  | left longer ago, or registered again                     | no (D1 if again)|

A client that tries a named dead broker meets a refused connection (a dead process) or a
connection timeout (a broker cut off) and asks another, as it does for a broker that died
before its session expired; only Metadata names departed brokers (DescribeCluster, the
Produce and Fetch answers' leader endpoints do not).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from .znodes import BrokerRegistration

GRACE_S = 3.0  # librdkafka's metadata queries back off to 1 s: two of them, and a margin


@dataclass
class _Departed:
    registration: BrokerRegistration
    until: float  # named until then, unless it leads something (D2)
    leading: bool


class DepartedBrokers:
    __slots__ = ("_departed", "_registered")

    def __init__(self) -> None:
        self._registered: dict[int, BrokerRegistration] = {}
        self._departed: dict[int, _Departed] = {}

    @property
    def departed(self) -> Collection[int]:
        """The ids of the brokers named under D2 or D3 (as last observed)."""
        return self._departed.keys()

    def observe(self, registered: Iterable[BrokerRegistration], now: float) -> None:
        """The registrations read now: those gone since the last read begin their grace
        (D3, or D2 once ``leaders`` says so), those back are D1 again."""
        current = {b.broker_id: b for b in registered}
        for broker_id, gone in self._registered.items():
            if broker_id not in current:
                self._departed[broker_id] = _Departed(gone, now + GRACE_S, False)
        for broker_id in current:
            self._departed.pop(broker_id, None)
        self._registered = current

    def leaders(self, leading: Collection[int], now: float) -> None:
        """Which departed brokers some partition's state names leader now (D2); one that
        stops leading is named GRACE_S more from now (D3)."""
        for broker_id, d in self._departed.items():
            if broker_id in leading:
                d.leading = True
            elif d.leading:
                d.leading, d.until = False, now + GRACE_S

    def named(self, registered: tuple[BrokerRegistration, ...], now: float
              ) -> tuple[BrokerRegistration, ...]:
        """The brokers to name, by id: ``registered`` (D1) and the departed under D2/D3;
        those past their grace are forgotten (D4)."""
        if not self._departed:
            return registered
        for broker_id in [b for b, d in self._departed.items()
                          if not d.leading and d.until <= now]:
            del self._departed[broker_id]
        if not self._departed:
            return registered
        return tuple(sorted((*registered, *(d.registration for d in self._departed.values())),
                            key=lambda b: b.broker_id))
