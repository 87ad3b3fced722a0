"""The server-side assignors of consumer groups (KIP-848): ``uniform`` and ``range``.

An assignor is a pure function: the members (what each subscribes to, what each holds in
the current target assignment) and the topics (id -> partition count) in, the new target
assignment out. Both give every partition of a subscribed topic to exactly one member that
subscribes to it, and leave out partitions nobody subscribes to.

- ``uniform`` (Kafka's UniformAssignor, the default): balanced and sticky. Members keep the
  partitions they hold as far as balance allows; the rest go to the least loaded subscriber;
  then partitions move from the most loaded member to a subscriber holding at least two
  fewer, until no such move exists. With identical subscriptions every member ends with
  floor or ceil of partitions/members; with different ones no partition could move to a
  subscriber that holds two fewer than its owner (Kafka's notion of balanced).
- ``range`` (Kafka's RangeAssignor): per topic, its subscribers in a fixed order (instance
  id, else member id) take consecutive ranges, the first ``partitions % members`` one more;
  members with the same subscriptions get the same partition numbers of topics of equal size
  (co-partitioning, for joins). Sticky only in that the ranges are deterministic.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

Assignment = dict[uuid.UUID, frozenset[int]]
TopicPartition = tuple[uuid.UUID, int]


@dataclass(frozen=True)
class MemberSpec:
    subscribed: frozenset[uuid.UUID]  # topic ids
    instance_id: str | None = None
    current: Mapping[uuid.UUID, frozenset[int]] = field(default_factory=dict)


Assignor = Callable[[Mapping[str, MemberSpec], Mapping[uuid.UUID, int]], dict[str, Assignment]]


def _as_assignment(held: set[TopicPartition]) -> Assignment:
    out: dict[uuid.UUID, set[int]] = {}
    for topic_id, p in held:
        out.setdefault(topic_id, set()).add(p)
    return {t: frozenset(ps) for t, ps in out.items()}


def uniform(members: Mapping[str, MemberSpec], topics: Mapping[uuid.UUID, int]
            ) -> dict[str, Assignment]:
    order = sorted(members)
    held: dict[str, set[TopicPartition]] = {m: set() for m in order}
    owner: dict[TopicPartition, str] = {}
    # 1. Stickiness: keep what is still valid (the topic exists and is subscribed, the
    # partition exists, nobody else kept it).
    for m in order:
        spec = members[m]
        for topic_id, partitions in spec.current.items():
            count = topics.get(topic_id)
            if count is None or topic_id not in spec.subscribed:
                continue
            for p in partitions:
                if 0 <= p < count and (topic_id, p) not in owner:
                    owner[topic_id, p] = m
                    held[m].add((topic_id, p))
    subscribers: dict[uuid.UUID, list[str]] = {
        t: [m for m in order if t in members[m].subscribed] for t in sorted(topics)}
    # 2. Everything else goes to the least loaded subscriber.
    for topic_id, names in subscribers.items():
        if not names:
            continue
        for p in range(topics[topic_id]):
            if (topic_id, p) in owner:
                continue
            m = min(names, key=lambda n: (len(held[n]), n))
            owner[topic_id, p] = m
            held[m].add((topic_id, p))
    # 3. Balance: move from the most loaded to a subscriber holding at least two fewer.
    # Each move lowers the sum of squared loads, so the loop ends; the bound is a guard.
    for _ in range(sum(topics.values()) * max(len(order), 1) + 1):
        moved = False
        for giver in sorted(order, key=lambda n: (-len(held[n]), n)):
            best: tuple[int, str, TopicPartition] | None = None
            for tp in sorted(held[giver]):
                for taker in subscribers[tp[0]]:
                    load = len(held[taker])
                    if load <= len(held[giver]) - 2 and (best is None or (load, taker) <
                                                          best[:2]):
                        best = (load, taker, tp)
            if best is not None:
                _, taker, tp = best
                held[giver].discard(tp)
                held[taker].add(tp)
                moved = True
                break
        if not moved:
            break
    return {m: _as_assignment(held[m]) for m in order}


def range_(members: Mapping[str, MemberSpec], topics: Mapping[uuid.UUID, int]
           ) -> dict[str, Assignment]:
    def rank(m: str) -> tuple[int, str, str]:
        instance = members[m].instance_id
        return (0, instance, m) if instance is not None else (1, m, "")

    held: dict[str, set[TopicPartition]] = {m: set() for m in members}
    for topic_id, count in sorted(topics.items()):
        names = sorted((m for m in members if topic_id in members[m].subscribed), key=rank)
        if not names:
            continue
        quota, extra = divmod(count, len(names))
        start = 0
        for i, m in enumerate(names):
            size = quota + (1 if i < extra else 0)
            held[m].update((topic_id, p) for p in range(start, start + size))
            start += size
    return {m: _as_assignment(held[m]) for m in sorted(members)}


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_}
