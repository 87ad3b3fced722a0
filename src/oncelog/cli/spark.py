"""``oncelog spark``: what an operator does about the Spark sink's transactions
(spark/two_phase.py) when a driver died after its tasks prepared and nobody runs its job
again. Its prepared transactions have no timeout (two-phase commit) and hold read_committed
readers of their partitions back.

- ``oncelog spark recover``: the prefixes (transactionalIdPrefix, or the sink's default one
  per save() or per streaming query) that have task transactions open, with how many.
- ``oncelog spark recover --prefix P``: does what the next write with that prefix would:
  opens P (fencing a driver of it still alive, which then fails instead of reporting
  success), finishes every open transaction of P that a decision names and aborts the others.

Exit status: 0 done, 1 the broker refused or failed, 2 usage errors.
"""

from __future__ import annotations

import argparse
import collections
import sys

from ..client.admin.admin import Admin
from ..client.network.connection import KafkaError
from .client_config import client_config
from .table import tabbed


def _recover(args: argparse.Namespace) -> int:
    try:
        from ..spark import two_phase
        from ..spark.options import WriteOptions
    except ImportError as exc:
        print(f"oncelog spark recover: needs oncelog's Spark extra ({exc})", file=sys.stderr)
        return 1
    try:
        if args.prefix is None:
            with Admin(client_config(args)) as admin:
                listed = admin.list_transactions(states=("Ongoing",))
            prefixes = collections.Counter(
                p for ts in listed.values() for t in ts
                if (p := two_phase.prefix_of(t.transactional_id)) is not None)
            for line in tabbed(("Prefix", "OpenTransactions"),
                              [(p, str(n)) for p, n in sorted(prefixes.items())]):
                print(line)
            return 0
        options = WriteOptions(args.bootstrap_server, None,
                               client_config(args),
                               transactional_id_prefix=args.prefix)
        finished, aborted = two_phase.recover(options)
    except (KafkaError, RuntimeError, ValueError) as exc:
        print(f"oncelog spark recover: {exc}", file=sys.stderr)
        return 1
    print(f"{args.prefix}: finished {len(finished)} transactions a decision named"
          f"{': ' + ', '.join(finished) if finished else ''}")
    print(f"{args.prefix}: aborted {len(aborted)} transactions no decision named"
          f"{': ' + ', '.join(aborted) if aborted else ''}")
    return 0


def add_spark_commands(sub, with_bootstrap) -> None:
    spark = sub.add_parser(
        "spark", help="the Spark sink's transactions: recover a dead driver's run",
        description="What to do about the exactly-once Spark sink's transactions when a "
                    "driver died after its tasks prepared and its job is not run again.")
    ssub = spark.add_subparsers(dest="spark_command", required=True, metavar="ACTION")
    recover = with_bootstrap(ssub.add_parser(
        "recover", help="finish or abort a dead run's prepared transactions",
        description="With --prefix P: finish every open transaction of P that a commit "
                    "decision names, abort the others (a driver of P still running then "
                    "fails its commit). Without: list the prefixes with open transactions."))
    recover.add_argument("--prefix", metavar="P", help="the transactionalIdPrefix (see the "
                                                       "listing without --prefix)")
    recover.set_defaults(func=_recover)
