"""The client's side of SASL for the blocking and the asyncio connection: each drives
``exchange`` with a function that sends one request and returns its answer. The steps are
security/sasl_client.py's, shared with a broker reaching another broker.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from ...security import sasl_client
from ...security.sasl_client import SaslRefused, Step
from .security import ClientSecurity

__all__ = ["SaslRefused", "Step", "exchange"]


def exchange(security: ClientSecurity) -> Generator[Step, Any, None]:
    """security/sasl_client.exchange with the client's mechanism and credentials; SaslRefused
    (the connections raise it as KafkaError with its code)."""
    assert security.mechanism is not None
    return sasl_client.exchange(security.mechanism, security.username, security.password)
