"""SCRAM users through the admin API (KIP-554): DescribeUserScramCredentials and
AlterUserScramCredentials, as ``Admin.describe_user_scram_credentials`` and
``Admin.alter_user_scram_credentials`` call them. The password never leaves the client: it
sends the salt and the salted password (RFC 5802's SaltedPassword), the broker keeps only
StoredKey and ServerKey."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.schema import build
from ...security import scram
from ..network.connection import BrokerConnection, KafkaError
from .base import AdminBase


@dataclass(frozen=True, slots=True)
class ScramUpsertion:
    user: str
    mechanism: str  # SCRAM-SHA-256 or SCRAM-SHA-512
    password: str
    iterations: int = scram.DEFAULT_ITERATIONS


def describe(conn: BrokerConnection, users: Iterable[str] | None
             ) -> dict[str, dict[str, int] | KafkaError]:
    """user -> {mechanism: iterations}, or the error the broker gave for it; every user with
    a credential when ``users`` is None."""
    asked = None if users is None else tuple(users)
    response = conn.call(apis.DESCRIBE_USER_SCRAM_CREDENTIALS, lambda mod, _v: build(
        mod.DescribeUserScramCredentialsRequest,
        users=None if asked is None else tuple(build(mod.UserName, name=u) for u in asked)))
    if response.error_code != ErrorCode.none:
        raise KafkaError(response.error_code, response.error_message)
    found: dict[str, dict[str, int] | KafkaError] = {}
    for result in response.results:
        if result.error_code != ErrorCode.none:
            found[result.user] = KafkaError(result.error_code, result.error_message)
        else:
            found[result.user] = {scram.MECHANISM_NAMES.get(i.mechanism, str(i.mechanism)):
                                  i.iterations for i in result.credential_infos}
    return found


def alter(conn: BrokerConnection, upsertions: Iterable[ScramUpsertion],
          deletions: Iterable[tuple[str, str]]) -> dict[str, KafkaError | None]:
    """user -> None when its changes were made, else the broker's error."""
    ups, dels = list(upsertions), list(deletions)
    for up in ups:
        if up.mechanism not in scram.MECHANISMS:
            raise ValueError(f"mechanism {up.mechanism!r} must be one of "
                             f"{', '.join(scram.MECHANISMS)}")

    def make(mod, _version):
        upserted = []
        for up in ups:
            salt = secrets.token_bytes(32)
            upserted.append(build(
                mod.ScramCredentialUpsertion, name=up.user,
                mechanism=scram.MECHANISM_TYPES[up.mechanism], iterations=up.iterations,
                salt=salt, salted_password=scram.salted_password(
                    up.mechanism, up.password.encode(), salt, up.iterations)))
        return build(mod.AlterUserScramCredentialsRequest, upsertions=tuple(upserted),
                     deletions=tuple(build(mod.ScramCredentialDeletion, name=user,
                                           mechanism=scram.MECHANISM_TYPES.get(mechanism, 0))
                                     for user, mechanism in dels))

    response = conn.call(apis.ALTER_USER_SCRAM_CREDENTIALS, make)
    return {r.user: None if r.error_code == ErrorCode.none
            else KafkaError(r.error_code, r.error_message) for r in response.results}


class ScramAdmin(AdminBase):
    """DescribeUserScramCredentials and AlterUserScramCredentials."""

    def describe_user_scram_credentials(self, users: Iterable[str] | None = None
                                        ) -> dict[str, dict[str, int] | KafkaError]:
        """user -> {mechanism: iterations} (or the broker's error for that user)."""
        return describe(self.conn, users)

    def alter_user_scram_credentials(self, upsertions: Iterable[ScramUpsertion] = (),
                                     deletions: Iterable[tuple[str, str]] = ()
                                     ) -> dict[str, KafkaError | None]:
        """Set or delete SCRAM credentials: user -> None when done, else its error."""
        return alter(self.conn, upsertions, deletions)
