"""``oncelog chaos proxy``: the fault-injecting proxy from the shell."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from ..chaos.proxy import ChaosProxy
from ..chaos.rules import API_NAMES, Action, Rule
from ..client.network.connection import parse_bootstrap


def _proxy(args: argparse.Namespace) -> int:
    try:
        upstream = parse_bootstrap(args.upstream)[0]
        listen = parse_bootstrap(args.listen)[0]
        rules = [Rule.parse(action, spec) for action in Action
                 for spec in getattr(args, action.value.replace("-", "_")) or []]
    except ValueError as exc:
        print(f"oncelog chaos proxy: {exc}", file=sys.stderr)
        return 2
    proxy = ChaosProxy(upstream, listen)
    for rule in rules:
        proxy.add_rule(rule)

    async def main() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        await proxy.serve()
        print(f"chaos proxy listening on {proxy.bootstrap}, forwarding to {args.upstream}",
              flush=True)
        for rule in rules:
            print(f"  rule: {rule.describe()}", flush=True)
        await stopping.wait()

    try:
        asyncio.run(main())
    except OSError as exc:
        print(f"oncelog chaos proxy: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 1
    return 0


def _scenario(args: argparse.Namespace) -> int:
    from ..chaos.diagram import render_html
    from ..chaos.scenarios import SCENARIOS, run_scenario
    from ..client.network.connection import KafkaError

    if args.list:
        for name, scenario in SCENARIOS.items():
            print(f"{name}\t{scenario.title}")
        return 0
    if args.name is None or args.name not in SCENARIOS:
        print(f"oncelog scenario: NAME must be one of {', '.join(SCENARIOS)} (or --list)",
              file=sys.stderr)
        return 2
    try:
        if args.name == "failover":  # on a cluster of its own, whose brokers it kills
            from .scenario_cluster import run_failover_locally

            outcome = run_failover_locally(args.data_dir, args.topic)
            for step in outcome.steps:
                print(f"  {step.kind:<14} {step.text}")
        else:
            outcome = run_scenario(args.name, args.bootstrap_server, args.topic)
    except (KafkaError, OSError, TimeoutError) as exc:
        print(f"oncelog scenario: {exc}", file=sys.stderr)
        return 1
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(render_html(outcome))
    print(f"{args.name}: {outcome.verdict}")
    return 0 if outcome.passed else 1


def add_chaos_commands(sub) -> None:
    scenario = sub.add_parser(
        "scenario", help="run one of the seeds' idempotence or transaction flows against a "
                         "broker",
        description="Run one of seed 000's sequence flows (success, missing-acks, "
                    "missing-records, cache-missed) with a low-level producer that controls "
                    "sequence numbers and in-flight order exactly, or one of seed 004's "
                    "transactional flows (zombie-fencing, abort-then-commit) with raw "
                    "transactional producers, or seed 004's failover (ZooKeeper and three "
                    "brokers of its own, the leader killed); print a one-line verdict and "
                    "write a sequence diagram.")
    scenario.add_argument("name", nargs="?", metavar="NAME", help="the flow to run")
    scenario.add_argument("--list", action="store_true", help="list the flows")
    scenario.add_argument("--bootstrap-server", default="127.0.0.1:9092", metavar="HOST:PORT")
    scenario.add_argument("--out", metavar="FILE", help="write the diagram here (HTML)")
    scenario.add_argument("--topic", help="topic to create (default: a fresh one)")
    scenario.add_argument("--data-dir", help="failover: keep its cluster's data and logs here "
                                             "(default: a temporary directory, removed)")
    scenario.set_defaults(func=_scenario)

    chaos = sub.add_parser("chaos", help="fault injection: a Kafka-aware proxy",
                           description="Inject network faults between Kafka clients and a "
                                       "broker.")
    csub = chaos.add_subparsers(dest="chaos_command", required=True, metavar="ACTION")
    proxy = csub.add_parser(
        "proxy", help="run a fault-injecting proxy in front of a broker",
        description="A TCP proxy that understands Kafka framing. Each rule is "
                    "API[TOPIC-PARTITION]:N[,N...] (the Nth request of that API, counted over "
                    "all connections, 1-based), with =MILLIS for delays. APIs: "
                    + ", ".join(sorted(API_NAMES)) + " (or a numeric api key). Metadata "
                    "answers are rewritten to point clients at the proxy.",
        epilog="example: oncelog chaos proxy --upstream 127.0.0.1:9092 --listen "
               "127.0.0.1:19092 --drop-response produce:3,4")
    proxy.add_argument("--upstream", required=True, metavar="HOST:PORT", help="the broker")
    proxy.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                       help="where clients connect (default: a free port on 127.0.0.1)")
    helps = {
        Action.DROP_REQUEST: "never forward it (the broker does not see it)",
        Action.DROP_RESPONSE: "the broker acts on it, the client never hears back",
        Action.DELAY_REQUEST: "hold it MILLIS before forwarding",
        Action.DELAY_RESPONSE: "hold the answer MILLIS",
        Action.DUPLICATE_REQUEST: "deliver it to the broker twice",
        Action.CUT_AFTER_REQUEST: "let the broker answer, then cut the connection",
        Action.EMPTY_RESPONSE: "fetch only: the answer comes back without its records",
    }
    for action, text in helps.items():
        proxy.add_argument(f"--{action.value}", action="append", metavar="RULE", help=text)
    proxy.set_defaults(func=_proxy)
