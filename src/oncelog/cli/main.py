"""The ``oncelog`` command: run a broker, manage topics, produce and consume by hand."""

from __future__ import annotations

import argparse
import logging
import sys

from ..broker.config import ConfigError


def _broker(args: argparse.Namespace) -> int:
    from ..broker.announce import listening_line
    from ..broker.config import BrokerConfig
    from ..broker.log_limits import install_log_bounds
    from ..broker.server import run_broker

    try:
        config = BrokerConfig.from_sources(args.config, args.set or [])
    except ConfigError as exc:
        print(f"oncelog broker: {exc}", file=sys.stderr)
        return 2
    install_log_bounds()

    def started(host: str, port: int) -> None:
        print(listening_line(host, port), flush=True)

    from ..cluster import CLUSTER_START_EXIT_CODE, ClusterStartError

    try:
        run_broker(config, started)
    except ConfigError as exc:  # what only starting shows: a TLS file missing or bad
        print(f"oncelog broker: {exc}", file=sys.stderr)
        return 2
    except ClusterStartError as exc:
        print(f"oncelog broker: cannot join the cluster: {exc}", file=sys.stderr)
        return CLUSTER_START_EXIT_CODE
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oncelog", description="A Kafka-compatible log broker built for exactly-once.")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="logging verbosity")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    broker = sub.add_parser("broker", help="run a single-node broker",
                            description="Run a single-node broker until SIGINT or SIGTERM.")
    broker.add_argument("--config", metavar="FILE",
                        help="a Kafka-style .properties file (listeners=, log.dirs=, ...)")
    broker.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override one config key; may be repeated")
    broker.set_defaults(func=_broker)

    from .acls import add_acl_commands
    from .chaos import add_chaos_commands
    from .configs import add_config_commands
    from .spark import add_spark_commands
    from .tools import _with_bootstrap, add_tool_commands
    from .users import add_user_commands

    add_tool_commands(sub)
    add_config_commands(sub, _with_bootstrap)
    add_acl_commands(sub, _with_bootstrap)
    add_spark_commands(sub, _with_bootstrap)
    add_chaos_commands(sub)
    add_user_commands(sub, _with_bootstrap)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
