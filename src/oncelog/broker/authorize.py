"""Authorization as the API handlers ask it: each check is one call here, deciding from the
request's session (principal) and peer (host) by ``oncelog.security.acls.Authorizer``.

``authorizer.class.name`` empty (Kafka's default) means no authorizer: every check allows
(row A1 of the decision table), and the ACL APIs answer SECURITY_DISABLED. Kafka's two class
names (``kafka.security.authorizer.AclAuthorizer``,
``org.apache.kafka.metadata.authorizer.StandardAuthorizer``) enable oncelog's authorizer,
with ``super.users`` (``User:a;User:b``) and ``allow.everyone.if.no.acl.found``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..metadata.store import MetadataUnavailable
from ..security.acl_store import AclStore
from ..security.acls import (
    CLUSTER_NAME,
    AclOperation,
    Authorizer,
    ResourceType,
    all_operations_field,
)
from ..security.principal import ANONYMOUS
from .log_limits import RateLimitedLog, log_safe

log = logging.getLogger(__name__)
_denied = RateLimitedLog(log)

Op = AclOperation
Rt = ResourceType


class BrokerAuthorizer:
    """The decision (``Authorizer``) over the ACLs the metadata store holds."""

    def __init__(self, store, super_users: Iterable[str], allow_if_no_acl: bool,
                 shared: bool) -> None:
        self.acls = AclStore(store, shared)
        self.decision = Authorizer(self.acls.index, super_users, allow_if_no_acl)

    def refresh(self) -> None:
        """The other brokers' changes (cluster mode, every second): while ZooKeeper is away
        the ACLs read last keep deciding."""
        try:
            self.acls.refresh()
        except MetadataUnavailable as exc:
            _denied.log(logging.WARNING, "refresh", "ACLs not reread: %s", exc)
            return
        self.decision.acls = self.acls.index

    def changed(self) -> None:
        """After a change through ``self.acls``: decide from its index from now on."""
        self.decision.acls = self.acls.index


def make_authorizer(config, store, shared: bool) -> BrokerAuthorizer | None:
    """``shared``: the store is the cluster's (other brokers change the ACLs too)."""
    if not config.get("authorizer.class.name"):
        return None
    super_users = [p.strip() for p in (config.get("super.users") or "").split(";") if p.strip()]
    return BrokerAuthorizer(store, super_users, config.get("allow.everyone.if.no.acl.found"),
                            shared)


def _who(request) -> tuple[str, str]:
    session = request.session
    principal = session.principal if session is not None else ANONYMOUS
    host = request.peer.rsplit(":", 1)[0] if request.peer else ""
    return str(principal), host.strip("[]")


def allowed(broker, request, operation: AclOperation, resource_type: ResourceType,
            name: str, quiet: bool = False) -> bool:
    """``quiet``: a denial is not worth a log line (another check may still allow)."""
    authorizer = broker.authorizer
    if authorizer is None:
        return True
    principal, host = _who(request)
    if authorizer.decision.authorize(principal, host, operation, resource_type, name):
        return True
    if not quiet:
        # A refused client may ask again at once, and forever: bounded per kind of denial.
        _denied.log(logging.INFO, f"denied {operation.name} {resource_type.name}",
                    "Principal = %s is Denied operation = %s from host = %s on resource = "
                    "%s:%s (api key %d v%d)", principal, operation.name, host,
                    resource_type.name, log_safe(name), request.api_key, request.api_version)
    return False


def cluster(broker, request, operation: AclOperation, quiet: bool = False) -> bool:
    return allowed(broker, request, operation, Rt.CLUSTER, CLUSTER_NAME, quiet)


def allowed_names(broker, request, operation: AclOperation, resource_type: ResourceType,
                  names: Iterable[str], quiet: bool = False) -> set[str]:
    """The names (of one request) the operation is allowed on, each decided once."""
    if broker.authorizer is None:
        return set(names)
    return {name for name in set(names)
            if allowed(broker, request, operation, resource_type, name, quiet)}


def any_of_type(broker, request, operation: AclOperation, resource_type: ResourceType) -> bool:
    """KIP-679: the operation is allowed on some resource of the type."""
    authorizer = broker.authorizer
    if authorizer is None:
        return True
    principal, host = _who(request)
    return authorizer.decision.authorize_by_resource_type(principal, host, operation,
                                                          resource_type)


def operations(broker, request, resource_type: ResourceType, name: str) -> int:
    """The ``*_authorized_operations`` field: what the caller may do to the resource."""
    authorizer = broker.authorizer
    if authorizer is None:
        return all_operations_field(resource_type)
    principal, host = _who(request)
    return authorizer.decision.authorized_operations(principal, host, resource_type, name)
