"""The security APIs of a broker without SASL and without an authorizer, answered as Kafka
answers them then: the ACL APIs SECURITY_DISABLED (through kafka-python's admin client), the
SASL APIs ILLEGAL_SASL_STATE (kafka-python's encoding of them), the connection kept."""

from __future__ import annotations

import datetime
import socket
import struct

import kafka.admin
import kafka.errors
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

TIMEOUT = 30.0


def test_acl_apis_say_security_is_disabled(broker):
    admin = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap,
                                         request_timeout_ms=int(TIMEOUT * 1000))
    try:
        pattern = ResourcePattern(ResourceType.TOPIC, "t", ACLResourcePatternType.LITERAL)
        acl = ACL("User:alice", "*", ACLOperation.READ, ACLPermissionType.ALLOW, pattern)
        anything = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                             ResourcePatternFilter(ResourceType.ANY, None,
                                                   ACLResourcePatternType.ANY))
        try:
            _, error = admin.describe_acls(anything)
        except kafka.errors.SecurityDisabledError:
            error = kafka.errors.SecurityDisabledError
        assert error is kafka.errors.SecurityDisabledError
        created = admin.create_acls([acl])
        assert created["succeeded"] == []
        assert created["failed"] == [kafka.errors.SecurityDisabledError]
        deleted = admin.delete_acls([anything])
        assert [e for _, _, e in deleted] == [kafka.errors.SecurityDisabledError]
    finally:
        admin.close()


def test_sasl_apis_say_this_listener_does_not_authenticate(broker):
    with socket.create_connection(("127.0.0.1", broker.port), timeout=TIMEOUT) as sock:
        stream = sock.makefile("rb")

        def call(request, version: int, correlation_id: int):
            request.with_header(correlation_id=correlation_id, client_id="sasl")
            sock.sendall(request.encode(version, header=True, framed=True))
            (size,) = struct.unpack(">i", stream.read(4))
            frame = stream.read(size)
            return _response(request, version, frame)

        for version in (0, 1):
            answer = call(SaslHandshakeRequest(mechanism="PLAIN"), version, 10 + version)
            assert answer.error_code == kafka.errors.IllegalSaslStateError.errno
        for version in (0, 1, 2):
            answer = call(SaslAuthenticateRequest(auth_bytes=b"\0alice\0secret"), version,
                          20 + version)
            assert answer.error_code == kafka.errors.IllegalSaslStateError.errno


def _response(request, version: int, frame: bytes):
    from kafka.protocol.api_header import ResponseClassRegistry

    response_class = ResponseClassRegistry.get_response_class(request.header)
    assert struct.unpack(">i", frame[:4])[0] == request.header.correlation_id
    return response_class.decode(frame, version=version, header=True)


def test_delegation_tokens_are_not_allowed_on_plaintext(broker):
    """kafka-python has no encoding of these: kio's, every version."""
    from kio.schema.errors import ErrorCode

    from oncelog.protocol import api_versions as apis
    from oncelog.protocol.messages import decode_response, encode_request
    from oncelog.protocol.schema import build, request_module

    hour = datetime.timedelta(hours=1)
    calls = [(apis.CREATE_DELEGATION_TOKEN, v, "CreateDelegationTokenRequest",
              {"owner_principal_type": None, "owner_principal_name": None, "renewers": (),
               "max_lifetime": hour}) for v in (1, 2, 3)]
    calls += [(key, v, name, {"hmac": b"x", "renew_period": hour, "expiry_time_period": hour})
              for key, name in ((apis.RENEW_DELEGATION_TOKEN, "RenewDelegationTokenRequest"),
                                (apis.EXPIRE_DELEGATION_TOKEN, "ExpireDelegationTokenRequest"))
              for v in (1, 2)]
    calls += [(apis.DESCRIBE_DELEGATION_TOKEN, v, "DescribeDelegationTokenRequest",
               {"owners": None}) for v in (1, 2, 3)]
    with socket.create_connection(("127.0.0.1", broker.port), timeout=TIMEOUT) as sock:
        stream = sock.makefile("rb")
        for i, (key, version, name, fields) in enumerate(calls):
            body = build(getattr(request_module(key, version), name), **fields)
            sock.sendall(encode_request(key, version, i, "tokens", body))
            (size,) = struct.unpack(">i", stream.read(4))
            frame = stream.read(size)
            # kio cannot read the -1 timestamps Kafka writes: the error code is the first
            # field, after the correlation id and (flexible versions) the header's tags.
            flexible = getattr(request_module(key, version), name).__flexible__
            got, error = struct.unpack_from(">ih", frame[:4] + frame[5 if flexible else 4:])
            assert (got, error) == (i, ErrorCode.delegation_token_request_not_allowed), \
                (key, version)
            if key == apis.CREATE_DELEGATION_TOKEN:
                assert b"\x04User" in frame or b"\x05User" in frame
                assert b"ANONYMOUS" + b"\xff" * 24 in frame  # issued, expires, max: -1
            if key == apis.DESCRIBE_DELEGATION_TOKEN:
                assert decode_response(key, version, frame)[1].tokens == ()
