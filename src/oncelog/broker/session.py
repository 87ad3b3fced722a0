"""Who is on the other end of a connection, as the handlers see it: the principal it acts as
and the listener it came in on. A connection starts as ``PLAINTEXT_SESSION`` (User:ANONYMOUS
on a PLAINTEXT listener); authentication (TLS, SASL) gives it another session. Every request
carries its connection's session (``Request.session``) so that authorization and quotas
decide from it alone."""

from __future__ import annotations

from dataclasses import dataclass

from ..security.principal import ANONYMOUS, KafkaPrincipal


@dataclass(frozen=True, slots=True)
class Session:
    principal: KafkaPrincipal = ANONYMOUS
    listener: str = "PLAINTEXT"
    security_protocol: str = "PLAINTEXT"


PLAINTEXT_SESSION = Session()
