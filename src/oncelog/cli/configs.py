"""``oncelog configs describe | alter``: topic and broker configs, as kafka-configs.sh does.

    oncelog configs describe --entity-type topics --entity-name T [--all]
    oncelog configs alter --entity-type brokers --entity-name 0 \\
        --add-config log.retention.ms=60000,log.cleanup.policy=[delete,compact] \\
        --delete-config log.segment.bytes

kafka-configs.sh's own spelling works too (``oncelog configs --alter --entity-type ...``).
``--entity-default`` (or ``--entity-name ""``) is the brokers' cluster-wide default. Without
``--all``, describe shows only what is set: a topic's overrides, a broker's dynamic configs.
"""

from __future__ import annotations

import argparse
import sys

from ..client.admin.admin import Admin
from ..client.admin.admin_configs import AlterConfigOp, ConfigEntry, ConfigResource
from ..client.network.connection import KafkaError
from .client_config import client_config
from .quotas import add_quota_options, is_quota_command, run_quota_command


def parse_add_config(text: str) -> dict[str, str]:
    """kafka-configs.sh's --add-config: k=v pairs split on commas, a value in square
    brackets keeping its commas (``cleanup.policy=[delete,compact]``)."""
    result: dict[str, str] = {}
    items: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    for item in (i.strip() for i in items):
        if not item:
            continue
        if "=" not in item:
            raise SystemExit(f"oncelog configs: --add-config expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        result[key.strip()] = value
    return result


def _entity_names(args: argparse.Namespace, admin: Admin) -> list[str]:
    if args.entity_default:
        if args.entity_type != "brokers":
            raise SystemExit("oncelog configs: --entity-default is for --entity-type brokers")
        return [""]
    if args.entity_name is not None:
        return [args.entity_name]
    if args.action == "alter":
        raise SystemExit("oncelog configs: alter needs --entity-name or --entity-default")
    info = admin.metadata()
    if args.entity_type == "topics":
        return sorted(info.topics)
    return [str(node) for node in sorted(info.brokers)]


def _describe(args: argparse.Namespace) -> int:
    with Admin(client_config(args)) as admin:
        resources = [ConfigResource(args.entity_type, name)
                     for name in _entity_names(args, admin)]
        described = admin.describe_configs(resources, include_synonyms=True)
    kind = args.entity_type[:-1]
    for resource in resources:
        entries = described[resource]
        label = "the default broker" if kind == "broker" and not resource.name \
            else f"{kind} {resource.name}"
        if args.all:
            print(f"All configs for {label} are:")
            shown = list(entries.values())
        else:
            print(f"Dynamic configs for {label} are:")
            shown = [e for e in entries.values()
                     if e.source not in ("DEFAULT_CONFIG", "STATIC_BROKER_CONFIG")]
        for entry in sorted(shown, key=lambda e: e.name):
            print(f"  {_line(entry)}")
    return 0


def _line(entry: ConfigEntry) -> str:
    value = "null" if entry.value is None else entry.value
    synonyms = ", ".join(f"{s.source}:{s.name}={'null' if s.value is None else s.value}"
                         for s in entry.synonyms)
    return f"{entry.name}={value} sensitive={str(entry.sensitive).lower()} " \
           f"synonyms={{{synonyms}}}"


def _alter(args: argparse.Namespace) -> int:
    ops = [AlterConfigOp(k, "SET", v)
           for add in args.add_config or [] for k, v in parse_add_config(add).items()]
    ops += [AlterConfigOp(name.strip(), "DELETE")
            for item in args.delete_config or [] for name in item.split(",") if name.strip()]
    if not ops:
        raise SystemExit("oncelog configs: alter needs --add-config or --delete-config")
    with Admin(client_config(args)) as admin:
        names = _entity_names(args, admin)
        results = admin.incremental_alter_configs(
            {ConfigResource(args.entity_type, name): ops for name in names},
            validate_only=args.validate_only)
    failed = 0
    kind = args.entity_type[:-1]
    for resource, error in results.items():
        label = "the default broker" if kind == "broker" and not resource.name \
            else f"{kind} {resource.name}"
        if error is not None:
            print(f"oncelog configs: {label}: {error}", file=sys.stderr)
            failed += 1
        else:
            verb = "would be changed (validate only)" if args.validate_only else "changed"
            print(f"Configs of {label} {verb}.")
    return 1 if failed else 0


def _run(args: argparse.Namespace) -> int:
    flags = [name for name in ("describe", "alter") if getattr(args, f"do_{name}")]
    if (args.action and flags and flags != [args.action]) or len(flags) > 1:
        raise SystemExit("oncelog configs: say describe or alter, once")
    args.action = args.action or (flags[0] if flags else None)
    if args.action is None:
        raise SystemExit("oncelog configs: say describe or alter (or --describe / --alter)")
    try:
        if is_quota_command(args):
            return run_quota_command(args)
        if args.entity_type is None:
            raise SystemExit("oncelog configs: say --entity-type (or --user, --client, --ip)")
        return _describe(args) if args.action == "describe" else _alter(args)
    except KafkaError as exc:
        print(f"oncelog configs: {exc}", file=sys.stderr)
        return 1


def add_config_commands(sub, with_bootstrap) -> None:
    configs = with_bootstrap(sub.add_parser(
        "configs", help="describe and alter topic and broker configs (as kafka-configs.sh)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    configs.add_argument("action", nargs="?", choices=["describe", "alter"])
    configs.add_argument("--describe", dest="do_describe", action="store_true",
                         help="same as the describe action")
    configs.add_argument("--alter", dest="do_alter", action="store_true",
                         help="same as the alter action")
    configs.add_argument("--entity-type",
                         choices=["topics", "brokers", "users", "clients", "ips"])
    configs.add_argument("--entity-name", help="topic name or broker id (describe: all "
                                               "when left out)")
    configs.add_argument("--entity-default", action="store_true",
                         help="the brokers' cluster-wide default")
    configs.add_argument("--all", action="store_true",
                         help="describe every config, not only those set")
    configs.add_argument("--add-config", action="append", metavar="K=V,K2=[A,B]",
                         help="configs to set; may be repeated")
    configs.add_argument("--delete-config", action="append", metavar="K,K2",
                         help="configs to remove (back to their defaults); may be repeated")
    configs.add_argument("--validate-only", action="store_true",
                         help="check the change without making it")
    add_quota_options(configs)
    configs.set_defaults(func=_run)
