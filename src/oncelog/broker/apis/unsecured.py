"""What a Kafka broker without SASL and without an authorizer answers to the security APIs,
answered the same here: a client configured for them learns why, instead of losing its
connection.

- SaslHandshake and SaslAuthenticate: ILLEGAL_SASL_STATE, as Kafka answers them on a
  listener that does not authenticate with SASL, or once a SASL connection is authenticated
  (before, a SASL listener's frames go to broker/sasl_gate.py instead).
- DescribeAcls, CreateAcls, DeleteAcls without an authorizer: SECURITY_DISABLED, "No
  Authorizer is configured.", for the request (Describe) or each creation or filter (acls.py
  answers them, and asks here when there is no authorizer).
- The delegation token APIs: DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, as Kafka answers them on
  a PLAINTEXT channel (the principal is User:ANONYMOUS, timestamps -1).
"""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.api_versions import (
    CREATE_ACLS,
    CREATE_DELEGATION_TOKEN,
    DELETE_ACLS,
    DESCRIBE_ACLS,
    DESCRIBE_DELEGATION_TOKEN,
    EXPIRE_DELEGATION_TOKEN,
    RENEW_DELEGATION_TOKEN,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
)
from ...protocol.messages import Request
from ...protocol.schema import build, response_module
from .api_meta import NO_THROTTLE

NO_AUTHORIZER = "No Authorizer is configured."
NOT_ALLOWED = ErrorCode.delegation_token_request_not_allowed
NO_TIMESTAMP = datetime.datetime.fromtimestamp(-0.001, datetime.UTC)  # written as -1
ANONYMOUS = ("User", "ANONYMOUS")


def handle_sasl_handshake(broker, request: Request):
    mod = response_module(SASL_HANDSHAKE, request.api_version)
    return build(mod.SaslHandshakeResponse, error_code=ErrorCode.illegal_sasl_state,
                 mechanisms=())


def handle_sasl_authenticate(broker, request: Request):
    mod = response_module(SASL_AUTHENTICATE, request.api_version)
    return build(mod.SaslAuthenticateResponse, error_code=ErrorCode.illegal_sasl_state,
                 error_message="this listener does not authenticate with SASL",
                 auth_bytes=b"", session_lifetime=datetime.timedelta(0))


def handle_describe_acls(broker, request: Request):
    mod = response_module(DESCRIBE_ACLS, request.api_version)
    return build(mod.DescribeAclsResponse, throttle_time=NO_THROTTLE,
                 error_code=ErrorCode.security_disabled, error_message=NO_AUTHORIZER,
                 resources=())


def handle_create_acls(broker, request: Request):
    mod = response_module(CREATE_ACLS, request.api_version)
    return build(mod.CreateAclsResponse, throttle_time=NO_THROTTLE, results=tuple(
        build(mod.AclCreationResult, error_code=ErrorCode.security_disabled,
              error_message=NO_AUTHORIZER) for _ in request.body.creations))


def handle_delete_acls(broker, request: Request):
    mod = response_module(DELETE_ACLS, request.api_version)
    return build(mod.DeleteAclsResponse, throttle_time=NO_THROTTLE, filter_results=tuple(
        build(mod.DeleteAclsFilterResult, error_code=ErrorCode.security_disabled,
              error_message=NO_AUTHORIZER, matching_acls=()) for _ in request.body.filters))


def handle_create_delegation_token(broker, request: Request):
    mod = response_module(CREATE_DELEGATION_TOKEN, request.api_version)
    body = request.body
    owner = (getattr(body, "owner_principal_type", None) or ANONYMOUS[0],
             getattr(body, "owner_principal_name", None) or ANONYMOUS[1])
    return build(mod.CreateDelegationTokenResponse, error_code=NOT_ALLOWED,
                 principal_type=owner[0], principal_name=owner[1],
                 token_requester_principal_type=ANONYMOUS[0],
                 token_requester_principal_name=ANONYMOUS[1], issue_timestamp=NO_TIMESTAMP,
                 expiry_timestamp=NO_TIMESTAMP, max_timestamp=NO_TIMESTAMP, token_id="",
                 hmac=b"", throttle_time=NO_THROTTLE)


def handle_renew_delegation_token(broker, request: Request):
    mod = response_module(RENEW_DELEGATION_TOKEN, request.api_version)
    return build(mod.RenewDelegationTokenResponse, error_code=NOT_ALLOWED,
                 expiry_timestamp=NO_TIMESTAMP, throttle_time=NO_THROTTLE)


def handle_expire_delegation_token(broker, request: Request):
    mod = response_module(EXPIRE_DELEGATION_TOKEN, request.api_version)
    return build(mod.ExpireDelegationTokenResponse, error_code=NOT_ALLOWED,
                 expiry_timestamp=NO_TIMESTAMP, throttle_time=NO_THROTTLE)


def handle_describe_delegation_token(broker, request: Request):
    mod = response_module(DESCRIBE_DELEGATION_TOKEN, request.api_version)
    return build(mod.DescribeDelegationTokenResponse, error_code=NOT_ALLOWED, tokens=(),
                 throttle_time=NO_THROTTLE)


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.SASL_HANDSHAKE: handle_sasl_handshake,
    apis.SASL_AUTHENTICATE: handle_sasl_authenticate,
    apis.CREATE_DELEGATION_TOKEN: handle_create_delegation_token,
    apis.RENEW_DELEGATION_TOKEN: handle_renew_delegation_token,
    apis.EXPIRE_DELEGATION_TOKEN: handle_expire_delegation_token,
    apis.DESCRIBE_DELEGATION_TOKEN: handle_describe_delegation_token,
}
