"""The principal a connection acts as, Kafka's ``KafkaPrincipal``: a type and a name
(``User:alice``). A PLAINTEXT connection without SASL is ``User:ANONYMOUS``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KafkaPrincipal:
    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """``User:alice`` (the form ACLs and ``super.users`` name principals in)."""
        principal_type, sep, name = text.partition(":")
        if not sep or not principal_type or not name:
            raise ValueError(f"a principal is TYPE:NAME, got {text!r}")
        return cls(principal_type, name)


ANONYMOUS = KafkaPrincipal("User", "ANONYMOUS")
