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
| D2  | left; a partition's state still names it leader, and a   | yes, as it was  |
|     | registered broker of that ISR can take it over (no       | registered      |
|     | election yet)                                            |                 |
| D3  | left without a controlled shutdown (killed, cut off),    | yes, as it was  |
|     | less than GRACE_S since this broker saw it leave or, D2  | registered      |
|     | over, stop leading                                       |                 |
| D4  | left after this broker saw it in controlled shutdown and | no (D1 if again)|
|     | leading nothing another could take (its leaderships      |                 |
|     | moved before it left: no answer can race), or past D3's  |                 |
|     | grace, or registered again                               |                 |

D4's first case keeps a rolling restart's stopped broker out of Metadata at once: a
client's fan-out to every named broker (ListGroups, as kafka-python's admin and ours send it)
would otherwise meet its refused connection for the grace. A stop is known by its znode
(``/oncelog/controlled_shutdown/<id>``, membership.py's ``left_cleanly``), made before its
leaderships move, which the broker waits for before it leaves. D3 does not ask whether the
broker led anything when it left: this broker's picture of the leaders and of the
registrations come by different threads, and the controller's moves after a crash could be
read first. A broker killed or cut off while leading nothing is named for the grace, as it
was named, dead, until its session expired. A client that tries a named dead broker meets a
refused connection (a dead process) or a connection timeout (a broker cut off) and asks
another, as it does for a broker that died before its session expired; only Metadata names
departed brokers (DescribeCluster, the Produce and Fetch answers' leader endpoints do not).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from .znodes import BrokerRegistration

GRACE_S = 3.0  # librdkafka's metadata queries back off to 1 s: two of them, and a margin


@dataclass
class _Departed:
    registration: BrokerRegistration
    until: float  # named until then (D3), or while it leads something (D2)
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

    def observe(self, registered: Iterable[BrokerRegistration], now: float,
                cleanly: Collection[int] = ()) -> None:
        """The registrations read now: those gone since the last read are departed, named
        for the grace (D3) unless they left ``cleanly`` (then only while ``leaders`` finds
        them leading, D2); those back are D1 again."""
        current = {b.broker_id: b for b in registered}
        for broker_id, gone in self._registered.items():
            if broker_id not in current:
                self._departed[broker_id] = _Departed(
                    gone, now if broker_id in cleanly else now + GRACE_S, False)
        for broker_id in current:
            self._departed.pop(broker_id, None)
        self._registered = current

    def leaders(self, leading: Collection[int], now: float) -> None:
        """Which departed brokers some partition's state names leader now (D2); one that
        stops leading is named GRACE_S more from now (D3); one past its grace is forgotten
        (D4)."""
        for broker_id, d in self._departed.items():
            if broker_id in leading:
                d.leading = True
            elif d.leading:
                d.leading, d.until = False, now + GRACE_S
        self._expire(now)

    def named(self, registered: tuple[BrokerRegistration, ...], now: float
              ) -> tuple[BrokerRegistration, ...]:
        """The brokers to name, by id: ``registered`` (D1) and the departed under D2/D3."""
        self._expire(now)
        if not self._departed:
            return registered
        return tuple(sorted((*registered, *(d.registration for d in self._departed.values())),
                            key=lambda b: b.broker_id))

    def _expire(self, now: float) -> None:
        for broker_id in [b for b, d in self._departed.items()
                          if not d.leading and d.until <= now]:
            del self._departed[broker_id]  # D4
