"""``oncelog cluster describe`` and ``oncelog log-dirs describe | alter``: the cluster and
storage views, in the manner of kafka-cluster.sh and kafka-log-dirs.sh."""

from __future__ import annotations

import argparse
import json
import sys

from kio.schema.errors import ErrorCode

from ..client.admin.admin import Admin
from .client_config import client_config
from .cluster_up import add_cluster_up_commands


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(client_config(args))


def _cluster_describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        cluster = admin.describe_cluster(include_authorized_operations=True)
    print(f"Cluster ID: {cluster.cluster_id}")
    print(f"Controller: {cluster.controller_id}")
    for b in cluster.brokers:
        print(f"Broker: {b.node_id}\tEndpoint: {b.host}:{b.port}\tRack: {b.rack or '-'}"
              f"{chr(9) + 'Fenced' if b.fenced else ''}")
    if cluster.authorized_operations is not None:
        print(f"Authorized operations: {','.join(sorted(cluster.authorized_operations))}")
    return 0


def _log_dirs_describe(args: argparse.Namespace) -> int:
    """As kafka-log-dirs.sh --describe prints it: two lines, then the JSON."""
    topics = None
    with _admin(args) as admin:
        if args.topic_list:
            names = [t for t in args.topic_list.split(",") if t]
            described = admin.describe_topic_partitions(names)
            topics = {name: [p.index for p in t.partitions] for name, t in described.items()}
        brokers = None if not args.broker_list else \
            {int(b) for b in args.broker_list.split(",") if b}
        print("Querying brokers for log directories information")
        found = {node: dirs for node, dirs in admin.describe_log_dirs(topics).items()
                 if brokers is None or node in brokers}
    print(f"Received log directory information from brokers {','.join(map(str, found))}")
    print(json.dumps({"brokers": [
        {"broker": node, "logDirs": [
            {"partitions": [{"partition": f"{r.topic}-{r.partition}", "size": r.size,
                             "offsetLag": r.offset_lag, "isFuture": r.is_future}
                            for r in d.replicas],
             "error": None if d.error is None else ErrorCode(d.error).name.upper(),
             "logDir": d.path,
             "totalBytes": d.total_bytes, "usableBytes": d.usable_bytes}
            for d in dirs]}
        for node, dirs in found.items()], "version": 1}))
    return 0


def _log_dirs_alter(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        results = admin.alter_replica_log_dirs(
            {(args.topic, p): args.dir for p in args.partition}, args.broker)
    failed = 0
    for (topic, partition), error in sorted(results.items()):
        if error == ErrorCode.none:
            print(f"{topic}-{partition}: moving to {args.dir}")
        else:
            failed += 1
            why = {ErrorCode.log_dir_not_found: f"{args.dir} is not a log directory of the "
                                                 "broker (an absolute path from log.dirs)",
                   ErrorCode.unknown_topic_or_partition: "no such partition",
                   ErrorCode.kafka_storage_error: "a log directory is offline"}.get(error, "")
            print(f"{topic}-{partition}: {error.name.upper()}: {why}", file=sys.stderr)
    return 1 if failed else 0


def add_cluster_commands(sub, with_bootstrap, guarded) -> None:
    cluster = sub.add_parser("cluster", help="describe, start or check a cluster",
                             description="The cluster id, the controller and the brokers; "
                                         "a ZooKeeper cluster on loopback to try.")
    csub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    describe = with_bootstrap(csub.add_parser(
        "describe", help="cluster id, controller, brokers and what you may do"))
    describe.set_defaults(func=guarded(_cluster_describe))
    add_cluster_up_commands(csub, with_bootstrap, guarded)

    dirs = sub.add_parser("log-dirs", help="describe log directories, move partitions",
                          description="The brokers' log directories (log.dirs), their "
                                      "partitions and sizes, as kafka-log-dirs.sh shows them; "
                                      "moving a partition to another directory.")
    dsub = dirs.add_subparsers(dest="log_dirs_command", required=True, metavar="ACTION")
    ddescribe = with_bootstrap(dsub.add_parser(
        "describe", help="each directory, its partitions, sizes and offset lag (JSON)"))
    ddescribe.add_argument("--topic-list", metavar="T1,T2",
                           help="only these topics (default: all)")
    ddescribe.add_argument("--broker-list", metavar="B1,B2",
                           help="only these brokers (default: all)")
    ddescribe.set_defaults(func=guarded(_log_dirs_describe))
    alter = with_bootstrap(dsub.add_parser(
        "alter", help="move partitions into another log directory of their broker, online"))
    alter.add_argument("--topic", required=True)
    alter.add_argument("--partition", type=int, action="append", required=True,
                       help="a partition to move; may be repeated")
    alter.add_argument("--dir", required=True, help="the absolute path of the directory")
    alter.add_argument("--broker", type=int, help="the broker (default: the only one)")
    alter.set_defaults(func=guarded(_log_dirs_alter))
