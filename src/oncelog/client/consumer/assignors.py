"""The partition assignors a group's leader runs: ``range``, ``roundrobin`` and
``cooperative-sticky``, under Kafka's names (``partition.assignment.strategy``).

Pure functions: the members' subscriptions and the partition count of each topic in, each
member's partitions out. A topic nobody can see (absent from the counts) is assigned to
nobody. Members are ordered as Kafka orders them: static members (group.instance.id) first
by instance id, then dynamic ones by member id, so a restarted static member lands where it
was.

``range`` and ``roundrobin`` are eager: every member gives up all its partitions before it
joins. ``cooperative-sticky`` (KIP-429) is incremental: members keep their partitions while
they rejoin, the assignment keeps every partition it can where it is, and a partition that
must move is first left unassigned (its owner revokes it, only it, and rejoins) and handed
to its new member by the rebalance that follows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..topic_partition import TopicPartition

EAGER, COOPERATIVE = "eager", "cooperative"


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    topics: frozenset[str]
    instance_id: str | None = None
    owned: tuple[TopicPartition, ...] = ()  # what it holds now (cooperative protocol)
    generation: int = -1  # the generation it was given ``owned`` in


Assignments = dict[str, list[TopicPartition]]


def member_order(member: Member) -> tuple:
    return (member.instance_id is None, member.instance_id or "", member.member_id)


def _partitions(topic: str, counts: Mapping[str, int]) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in range(counts.get(topic, 0))]


def range_assign(members: Iterable[Member], counts: Mapping[str, int]) -> Assignments:
    """Per topic, consecutive ranges: the first ``n % m`` members get one partition more."""
    ordered = sorted(members, key=member_order)
    result: Assignments = {m.member_id: [] for m in ordered}
    for topic in sorted({t for m in ordered for t in m.topics}):
        subscribers = [m.member_id for m in ordered if topic in m.topics]
        partitions = _partitions(topic, counts)
        share, extra = divmod(len(partitions), len(subscribers))
        start = 0
        for i, member_id in enumerate(subscribers):
            end = start + share + (1 if i < extra else 0)
            result[member_id] += partitions[start:end]
            start = end
    return result


def roundrobin_assign(members: Iterable[Member], counts: Mapping[str, int]) -> Assignments:
    """Every partition of every topic in order, dealt to the members in turn; a member not
    subscribed to a partition's topic is passed over for it."""
    ordered = sorted(members, key=member_order)
    result: Assignments = {m.member_id: [] for m in ordered}
    if not ordered:
        return result
    turn = 0
    for topic in sorted({t for m in ordered for t in m.topics}):
        for tp in _partitions(topic, counts):
            for step in range(len(ordered)):
                member = ordered[(turn + step) % len(ordered)]
                if topic in member.topics:
                    result[member.member_id].append(tp)
                    turn = (turn + step + 1) % len(ordered)
                    break
    return result


def current_owners(members: Iterable[Member],
                   counts: Mapping[str, int]) -> dict[TopicPartition, str]:
    """Who holds each partition now, from the members' claims: a claim is kept only for a
    partition that exists and whose topic the member still subscribes to; of several claims
    the newest generation wins, and several claims of one generation cancel out (the
    partition is treated as nobody's, as Kafka's sticky assignors do)."""
    best: dict[TopicPartition, tuple[int, list[str]]] = {}
    for m in members:
        for tp in m.owned:
            if tp.topic not in m.topics or not 0 <= tp.partition < counts.get(tp.topic, 0):
                continue
            generation, claimants = best.get(tp, (-2, []))
            if m.generation > generation:
                best[tp] = (m.generation, [m.member_id])
            elif m.generation == generation:
                claimants.append(m.member_id)
    return {tp: claimants[0] for tp, (_, claimants) in best.items() if len(claimants) == 1}


def sticky_assign(members: Iterable[Member], counts: Mapping[str, int]) -> Assignments:
    """A balanced assignment that moves as few owned partitions as it can.

    Every member keeps what it owns; unowned partitions go, those with fewest possible
    members first, to the least loaded member that can take them; then, while a member holds
    two or more partitions more than another member that could take one of them, one moves
    from the most loaded member, a partition it did not own before if it has one. Each move
    lowers the sum of squared loads, so this ends; with identical subscriptions every member
    ends with floor(P/N) or ceil(P/N) partitions and keeps at least min(owned, floor(P/N)).
    """
    ordered = sorted(members, key=member_order)
    order = {m.member_id: i for i, m in enumerate(ordered)}
    topics_of = {m.member_id: m.topics for m in ordered}
    owners = current_owners(ordered, counts)
    result: Assignments = {m.member_id: [] for m in ordered}
    for tp, owner in sorted(owners.items()):
        result[owner].append(tp)
    eligible = {topic: [m.member_id for m in ordered if topic in m.topics]
                for topic in {t for m in ordered for t in m.topics}}
    free = [tp for topic in sorted(eligible) for tp in _partitions(topic, counts)
            if tp not in owners]
    free.sort(key=lambda tp: (len(eligible[tp.topic]), tp))
    for tp in free:
        target = min(eligible[tp.topic], key=lambda m: (len(result[m]), order[m]))
        result[target].append(tp)
    while True:
        move = _best_move(result, topics_of, owners, order)
        if move is None:
            break
        tp, source, target = move
        result[source].remove(tp)
        result[target].append(tp)
    for partitions in result.values():
        partitions.sort()
    return result


def _best_move(result: Assignments, topics_of: Mapping[str, frozenset[str]],
               owners: Mapping[TopicPartition, str], order: Mapping[str, int]
               ) -> tuple[TopicPartition, str, str] | None:
    """One partition to move from a most loaded member to a least loaded one that can take
    it (two or more fewer partitions), or None when no such move exists."""
    by_load = sorted(result, key=lambda m: (-len(result[m]), order[m]))
    for source in by_load:
        load = len(result[source])
        # Partitions the source did not own before the rebalance move first.
        for tp in sorted(result[source], key=lambda tp: (owners.get(tp) == source, tp)):
            takers = [m for m in result if tp.topic in topics_of[m]
                      and len(result[m]) <= load - 2]
            if takers:
                return tp, source, min(takers, key=lambda m: (len(result[m]), order[m]))
    return None


def cooperative_sticky_assign(members: Iterable[Member], counts: Mapping[str, int]
                              ) -> Assignments:
    """sticky_assign, less every partition another member still owns: its owner revokes it
    first (KIP-429), and the next rebalance assigns it."""
    members = list(members)
    owners = current_owners(members, counts)
    target = sticky_assign(members, counts)
    return {member_id: [tp for tp in partitions if owners.get(tp, member_id) == member_id]
            for member_id, partitions in target.items()}


@dataclass(frozen=True, slots=True)
class Assignor:
    name: str
    rebalance_protocol: str
    assign: Callable[[Iterable[Member], Mapping[str, int]], Assignments]


ASSIGNORS: dict[str, Assignor] = {
    a.name: a for a in (
        Assignor("range", EAGER, range_assign),
        Assignor("roundrobin", EAGER, roundrobin_assign),
        Assignor("cooperative-sticky", COOPERATIVE, cooperative_sticky_assign),
    )
}


def parse_strategy(value: str) -> list[Assignor]:
    """``partition.assignment.strategy``: names in preference order, comma separated (Java's
    class names are taken for their short names too)."""
    java = {"org.apache.kafka.clients.consumer.RangeAssignor": "range",
            "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
            "org.apache.kafka.clients.consumer.CooperativeStickyAssignor": "cooperative-sticky"}
    names = [java.get(n.strip(), n.strip()) for n in str(value).split(",") if n.strip()]
    unknown = [n for n in names if n not in ASSIGNORS]
    if unknown or not names:
        raise ValueError(f"partition.assignment.strategy: unknown assignor(s) {unknown or value!r}"
                         f"; known: {', '.join(ASSIGNORS)}")
    return [ASSIGNORS[n] for n in dict.fromkeys(names)]


def rebalance_protocol(assignors: list[Assignor]) -> str:
    """Cooperative only when every configured assignor is (Kafka's rule): a member that may
    be handed an eager assignor's result must give everything up before it joins."""
    return COOPERATIVE if all(a.rebalance_protocol == COOPERATIVE for a in assignors) else EAGER
