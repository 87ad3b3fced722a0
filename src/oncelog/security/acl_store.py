"""ACLs kept in the metadata store, where Kafka keeps them in ZooKeeper, in Kafka's JSON.

A LITERAL pattern's ACLs are the value at ``kafka-acl/<ResourceType>/<name>``, a PREFIXED
pattern's at ``kafka-acl-extended/prefixed/<ResourceType>/<name>``, each
``{"version": 1, "acls": [{"principal": "User:a", "permissionType": "Allow",
"operation": "Read", "host": "*"}]}``: on the cluster's ZooKeeper these are Kafka's own znodes.
Every change is a compare-and-set of the pattern's value, retried on a lost race from a fresh
read, so two CreateAcls (on one broker or two) never lose each other's ACLs.

In a cluster (``shared``) each change then bumps the value at ``kafka-acl-changes``; a broker
whose copy was read at an older version reads every ACL again (``refresh``), which is how the
other brokers learn of it (one read of one path per refresh while nothing changes). A broker
alone is the only writer of its store: nothing to announce.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ..metadata.store import NO_VERSION, BadVersion, MetadataStore, race_attempts
from .acls import (
    OPERATION_NAMES,
    PERMISSION_NAMES,
    RESOURCE_TYPE_NAMES,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclIndex,
    InvalidAcl,
    PatternType,
    ResourcePattern,
)

log = logging.getLogger(__name__)

LITERAL_ROOT = "kafka-acl"
PREFIXED_ROOT = "kafka-acl-extended/prefixed"
CHANGES = "kafka-acl-changes"
_ROOTS = {PatternType.LITERAL: LITERAL_ROOT, PatternType.PREFIXED: PREFIXED_ROOT}
# Compare-and-set rounds before a change gives up: each lost round means another writer
# succeeded, so this many in a row is a store far busier than ACL changes ever make it.

_TYPES_BY_NAME = {name: rtype for rtype, name in RESOURCE_TYPE_NAMES.items()}
_OPS_BY_NAME = {name: op for op, name in OPERATION_NAMES.items()}
_PERMS_BY_NAME = {name: perm for perm, name in PERMISSION_NAMES.items()}


def path(pattern: ResourcePattern) -> str:
    return (f"{_ROOTS[pattern.pattern_type]}/{RESOURCE_TYPE_NAMES[pattern.resource_type]}/"
            f"{pattern.name}")


def to_json(entries: Iterable[AccessControlEntry]) -> dict[str, Any]:
    acls = [{"principal": e.principal, "permissionType": PERMISSION_NAMES[e.permission],
             "operation": OPERATION_NAMES[e.operation], "host": e.host}
            for e in entries]
    acls.sort(key=lambda a: (a["principal"], a["host"], a["operation"], a["permissionType"]))
    return {"version": 1, "acls": acls}


def from_json(value: Any) -> set[AccessControlEntry]:
    if not isinstance(value, dict):
        return set()
    return {AccessControlEntry(a["principal"], a["host"], _OPS_BY_NAME[a["operation"]],
                               _PERMS_BY_NAME[a["permissionType"]])
            for a in value.get("acls", ())}


class AclStore:
    """The store's ACLs and this broker's copy of them, indexed for the authorizer."""

    def __init__(self, store: MetadataStore, shared: bool = True) -> None:
        self.store = store
        self.shared = shared
        self.index = AclIndex()
        self._seen = NO_VERSION - 1  # nothing read yet
        self.refresh()

    def check(self, pattern: ResourcePattern) -> None:
        """InvalidAcl for a name the store cannot keep at Kafka's path: in ZooKeeper a "/"
        in it would make a deeper znode (read back as another name), "." and ".." none."""
        if self.shared and ("/" in pattern.name or pattern.name in (".", "..")
                            or "\x00" in pattern.name):
            raise InvalidAcl(f"resource name {pattern.name!r} cannot be a ZooKeeper znode "
                             "name (no '/', '.', '..' or NUL)")

    def refresh(self) -> None:
        """Reads every ACL again when another writer changed them since the last read."""
        _, version = self.store.get(CHANGES)
        if version == self._seen:
            return
        index = AclIndex()
        for pattern_type, root in _ROOTS.items():
            for type_name, resource_type in _TYPES_BY_NAME.items():
                for name in self.store.children(f"{root}/{type_name}"):
                    pattern = ResourcePattern(resource_type, name, pattern_type)
                    value, _ = self.store.get(path(pattern))
                    try:
                        entries = from_json(value)
                    except (KeyError, TypeError) as exc:
                        log.error("ACLs at %s unreadable, skipped: %r", path(pattern), exc)
                        continue
                    for entry in entries:
                        index.add(AclBinding(pattern, entry))
        self.index = index
        self._seen = version

    def _change(self, pattern: ResourcePattern,
                edit: Any) -> set[AccessControlEntry]:
        """``edit(entries) -> entries`` applied to the pattern's stored ACLs by
        compare-and-set; the entries now stored."""
        key = path(pattern)
        for _ in race_attempts(f"change the ACLs of {key}"):
            value, version = self.store.get(key)
            before = from_json(value)
            after = edit(set(before))
            if after == before:
                return after
            try:
                if after:
                    self.store.compare_and_set(key, to_json(after), version)
                else:
                    self.store.delete(key, version)
            except BadVersion:
                continue
            self.index.replace(pattern, after)
            return after

    def _changed(self) -> None:
        if not self.shared:
            return
        for _ in race_attempts(f"count a change in {CHANGES}"):
            value, version = self.store.get(CHANGES)
            count = value.get("changes", 0) if isinstance(value, dict) else 0
            try:
                new_version = self.store.compare_and_set(
                    CHANGES, {"version": 1, "changes": count + 1}, version)
            except BadVersion:
                continue
            if version == self._seen:
                self._seen = new_version  # nobody else changed them: this copy is current
            else:
                self._seen = NO_VERSION - 1  # others did: read them all again
                self.refresh()
            return

    def create(self, bindings: list[AclBinding]) -> None:
        """Stores the (validated) bindings, grouped by pattern."""
        by_pattern: dict[ResourcePattern, set[AccessControlEntry]] = {}
        for binding in bindings:
            by_pattern.setdefault(binding.pattern, set()).add(binding.entry)
        try:
            for pattern, entries in by_pattern.items():
                self._change(pattern, lambda stored, e=entries: stored | e)
        finally:
            if by_pattern:
                self._changed()

    def delete(self, filters: list[AclBindingFilter]) -> list[list[AclBinding]]:
        """The bindings each filter matched, all removed from the store."""
        self.refresh()
        matched = [self.index.matching(f) for f in filters]
        by_pattern: dict[ResourcePattern, set[AccessControlEntry]] = {}
        for bindings in matched:
            for binding in bindings:
                by_pattern.setdefault(binding.pattern, set()).add(binding.entry)
        try:
            for pattern, entries in by_pattern.items():
                self._change(pattern, lambda stored, e=entries: stored - e)
        finally:
            if by_pattern:
                self._changed()
        return matched
