"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554): the SCRAM users kept in
the metadata store (security/credentials.py), answered as Kafka answers them.

Describe, for each user asked (every user with a credential when none is named):

| case | answer |
|---|---|
| a user named twice in the request | DUPLICATE_RESOURCE for it |
| a user without any credential | RESOURCE_NOT_FOUND |
| otherwise | NONE, (mechanism, iterations) of each credential |

Alter, decided per user by ``alteration_error`` (a user's changes are all made or none):

| case | answer |
|---|---|
| an empty user name | UNACCEPTABLE_CREDENTIAL |
| a mechanism that is not SCRAM-SHA-256 or SCRAM-SHA-512 | UNSUPPORTED_SASL_MECHANISM |
| one (user, mechanism) twice in the request (deleted and upserted, ...) | DUPLICATE_RESOURCE |
| an upsertion's iterations outside 4096..16384 | UNACCEPTABLE_CREDENTIAL |
| an upsertion without a salt or salted password | UNACCEPTABLE_CREDENTIAL |
| a deletion of a credential that does not exist | RESOURCE_NOT_FOUND |
| otherwise | NONE: deletions, then upsertions (StoredKey and ServerKey from the salted password) |

The salted password travels in the request (Kafka's design): the broker stores only what
RFC 5802 says a server keeps.
"""

from __future__ import annotations

import collections
import logging

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.messages import Request
from ...protocol.schema import build, response_module
from ...security import scram
from .. import authorize
from ..authorize import Op
from ..log_limits import log_safe
from .api_meta import NO_THROTTLE

log = logging.getLogger(__name__)


def handle_describe_user_scram_credentials(broker, request: Request):
    mod = response_module(apis.DESCRIBE_USER_SCRAM_CREDENTIALS, request.api_version)
    if not authorize.cluster(broker, request, Op.DESCRIBE):  # as Kafka
        return build(mod.DescribeUserScramCredentialsResponse, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.cluster_authorization_failed,
                     error_message=ErrorCode.cluster_authorization_failed.name, results=())
    credentials = broker.credentials
    asked = [u.name for u in request.body.users or ()]
    counts = collections.Counter(asked)
    results = []
    for user in dict.fromkeys(asked) if asked else credentials.users():
        if counts[user] > 1:
            error, message, infos = (ErrorCode.duplicate_resource, "Cannot describe SCRAM "
                                     "credentials for the same user twice in a single request",
                                     {})
        else:
            infos = credentials.mechanisms(user)
            error, message = (ErrorCode.none, None) if infos else (
                ErrorCode.resource_not_found,
                "Attempt to describe a user credential that does not exist")
        results.append(build(mod.DescribeUserScramCredentialsResult, user=user,
                             error_code=error, error_message=message, credential_infos=tuple(
                                 build(mod.CredentialInfo,
                                       mechanism=scram.MECHANISM_TYPES[name],
                                       iterations=iterations)
                                 for name, iterations in infos.items())))
    return build(mod.DescribeUserScramCredentialsResponse, throttle_time=NO_THROTTLE,
                 error_code=ErrorCode.none, error_message=None, results=tuple(results))


def alteration_error(user: str, deletions: list, upsertions: list,
                     existing: dict[str, int]) -> tuple[ErrorCode, str | None]:
    """The table's answer for one user's deletions and upsertions (``existing``: the
    mechanisms it has now)."""
    if not user:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    mechanisms = [c.mechanism for c in deletions] + [c.mechanism for c in upsertions]
    if any(m not in scram.MECHANISM_NAMES for m in mechanisms):
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    if len(set(mechanisms)) != len(mechanisms):
        return (ErrorCode.duplicate_resource,
                "A user credential cannot be altered twice in the same request")
    for up in upsertions:
        if up.iterations < scram.MIN_ITERATIONS:
            return ErrorCode.unacceptable_credential, (
                f"Too few iterations: {up.iterations} < {scram.MIN_ITERATIONS}")
        if up.iterations > scram.MAX_ITERATIONS:
            return ErrorCode.unacceptable_credential, (
                f"Too many iterations: {up.iterations} > {scram.MAX_ITERATIONS}")
        if not up.salt or not up.salted_password:
            return ErrorCode.unacceptable_credential, "The salt and salted password are required"
    for deletion in deletions:
        if scram.MECHANISM_NAMES[deletion.mechanism] not in existing:
            return (ErrorCode.resource_not_found,
                    "Attempt to delete a user credential that does not exist")
    return ErrorCode.none, None


def handle_alter_user_scram_credentials(broker, request: Request):
    mod = response_module(apis.ALTER_USER_SCRAM_CREDENTIALS, request.api_version)
    credentials = broker.credentials
    body = request.body
    by_user: dict[str, tuple[list, list]] = {}
    for deletion in body.deletions:
        by_user.setdefault(deletion.name, ([], []))[0].append(deletion)
    for upsertion in body.upsertions:
        by_user.setdefault(upsertion.name, ([], []))[1].append(upsertion)
    results = []
    permitted = authorize.cluster(broker, request, Op.ALTER)  # else every user refused
    for user, (deletions, upsertions) in by_user.items():
        error, message = alteration_error(user, deletions, upsertions,
                                          credentials.mechanisms(user) if user else {}) \
            if permitted else (ErrorCode.cluster_authorization_failed,
                               ErrorCode.cluster_authorization_failed.name)
        if error == ErrorCode.none:
            for deletion in deletions:
                credentials.delete(user, scram.MECHANISM_NAMES[deletion.mechanism])
            for up in upsertions:
                name = scram.MECHANISM_NAMES[up.mechanism]
                credentials.put(user, name, scram.credential_from_salted(
                    name, bytes(up.salted_password), bytes(up.salt), up.iterations))
            log.info("%s: SCRAM credentials of %s: %d deleted, %d set", request.peer,
                     log_safe(user), len(deletions), len(upsertions))
        results.append(build(mod.AlterUserScramCredentialsResult, user=user, error_code=error,
                             error_message=message))
    return build(mod.AlterUserScramCredentialsResponse, throttle_time=NO_THROTTLE,
                 results=tuple(results))


# The requests this module answers (gathered in registry.py).
HANDLERS = {
    apis.DESCRIBE_USER_SCRAM_CREDENTIALS: handle_describe_user_scram_credentials,
    apis.ALTER_USER_SCRAM_CREDENTIALS: handle_alter_user_scram_credentials,
}
