"""``oncelog configs`` for client quotas, as kafka-configs.sh does them:

    oncelog configs alter --entity-type clients --entity-name X \\
        --add-config producer_byte_rate=1024,consumer_byte_rate=2048
    oncelog configs alter --user alice --client-defaults --add-config request_percentage=50
    oncelog configs describe --entity-type users [--entity-name alice | --entity-default]
    oncelog configs alter --entity-type clients --entity-name X --delete-config producer_byte_rate

``--entity-type users | clients | ips`` with ``--entity-name`` or ``--entity-default``, or
kafka-configs.sh's shorthands ``--user``, ``--client``, ``--ip`` and ``--user-defaults``,
``--client-defaults``, ``--ip-defaults`` (a user and a client together name one entity).
"""

from __future__ import annotations

import argparse
import sys

from ..client.admin import admin_quotas
from ..client.admin.admin import Admin

QUOTA_ENTITY_TYPES = {"users": "user", "clients": "client-id", "ips": "ip"}
_SHORTHANDS = (("user", "user"), ("client", "client-id"), ("ip", "ip"))


def add_quota_options(parser: argparse.ArgumentParser) -> None:
    for flag, kind in _SHORTHANDS:
        parser.add_argument(f"--{flag}", metavar="NAME", help=f"the {kind} quota entity")
        parser.add_argument(f"--{flag}-defaults", action="store_true",
                            help=f"the default {kind} quota entity")


def is_quota_command(args: argparse.Namespace) -> bool:
    return args.entity_type in QUOTA_ENTITY_TYPES or any(
        getattr(args, flag) is not None or getattr(args, f"{flag}_defaults")
        for flag, _ in _SHORTHANDS)


def _entity(args: argparse.Namespace) -> tuple[dict[str, str | None], bool]:
    """The entity named, and whether every part of it is named (not only its types)."""
    entity: dict[str, str | None] = {}
    whole = True
    if args.entity_type in QUOTA_ENTITY_TYPES:
        kind = QUOTA_ENTITY_TYPES[args.entity_type]
        if args.entity_default:
            entity[kind] = None
        elif args.entity_name is not None:
            entity[kind] = args.entity_name
        else:
            entity[kind] = ""  # every name of this type (describe only)
            whole = False
    for flag, kind in _SHORTHANDS:
        if getattr(args, f"{flag}_defaults"):
            entity[kind] = None
        elif getattr(args, flag) is not None:
            entity[kind] = getattr(args, flag)
    return entity, whole


def run_quota_command(args: argparse.Namespace) -> int:
    entity, whole = _entity(args)
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        if args.action == "describe":
            components = [(kind, admin_quotas.MATCH_SPECIFIED, None) if name == ""
                          else (kind, admin_quotas.MATCH_DEFAULT, None) if name is None
                          else (kind, admin_quotas.MATCH_EXACT, name)
                          for kind, name in entity.items()]
            for found, values in admin_quotas.describe_client_quotas(admin.conn, components,
                                                                     strict=True):
                shown = ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
                print(f"Quota configs for {_label(found)} are {shown}")
            return 0
        if not whole:
            raise SystemExit("oncelog configs: alter needs --entity-name or --entity-default")
        changes: dict[str, float | None] = {}
        for item in (i.strip() for add in args.add_config or [] for i in add.split(",")
                     if i.strip()):
            key, _, value = item.partition("=")
            try:
                changes[key.strip()] = float(value)
            except ValueError:
                raise SystemExit(f"oncelog configs: --add-config expects key=number, got "
                                 f"{item!r}") from None
        for item in args.delete_config or []:
            changes.update({name.strip(): None for name in item.split(",") if name.strip()})
        if not changes:
            raise SystemExit("oncelog configs: alter needs --add-config or --delete-config")
        (error,) = admin_quotas.alter_client_quotas(admin.conn, [(entity, changes)],
                                                    validate_only=args.validate_only)
    if error is not None:
        print(f"oncelog configs: {_label(entity)}: {error}", file=sys.stderr)
        return 1
    verb = "would be updated (validate only)" if args.validate_only else "updated"
    print(f"Quota configs for {_label(entity)} {verb}.")
    return 0


def _label(entity: dict[str, str | None]) -> str:
    names = {"user": "user-principal", "client-id": "client-id", "ip": "ip"}
    return ", ".join(f"the default {names[kind]}" if name is None
                     else f"{names[kind]} '{name}'" for kind, name in sorted(
                         entity.items(), key=lambda item: list(names).index(item[0])))
