"""CreateAcls, DescribeAcls, DeleteAcls, as Kafka answers them.

The caller needs Cluster Alter (Create, Delete) or Cluster Describe (Describe), else
CLUSTER_AUTHORIZATION_FAILED for the request (Describe) or each creation or filter. Without an
authorizer (``authorizer.class.name`` empty) they are answered SECURITY_DISABLED
(``unsecured.py``). A creation or filter Kafka refuses is answered INVALID_REQUEST with
Kafka's reason (``oncelog.security.acls.validate_binding``, ``AclBindingFilter.check``); the
others are stored (``oncelog.security.acl_store``).
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.api_versions import CREATE_ACLS, DELETE_ACLS, DESCRIBE_ACLS
from ...protocol.messages import Request
from ...protocol.schema import build, response_module
from ...security.acls import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    InvalidAcl,
    PatternType,
    ResourcePattern,
    ResourceType,
    validate_binding,
)
from .. import authorize
from ..log_limits import log_safe
from . import unsecured
from .api_meta import NO_THROTTLE

log = logging.getLogger(__name__)

# A change the store could not make is answered, never a closed connection: ZooKeeper away
# (MetadataUnavailable), races lost until a deadline (StillContended), and ZooKeeper's own
# refusals (a group or transactional id naming a path it cannot hold, "a/../b").
_UNAVAILABLE = Exception
NOT_AUTHORIZED = "Request is not authorized."


def _enum(kind, code: int):
    """A code the client sent, UNKNOWN (0) for one Kafka does not know."""
    try:
        return kind(code)
    except ValueError:
        return kind(0)


def _binding(creation) -> AclBinding:
    return AclBinding(
        ResourcePattern(_enum(ResourceType, creation.resource_type), creation.resource_name,
                        _enum(PatternType, creation.resource_pattern_type)),
        AccessControlEntry(creation.principal, creation.host,
                           _enum(AclOperation, creation.operation),
                           _enum(AclPermissionType, creation.permission_type)))


def _filter(f) -> AclBindingFilter:
    return AclBindingFilter(
        _enum(ResourceType, f.resource_type_filter), f.resource_name_filter,
        _enum(PatternType, f.pattern_type_filter), f.principal_filter, f.host_filter,
        _enum(AclOperation, f.operation), _enum(AclPermissionType, f.permission_type))


def handle_create_acls(broker, request: Request):
    mod = response_module(CREATE_ACLS, request.api_version)
    creations = request.body.creations

    def answer(results):
        return build(mod.CreateAclsResponse, throttle_time=NO_THROTTLE, results=tuple(
            build(mod.AclCreationResult, error_code=code, error_message=message)
            for code, message in results))

    if not authorize.cluster(broker, request, AclOperation.ALTER):
        return answer([(ErrorCode.cluster_authorization_failed, NOT_AUTHORIZED)] *
                      len(creations))
    if broker.authorizer is None:
        return unsecured.handle_create_acls(broker, request)
    results: list[tuple[ErrorCode, str | None]] = []
    valid = []
    for creation in creations:
        binding = _binding(creation)
        try:
            validate_binding(binding)
            broker.authorizer.acls.check(binding.pattern)
        except InvalidAcl as exc:
            results.append((ErrorCode.invalid_request, str(exc)))
            continue
        valid.append(binding)
        results.append((ErrorCode.none, None))
    try:
        broker.authorizer.acls.create(valid)
    except _UNAVAILABLE as exc:
        log.warning("CreateAcls from %s failed: %s", log_safe(request.client_id), exc)
        results = [(ErrorCode.unknown_server_error, str(exc)) if code == ErrorCode.none
                   else (code, message) for code, message in results]
    finally:
        broker.authorizer.changed()
    for binding in valid:
        log.info("ACL created by %s: %s", request.session.principal if request.session
                 else "?", binding)
    return answer(results)


def handle_describe_acls(broker, request: Request):
    mod = response_module(DESCRIBE_ACLS, request.api_version)

    def answer(code: ErrorCode, message: str | None, resources=()):
        return build(mod.DescribeAclsResponse, throttle_time=NO_THROTTLE, error_code=code,
                     error_message=message, resources=resources)

    if not authorize.cluster(broker, request, AclOperation.DESCRIBE):
        return answer(ErrorCode.cluster_authorization_failed, NOT_AUTHORIZED)
    if broker.authorizer is None:
        return unsecured.handle_describe_acls(broker, request)
    acl_filter = _filter(request.body)
    try:
        acl_filter.check()
    except InvalidAcl as exc:
        return answer(ErrorCode.invalid_request, str(exc))
    by_pattern: dict[ResourcePattern, list[AccessControlEntry]] = {}
    for binding in broker.authorizer.acls.index.matching(acl_filter):
        by_pattern.setdefault(binding.pattern, []).append(binding.entry)
    return answer(ErrorCode.none, None, tuple(
        build(mod.DescribeAclsResource, resource_type=int(p.resource_type),
              resource_name=p.name, pattern_type=int(p.pattern_type), acls=tuple(
                  build(mod.AclDescription, principal=e.principal, host=e.host,
                        operation=int(e.operation), permission_type=int(e.permission))
                  for e in entries))
        for p, entries in by_pattern.items()))


def handle_delete_acls(broker, request: Request):
    mod = response_module(DELETE_ACLS, request.api_version)
    filters = request.body.filters

    def result(code: ErrorCode, message: str | None, matching=()):
        return build(mod.DeleteAclsFilterResult, error_code=code, error_message=message,
                     matching_acls=tuple(
                         build(mod.DeleteAclsMatchingAcl, error_code=ErrorCode.none,
                               error_message=None, resource_type=int(b.pattern.resource_type),
                               resource_name=b.pattern.name,
                               pattern_type=int(b.pattern.pattern_type),
                               principal=b.entry.principal, host=b.entry.host,
                               operation=int(b.entry.operation),
                               permission_type=int(b.entry.permission))
                         for b in matching))

    def answer(results):
        return build(mod.DeleteAclsResponse, throttle_time=NO_THROTTLE,
                     filter_results=tuple(results))

    if not authorize.cluster(broker, request, AclOperation.ALTER):
        return answer([result(ErrorCode.cluster_authorization_failed, NOT_AUTHORIZED)] *
                      len(filters))
    if broker.authorizer is None:
        return unsecured.handle_delete_acls(broker, request)
    parsed = [_filter(f) for f in filters]
    checked: list[str | None] = []
    for acl_filter in parsed:
        try:
            acl_filter.check()
            checked.append(None)
        except InvalidAcl as exc:
            checked.append(str(exc))
    valid = [f for f, problem in zip(parsed, checked, strict=True) if problem is None]
    try:
        matched = iter(broker.authorizer.acls.delete(valid))
    except _UNAVAILABLE as exc:
        log.warning("DeleteAcls from %s failed: %s", log_safe(request.client_id), exc)
        return answer([result(ErrorCode.unknown_server_error, str(exc))] * len(filters))
    finally:
        broker.authorizer.changed()
    return answer([result(ErrorCode.invalid_request, problem) if problem is not None
                   else result(ErrorCode.none, None, next(matched)) for problem in checked])


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.DESCRIBE_ACLS: handle_describe_acls,
    apis.CREATE_ACLS: handle_create_acls,
    apis.DELETE_ACLS: handle_delete_acls,
}
