"""How oncelog's clients reach a secured broker, configured with librdkafka's names (as the
rest of their configuration): ``security.protocol`` (plaintext, ssl, sasl_plaintext,
sasl_ssl), ``sasl.mechanism`` (or ``sasl.mechanisms``: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512),
``sasl.username``, ``sasl.password``, ``ssl.ca.location`` (the CA file that signs the
broker's certificate; the system's CAs without it), ``ssl.certificate.location`` and
``ssl.key.location`` (the client's own, for mutual TLS), ``ssl.key.password`` and
``ssl.endpoint.identification.algorithm`` (https, the default: the certificate must name
the host; none: it need not).

A bad value, a missing file, a key that does not decrypt is a ValueError naming the key when
the client is made, never at the first connection.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...security.scram import MECHANISMS

SUPPORTED_MECHANISMS = ("PLAIN", *MECHANISMS)

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SECURITY_DEFAULTS: dict[str, Any] = {
    "security.protocol": "plaintext",
    "sasl.mechanism": None,
    "sasl.mechanisms": None,
    "sasl.username": None,
    "sasl.password": None,
    "ssl.ca.location": None,
    "ssl.certificate.location": None,
    "ssl.key.location": None,
    "ssl.key.password": None,
    "ssl.endpoint.identification.algorithm": "https",
}
SECURITY_KEYS = frozenset(SECURITY_DEFAULTS)


@dataclass(frozen=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str = ""
    password: str = ""
    ssl_context: ssl.SSLContext | None = None

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ClientSecurity:
        """The security settings among ``config``'s (other keys are ignored)."""
        c = {**SECURITY_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
        protocol = str(c["security.protocol"]).upper()
        if protocol not in PROTOCOLS:
            raise ValueError(f"security.protocol: {c['security.protocol']!r} must be one of "
                             f"{', '.join(p.lower() for p in PROTOCOLS)}")
        mechanism = None
        username = password = ""
        if protocol.startswith("SASL_"):
            mechanism = str(c["sasl.mechanism"] or c["sasl.mechanisms"] or "").upper()
            if mechanism not in SUPPORTED_MECHANISMS:
                raise ValueError(f"sasl.mechanism: {mechanism or 'unset'} must be one of "
                                 f"{', '.join(SUPPORTED_MECHANISMS)}")
            username, password = str(c["sasl.username"] or ""), str(c["sasl.password"] or "")
            if not username:
                raise ValueError("sasl.username: required with security.protocol "
                                 f"{protocol.lower()}")
        context = _context(c) if protocol in ("SSL", "SASL_SSL") else None
        return cls(protocol, mechanism, username, password, context)


PLAINTEXT = ClientSecurity()


def _no_password() -> bytes:
    return b""


def _context(c: Mapping[str, Any]) -> ssl.SSLContext:
    context = ssl.create_default_context()
    verify_host = str(c["ssl.endpoint.identification.algorithm"]).lower()
    if verify_host not in ("https", "none", ""):
        raise ValueError("ssl.endpoint.identification.algorithm: must be https or none")
    context.check_hostname = verify_host == "https"
    for key, load in (("ssl.ca.location", lambda path: context.load_verify_locations(path)),
                      ("ssl.certificate.location", lambda path: context.load_cert_chain(
                          # never None: OpenSSL would ask on the terminal
                          path, c["ssl.key.location"], c["ssl.key.password"] or _no_password))):
        path = c[key]
        if path is None:
            continue
        try:
            load(str(path))
        except FileNotFoundError:
            raise ValueError(f"{key}: {path}: no such file") from None
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"{key}: {path}: not a usable PEM file ({exc})") from None
    return context
