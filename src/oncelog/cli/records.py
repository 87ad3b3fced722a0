"""``oncelog topics alter`` (more partitions) and ``oncelog records delete`` (DeleteRecords,
taking ``kafka-delete-records.sh``'s offsets file), against oncelog or any Kafka broker.

Exit status: 0 done, 1 the broker refused or failed (the Kafka error is printed), 2 usage
errors such as an unreadable offsets file.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..client.admin.admin import Admin
from ..client.network.connection import KafkaError
from .client_config import client_config


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(client_config(args))


# --- topics alter ----------------------------------------------------------------------------

def parse_replica_assignment(text: str) -> list[list[int]]:
    """kafka-topics.sh's --replica-assignment: partitions separated by commas, the broker
    ids of each by colons ("0:1,1:2"). Raises ValueError."""
    try:
        return [[int(b) for b in part.split(":")] for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--replica-assignment {text!r}: expected broker ids such as "
                         f"0:1,1:2 (partitions by commas, replicas by colons)") from None


def _topics_alter(args: argparse.Namespace) -> int:
    assignments = None
    if args.replica_assignment is not None:
        try:
            assignments = parse_replica_assignment(args.replica_assignment)
        except ValueError as exc:
            print(f"oncelog topics alter: {exc}", file=sys.stderr)
            return 2
    with _admin(args) as admin:
        if assignments is not None:
            # As kafka-topics.sh: the list names every partition; the new ones are its tail.
            current = len(admin.metadata([args.topic]).topics[args.topic].partitions)
            assignments = assignments[current:]
        admin.create_partitions(args.topic, args.partitions, assignments,
                                validate_only=args.validate_only)
    done = "would have" if args.validate_only else "now has"
    print(f"topic {args.topic} {done} {args.partitions} partitions")
    return 0


def add_topics_alter(tsub, with_bootstrap, guarded) -> None:
    alter = with_bootstrap(tsub.add_parser(
        "alter", help="add partitions to a topic",
        description="Add partitions to a topic (CreatePartitions), as kafka-topics.sh --alter "
                    "--partitions does. Records keep their partition; new keys may hash to "
                    "the new ones."))
    alter.add_argument("--topic", required=True)
    alter.add_argument("--partitions", type=int, required=True,
                       help="the new partition count (more than the topic has)")
    alter.add_argument("--replica-assignment", metavar="IDS",
                       help="broker ids of every partition, old and new, as kafka-topics.sh "
                            "takes them: 0,0,0 (partitions by commas, replicas by colons)")
    alter.add_argument("--validate-only", action="store_true",
                       help="only check that the broker would take it")
    alter.set_defaults(func=guarded(_topics_alter))


# --- records delete --------------------------------------------------------------------------

def read_offsets_file(path: str) -> dict[tuple[str, int], int]:
    """kafka-delete-records.sh's --offset-json-file: {"partitions": [{"topic": T,
    "partition": P, "offset": O}, ...], "version": 1}. Raises ValueError naming the problem."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    entries = doc.get("partitions") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected {{\"partitions\": [{{\"topic\": ..., "
                         f"\"partition\": ..., \"offset\": ...}}], \"version\": 1}}")
    wanted: dict[tuple[str, int], int] = {}
    for entry in entries:
        try:
            topic, partition, offset = entry["topic"], entry["partition"], entry["offset"]
        except (TypeError, KeyError) as exc:
            raise ValueError(f"{path}: entry {entry!r} lacks {exc}") from None
        if not isinstance(topic, str) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                 for v in (partition, offset)):
            raise ValueError(f"{path}: entry {entry!r}: topic is a string, partition and "
                             f"offset are integers")
        if (topic, partition) in wanted:
            raise ValueError(f"{path}: partition {topic}-{partition} is named more than once")
        wanted[topic, partition] = offset
    return wanted


def _records_delete(args: argparse.Namespace) -> int:
    if args.offset_json_file is not None:
        if args.topic is not None or args.partition is not None or args.before is not None:
            print("oncelog records delete: give --offset-json-file or --topic, --partition "
                  "and --before, not both", file=sys.stderr)
            return 2
        try:
            wanted = read_offsets_file(args.offset_json_file)
        except ValueError as exc:
            print(f"oncelog records delete: {exc}", file=sys.stderr)
            return 2
    elif args.topic is None or args.partition is None or args.before is None:
        print("oncelog records delete: --topic, --partition and --before are required "
              "(or --offset-json-file)", file=sys.stderr)
        return 2
    else:
        wanted = {(args.topic, args.partition): args.before}
    with _admin(args) as admin:
        results = admin.delete_records(wanted)
    print("Records delete operation completed:")
    failed = False
    for (topic, partition), outcome in sorted(results.items()):
        if isinstance(outcome, KafkaError):
            failed = True
            print(f"partition: {topic}-{partition}\terror: {outcome}")
        else:
            print(f"partition: {topic}-{partition}\tlow_watermark: {outcome}")
    return 1 if failed else 0


def add_records_commands(sub, with_bootstrap, guarded) -> None:
    records = sub.add_parser("records", help="delete records below an offset",
                             description="Manage the records of partitions.")
    rsub = records.add_subparsers(dest="records_command", required=True, metavar="ACTION")
    delete = with_bootstrap(rsub.add_parser(
        "delete", help="move partitions' log start forward (DeleteRecords)",
        description="Delete every record below an offset of a partition, as "
                    "kafka-delete-records.sh does: the log start moves there (-1: the high "
                    "watermark), whole segments below it are deleted, fetches below it get "
                    "OFFSET_OUT_OF_RANGE."))
    delete.add_argument("--topic")
    delete.add_argument("--partition", type=int)
    delete.add_argument("--before", type=int, metavar="OFFSET",
                        help="the new log start offset (-1: the high watermark)")
    delete.add_argument("--offset-json-file", metavar="FILE",
                        help='kafka-delete-records.sh\'s file: {"partitions": [{"topic": "t", '
                             '"partition": 0, "offset": 10}], "version": 1}')
    delete.set_defaults(func=guarded(_records_delete))
