"""The admin client's ACL calls: CreateAcls, DescribeAcls, DeleteAcls, against any Kafka
broker with an authorizer (``AclAdmin``, a part of ``oncelog.Admin``)."""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.acl_codes import AclOperation, AclPermissionType, PatternType, ResourceType
from ...protocol.schema import build
from ..network.connection import KafkaError
from .base import AdminBase


@dataclass(frozen=True, slots=True)
class Acl:
    """One ACL binding: a resource pattern and who may (or may not) do what to it."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType


@dataclass(frozen=True, slots=True)
class AclFilter:
    """What DescribeAcls and DeleteAcls match: None and ANY match anything; MATCH as the
    pattern type matches the ACLs that apply to a resource of that name."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY


def _filter_fields(f: AclFilter) -> dict:
    return dict(resource_type_filter=int(f.resource_type), resource_name_filter=f.name,
                pattern_type_filter=int(f.pattern_type), principal_filter=f.principal,
                host_filter=f.host, operation=int(f.operation),
                permission_type=int(f.permission))


def _acl(rtype: int, name: str, ptype: int, e) -> Acl:
    return Acl(ResourceType(rtype), name, PatternType(ptype), e.principal, e.host,
               AclOperation(e.operation), AclPermissionType(e.permission_type))


class AclAdmin(AdminBase):
    """CreateAcls, DescribeAcls, DeleteAcls."""

    def create_acls(self, acls: list[Acl]) -> None:
        """KafkaError for the first creation refused (the others are created)."""
        response = self.conn.call(apis.CREATE_ACLS, lambda m, v: build(
            m.CreateAclsRequest, creations=tuple(build(
                m.AclCreation, resource_type=int(a.resource_type), resource_name=a.name,
                resource_pattern_type=int(a.pattern_type), principal=a.principal,
                host=a.host, operation=int(a.operation), permission_type=int(a.permission))
                for a in acls)))
        for acl, result in zip(acls, response.results, strict=True):
            if result.error_code != ErrorCode.none:
                raise KafkaError(result.error_code, result.error_message or str(acl))

    def describe_acls(self, acl_filter: AclFilter = AclFilter()) -> list[Acl]:
        response = self.conn.call(apis.DESCRIBE_ACLS, lambda m, v: build(
            m.DescribeAclsRequest, **_filter_fields(acl_filter)))
        if response.error_code != ErrorCode.none:
            raise KafkaError(response.error_code, response.error_message)
        return [_acl(r.resource_type, r.resource_name, r.pattern_type, e)
                for r in response.resources for e in r.acls]

    def delete_acls(self, filters: list[AclFilter]) -> list[list[Acl]]:
        """The ACLs each filter deleted."""
        response = self.conn.call(apis.DELETE_ACLS, lambda m, v: build(
            m.DeleteAclsRequest, filters=tuple(
                build(m.DeleteAclsFilter, **_filter_fields(f)) for f in filters)))
        deleted = []
        for result in response.filter_results:
            if result.error_code != ErrorCode.none:
                raise KafkaError(result.error_code, result.error_message)
            deleted.append([_acl(a.resource_type, a.resource_name, a.pattern_type, a)
                            for a in result.matching_acls])
        return deleted
