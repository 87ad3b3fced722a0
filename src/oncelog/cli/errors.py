"""How a command of the ``oncelog`` tool stops when it cannot go on, as Kafka's tools do: exit
status 2 for arguments that cannot work, 1 for a failure (the message on standard error), 130
for Ctrl-C; and the admin client a command family opens."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..client.admin.admin import Admin
from ..client.network.connection import KafkaError
from .client_config import client_config


class UsageError(Exception):
    """Arguments that cannot work: exit status 2."""


class Failed(Exception):
    """Kafka's printErrorAndExit: the message, exit status 1."""


def guarded(func: Callable[[argparse.Namespace], int], family: str | None = None
            ) -> Callable[[argparse.Namespace], int]:
    """``func`` as the command ``oncelog FAMILY <its subcommand>`` (``args.<family>_command``),
    or without a family ``oncelog <command>``, its errors turned into a message and an exit
    status."""
    def run(args: argparse.Namespace) -> int:
        name = f"oncelog {family} {getattr(args, f'{family}_command')}" if family \
            else f"oncelog {args.command}"
        try:
            return func(args)
        except UsageError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 2
        except Failed as exc:
            print(str(exc), file=sys.stderr)
            return 1
        except KafkaError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130

    return run


def admin_for(args: argparse.Namespace, client_id: str) -> Admin:
    """An admin client on ``--bootstrap-server``; one that is not host:port is a UsageError."""
    try:
        return Admin(client_config(args, **{"client.id": client_id}))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
