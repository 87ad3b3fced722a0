"""Replica placement: which brokers hold each new partition, the first being its preferred
leader, as Kafka's ZooKeeper-mode admin places them (AdminUtils.assignReplicasToBrokers).

Rack-unaware (some broker has no ``broker.rack``): brokers in id order; partition p's first
replica is broker ``(p + start) % n``, so leaders go round the brokers; its other replicas
follow at a distance ``1 + (shift + j) % (n - 1)`` from it, and ``shift`` grows by one each
time the partitions have gone once round the brokers, so the followers of one broker's
partitions are spread over all the others instead of always being its neighbours.

Rack-aware (every broker has a rack): the same walk over the brokers listed rack by rack in
turn (the first broker of each rack, then the second of each, ...), so consecutive leaders
sit in different racks; a follower is taken only from a rack without a replica of the
partition yet (unless every rack has one) and only a broker without one (unless every
broker has one).

Only brokers that can hold a replica are placed on (``usable``): a registered broker whose
log directories have all failed (its report under ``/oncelog/offline_replicas/<id>``, see
znodes.py) is left out, as a Kafka broker in that state has shut down and is no longer
registered; with too few left, INVALID_REPLICATION_FACTOR names the brokers available.

``start`` and ``shift`` are random for a new topic (Kafka's choice: topics created one after
another do not all lead from the same broker); CreatePartitions passes both as the position
of partition 0's leader, so the new partitions continue the topic's own round.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass


class PlacementError(Exception):
    """INVALID_REPLICATION_FACTOR (or INVALID_PARTITIONS): the placement cannot be made."""


@dataclass(frozen=True, slots=True)
class Candidate:
    broker_id: int
    rack: str | None = None


def usable(brokers: Sequence[Candidate], without_log_dirs: Collection[int]
           ) -> list[Candidate]:
    """The brokers new replicas may go to: those with a log directory left."""
    return [b for b in brokers if b.broker_id not in without_log_dirs]


def replication_factor_problem(replication_factor: int, brokers: int) -> str | None:
    """Kafka's INVALID_REPLICATION_FACTOR messages (ZooKeeper mode), or None."""
    if replication_factor <= 0:
        return "Replication factor must be larger than 0."
    if replication_factor > brokers:
        return (f"Replication factor: {replication_factor} larger than available brokers: "
                f"{brokers}.")
    return None


def assign(brokers: Sequence[Candidate], partitions: int, replication_factor: int,
           start: int | None = None, first_partition: int = 0,
           rng: random.Random | None = None) -> list[tuple[int, ...]]:
    """The replica lists of partitions ``first_partition .. first_partition + partitions - 1``.
    ``start``: the index (in the walk's broker order) partition 0 leads from, random if
    None; also the initial shift, as Kafka fixes both together."""
    problem = replication_factor_problem(replication_factor, len(brokers))
    if problem:
        raise PlacementError(problem)
    if partitions < 0:
        raise PlacementError("Number of partitions must be larger than 0.")
    rng = rng or random.Random()
    racks = [b.rack for b in brokers]
    if all(rack is not None for rack in racks) and len(set(racks)) > 1:
        order = rack_alternated(brokers)
        rack_of = {b.broker_id: b.rack for b in brokers}
    else:
        order = sorted(b.broker_id for b in brokers)
        rack_of = None
    n = len(order)
    start_index = rng.randrange(n) if start is None else start % n
    shift = rng.randrange(n) if start is None else start % n
    result = []
    for p in range(first_partition, first_partition + partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start_index) % n
        if rack_of is None:
            replicas = [order[first]] + [order[_follower(first, shift, j, n)]
                                         for j in range(replication_factor - 1)]
        else:
            replicas = _rack_aware(order, rack_of, first, shift, replication_factor)
        result.append(tuple(replicas))
    return result


def _follower(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def rack_alternated(brokers: Sequence[Candidate]) -> list[int]:
    """Broker ids rack by rack in turn: racks in name order, brokers by id within a rack."""
    by_rack: dict[str, list[int]] = {}
    for b in sorted(brokers, key=lambda b: b.broker_id):
        by_rack.setdefault(str(b.rack), []).append(b.broker_id)
    columns = [by_rack[rack] for rack in sorted(by_rack)]
    return [column[i] for i in range(max(map(len, columns))) for column in columns
            if i < len(column)]


def _rack_aware(order: list[int], rack_of: dict[int, str | None], first: int, shift: int,
                replication_factor: int) -> list[int]:
    n = len(order)
    all_racks = len(set(rack_of.values()))
    leader = order[first]
    replicas, racks, k = [leader], {rack_of[leader]}, 0
    for _ in range(replication_factor - 1):
        # Every broker but the leader is reached within n - 1 steps and one of them always
        # qualifies (a broker of a rack without a replica, or any broker without one).
        for _ in range(n - 1):
            broker = order[_follower(first, shift * all_racks, k, n)]
            k += 1
            rack = rack_of[broker]
            if (rack not in racks or len(racks) == all_racks) and broker not in replicas:
                replicas.append(broker)
                racks.add(rack)
                break
        else:  # pragma: no cover - unreachable, see above
            raise AssertionError("rack-aware placement found no broker")
    return replicas
