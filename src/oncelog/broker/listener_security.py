"""What each listener asks of a connection before it is anyone: its TLS context (from PEM
files, Python's ``ssl``), its SASL mechanisms, and the principal a client certificate names.

Everything is read and checked once, when the broker starts: a missing or bad file, a key
that does not decrypt, a mechanism that does not exist, mutual TLS without a truststore is a
ConfigError naming the listener and the key (``oncelog broker`` exits 2 with it), never a
traceback and never at the first connection.
"""

from __future__ import annotations

import contextlib
import os
import re
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..security.principal import ANONYMOUS, KafkaPrincipal
from ..security.principal_mapping import Rule, parse_rules, principal_name
from ..security.sasl_server import PLAIN, SUPPORTED_MECHANISMS
from .config import BrokerConfig, ConfigError
from .listeners import Endpoint

_CLIENT_AUTH = {"required": ssl.CERT_REQUIRED, "requested": ssl.CERT_OPTIONAL,
                "none": ssl.CERT_NONE}
_TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
# Java's X500Principal.getName() (RFC 2253) short names; Python's peercert long names.
_SHORT_NAMES = {"commonName": "CN", "countryName": "C", "localityName": "L",
                "stateOrProvinceName": "ST", "organizationName": "O",
                "organizationalUnitName": "OU", "streetAddress": "STREET",
                "domainComponent": "DC", "userId": "UID"}
_PLAIN_USER = re.compile(r'user_([^=\s]+)\s*=\s*"([^"]*)"')


@dataclass(frozen=True)
class ListenerSecurity:
    endpoint: Endpoint
    ssl_context: ssl.SSLContext | None
    mechanisms: tuple[str, ...]  # enabled SASL mechanisms (SASL listeners only)
    plain_users: Mapping[str, str] | None  # PLAIN's static users, from its JAAS config
    failed_delay_s: float  # connection.failed.authentication.delay.ms
    max_receive: int  # sasl.server.max.receive.size: a frame before authentication
    # KIP-368's connections.max.reauth.ms by enabled mechanism (0: sessions never end)
    reauth_ms: Mapping[str, int] = field(default_factory=dict)
    # ssl.principal.mapping.rules: a client certificate's subject -> the principal's name
    principal_rules: tuple[Rule, ...] = (Rule(None),)

    @property
    def name(self) -> str:
        return self.endpoint.name


def listener_securities(config: BrokerConfig) -> list[ListenerSecurity]:
    return [_one(config, endpoint) for endpoint in config.listeners]


def _one(config: BrokerConfig, endpoint: Endpoint) -> ListenerSecurity:
    name = endpoint.name
    mechanisms: tuple[str, ...] = ()
    plain_users = None
    if endpoint.sasl:
        mechanisms = tuple(m for m in config.listener_setting(name, "sasl.enabled.mechanisms")
                           .split(",") if m)
        unknown = [m for m in mechanisms if m not in SUPPORTED_MECHANISMS]
        if unknown or not mechanisms:
            raise ConfigError(
                f"listener {name}: sasl.enabled.mechanisms: {', '.join(unknown) or 'none'} "
                f"not available; set one or more of {', '.join(SUPPORTED_MECHANISMS)}")
        if PLAIN in mechanisms:
            plain_users = _plain_users(config, name)
    return ListenerSecurity(
        endpoint, _server_context(config, name) if endpoint.tls else None, mechanisms,
        plain_users, config.get("connection.failed.authentication.delay.ms") / 1000,
        config.get("sasl.server.max.receive.size"), _reauth_ms(config, name, mechanisms),
        parse_rules(config.listener_setting(name, "ssl.principal.mapping.rules")))


def _reauth_ms(config: BrokerConfig, listener: str,
               mechanisms: tuple[str, ...]) -> Mapping[str, int]:
    """Each mechanism's session lifetime: listener.name.<l>.<mechanism>.connections.max.
    reauth.ms, else the listener's, else the broker's (Kafka's prefix overrides)."""
    key = "connections.max.reauth.ms"
    return MappingProxyType({m: config.listener_overrides.get(
        f"listener.name.{listener.lower()}.{m.lower()}.{key}",
        config.listener_setting(listener, key)) for m in mechanisms})


def _plain_users(config: BrokerConfig, listener: str) -> dict[str, str] | None:
    jaas = config.listener_overrides.get(f"listener.name.{listener.lower()}.plain.sasl.jaas.config")
    if jaas is None:
        return None
    return dict(_PLAIN_USER.findall(jaas)) or None


def _server_context(config: BrokerConfig, listener: str) -> ssl.SSLContext:
    def setting(key: str):
        return config.listener_setting(listener, key)

    def fail(key: str, why: object) -> ConfigError:
        return ConfigError(f"listener {listener}: {key}: {why}")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = [_TLS_VERSIONS[v] for v in setting("ssl.enabled.protocols").split(",")]
    context.minimum_version, context.maximum_version = min(versions), max(versions)
    location = setting("ssl.keystore.location")
    chain, key = setting("ssl.keystore.certificate.chain"), setting("ssl.keystore.key")
    # Never None: OpenSSL would ask for an encrypted key's password on the terminal.
    password = setting("ssl.key.password") or _no_password
    if location:
        try:
            context.load_cert_chain(location, password=password)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise fail("ssl.keystore.location", f"{location}: {_reason(exc)}") from None
    elif chain and key:
        try:
            _load_chain_text(context, chain, key, password)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise fail("ssl.keystore.certificate.chain", _reason(exc)) from None
    else:
        raise fail("ssl.keystore.location", "a TLS listener needs its certificate and key "
                   "(or ssl.keystore.certificate.chain and ssl.keystore.key)")
    client_auth = setting("ssl.client.auth")
    context.verify_mode = _CLIENT_AUTH[client_auth]
    trust_location, trust_text = (setting("ssl.truststore.location"),
                                  setting("ssl.truststore.certificates"))
    try:
        if trust_location:
            context.load_verify_locations(cafile=trust_location)
        elif trust_text:
            context.load_verify_locations(cadata=trust_text)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise fail("ssl.truststore.location", f"{trust_location or 'certificates'}: "
                   f"{_reason(exc)}") from None
    if client_auth != "none" and not (trust_location or trust_text):
        raise fail("ssl.client.auth", f"{client_auth} needs ssl.truststore.location (the CA "
                   f"that signs client certificates)")
    return context


def client_context(config: BrokerConfig, listener: str) -> ssl.SSLContext:
    """The TLS context a broker reaches another's ``listener`` with: that listener's
    truststore (the system's CAs without one) checks the other broker, whose name is checked
    when ssl.endpoint.identification.algorithm is https; the listener's keystore is this
    broker's certificate, for a listener that asks for one (as Kafka's brokers use one
    listener's ssl.* settings for both ends)."""
    def setting(key: str):
        return config.listener_setting(listener, key)

    def fail(key: str, why: object) -> ConfigError:
        return ConfigError(f"inter-broker listener {listener}: {key}: {why}")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    versions = [_TLS_VERSIONS[v] for v in setting("ssl.enabled.protocols").split(",")]
    context.minimum_version, context.maximum_version = min(versions), max(versions)
    context.check_hostname = setting("ssl.endpoint.identification.algorithm").lower() == "https"
    trust_location, trust_text = (setting("ssl.truststore.location"),
                                  setting("ssl.truststore.certificates"))
    try:
        if trust_location:
            context.load_verify_locations(cafile=trust_location)
        elif trust_text:
            context.load_verify_locations(cadata=trust_text)
        else:
            context.load_default_certs()
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise fail("ssl.truststore.location", f"{trust_location or 'certificates'}: "
                   f"{_reason(exc)}") from None
    location = setting("ssl.keystore.location")
    chain, key = setting("ssl.keystore.certificate.chain"), setting("ssl.keystore.key")
    password = setting("ssl.key.password") or _no_password
    try:
        if location:
            context.load_cert_chain(location, password=password)
        elif chain and key:
            _load_chain_text(context, chain, key, password)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise fail("ssl.keystore.location", f"{location or 'certificate chain'}: "
                   f"{_reason(exc)}") from None
    return context


def _no_password() -> bytes:
    return b""


def _load_chain_text(context: ssl.SSLContext, chain: str, key: str, password) -> None:
    # load_cert_chain reads files only: the PEM text goes to a file only we can read, for
    # as long as the call.
    fd, path = tempfile.mkstemp(prefix="oncelog-keystore-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(chain.strip() + "\n" + key.strip() + "\n")
        context.load_cert_chain(path, password=password)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _reason(exc: Exception) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, ssl.SSLError):
        return (f"not a usable PEM certificate and key, or the key's password "
                f"(ssl.key.password) is missing or wrong ({exc.reason or exc})")
    return str(exc.args[-1] if exc.args else exc)


def certificate_principal(peercert: Mapping | None,
                          rules: tuple[Rule, ...] = (Rule(None),)) -> KafkaPrincipal | None:
    """User:<the name ssl.principal.mapping.rules give the subject's distinguished name as
    Java's X500Principal.getName() writes it (RFC 2253: the last RDN first, short attribute
    names)>; DEFAULT gives the name itself. User:ANONYMOUS without a certificate; None when
    no rule applies (Kafka refuses the connection)."""
    subject = (peercert or {}).get("subject")
    if not subject:
        return ANONYMOUS
    rdns = ["+".join(f"{_SHORT_NAMES.get(attr, attr)}={_escape(value)}" for attr, value in rdn)
            for rdn in reversed(subject)]
    name = principal_name(rules, ",".join(rdns))
    return None if name is None else KafkaPrincipal("User", name)


def _escape(value: str) -> str:
    escaped = re.sub(r'([,+"\\<>;])', r"\\\1", value)
    if escaped.startswith(("#", " ")):
        escaped = "\\" + escaped
    if escaped.endswith(" "):
        escaped = escaped[:-1] + "\\ "
    return escaped
