"""``oncelog users add | list | delete``: SCRAM users, as Kafka's ``kafka-configs --alter
--add-config 'SCRAM-SHA-512=[password=...]' --entity-type users`` and ``kafka-storage format
--add-scram`` manage them.

Where the users are kept, one of:

- ``--bootstrap-server`` (with ``--command-config``): through a running broker's
  AlterUserScramCredentials / DescribeUserScramCredentials;
- ``--data-dir DIR``: straight into the metadata store of a broker's first log directory,
  for the first user before any broker runs (the broker need not be stopped: the store is
  locked per change);
- ``--zookeeper HOST:PORT[/chroot]``: a cluster's ZooKeeper, where every broker reads them.

The password comes from ``--password``, else from ``ONCELOG_PASSWORD``, else it is asked for
(not echoed). Both mechanisms by default, 4096 iterations.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
from collections.abc import Iterator

from ..client.admin.admin import Admin
from ..client.admin.admin_scram import ScramUpsertion
from ..client.network.connection import KafkaError
from ..metadata.store import LocalFileStore, MetadataStore
from ..security import scram
from ..security.credentials import ScramCredentials
from .client_config import client_config
from .errors import Failed, UsageError, guarded
from .table import tabbed

_ZOOKEEPER_TIMEOUT_MS = 10_000


@contextlib.contextmanager
def _store(args: argparse.Namespace) -> Iterator[MetadataStore | None]:
    """The store ``--data-dir`` or ``--zookeeper`` names (closed after), else None: through
    the broker at ``--bootstrap-server``."""
    if args.data_dir and args.zookeeper:
        raise UsageError("give --data-dir or --zookeeper, not both")
    if args.data_dir:
        from ..broker.server import METADATA_DIR  # here: the broker is slow to import

        yield LocalFileStore(os.path.join(args.data_dir, METADATA_DIR))
        return
    if not args.zookeeper:
        yield None
        return
    from ..metadata.zookeeper import ZooKeeperStore

    try:
        store = ZooKeeperStore(args.zookeeper, _ZOOKEEPER_TIMEOUT_MS)
    except Exception as exc:  # unreachable, malformed: the message says which
        raise Failed(f"oncelog users: ZooKeeper {args.zookeeper}: {exc}") from None
    try:
        yield store
    finally:
        store.close()


def _mechanisms(args: argparse.Namespace) -> list[str]:
    return [args.mechanism] if args.mechanism else list(scram.MECHANISMS)


def _password(args: argparse.Namespace) -> str:
    password = args.password or os.environ.get("ONCELOG_PASSWORD")
    if password is None:
        password = getpass.getpass(f"password for {args.user}: ")
    if not password:
        raise UsageError("the password is empty")
    return password


def _add(args: argparse.Namespace) -> int:
    if not args.user:
        raise UsageError("the user name is empty")
    if not scram.MIN_ITERATIONS <= args.iterations <= scram.MAX_ITERATIONS:
        raise UsageError(f"--iterations must be within {scram.MIN_ITERATIONS}.."
                         f"{scram.MAX_ITERATIONS}")
    password = _password(args)
    with _store(args) as store:
        if store is not None:
            credentials = ScramCredentials(store)
            for mechanism in _mechanisms(args):
                credentials.put(args.user, mechanism, scram.make_credential(
                    mechanism, password.encode(), iterations=args.iterations))
            print(f"user {args.user}: {', '.join(_mechanisms(args))} set")
            return 0
    with Admin(client_config(args)) as admin:
        _check(admin.alter_user_scram_credentials(
            [ScramUpsertion(args.user, m, password, args.iterations) for m in _mechanisms(args)]))
    print(f"user {args.user}: {', '.join(_mechanisms(args))} set")
    return 0


def _list(args: argparse.Namespace) -> int:
    rows = []
    with _store(args) as store:
        if store is not None:
            credentials = ScramCredentials(store)
            for user in credentials.users():
                rows += [(user, m, str(i)) for m, i in credentials.mechanisms(user).items()]
    if store is None:
        with Admin(client_config(args)) as admin:
            found = admin.describe_user_scram_credentials(None)
        for user, infos in sorted(found.items()):
            if isinstance(infos, KafkaError):
                raise Failed(f"oncelog users list: {user}: {infos}")
            rows += [(user, m, str(i)) for m, i in infos.items()]
    for line in tabbed(("User", "Mechanism", "Iterations"), rows):
        print(line)
    return 0


def _delete(args: argparse.Namespace) -> int:
    with _store(args) as store:
        if store is not None:
            credentials = ScramCredentials(store)
            have = credentials.mechanisms(args.user)
            asked = [m for m in _mechanisms(args) if m in have or args.mechanism]
            if not asked or not all(credentials.delete(args.user, m) for m in asked):
                raise Failed(f"oncelog users delete: {args.user} has no such credential")
    if store is None:
        with Admin(client_config(args)) as admin:
            have = admin.describe_user_scram_credentials([args.user])[args.user]
            if isinstance(have, KafkaError):
                raise Failed(f"oncelog users delete: {args.user}: {have}")
            asked = [m for m in _mechanisms(args) if m in have or args.mechanism]
            _check(admin.alter_user_scram_credentials(
                deletions=[(args.user, m) for m in asked]))
    print(f"user {args.user}: {', '.join(asked)} deleted")
    return 0


def _check(results: dict[str, KafkaError | None]) -> None:
    for user, error in results.items():
        if error is not None:
            raise Failed(f"oncelog users: {user}: {error}")


def add_user_commands(sub, with_bootstrap) -> None:
    users = sub.add_parser("users", help="SCRAM users (add, list, delete)",
                           description=__doc__.split("\n\n")[0].replace("\n", " "))
    usub = users.add_subparsers(dest="users_command", required=True, metavar="SUBCOMMAND")

    def where(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        with_bootstrap(parser)
        parser.add_argument("--data-dir", metavar="DIR",
                            help="a broker's first log directory: change its metadata store "
                                 "directly (before any broker runs)")
        parser.add_argument("--zookeeper", metavar="HOST:PORT[/CHROOT]",
                            help="a cluster's ZooKeeper (zookeeper.connect)")
        return parser

    add = where(usub.add_parser("add", help="add a user or set its password"))
    add.add_argument("user")
    add.add_argument("--password", help="(else ONCELOG_PASSWORD, else asked for)")
    add.add_argument("--mechanism", choices=list(scram.MECHANISMS),
                     help="only this mechanism (default: both)")
    add.add_argument("--iterations", type=int, default=scram.DEFAULT_ITERATIONS)
    add.set_defaults(func=guarded(_add, "users"))
    listing = where(usub.add_parser("list", help="list the users and their mechanisms"))
    listing.set_defaults(func=guarded(_list, "users"))
    delete = where(usub.add_parser("delete", help="delete a user's credentials"))
    delete.add_argument("user")
    delete.add_argument("--mechanism", choices=list(scram.MECHANISMS),
                        help="only this mechanism (default: every one it has)")
    delete.set_defaults(func=guarded(_delete, "users"))

