"""ACLs and Kafka's authorizer decision, without I/O.

An ACL binding is a resource pattern (type, name, LITERAL or PREFIXED) and an entry
(principal, host, operation, Allow or Deny). ``Authorizer.authorize`` is the one decision,
Kafka's (AclAuthorizer / StandardAuthorizer), as this table, first row that applies:

| row | when | answer |
|---|---|---|
| A1 | no authorizer configured (``authorizer.class.name`` empty; the caller holds None) | allowed |
| A2 | the principal is one of ``super.users`` | allowed |
| A3 | a Deny ACL matches the resource, principal, host and the operation itself or All | denied |
| A4 | an Allow ACL matches, for the operation, All, or one that implies it | allowed |
| A5 | no ACL (any principal) matches the resource; ``allow.everyone.if.no.acl.found`` | allowed |
| A6 | anything else | denied |

An ACL matches a resource when its pattern is LITERAL with the resource's name or ``*``, or
PREFIXED with a prefix of the name; it matches a principal when it names it or ``User:*``, a
host when it names it or ``*``. Implied operations (Allow only, never Deny): Describe by Read,
Write, Delete and Alter; DescribeConfigs by AlterConfigs; everything by All.

``authorize_by_resource_type`` (KIP-679: may the principal do an operation on SOME resource
of a type, as InitProducerId asks of Write on topics) is Kafka's default
``Authorizer.authorizeByResourceType``:

| row | when | answer |
|---|---|---|
| T1 | ``authorize`` allows it on a resource named ``hardcode`` (super users, A5) | allowed |
| T2 | a Deny ACL on the literal ``*`` matches principal, host and operation (or All) | denied |
| T3 | an Allow ACL on the literal ``*`` matches | allowed |
| T4 | an Allow ACL on a name no Deny names literally nor by a prefix of it | allowed |
| T5 | anything else | denied |

A check costs the ACLs that could match: the resource type's literal ACLs of the name and of
``*`` (dictionary look-ups) and its prefixed ACLs along the name (a walk down a trie, one step
per character), never a scan of every ACL.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..protocol.acl_codes import (  # noqa: F401 (the names security's users take from here)
    CLUSTER_NAME,
    OPERATION_NAMES,
    PERMISSION_NAMES,
    RESOURCE_TYPE_NAMES,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

WILDCARD = "*"  # a LITERAL name matching every resource of its type
WILDCARD_PRINCIPAL = "User:*"
WILDCARD_HOST = "*"

_Op = AclOperation
# What each operation is also allowed by (A4); Deny is never implied.
_ALLOWED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    op: frozenset({op, _Op.ALL}) for op in AclOperation}
_ALLOWED_BY[_Op.DESCRIBE] = frozenset(
    {_Op.DESCRIBE, _Op.READ, _Op.WRITE, _Op.DELETE, _Op.ALTER, _Op.ALL})
_ALLOWED_BY[_Op.DESCRIBE_CONFIGS] = frozenset(
    {_Op.DESCRIBE_CONFIGS, _Op.ALTER_CONFIGS, _Op.ALL})

# What a resource type supports (AclEntry.supportedOperations): the *_authorized_operations
# fields answer a subset of these.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (_Op.READ, _Op.WRITE, _Op.CREATE, _Op.DESCRIBE, _Op.DELETE, _Op.ALTER,
                         _Op.DESCRIBE_CONFIGS, _Op.ALTER_CONFIGS),
    ResourceType.GROUP: (_Op.READ, _Op.DESCRIBE, _Op.DELETE, _Op.DESCRIBE_CONFIGS,
                         _Op.ALTER_CONFIGS),
    ResourceType.CLUSTER: (_Op.CREATE, _Op.CLUSTER_ACTION, _Op.DESCRIBE_CONFIGS,
                           _Op.ALTER_CONFIGS, _Op.IDEMPOTENT_WRITE, _Op.ALTER, _Op.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (_Op.DESCRIBE, _Op.WRITE, _Op.TWO_PHASE_COMMIT),
    ResourceType.DELEGATION_TOKEN: (_Op.DESCRIBE,),
    ResourceType.USER: (_Op.CREATE_TOKENS, _Op.DESCRIBE_TOKENS),
}


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType


@dataclass(frozen=True, slots=True)
class AccessControlEntry:
    principal: str  # "User:alice", or "User:*"
    host: str  # an address, or "*"
    operation: AclOperation
    permission: AclPermissionType


@dataclass(frozen=True, slots=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry


class InvalidAcl(ValueError):
    """A binding or filter Kafka refuses: answered INVALID_REQUEST with this message."""


def validate_binding(binding: AclBinding) -> None:
    """What CreateAcls refuses (Kafka's KafkaApis/AclControlManager checks), else None."""
    pattern, entry = binding.pattern, binding.entry
    if pattern.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        raise InvalidAcl(f"Invalid resourceType {pattern.resource_type.name}")
    if pattern.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAcl(f"Invalid patternType {pattern.pattern_type.name}")
    if entry.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        raise InvalidAcl(f"Invalid operation {entry.operation.name}")
    if entry.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
        raise InvalidAcl(f"Invalid permissionType {entry.permission.name}")
    if pattern.resource_type == ResourceType.CLUSTER and pattern.name != CLUSTER_NAME:
        raise InvalidAcl(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if not pattern.name:
        raise InvalidAcl("Invalid empty resource name")
    if ":" not in entry.principal:
        raise InvalidAcl(f"Could not parse principal from `{entry.principal}` (no colon is "
                         "present separating the principal type from the principal name)")


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """DescribeAcls' filter and each of DeleteAcls': None and ANY match anything."""

    resource_type: ResourceType
    name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: AclOperation
    permission: AclPermissionType

    def check(self) -> None:
        """InvalidAcl for a filter with an UNKNOWN element (Kafka refuses those too)."""
        for value in (self.resource_type, self.pattern_type, self.operation, self.permission):
            if value == 0:
                raise InvalidAcl(f"the filter contains an UNKNOWN element: {self}")

    def matches(self, binding: AclBinding) -> bool:
        return self.matches_pattern(binding.pattern) and self.matches_entry(binding.entry)

    def matches_pattern(self, pattern: ResourcePattern) -> bool:
        if self.resource_type not in (ResourceType.ANY, pattern.resource_type):
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH, pattern.pattern_type):
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, pattern.pattern_type):
            return self.name == pattern.name
        # MATCH: the patterns that would apply to a resource of this name
        if pattern.pattern_type == PatternType.LITERAL:
            return pattern.name in (self.name, WILDCARD)
        return self.name.startswith(pattern.name)

    def matches_entry(self, entry: AccessControlEntry) -> bool:
        return ((self.principal is None or self.principal == entry.principal)
                and (self.host is None or self.host == entry.host)
                and self.operation in (AclOperation.ANY, entry.operation)
                and self.permission in (AclPermissionType.ANY, entry.permission))


class _Node:
    __slots__ = ("children", "entries")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.entries: set[AccessControlEntry] = set()


class AclIndex:
    """Every ACL, by resource type: literal names in a dict, prefixes in a trie."""

    def __init__(self, bindings: Iterable[AclBinding] = ()) -> None:
        self._literal: dict[ResourceType, dict[str, set[AccessControlEntry]]] = {}
        self._prefixed: dict[ResourceType, _Node] = {}
        self._patterns: dict[ResourcePattern, set[AccessControlEntry]] = {}
        for binding in bindings:
            self.add(binding)

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._patterns.values())

    def _entries(self, pattern: ResourcePattern, create: bool) -> set[AccessControlEntry] | None:
        if pattern.pattern_type == PatternType.LITERAL:
            names = self._literal.setdefault(pattern.resource_type, {}) if create \
                else self._literal.get(pattern.resource_type, {})
            return names.setdefault(pattern.name, set()) if create else names.get(pattern.name)
        node = self._prefixed.setdefault(pattern.resource_type, _Node()) if create \
            else self._prefixed.get(pattern.resource_type)
        for ch in pattern.name:
            if node is None:
                return None
            node = node.children.setdefault(ch, _Node()) if create else node.children.get(ch)
        return None if node is None else node.entries

    def add(self, binding: AclBinding) -> None:
        entries = self._entries(binding.pattern, create=True)
        assert entries is not None
        entries.add(binding.entry)
        self._patterns.setdefault(binding.pattern, entries)

    def remove(self, binding: AclBinding) -> None:
        entries = self._entries(binding.pattern, create=False)
        if entries is not None:
            entries.discard(binding.entry)
            if not entries:
                self._patterns.pop(binding.pattern, None)
        # An emptied trie branch stays: it costs a walk no longer than the name's.

    def replace(self, pattern: ResourcePattern, entries: Iterable[AccessControlEntry]) -> None:
        """The pattern's ACLs are now ``entries`` (as the store holds them)."""
        for entry in list(self._patterns.get(pattern, ())):
            self.remove(AclBinding(pattern, entry))
        for entry in entries:
            self.add(AclBinding(pattern, entry))

    def patterns(self) -> dict[ResourcePattern, set[AccessControlEntry]]:
        return self._patterns

    def bindings(self) -> Iterator[AclBinding]:
        for pattern, entries in self._patterns.items():
            for entry in entries:
                yield AclBinding(pattern, entry)

    def matching(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        return [b for b in self.bindings() if acl_filter.matches(b)]

    def for_resource(self, resource_type: ResourceType,
                     name: str) -> Iterator[AccessControlEntry]:
        """The entries of every pattern that applies to the named resource."""
        literal = self._literal.get(resource_type)
        if literal:
            yield from literal.get(name, ())
            if name != WILDCARD:
                yield from literal.get(WILDCARD, ())
        node = self._prefixed.get(resource_type)
        for ch in name:
            if node is None:
                break
            node = node.children.get(ch)
            if node is not None:
                yield from node.entries

    def of_type(self, resource_type: ResourceType) -> Iterator[AclBinding]:
        for pattern, entries in self._patterns.items():
            if pattern.resource_type == resource_type:
                for entry in entries:
                    yield AclBinding(pattern, entry)


def _applies(entry: AccessControlEntry, principal: str, host: str) -> bool:
    return (entry.principal in (principal, WILDCARD_PRINCIPAL)
            and entry.host in (host, WILDCARD_HOST))


class Authorizer:
    def __init__(self, acls: AclIndex | None = None, super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.acls = acls if acls is not None else AclIndex()
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found

    def authorize(self, principal: str, host: str, operation: AclOperation,
                  resource_type: ResourceType, name: str) -> bool:
        """Rows A2-A6 (A1 is the caller's: it has no Authorizer)."""
        if principal in self.super_users:
            return True  # A2
        allowed_by = _ALLOWED_BY[operation]
        any_acl = allowed = False
        for entry in self.acls.for_resource(resource_type, name):
            any_acl = True
            if not _applies(entry, principal, host):
                continue
            if entry.permission == AclPermissionType.DENY:
                if entry.operation in (operation, AclOperation.ALL):
                    return False  # A3
            elif entry.operation in allowed_by:
                allowed = True
        if allowed:
            return True  # A4
        return not any_acl and self.allow_everyone_if_no_acl_found  # A5, A6

    def authorize_by_resource_type(self, principal: str, host: str, operation: AclOperation,
                                   resource_type: ResourceType) -> bool:
        """Rows T1-T5."""
        if self.authorize(principal, host, operation, resource_type, "hardcode"):
            return True  # T1
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allow: list[ResourcePattern] = []
        wildcard_allow = False
        for binding in self.acls.of_type(resource_type):
            entry, pattern = binding.entry, binding.pattern
            if not _applies(entry, principal, host) \
                    or entry.operation not in (operation, AclOperation.ALL):
                continue
            literal = pattern.pattern_type == PatternType.LITERAL
            if entry.permission == AclPermissionType.DENY:
                if literal and pattern.name == WILDCARD:
                    return False  # T2
                (deny_literal if literal else deny_prefixed).add(pattern.name)
            elif literal and pattern.name == WILDCARD:
                wildcard_allow = True
            else:
                allow.append(pattern)
        if wildcard_allow:
            return True  # T3
        for pattern in allow:
            if pattern.pattern_type == PatternType.LITERAL and pattern.name in deny_literal:
                continue
            if not any(pattern.name[:i] in deny_prefixed for i in range(1, len(pattern.name) + 1)):
                return True  # T4
        return False  # T5

    def authorized_operations(self, principal: str, host: str, resource_type: ResourceType,
                              name: str) -> int:
        """The 32-bit field of the operations allowed (bit ``code`` for each)."""
        field = 0
        for operation in SUPPORTED_OPERATIONS[resource_type]:
            if self.authorize(principal, host, operation, resource_type, name):
                field |= 1 << int(operation)
        return field


def all_operations_field(resource_type: ResourceType) -> int:
    """The field without an authorizer: everything the type supports."""
    field = 0
    for operation in SUPPORTED_OPERATIONS[resource_type]:
        field |= 1 << int(operation)
    return field
