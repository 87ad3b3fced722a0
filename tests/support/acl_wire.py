"""Raw Kafka requests from a chosen loopback address, for the authorization tests: ACLs can
name a host, so one broker serves an admin (from 127.0.0.2, allowed everything) and the
subject of a test (from 127.0.0.1), both User:ANONYMOUS on PLAINTEXT."""

from __future__ import annotations

import dataclasses
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.metadata.store import LocalFileStore
from oncelog.protocol import api_versions as apis
from oncelog.protocol.messages import decode_response, encode_request
from oncelog.protocol.schema import build, request_module
from oncelog.security.acl_store import AclStore
from oncelog.security.acls import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)

IO_TIMEOUT = 10.0
ADMIN_HOST, SUBJECT_HOST = "127.0.0.2", "127.0.0.1"
ANONYMOUS = "User:ANONYMOUS"
AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"
METADATA_DIR = ".oncelog-metadata"  # the broker's store under its first log dir


def seed_admin(data_dir: Path) -> None:
    """Before the broker starts: everything allowed to ANONYMOUS from ADMIN_HOST, as an
    operator seeds the store (there is no super user here)."""
    store = AclStore(LocalFileStore(str(data_dir / METADATA_DIR)))
    store.create([
        AclBinding(ResourcePattern(rtype, CLUSTER_NAME if rtype == ResourceType.CLUSTER
                                   else "*", PatternType.LITERAL),
                   AccessControlEntry(ANONYMOUS, ADMIN_HOST, AclOperation.ALL,
                                      AclPermissionType.ALLOW))
        for rtype in (ResourceType.CLUSTER, ResourceType.TOPIC, ResourceType.GROUP,
                      ResourceType.TRANSACTIONAL_ID)])


class Wire:
    """One connection; ``call(api_key, make, version=None)`` at the broker's newest version
    unless told."""

    def __init__(self, port: int, source: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT,
                                             source_address=(source, 0))
        self._correlation = 0

    def close(self) -> None:
        self.sock.close()

    def call(self, api_key: int, make: Callable[[ModuleType, int], Any],
             version: int | None = None, raw: bool = False) -> Any:
        """The decoded answer; with ``raw`` its frame after the correlation id."""
        version = apis.SUPPORTED_VERSIONS[api_key][1] if version is None else version
        self._correlation += 1
        body = make(request_module(api_key, version), version)
        self.sock.sendall(encode_request(api_key, version, self._correlation, "acl-tests",
                                         body))
        (size,) = struct.unpack(">i", self._exact(4))
        frame = self._exact(size)
        if raw:
            assert struct.unpack_from(">i", frame)[0] == self._correlation
            return frame[4:]
        correlation, response = decode_response(api_key, version, frame)
        assert correlation == self._correlation
        return response

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    # --- ACLs ------------------------------------------------------------------------------

    def create_acls(self, bindings: list[AclBinding]) -> list[ErrorCode]:
        if not bindings:
            return []
        response = self.call(apis.CREATE_ACLS, lambda m, v: build(
            m.CreateAclsRequest, creations=tuple(build(
                m.AclCreation, resource_type=int(b.pattern.resource_type),
                resource_name=b.pattern.name,
                resource_pattern_type=int(b.pattern.pattern_type),
                principal=b.entry.principal, host=b.entry.host,
                operation=int(b.entry.operation), permission_type=int(b.entry.permission))
                for b in bindings)))
        return [r.error_code for r in response.results]

    def delete_acls_of_host(self, host: str) -> None:
        response = self.call(apis.DELETE_ACLS, lambda m, v: build(
            m.DeleteAclsRequest, filters=(build(
                m.DeleteAclsFilter, resource_type_filter=int(ResourceType.ANY),
                resource_name_filter=None, pattern_type_filter=int(PatternType.ANY),
                principal_filter=None, host_filter=host, operation=int(AclOperation.ANY),
                permission_type=int(AclPermissionType.ANY)),)))
        assert [r.error_code for r in response.filter_results] == [ErrorCode.none]


def error_codes(value: Any) -> Iterator[ErrorCode]:
    """Every ``*error_code`` in a response, at any depth."""
    if dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            inner = getattr(value, field.name)
            if field.name.endswith("error_code"):
                yield inner
            else:
                yield from error_codes(inner)
    elif isinstance(value, tuple):
        for item in value:
            yield from error_codes(item)
