"""The client's side of SASL for the blocking and the asyncio connection: each drives a
``Reauthentication`` with a function that sends one request and returns its answer, once
connected and again before its session ends (KIP-368). The steps and the timing are
security/sasl_client.py's and security/sasl_reauth_client.py's, shared with a broker reaching
another broker.
"""

from __future__ import annotations

from ...security.sasl_client import SaslRefused
from ...security.sasl_reauth_client import Action, Reauthentication
from .security import ClientSecurity

__all__ = ["Action", "Reauthentication", "SaslRefused", "reauthentication"]


def reauthentication(security: ClientSecurity) -> Reauthentication | None:
    """The client's mechanism and credentials, to authenticate a connection and again before
    its session ends (KIP-368); None without SASL. SaslRefused is raised by the connections
    as KafkaError with its code."""
    if not security.sasl:
        return None
    assert security.mechanism is not None
    return Reauthentication(security.mechanism, security.username, security.password)
