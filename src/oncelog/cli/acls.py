"""``oncelog acls add | list | remove``: ACLs over the admin API, in the manner of
kafka-acls.sh.

    oncelog acls add --allow-principal User:alice --operation Read --operation Describe \\
        --topic orders --group billing-
    oncelog acls add --allow-principal User:app --producer --idempotent --topic orders
    oncelog acls add --deny-principal User:mallory --operation All --topic orders \\
        --resource-pattern-type prefixed
    oncelog acls list [--topic orders] [--principal User:alice] [--resource-pattern-type match]
    oncelog acls remove --topic orders [--allow-principal User:alice --operation Read]

Resources: ``--topic``, ``--group``, ``--transactional-id`` (each may be repeated) and
``--cluster``. ``--operation`` may be repeated (default All); ``--allow-host`` and
``--deny-host`` default to ``*``. ``--producer`` is Write, Describe and Create on the topics
(Write and Describe on the transactional ids; IdempotentWrite on the cluster with
``--idempotent``); ``--consumer`` is Read and Describe on the topics and Read on the groups.
``--resource-pattern-type`` is literal (default) or prefixed, and for list and remove also
any or match. Without an authorizer on the broker every action fails with
SECURITY_DISABLED (exit status 1).
"""

from __future__ import annotations

import argparse

from ..client.admin.admin_acls import Acl, AclFilter
from ..protocol.acl_codes import (
    CLUSTER_NAME,
    OPERATION_NAMES,
    RESOURCE_TYPE_NAMES,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from .errors import UsageError, admin_for, guarded
from .table import print_tabbed

Op, Rt = AclOperation, ResourceType
_OPERATIONS = {name.lower(): op for op, name in OPERATION_NAMES.items()} | {
    op.name.lower().replace("_", ""): op for op in OPERATION_NAMES}
HEADERS = ("RESOURCE_TYPE", "NAME", "PATTERN_TYPE", "PRINCIPAL", "HOST", "OPERATION",
           "PERMISSION")


def _operation(text: str) -> AclOperation:
    try:
        return _OPERATIONS[text.lower().replace("_", "").replace("-", "")]
    except KeyError:
        raise UsageError(f"unknown operation {text!r}; one of "
                         f"{', '.join(OPERATION_NAMES.values())}") from None


def _resources(args: argparse.Namespace) -> list[tuple[ResourceType, str]]:
    found = [(Rt.TOPIC, t) for t in args.topic or ()]
    found += [(Rt.GROUP, g) for g in args.group or ()]
    found += [(Rt.TRANSACTIONAL_ID, t) for t in args.transactional_id or ()]
    if args.cluster:
        found.append((Rt.CLUSTER, CLUSTER_NAME))
    return found


def _pattern(args: argparse.Namespace, adding: bool) -> PatternType:
    pattern = PatternType[args.resource_pattern_type.upper()]
    if adding and pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise UsageError("ACLs are added with --resource-pattern-type literal or prefixed")
    return pattern


def _wanted(args: argparse.Namespace) -> list[tuple[ResourceType, str, AclOperation]]:
    """(resource type, name, operation) of every ACL the arguments ask for."""
    resources = _resources(args)
    if args.producer or args.consumer:
        wanted = []
        for rtype, name in resources:
            if args.producer and rtype == Rt.TOPIC:
                wanted += [(rtype, name, op) for op in (Op.WRITE, Op.DESCRIBE, Op.CREATE)]
            if args.producer and rtype == Rt.TRANSACTIONAL_ID:
                wanted += [(rtype, name, op) for op in (Op.WRITE, Op.DESCRIBE)]
            if args.consumer and rtype == Rt.TOPIC:
                wanted += [(rtype, name, op) for op in (Op.READ, Op.DESCRIBE)]
            if args.consumer and rtype == Rt.GROUP:
                wanted.append((rtype, name, Op.READ))
        if args.producer and args.idempotent:
            wanted.append((Rt.CLUSTER, CLUSTER_NAME, Op.IDEMPOTENT_WRITE))
        return list(dict.fromkeys(wanted))
    operations = [_operation(o) for o in args.operation or ["All"]]
    return [(rtype, name, op) for rtype, name in resources for op in operations]


def _entries(args: argparse.Namespace) -> list[tuple[str, str, AclPermissionType]]:
    return ([(p, h, AclPermissionType.ALLOW) for p in args.allow_principal or ()
             for h in args.allow_host or ["*"]]
            + [(p, h, AclPermissionType.DENY) for p in args.deny_principal or ()
               for h in args.deny_host or ["*"]])


def _rows(acls: list[Acl]) -> list[tuple[str, ...]]:
    return sorted((RESOURCE_TYPE_NAMES.get(a.resource_type, a.resource_type.name), a.name,
                   a.pattern_type.name, a.principal, a.host,
                   OPERATION_NAMES.get(a.operation, a.operation.name),
                   a.permission.name.capitalize()) for a in acls)


def _add(args: argparse.Namespace) -> int:
    pattern = _pattern(args, adding=True)
    wanted, entries = _wanted(args), _entries(args)
    if not wanted:
        raise UsageError("name a resource: --topic, --group, --transactional-id or --cluster")
    if not entries:
        raise UsageError("name a principal: --allow-principal or --deny-principal")
    acls = [Acl(rtype, name, pattern, principal, host, op, permission)
            for rtype, name, op in wanted for principal, host, permission in entries]
    with admin_for(args, "oncelog-acls") as admin:
        admin.create_acls(acls)
    print("Added ACLs:")
    print_tabbed(HEADERS, _rows(acls))
    return 0


def _filters(args: argparse.Namespace) -> list[AclFilter]:
    pattern = _pattern(args, adding=False)
    resources = _resources(args) or [(Rt.ANY, None)]
    entries: list[tuple[str | None, str | None, AclPermissionType]] = list(_entries(args)) \
        or [(getattr(args, "principal", None), None, AclPermissionType.ANY)]
    operations = [_operation(o) for o in args.operation] if args.operation else [Op.ANY]
    return [AclFilter(rtype, name, pattern if name is not None else PatternType.ANY,
                      principal, host, op, permission)
            for rtype, name in resources for principal, host, permission in entries
            for op in operations]


def _list(args: argparse.Namespace) -> int:
    found: dict[Acl, None] = {}
    with admin_for(args, "oncelog-acls") as admin:
        for acl_filter in _filters(args):
            found.update(dict.fromkeys(admin.describe_acls(acl_filter)))
    print_tabbed(HEADERS, _rows(list(found)))
    return 0


def _remove(args: argparse.Namespace) -> int:
    with admin_for(args, "oncelog-acls") as admin:
        deleted = [acl for acls in admin.delete_acls(_filters(args)) for acl in acls]
    print(f"Removed {len(deleted)} ACL(s):")
    print_tabbed(HEADERS, _rows(list(dict.fromkeys(deleted))))
    return 0


def add_acl_commands(sub, with_bootstrap) -> None:
    acls = sub.add_parser("acls", help="add, list and remove ACLs (as kafka-acls.sh)",
                          description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    asub = acls.add_subparsers(dest="acls_command", required=True, metavar="ACTION")
    for action, run, helptext in (("add", _add, "add ACLs"),
                                  ("list", _list, "list the ACLs matching"),
                                  ("remove", _remove, "remove the ACLs matching")):
        p = with_bootstrap(asub.add_parser(action, help=helptext))
        p.add_argument("--topic", action="append", metavar="NAME")
        p.add_argument("--group", action="append", metavar="NAME")
        p.add_argument("--transactional-id", action="append", metavar="ID")
        p.add_argument("--cluster", action="store_true", help="the cluster resource")
        p.add_argument("--resource-pattern-type", default="literal",
                       choices=["literal", "prefixed", "any", "match"])
        p.add_argument("--allow-principal", action="append", metavar="TYPE:NAME")
        p.add_argument("--deny-principal", action="append", metavar="TYPE:NAME")
        p.add_argument("--allow-host", action="append", metavar="HOST")
        p.add_argument("--deny-host", action="append", metavar="HOST")
        p.add_argument("--operation", action="append", metavar="OP",
                       help=f"one of {', '.join(OPERATION_NAMES.values())}")
        p.add_argument("--producer", action="store_true", help="a producer's ACLs")
        p.add_argument("--consumer", action="store_true", help="a consumer's ACLs")
        p.add_argument("--idempotent", action="store_true",
                       help="with --producer: IdempotentWrite on the cluster")
        p.add_argument("--force", action="store_true",
                       help="accepted for kafka-acls.sh's sake: nothing is asked")
        if action == "list":
            p.add_argument("--principal", metavar="TYPE:NAME",
                           help="only this principal's ACLs")
        p.set_defaults(func=guarded(run, "acls"))
