"""``oncelog groups``: list, describe and delete consumer groups and reset their committed
offsets, in the manner of Kafka's ``kafka-consumer-groups.sh`` (its columns, its "-" where a
value is missing, its messages), against oncelog or any Kafka broker.

Exit status: 0 done, 1 the broker refused or failed (a group that does not exist, is not
empty, is active while its offsets are reset...), 2 usage errors.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ..client.admin.admin import Admin, GroupInfo
from ..client.network import calls
from ..client.network.connection import KafkaError
from .errors import UsageError, admin_for, guarded
from .table import aligned, column_width, print_aligned

MISSING = "-"
# The states of consumer groups, classic and KIP-848, as Kafka spells them (ListGroups'
# filter).
STATES = ("PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling", "Stable",
          "Dead", "Empty")
INACTIVE = ("Empty", "Dead")
# Kafka's wording of the errors a user of this tool meets (Errors.java).
_ERROR_TEXT = {
    ErrorCode.non_empty_group: "The group is not empty.",
    ErrorCode.group_id_not_found: "The group id does not exist.",
    ErrorCode.invalid_group_id: "The configured groupId is invalid.",
    ErrorCode.coordinator_not_available: "The coordinator is not available.",
    ErrorCode.not_coordinator: "This is not the correct coordinator.",
    ErrorCode.unknown_member_id: "The coordinator is not aware of this member.",
    ErrorCode.unknown_topic_or_partition: "This server does not host this topic-partition.",
}


def _describe_error(error: ErrorCode) -> str:
    text = _ERROR_TEXT.get(error)
    return f"{error.name.upper()}: {text}" if text else error.name.upper()


def _err(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr)


def _consumer_groups(admin: Admin) -> list[str]:
    return [g.group_id for g in admin.list_groups() if g.is_consumer_group]


def _group_ids(args: argparse.Namespace, admin: Admin) -> list[str]:
    if args.all_groups:
        return _consumer_groups(admin)
    return list(dict.fromkeys(args.group))


# --- list -------------------------------------------------------------------------------------

def parse_states(text: str) -> list[str]:
    """A comma-separated list of group states, in any case, as Kafka spells them."""
    by_lower = {s.lower(): s for s in STATES}
    wanted = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in wanted if s.lower() not in by_lower]
    if unknown:
        raise UsageError(f"Invalid state list '{text}'. Valid states are: {', '.join(STATES)}")
    return [by_lower[s.lower()] for s in wanted]


def _list(args: argparse.Namespace) -> int:
    states = parse_states(args.state) if args.state else []
    with admin_for(args, "oncelog-groups") as admin:
        groups = [g for g in admin.list_groups(states) if g.is_consumer_group]
    if args.state is None:
        for g in groups:
            print(g.group_id)
        return 0
    width = column_width(15, (g.group_id for g in groups)) + 10
    for line in aligned([("GROUP", "STATE"), *((g.group_id, g.state or "Unknown")
                                             for g in groups)], [width]):
        print(line.rstrip())
    return 0


# --- describe ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class OffsetRow:
    group: str
    topic: str
    partition: int
    offset: int | None
    log_end: int | None
    member_id: str = MISSING
    host: str = MISSING
    client_id: str = MISSING

    @property
    def lag(self) -> int | None:
        if self.offset is None or self.log_end is None:
            return None
        return self.log_end - self.offset

    def cells(self) -> tuple[str, ...]:
        def show(value: int | None) -> str:
            return MISSING if value is None else str(value)

        return (self.group, self.topic, str(self.partition), show(self.offset),
                show(self.log_end), show(self.lag), self.member_id, self.host, self.client_id)


def offset_rows(info: GroupInfo, committed: dict[tuple[str, int], int],
                log_ends: dict[tuple[str, int], int | None]) -> list[OffsetRow]:
    """Kafka's rows: the partitions of each member with an assignment (most partitions first),
    then the committed partitions no member holds, with "-" for the member."""
    rows = []
    assigned: set[tuple[str, int]] = set()
    members = sorted((m for m in info.members if m.assignment),
                     key=lambda m: len(m.assignment), reverse=True)
    for m in members:
        for tp in sorted(m.assignment):
            assigned.add(tp)
            rows.append(OffsetRow(info.group_id, tp[0], tp[1], committed.get(tp),
                                  log_ends.get(tp), m.member_id, m.host, m.client_id))
    for tp in sorted(set(committed) - assigned):
        rows.append(OffsetRow(info.group_id, tp[0], tp[1], committed[tp], log_ends.get(tp)))
    return rows


def _state_allows_rows(group_id: str, state: str, rows: int) -> bool:
    """Kafka's shouldPrintMemberState: the notes on the group's state, and whether it has
    rows to show."""
    if state == "Dead":
        _err(f"Error: Consumer group '{group_id}' does not exist.")
        return False
    if state == "Empty":
        _err("", f"Consumer group '{group_id}' has no active members.")
    elif state in ("PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling"):
        _err("", f"Warning: Consumer group '{group_id}' is rebalancing.")
    return rows > 0


def _describe(args: argparse.Namespace) -> int:
    failed = False
    with admin_for(args, "oncelog-groups") as admin:
        for group_id in sorted(_group_ids(args, admin)):
            try:
                info = admin.describe_group(group_id)
            except KafkaError as exc:
                if exc.error != ErrorCode.group_id_not_found:
                    raise
                _err(f"Error: Consumer group '{group_id}' does not exist.")
                failed = True
                continue
            if info.state == "Dead":
                failed = True
            if args.members:
                _print_members(info, args.verbose)
            elif args.state:
                _print_state(info)
            else:
                _print_offsets(admin, info)
    return 1 if failed else 0


def _print_offsets(admin: Admin, info: GroupInfo) -> None:
    committed = {tp: c.offset for tp, c in admin.list_group_offsets(info.group_id).items()}
    partitions = set(committed) | {tp for m in info.members for tp in m.assignment}
    log_ends = {tp: (end if isinstance(end, int) else None)
                for tp, end in admin.list_offsets(
                    dict.fromkeys(partitions, calls.LATEST)).items()}
    rows = offset_rows(info, committed, log_ends)
    if not _state_allows_rows(info.group_id, info.state, len(rows)):
        return
    cells = [r.cells() for r in rows]
    widths = [column_width(15, (c[0] for c in cells)), column_width(15, (c[1] for c in cells)),
              10, 15, 15, 15, column_width(15, (c[6] for c in cells)),
              column_width(15, (c[7] for c in cells))]
    header = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
              "CONSUMER-ID", "HOST", "CLIENT-ID")
    print_aligned([header, *cells], widths)


def assignment_text(assignment: Iterable[tuple[str, int]]) -> str:
    """Kafka's ASSIGNMENT column: topic(0,1), other(2); "-" for none."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in assignment:
        by_topic.setdefault(topic, []).append(partition)
    if not by_topic:
        return MISSING
    return ", ".join(sorted(f"{topic}({','.join(map(str, sorted(parts)))})"
                            for topic, parts in by_topic.items()))


def _print_members(info: GroupInfo, verbose: bool) -> None:
    if not _state_allows_rows(info.group_id, info.state, len(info.members)):
        return
    with_instance = any(m.group_instance_id for m in info.members)
    header = ("GROUP", "CONSUMER-ID", *(("GROUP-INSTANCE-ID",) if with_instance else ()),
              "HOST", "CLIENT-ID", "#PARTITIONS", *(("ASSIGNMENT",) if verbose else ()))
    rows = [(info.group_id, m.member_id,
             *((m.group_instance_id or "",) if with_instance else ()), m.host, m.client_id,
             str(len(m.assignment)), *((assignment_text(m.assignment),) if verbose else ()))
            for m in info.members]
    minimums = [15, 15, *([17] if with_instance else []), 15, 15, 15]
    widths = [column_width(low, (r[i] for r in rows)) for i, low in enumerate(minimums)]
    print_aligned([header, *rows], widths)


def _print_state(info: GroupInfo) -> None:
    if not _state_allows_rows(info.group_id, info.state, 1):
        return
    c = info.coordinator
    coordinator = f"{c.host}:{c.port}  ({c.node_id})"
    row = (info.group_id, coordinator, info.protocol or MISSING, info.state,
           str(len(info.members)))
    header = ("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS")
    widths = [column_width(15, [info.group_id]), column_width(25, [coordinator]), 20, 20]
    print_aligned([header, row], widths)


# --- delete -----------------------------------------------------------------------------------

def _delete(args: argparse.Namespace) -> int:
    with admin_for(args, "oncelog-groups") as admin:
        results = admin.delete_groups(_group_ids(args, admin))
    deleted = [g for g, e in results.items() if e == ErrorCode.none]
    failed = {g: e for g, e in results.items() if e != ErrorCode.none}
    listing = ", ".join(f"'{g}'" for g in deleted)
    if not failed:
        print(f"Deletion of requested consumer groups ({listing}) was successful.")
        return 0
    _err("Error: Deletion of some consumer groups failed:",
         *(f"* Group '{g}' could not be deleted due to: {_describe_error(e)}"
           for g, e in failed.items()))
    if deleted:
        print(f"\nThese consumer groups were deleted successfully: {listing}")
    return 1


# --- reset-offsets ----------------------------------------------------------------------------

def parse_topic_arg(text: str) -> tuple[str, list[int] | None]:
    """``topic`` (every partition) or ``topic:0,1,2``."""
    if ":" not in text:
        if not text:
            raise UsageError("--topic needs a topic name")
        return text, None
    parts = text.split(":")
    if len(parts) != 2 or not parts[0]:
        raise UsageError(f"Invalid topic arg '{text}', expected topic name and partitions")
    partitions = []
    for item in parts[1].split(","):
        try:
            partitions.append(int(item))
        except ValueError:
            raise UsageError(f"Invalid partition '{item}' specified in topic arg "
                             f"'{text}'") from None
    return parts[0], partitions


def parse_datetime(text: str) -> int:
    """Milliseconds since the epoch of an ISO 8601 date and time; without a zone, local
    time (as Kafka reads --to-datetime)."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--to-datetime: '{text}' is not a date and time such as "
                         "2024-01-31T12:00:00.000 (optionally with a zone: Z, +01:00)") from None
    return int(when.timestamp() * 1000) if when.tzinfo else int(
        when.astimezone().timestamp() * 1000)


def _partitions_to_reset(args: argparse.Namespace, admin: Admin,
                         committed: dict[tuple[str, int], int]) -> list[tuple[str, int]]:
    """The partitions named (or, with --all-topics, those with a committed offset); every one
    must exist, as Kafka checks."""
    wanted = [(t, None) for t in sorted({t for t, _ in committed})] if args.all_topics else \
        [parse_topic_arg(t) for t in args.topic]
    info = admin.metadata(sorted({t for t, _ in wanted}), missing_ok=True)
    known = {(t.name, p.index) for t in info.topics.values() for p in t.partitions}
    chosen: list[tuple[str, int]] = []
    for topic, partitions in wanted:
        if args.all_topics:
            chosen += sorted(tp for tp in committed if tp[0] == topic)
        elif partitions is not None:
            chosen += [(topic, p) for p in partitions]
        elif topic not in info.topics:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"topic '{topic}'")
        else:
            chosen += sorted(tp for tp in known if tp[0] == topic)
    missing = [tp for tp in chosen if tp not in known]
    if missing:
        raise KafkaError(ErrorCode.unknown_topic_or_partition, "The partitions \"" +
                         ",".join(f"{t}-{p}" for t, p in missing) + "\" do not exist")
    return list(dict.fromkeys(chosen))


def _log_offsets(admin: Admin, partitions: list[tuple[str, int]], spec: int,
                 what: str) -> dict[tuple[str, int], int]:
    found = admin.list_offsets(dict.fromkeys(partitions, spec))
    result = {}
    for tp in partitions:
        offset = found.get(tp)
        if not isinstance(offset, int):
            raise KafkaError(getattr(offset, "error", ErrorCode.unknown_server_error),
                             f"Error getting {what} offset of topic partition: {tp[0]}-{tp[1]}")
        result[tp] = offset
    return result


def _clamped(admin: Admin, requested: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Kafka's checkOffsetsRange: an offset past the log end becomes the log end, one before
    the log start the log start."""
    partitions = list(requested)
    starts = _log_offsets(admin, partitions, calls.EARLIEST, "starting")
    ends = _log_offsets(admin, partitions, calls.LATEST, "ending")
    result = {}
    for (topic, partition), offset in requested.items():
        start, end = starts[topic, partition], ends[topic, partition]
        if offset > end:
            _err(f"New offset ({offset}) is higher than latest offset for topic partition "
                 f"{topic}-{partition}. Value will be set to {end}.")
            offset = end
        elif offset < start:
            _err(f"New offset ({offset}) is lower than earliest offset for topic partition "
                 f"{topic}-{partition}. Value will be set to {start}.")
            offset = start
        result[topic, partition] = offset
    return result


def plan_offsets(args: argparse.Namespace, admin: Admin, partitions: list[tuple[str, int]],
                 committed: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    if not partitions:
        return {}
    if args.to_earliest:
        return _log_offsets(admin, partitions, calls.EARLIEST, "starting")
    if args.to_latest:
        return _log_offsets(admin, partitions, calls.LATEST, "ending")
    if args.to_offset is not None:
        return _clamped(admin, dict.fromkeys(partitions, args.to_offset))
    if args.shift_by is not None:
        requested = {}
        for topic, partition in partitions:
            if (topic, partition) not in committed:
                raise UsageError(f"Cannot shift offset for partition {topic}-{partition} since "
                                 "there is no current committed offset")
            requested[topic, partition] = committed[topic, partition] + args.shift_by
        return _clamped(admin, requested)
    timestamp = parse_datetime(args.to_datetime)
    by_time = _log_offsets(admin, partitions, timestamp, "by timestamp")
    empty = [tp for tp, offset in by_time.items() if offset < 0]
    for topic, partition in empty:
        _err("", f"Warn: Partition {partition} from topic {topic} is empty. Falling back to "
             "latest known offset.")
    if empty:
        by_time.update(_log_offsets(admin, empty, calls.LATEST, "ending"))
    return by_time


def _reset_offsets(args: argparse.Namespace) -> int:
    if args.to_datetime is not None:
        parse_datetime(args.to_datetime)  # a usage error before anything is asked
    for topic in args.topic or ():
        parse_topic_arg(topic)
    if not args.dry_run and not args.execute:
        _err("WARN: No action will be performed as the --execute option is missing. Add "
             "--dry-run to say that this is what you want, or --execute to reset.")
    plans: dict[str, dict[tuple[str, int], int]] = {}
    failed = False
    with admin_for(args, "oncelog-groups") as admin:
        for group_id in _group_ids(args, admin):
            try:
                state = admin.describe_group(group_id).state
            except KafkaError as exc:
                if exc.error != ErrorCode.group_id_not_found:
                    raise
                state = "Dead"  # Kafka resets the offsets of a group that does not exist too
            if state not in INACTIVE:
                _err("", f"Error: Assignments can only be reset if the group '{group_id}' is "
                     f"inactive, but the current state is {state}.")
                failed = True
                continue
            committed = {tp: c.offset
                         for tp, c in admin.list_group_offsets(group_id).items()}
            plan = plan_offsets(args, admin, _partitions_to_reset(args, admin, committed),
                                committed)
            if args.execute and plan:
                errors = {tp: e for tp, e in admin.alter_group_offsets(group_id, plan).items()
                          if e != ErrorCode.none}
                if errors:
                    _err(f"Error: resetting the offsets of group '{group_id}' failed:",
                         *(f"* {t}-{p}: {_describe_error(e)}"
                           for (t, p), e in sorted(errors.items())))
                    failed = True
                    continue
            plans[group_id] = plan
    _print_plan(plans)
    return 1 if failed else 0


def _print_plan(plans: dict[str, dict[tuple[str, int], int]]) -> None:
    rows = [(group, topic, str(partition), str(offset))
            for group, plan in sorted(plans.items())
            for (topic, partition), offset in sorted(plan.items())]
    if not rows:
        return
    widths = [column_width(15, (r[0] for r in rows)), column_width(15, (r[1] for r in rows)), 10]
    print_aligned([("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"), *rows], widths)


# --- wiring -----------------------------------------------------------------------------------


def _group_choice(parser: argparse.ArgumentParser, action: str) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--group", action="append", metavar="GROUP",
                       help=f"the group to {action}; may be repeated")
    which.add_argument("--all-groups", action="store_true", help=f"{action} every group")


_RESET_HELP = """\
Compute new committed offsets for a group's partitions and, with --execute, commit them.
Without --execute (or with --dry-run) only the plan is printed: GROUP TOPIC PARTITION
NEW-OFFSET. A group with members (any state but Empty or Dead) is refused: stop its
consumers first. --to-offset and --shift-by are clamped to the log's range, as Kafka does.
--to-datetime takes ISO 8601 (2024-01-31T12:00:00.000, optionally with Z or +01:00; local
time without a zone); a partition with no record at or after that time gets its log end."""


def add_group_commands(sub, with_bootstrap) -> None:
    groups = sub.add_parser(
        "groups", help="list, describe and delete consumer groups, reset their offsets",
        description="Manage consumer groups, in the manner of kafka-consumer-groups.sh "
                    "(exit status 0 done, 1 refused or failed, 2 usage errors).")
    gsub = groups.add_subparsers(dest="groups_command", required=True, metavar="ACTION")

    listing = with_bootstrap(gsub.add_parser("list", help="list consumer groups"))
    listing.add_argument("--state", nargs="?", const="", metavar="STATES",
                         help="show each group's state; with a comma-separated list "
                              f"({', '.join(STATES)}) only groups in those states")
    listing.set_defaults(func=guarded(_list, "groups"))

    describe = with_bootstrap(gsub.add_parser(
        "describe", help="committed offsets and lag, members or state of groups",
        description="Without an option: each partition's committed offset, log end offset, "
                    "lag and the member holding it."))
    _group_choice(describe, "describe")
    view = describe.add_mutually_exclusive_group()
    view.add_argument("--offsets", action="store_true",
                      help="committed offsets, log end offsets and lag (the default)")
    view.add_argument("--members", action="store_true", help="the members of the group")
    view.add_argument("--state", action="store_true",
                      help="coordinator, assignment strategy, state and member count")
    describe.add_argument("--verbose", action="store_true",
                          help="with --members: each member's partitions")
    describe.set_defaults(func=guarded(_describe, "groups"))

    delete = with_bootstrap(gsub.add_parser(
        "delete", help="delete groups without members, with their committed offsets"))
    _group_choice(delete, "delete")
    delete.set_defaults(func=guarded(_delete, "groups"))

    reset = with_bootstrap(gsub.add_parser(
        "reset-offsets", help="reset the committed offsets of an inactive group",
        description=_RESET_HELP, formatter_class=argparse.RawDescriptionHelpFormatter))
    _group_choice(reset, "reset")
    scope = reset.add_mutually_exclusive_group(required=True)
    scope.add_argument("--topic", action="append", metavar="TOPIC[:P,...]",
                       help="a topic, or some of its partitions; may be repeated")
    scope.add_argument("--all-topics", action="store_true",
                       help="every partition the group has an offset for")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the log start offset")
    to.add_argument("--to-latest", action="store_true", help="the log end offset")
    to.add_argument("--to-offset", type=int, metavar="N", help="offset N")
    to.add_argument("--to-datetime", metavar="ISO",
                    help="the first offset at or after this time")
    to.add_argument("--shift-by", type=int, metavar="N",
                    help="the committed offset plus N (N may be negative)")
    run = reset.add_mutually_exclusive_group()
    run.add_argument("--dry-run", action="store_true", help="only print the plan (default)")
    run.add_argument("--execute", action="store_true", help="commit the new offsets")
    reset.set_defaults(func=guarded(_reset_offsets, "groups"))
